"""Tool catalogs: the tools an agent can call, with their documentation.

Three real-world shapes are accepted per tool:

* plain: ``{"name", "description", "parameters"?, "aliases"?}``
* OpenAI function tool: ``{"type": "function", "function": {"name", "description", "parameters"}}``
* MCP ``tools/list`` entry: ``{"name", "description", "inputSchema"}``

Tool ids are normalised (:func:`normalize_tool_id`) and names that differ only in
case or punctuation (``GetWeather``, ``get-weather``, ``get_weather``) collapse
to one tool.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synapse_flwr.core.errors import InputError
from synapse_flwr.core.files import read_records
from synapse_flwr.core.schema import MAX_DESCRIPTION

log = logging.getLogger(__name__)

_ID_JUNK = re.compile(r"[^a-z0-9_.\-]+")


def normalize_tool_id(name: str) -> str:
    """Normalise a tool name into a schema-valid id (lower case, ``[a-z0-9_.-]``)."""
    tool_id = _ID_JUNK.sub("_", name.strip().lower()).strip("_.-")
    if not tool_id:
        raise ValueError(f"tool name {name!r} has no letters or digits")
    return tool_id[:128]


def alias_key(name: str) -> str:
    """The key under which spellings of one tool name collapse."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


@dataclass(frozen=True)
class ToolDoc:
    """One tool of a catalog.

    Parameters
    ----------
    tool_id : str
        Normalised id.
    name : str
        The name as the catalog spells it.
    description : str
        Documentation, as given (truncated to the schema's limit).
    parameters : dict or None
        JSON Schema of the arguments, if given.
    aliases : tuple of str
        Other names that resolve to this tool.
    """

    tool_id: str
    name: str
    description: str
    parameters: Mapping[str, Any] | None = None
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Catalog:
    """An ordered, alias-aware set of tools.

    Parameters
    ----------
    tools : tuple of ToolDoc
        The tools, sorted by id, ids unique.
    """

    tools: tuple[ToolDoc, ...]
    _index: dict[str, str] = field(init=False, repr=False, compare=False)
    _by_id: dict[str, ToolDoc] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: dict[str, str] = {}
        for doc in self.tools:
            for name in (doc.tool_id, doc.name, *doc.aliases):
                index.setdefault(alias_key(name), doc.tool_id)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_by_id", {doc.tool_id: doc for doc in self.tools})

    def __len__(self) -> int:
        return len(self.tools)

    @property
    def ids(self) -> list[str]:
        """Tool ids in catalog order."""
        return [doc.tool_id for doc in self.tools]

    def resolve(self, name: str) -> str | None:
        """Map any spelling or alias of a tool name to its id, or None."""
        return self._index.get(alias_key(name))

    def get(self, tool_id: str) -> ToolDoc | None:
        """The tool with this id (or alias), or None."""
        resolved = self.resolve(tool_id)
        return self._by_id.get(resolved) if resolved else None

    def descriptions(self) -> dict[str, str]:
        """Tool id to description."""
        return {doc.tool_id: doc.description for doc in self.tools}


def parse_tool(obj: Mapping[str, Any]) -> ToolDoc:
    """Parse one catalog entry in any accepted shape.

    Raises
    ------
    ValueError
        With the dotted name of the offending field.
    """
    if obj.get("type") == "function" and isinstance(obj.get("function"), Mapping):
        body, prefix, params_key = obj["function"], "function.", "parameters"
    else:
        body, prefix = obj, ""
        params_key = "inputSchema" if "inputSchema" in obj else "parameters"
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{prefix}name: missing or not a non-empty string")
    description = body.get("description", "")
    if not isinstance(description, str):
        raise ValueError(f"{prefix}description: not a string")
    params = body.get(params_key)
    if params is not None and not isinstance(params, Mapping):
        raise ValueError(f"{prefix}{params_key}: not a JSON object")
    aliases = body.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ValueError(f"{prefix}aliases: not a list of strings")
    try:
        tool_id = normalize_tool_id(name)
    except ValueError as exc:
        raise ValueError(f"{prefix}name: {exc}") from None
    return ToolDoc(
        tool_id=tool_id,
        name=name.strip(),
        description=" ".join(description.split())[:MAX_DESCRIPTION],
        parameters=params,
        aliases=tuple(aliases),
    )


def make_catalog(docs: Iterable[ToolDoc]) -> Catalog:
    """Build a catalog, collapsing tools whose names are aliases of each other.

    The first spelling wins the id; later ones become aliases, and a missing
    description is filled from a later duplicate.
    """
    by_key: dict[str, ToolDoc] = {}
    for doc in docs:
        key = alias_key(doc.tool_id)
        first = by_key.get(key)
        if first is None:
            by_key[key] = doc
            continue
        log.info("catalog: %r collapses into %r", doc.name, first.tool_id)
        by_key[key] = ToolDoc(
            tool_id=first.tool_id,
            name=first.name,
            description=first.description or doc.description,
            parameters=first.parameters or doc.parameters,
            aliases=tuple(sorted({*first.aliases, doc.name, *doc.aliases} - {first.name})),
        )
    return Catalog(tuple(sorted(by_key.values(), key=lambda d: d.tool_id)))


def load_catalog(path: str | Path) -> Catalog:
    """Load a catalog from a JSON list or JSONL file.

    Raises
    ------
    InputError
        Naming the file, entry and field of the first malformed entry.
    """
    docs = []
    for line, obj in read_records(path):
        try:
            docs.append(parse_tool(obj))
        except ValueError as exc:
            field_name, _, message = str(exc).partition(": ")
            raise InputError(path, message, line=line, field=field_name) from None
    if not docs:
        raise InputError(path, "catalog holds no tools")
    return make_catalog(docs)
