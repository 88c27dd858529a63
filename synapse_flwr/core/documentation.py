"""Documentation text: what a tool's documentation embeds as (its name in words, then its description)."""

from __future__ import annotations

import re

from synapse_flwr.core.schema import ToolEntry

_BLANK = ToolEntry(tool_id="blank")


def doc_entry(tool_id: str, description: str) -> ToolEntry:
    """An entry with only an id and a description, not validated (a flat text may be longer).

    A copy of one blank entry: ``ToolEntry.model_construct`` inspects every
    default factory's signature on each call (~1 ms per tool, minutes at
    20,000 tools).
    """
    return _BLANK.model_copy(update={"tool_id": tool_id, "description": description})


# Word boundaries inside a name: "AusPetrolPrices", "getHTTPStatus", "AutoInfra1".
_NAME_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z])(?=[0-9])|[_\-]+")


def name_words(name: str) -> str:
    """A tool name as words: ``"AusPetrolPrices"`` -> ``"Aus Petrol Prices"``, ``"get_weather"`` -> ``"get weather"``.

    An uncased embedder would read a camelCase name as one unknown word (seed-7
    MetaTool split, 74 of 199 names camelCase: docs_only +1.2 seen points).
    """
    return _NAME_BOUNDARY.sub(" ", name).strip()


def documentation_text(name: str, description: str) -> str:
    """What a tool's documentation embeds as: its name in words, then its description (may be empty)."""
    words = name_words(name)
    return f"{words}: {description}" if description else words


def doc_text(entry: ToolEntry, name: str) -> str:
    """What a tool's documentation entry embeds: :func:`documentation_text` of its name and description."""
    return documentation_text(name, entry.description)
