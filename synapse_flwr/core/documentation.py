"""Documentation text: what a tool's documentation embeds as (its name in words, its description, its arguments)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from synapse_flwr.core.schema import ToolEntry

if TYPE_CHECKING:
    from synapse_flwr.core.catalog import Catalog

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


#: An argument taken by more than this share of a catalog's tools says nothing about which tool a request wants.
COMMON_ARGUMENT_SHARE = 0.5


def schema_properties(parameters: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The top-level ``properties`` of a parameters' JSON Schema (empty when it lists none)."""
    props = (parameters or {}).get("properties")
    return props if isinstance(props, Mapping) else {}


def arguments_text(parameters: Mapping[str, Any] | None) -> str:
    """A tool's arguments as words: ``"order id: The order id.; reason"`` from its parameters' JSON Schema.

    Each top-level property in schema order, its name as words (:func:`name_words`)
    and its description when it has one. Argument names and descriptions are
    public catalog text that says what a request must mention
    (``tuning/arguments/``: docs_only on tau-bench's 1,350 gold calls 0.222 ->
    0.343 per step, on the demo's seen tools 0.736 -> 0.764). Empty when the
    schema lists no properties.
    """
    parts = []
    for key, spec in schema_properties(parameters).items():
        about = spec.get("description") if isinstance(spec, Mapping) else None
        about = " ".join(about.split()) if isinstance(about, str) else ""
        parts.append(f"{name_words(str(key))}: {about}" if about else name_words(str(key)))
    return "; ".join(p for p in parts if p)


def distinctive_parameters(schemas: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Mapping[str, Any] | None]:
    """Each tool's parameters' schema without the arguments most of the catalog's tools take.

    An argument whose name (as words, case-blind) more than
    :data:`COMMON_ARGUMENT_SHARE` of the tools take (``query``, ``limit`` on
    every tool of an API wrapper) is dropped: read on every tool it would move
    every documentation vector alike and blur them (``tuning/arguments/``:
    four such arguments on every MetaTool tool cost docs_only 1.3 seen points
    before this rule, nothing after).

    Parameters
    ----------
    schemas : mapping of str to (mapping or None)
        Tool id to its parameters' JSON Schema (None: none given).
    """
    def key(name: object) -> str:
        return name_words(str(name)).lower()

    takes: dict[str, int] = {}
    for schema in schemas.values():
        for name in {key(k) for k in schema_properties(schema)}:
            takes[name] = takes.get(name, 0) + 1
    common = {name for name, n in takes.items() if n > COMMON_ARGUMENT_SHARE * len(schemas)}
    if not common:
        return dict(schemas)
    return {tool: {"properties": {k: v for k, v in schema_properties(schema).items() if key(k) not in common}}
            if schema_properties(schema) else schema for tool, schema in schemas.items()}


def catalog_arguments(catalog: Catalog) -> dict[str, str]:
    """Tool id to the arguments its documentation reads (:func:`arguments_text` of :func:`distinctive_parameters`)."""
    schemas = distinctive_parameters({d.tool_id: d.parameters for d in catalog.tools})
    return {tool: arguments_text(schema) for tool, schema in schemas.items()}


def documentation_text(name: str, description: str, arguments: str = "") -> str:
    """What a tool's documentation embeds as: its name in words, its description (may be empty), its arguments.

    ``arguments`` (:func:`catalog_arguments`) come last, so an embedder that
    keeps the first tokens of a long text cuts them, never the description.
    """
    text = f"{name_words(name)}: {description}" if description else name_words(name)
    if not arguments:
        return text
    return f"{text}{' ' if text.endswith(('.', '!', '?')) else '. '}Arguments: {arguments}."


def doc_text(entry: ToolEntry, name: str, arguments: str = "") -> str:
    """What a tool's documentation entry embeds: :func:`documentation_text` of its name, description and arguments."""
    return documentation_text(name, entry.description, arguments)
