"""Tool catalogs: the tools an agent can call, with their documentation.

Four real-world shapes are accepted per tool:

* plain: ``{"name", "description", "parameters"?, "aliases"?, "examples"?}``
* OpenAI function tool: ``{"type": "function", "function": {"name", "description", "parameters"}}``
* MCP ``tools/list`` entry: ``{"name", "description", "inputSchema"}``
* Anthropic Messages API tool: ``{"name", "description", "input_schema"}``

Tool ids are normalised (:func:`normalize_tool_id`). Any spelling that differs
only in case or punctuation (``get-weather``, ``GetWeather``) resolves to a
tool when no other tool claims it. Two catalog *entries* never merge silently:
entries whose names collide (:func:`alias_key`) are an error naming both
(:class:`ToolCollision`), unless an alias table declares one an alias of the
other (an entry's ``aliases`` list, or the ``aliases`` mapping of
:func:`make_catalog`: alias name -> tool name). Every alias of the table
resolves to its tool, so records may name a tool by it; an alias naming no
tool, or already another tool's name, is an error (:class:`AliasError`).

A tool may carry example requests (public text, e.g. written by an LLM from
the catalog, :mod:`synapse_flwr.core.examples`): an entry's ``examples``
list, or ``examples.json`` beside the catalog (tool name -> list of
requests), which :func:`load_catalog` reads like ``aliases.json``.
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from synapse_flwr.core.errors import InputError, log_once, warn_once
from synapse_flwr.core.files import (
    NonstandardJson,
    json_kind,
    loads_records,
    read_problem,
    read_records,
)
from synapse_flwr.core.sanitize import without_controls
from synapse_flwr.core.schema import MAX_DESCRIPTION, MAX_TEXT, MAX_TOOL_ID, MAX_TOOLS

log = logging.getLogger(__name__)

ALIASES_FILE = "aliases.json"
EXAMPLES_FILE = "examples.json"
#: Example requests kept per tool.
MAX_EXAMPLES = 16
#: Longest tool name a catalog or a record may give (records must be able to name every catalog tool).
MAX_NAME = 256
_ID_JUNK = re.compile(r"[^a-z0-9_.\-]+")
#: Keys of a catalog entry in any accepted shape: an object with none of them is not a tool.
_TOOL_KEYS = frozenset({"name", "description", "function", "type", "inputSchema", "input_schema", "parameters"})
#: Keys :func:`parse_tool` reads of a tool (a plain or MCP entry, or an OpenAI tool's ``function``).
_READ_KEYS = frozenset({"name", "description", "parameters", "inputSchema", "input_schema", "aliases", "examples"})
#: Keys of a parameters' schema, in the order one is read: MCP's, Anthropic's, then a plain entry's.
_SCHEMA_KEYS = ("inputSchema", "input_schema", "parameters")
#: An alias without letters or digits would resolve every name without them ("?", "-") to its tool.
_NAMELESS_ALIAS = ("{alias!r} has no letters or digits, so any record's tool without them ('?', '-') would "
                   "resolve to it; remove it")


def _ascii_name(name: str) -> str:
    """``name`` lower-cased in ASCII: accents dropped, other letters and digits as ``u<hex>``.

    Ids are ASCII (the schema's pattern), but a name in another script must keep
    its identity: "天气" and "酒店" stay two tools instead of collapsing to nothing.
    """
    folded = "".join(c for c in unicodedata.normalize("NFKD", name.lower()) if not unicodedata.combining(c))
    return "".join(c if c.isascii() or not c.isalnum() else f"u{ord(c):x}" for c in folded)


def _uncut_id(name: str) -> str:
    """A tool name normalised as :func:`normalize_tool_id` does, before the cut to :data:`MAX_TOOL_ID`."""
    return _ID_JUNK.sub("_", _ascii_name(name.strip())).strip("_.-")


def normalize_tool_id(name: str) -> str:
    """Normalise a tool name into a schema-valid id (lower case, ``[a-z0-9_.-]``, at most ``MAX_TOOL_ID``)."""
    tool_id = _uncut_id(name)
    if not tool_id:
        raise ValueError(f"tool name {name!r} has no letters or digits")
    return tool_id[:MAX_TOOL_ID]


def alias_key(name: str) -> str:
    """The key under which spellings of one tool name collapse."""
    return re.sub(r"[^a-z0-9]", "", _ascii_name(name))


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
    examples : tuple of str
        Example requests this tool handles (public text, part of its documentation).
    """

    tool_id: str
    name: str
    description: str
    parameters: Mapping[str, Any] | None = None
    aliases: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()


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


def size_problem(catalog: Catalog) -> str | None:
    """Why no compendium can carry this catalog (more tools than the schema's :data:`MAX_TOOLS`), or None.

    Checked before any work: a private artifact carries every catalog tool,
    so such a catalog would otherwise fail at its first build.
    """
    if len(catalog) <= MAX_TOOLS:
        return None
    return (f"the catalog holds {len(catalog):,} tools, a compendium at most {MAX_TOOLS:,}: split it into catalogs "
            f"of at most {MAX_TOOLS:,} tools (one federation each)")


def _body(obj: Mapping[str, Any]) -> tuple[Mapping[str, Any], str, str]:
    """A catalog entry's tool object, the prefix its fields are named by, and its parameters' key.

    An OpenAI function tool wraps the tool in ``function``; the other shapes are the tool itself.
    """
    if obj.get("type") == "function" and isinstance(obj.get("function"), Mapping):
        return obj["function"], "function.", "parameters"
    return obj, "", next((k for k in _SCHEMA_KEYS if k in obj), "parameters")


def parse_tool(obj: Mapping[str, Any]) -> ToolDoc:
    """Parse one catalog entry in any accepted shape.

    Raises
    ------
    ValueError
        With the dotted name of the offending field.
    """
    body, prefix, params_key = _body(obj)
    name = body.get("name")
    if not _TOOL_KEYS & obj.keys():  # e.g. a {tool name: description} table where entries were expected
        keys = ", ".join(map(repr, list(obj)[:3])) + (", ..." if len(obj) > 3 else "")
        result = obj.get("result")
        # a whole JSON-RPC response to tools/list, saved as it came: its "result" is the catalog
        hint = ('; a JSON-RPC response: save its "result", the {"tools": [...]} object'
                if isinstance(result, Mapping) and "tools" in result else "")
        raise ValueError(f": expected a tool object {{\"name\", \"description\"}} (a catalog is a JSON list "
                         f"of them, or {{\"tools\": [...]}}), found an object with keys {keys}{hint}")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{prefix}name: missing or not a non-empty string")
    if len(name.strip()) > MAX_NAME:
        raise ValueError(f"{prefix}name: {len(name.strip())} characters, at most {MAX_NAME} (shorten it; records "
                         "name tools by it)")
    description = body.get("description")
    if description is None:  # absent or null: MCP and OpenAI entries may leave it out
        description = ""
    if not isinstance(description, str):
        raise ValueError(f"{prefix}description: not a string")
    params = body.get(params_key)
    if params is not None and not isinstance(params, Mapping):
        raise ValueError(f"{prefix}{params_key}: not a JSON object")
    aliases = body.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ValueError(f"{prefix}aliases: not a list of strings")
    if (bad := next((a for a in aliases if not alias_key(a)), None)) is not None:
        raise ValueError(f"{prefix}aliases: {_NAMELESS_ALIAS.format(alias=bad)}")
    examples = body.get("examples", [])
    if not isinstance(examples, list) or not all(isinstance(a, str) for a in examples):
        raise ValueError(f"{prefix}examples: not a list of strings")
    try:
        tool_id = normalize_tool_id(name)
    except ValueError as exc:
        raise ValueError(f"{prefix}name: {exc}") from None
    return ToolDoc(
        tool_id=tool_id,
        name=written_name(name),
        description=fold_text(description)[:MAX_DESCRIPTION],
        parameters=params,
        aliases=tuple(map(written_name, aliases)),
        examples=clean_texts(examples),
    )


def written_name(name: str) -> str:
    """A tool name or alias as the catalog keeps it: stripped, Unicode-composed (NFC).

    Two entries whose names differ only in their Unicode form ("Café" composed, and decomposed as macOS writes
    it) print alike: they were named a collision no one could read, and declaring one the other's alias only
    worked typed byte for byte.
    """
    return unicodedata.normalize("NFC", name.strip())


#: The note :func:`entry_notes` gives an entry whose description :func:`parse_tool` cut to ``MAX_DESCRIPTION``.
DESCRIPTION_CUT = "description cut"


def entry_notes(obj: Mapping[str, Any]) -> list[str]:
    """What a reader of a catalog entry says of it beside the tool.

    Parameters
    ----------
    obj : mapping
        The entry as read from JSON.

    Returns
    -------
    list of str
        Its keys that :func:`parse_tool` does not read (an OpenAI tool's as
        ``function.<key>``), and :data:`DESCRIPTION_CUT` for a description
        longer than a compendium carries (``MAX_DESCRIPTION`` characters).
    """
    body, prefix, _ = _body(obj)
    unread = [k for k in obj if k not in ("type", "function")] if prefix else []
    unread += [f"{prefix}{k}" for k in body if k not in _READ_KEYS]
    description = body.get("description")
    return unread + [DESCRIPTION_CUT] * (isinstance(description, str)
                                         and len(fold_text(description)) > MAX_DESCRIPTION)


def fold_text(text: str) -> str:
    """Catalog text on one line: every whitespace run, and every control character, one space; ends trimmed.

    An organisation's artifact carries this text (descriptions, example
    requests), and the edge refuses a control character in an org artifact.
    """
    return " ".join(without_controls(text).split())


def clean_texts(texts: Iterable[str]) -> tuple[str, ...]:
    """Example requests as a tool keeps them: folded (:func:`fold_text`), blanks dropped, clipped, at most 16."""
    folded = (fold_text(t)[:MAX_TEXT] for t in texts)
    return tuple(dict.fromkeys(t for t in folded if t))[:MAX_EXAMPLES]


class ToolCollision(ValueError):
    """Two distinct catalog entries whose names normalise alike.

    Parameters
    ----------
    first, second : ToolDoc
        The colliding entries, in catalog order.
    """

    def __init__(self, first: ToolDoc, second: ToolDoc) -> None:
        self.first, self.second = first, second
        if first.name == second.name:
            other = "" if first == second else " with another description, arguments or examples"
            super().__init__(f"duplicate tool {first.name!r}{other}: remove one of the two entries")
            return
        if alias_key(_uncut_id(first.name)) != alias_key(_uncut_id(second.name)):  # alike only once cut
            super().__init__(f"tools {first.name!r} and {second.name!r} give the same id {first.tool_id!r} once "
                             f"cut to {MAX_TOOL_ID} characters; shorten one so that their first {MAX_TOOL_ID} "
                             "differ")
            return
        super().__init__(
            f"tools {first.name!r} and {second.name!r} differ only in case or punctuation (an agent or a log "
            "may spell either for the other); rename one, or "
            f"declare {second.name!r} an alias of {first.name!r} (aliases.json: "
            f'{{"{second.name}": "{first.name}"}})'
        )


class AliasCollision(ToolCollision):
    """A catalog entry whose own ``aliases`` list names another tool, or an alias two entries both list.

    Parameters
    ----------
    first, second : ToolDoc
        The tool whose name (or alias) it is, and the entry listing the alias (where the fix goes).
    alias : str
        The alias as written.
    """

    def __init__(self, first: ToolDoc, second: ToolDoc, alias: str) -> None:
        self.first, self.second = first, second
        what = "the name" if alias_key(alias) in {alias_key(first.tool_id), alias_key(first.name)} else "an alias"
        ValueError.__init__(self, f"{second.name!r} lists the alias {alias!r}, which is already {what} of the tool "
                                  f"{first.name!r} (records naming it would route to one of them silently); "
                                  "remove that alias, or merge the two entries into one")


def _entry_alias_collision(tools: Sequence[ToolDoc]) -> AliasCollision | None:
    """The first entry alias that is another tool's id, name or alias, or None."""
    owner = {alias_key(n): d for d in tools for n in (d.tool_id, d.name)}
    for doc in tools:
        for alias in doc.aliases:
            other = owner.setdefault(alias_key(alias), doc)
            if other.tool_id != doc.tool_id:
                return AliasCollision(other, doc, alias)
    return None


class AliasError(InputError):
    """Aliases of the alias table that name no catalog tool, or that are already another tool's name.

    Parameters
    ----------
    path : str or Path
        The alias table's file.
    problems : sequence of str
        One line per bad alias, every one of the table (the message says the first and counts the rest).
    """

    def __init__(self, path: str | Path, problems: Sequence[str]) -> None:
        more = f" (and {len(problems) - 1} more in the table)" if len(problems) > 1 else ""
        super().__init__(path, problems[0] + more)
        self.problems = tuple(problems)


def _with_table_aliases(tools: Iterable[ToolDoc], aliases: Mapping[str, str], source: str | Path) -> list[ToolDoc]:
    """The tools with every alias of the table added to the tool it names, so records may use it.

    Raises
    ------
    AliasError
        For an alias whose tool is not in the catalog, or whose name already resolves to another tool.
    """
    base = Catalog(tuple(tools))
    by_id = {d.tool_id: d for d in base.tools}
    added: dict[str, str] = {}  # alias key -> tool id, for the table's aliases seen so far
    problems = []  # every bad alias at once: one at a time, a converter's table took a run each
    for alias, name in aliases.items():
        if not alias_key(alias):
            problems.append(f"alias {alias!r} -> {name!r}: {_NAMELESS_ALIAS.format(alias=alias)}")
            continue
        target = base.resolve(name) or added.get(alias_key(name))
        if target is None:
            problems.append(f"alias {alias!r} -> {name!r}: no tool {name!r} in the catalog")
            continue
        taken = base.resolve(alias) or added.setdefault(alias_key(alias), target)
        if taken != target:
            problems.append(f"alias {alias!r} -> {name!r}: {alias!r} is already a name of the tool {taken!r}; "
                            "remove the alias or point it at that tool")
            continue
        doc = by_id[target]
        if alias_key(alias) not in {alias_key(n) for n in (target, doc.name, *doc.aliases)}:
            by_id[target] = replace(doc, aliases=(*doc.aliases, alias))
    if problems:
        raise AliasError(source, problems)
    return list(by_id.values())


def _declared(docs: Sequence[ToolDoc], aliases: Mapping[str, str]) -> set[tuple[str, str]]:
    """Pairs of names, as written, that the alias table (or an entry's ``aliases``) declares one tool.

    Exact names, not their alias keys: every spelling of a name shares its
    key, so a table naming ``Search.Web`` would otherwise declare an entry
    ``SEARCH-WEB`` nobody wrote down, and merge its text away.
    """
    pairs = {(written_name(a), written_name(t)) for a, t in aliases.items()}
    pairs |= {(a, d.name) for d in docs for a in d.aliases}
    return pairs | {(t, a) for a, t in pairs}


def without_repeats(docs: Iterable[ToolDoc], source: str | Path) -> list[ToolDoc]:
    """The entries less those that repeat an earlier one word for word (name, description, arguments,
    examples), with one warning naming ``source`` and counting them.

    Catalogs concatenated from several sources list a tool twice; only a
    repeat that differs is ambiguous (:class:`ToolCollision` in :func:`make_catalog`).
    """
    kept, by_name, repeated = [], dict[str, list[ToolDoc]](), Counter[str]()
    for doc in docs:
        if doc in by_name.get(doc.name, ()):
            repeated[doc.name] += 1
            continue
        by_name.setdefault(doc.name, []).append(doc)  # another content under a name: make_catalog names both
        kept.append(doc)
    if repeated:
        names = ", ".join(f"{n!r}" for n in list(repeated)[:5]) + (", ..." if len(repeated) > 5 else "")
        warn_once(log, f"{source}: {repeated.total()} entries repeat an earlier entry word for word (name, "
                       f"description, arguments, examples); each tool is read once: {names}")
    return kept


def make_catalog(
    docs: Iterable[ToolDoc], aliases: Mapping[str, str] | None = None, source: str | Path = ALIASES_FILE
) -> Catalog:
    """Build a catalog; entries whose names collide merge only when declared aliases.

    A declared alias collapses into the first entry (its id, name and
    description; a missing description is filled from the alias entry).
    Every alias of the table then resolves to its tool, so records may name
    the tool by it.

    Parameters
    ----------
    docs : iterable of ToolDoc
        Catalog entries in order.
    aliases : mapping of str to str or None
        Alias table: alias name -> the tool name it is another spelling of.
    source : str or Path
        The alias table's file, named by an :class:`AliasError`.

    Raises
    ------
    ToolCollision
        Naming both entries of an undeclared collision.
    AliasError
        For an alias naming no catalog tool, or already another tool's name.
    AliasCollision
        For an entry's own alias that is another tool's name or alias (a :class:`ToolCollision`).
    """
    docs = list(docs)
    declared = _declared(docs, aliases or {})
    by_key: dict[str, ToolDoc] = {}
    for doc in docs:
        key = alias_key(doc.tool_id)
        first = by_key.get(key)
        if first is None:
            by_key[key] = doc
            continue
        # one name given two contents is ambiguous whatever the alias table says of its spellings
        if doc.name == first.name or not any((doc.name, n) in declared for n in (first.name, *first.aliases)):
            raise ToolCollision(first, doc)
        log.debug("catalog: %r is a declared alias of %r", doc.name, first.tool_id)
        by_key[key] = ToolDoc(
            tool_id=first.tool_id,
            name=first.name,
            description=first.description or doc.description,
            parameters=first.parameters or doc.parameters,
            aliases=tuple(sorted({*first.aliases, doc.name, *doc.aliases} - {first.name})),
            examples=clean_texts([*first.examples, *doc.examples]),
        )
    if collision := _entry_alias_collision(list(by_key.values())):
        raise collision
    tools = _with_table_aliases(by_key.values(), aliases or {}, source)
    return Catalog(tuple(sorted(tools, key=lambda d: d.tool_id)))


def read_aliases(folder: Path) -> dict[str, str]:
    """The alias table ``aliases.json`` of a folder (alias name -> tool name), or an empty one.

    Raises
    ------
    InputError
        If ``aliases.json`` is not a JSON object of strings.
    """
    return _read_table(Path(folder) / ALIASES_FILE, lambda v: isinstance(v, str),
                       'expected a JSON object of alias name -> tool name: {"GetWeather": "get_weather"}')


def _read_table(path: Path, valid: Callable[[Any], bool], expected: str) -> dict:
    """A JSON object whose every value is ``valid``, or an empty one when the file is absent."""
    if not path.exists():
        return {}
    try:
        table = loads_records(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, read_problem(exc)) from None
    except (json.JSONDecodeError, NonstandardJson) as exc:
        raise InputError(path, f"invalid JSON: {exc}") from None
    if not isinstance(table, dict):
        raise InputError(path, f"{expected}; found {json_kind(table)}")
    if bad := [k for k, v in table.items() if not valid(v)]:
        raise InputError(path, f"{expected}; found {json_kind(table[bad[0]])} for {bad[0]!r}")
    return table


def read_examples(path: Path) -> dict[str, list[str]]:
    """An example-request table (``examples.json``: tool name -> requests), or an empty one when absent.

    Raises
    ------
    InputError
        If the file is not a JSON object of string lists.
    """
    return _read_table(path, lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
                       'expected a JSON object of tool name -> list of requests: {"get_weather": ["..."]}')


def with_examples(catalog: Catalog, table: Mapping[str, Sequence[str]], source: str | Path = EXAMPLES_FILE) -> Catalog:
    """The catalog with example requests added from ``table`` (tool name or id -> requests).

    Raises
    ------
    InputError
        Naming every tool the catalog does not have (``source`` is the file named).
    """
    extra: dict[str, list[str]] = {}
    unknown = [name for name in table if catalog.resolve(name) is None]
    if unknown:  # all of them at once: one at a time, a converter's dropped tools took a run each
        shown = ", ".join(map(repr, unknown[:10])) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        names = "a name that is" if len(unknown) == 1 else f"{len(unknown)} names that are"
        raise InputError(source, f"examples for {names} no tool of the catalog: {shown} "
                                 "(remove them, or add the tools to the catalog)")
    for name, texts in table.items():
        extra.setdefault(catalog.resolve(name), []).extend(texts)
    if not extra:
        return catalog
    return Catalog(tuple(replace(d, examples=clean_texts([*d.examples, *extra.get(d.tool_id, [])]))
                         for d in catalog.tools))


def with_examples_file(catalog: Catalog, path: Path) -> Catalog:
    """The catalog with the example requests of the table at ``path`` (:func:`read_examples`), if there is one.

    Raises
    ------
    InputError
        For a malformed table, or one naming a tool the catalog does not have.
    """
    return with_examples(catalog, read_examples(path), path)


def load_catalog(path: str | Path, aliases: Mapping[str, str] | None = None, examples: bool = True) -> Catalog:
    """Load a catalog from a JSON list or JSONL file.

    Parameters
    ----------
    path : str or Path
        The catalog file.
    aliases : mapping of str to str or None
        Alias table (see :func:`make_catalog`); None reads ``aliases.json``
        beside the catalog, if there is one. ``examples.json`` beside it
        adds example requests (:func:`with_examples`).
    examples : bool
        False: ``examples.json`` is not read (``synapse examples`` rewrites
        it, so a broken one must not stop it).

    Raises
    ------
    InputError
        Naming the file, entry and field of the first malformed entry, or
        both entries of a tool-id collision (:class:`AliasError` for a bad alias).
    """
    source = Path(path).parent / ALIASES_FILE if aliases is None else "aliases"
    if aliases is None:
        aliases = read_aliases(Path(path).parent)
    docs, lines, unread = [], {}, Counter[str]()
    for line, obj in read_records(path, catalog=True):
        try:
            docs.append(parse_tool(obj))
        except ValueError as exc:
            field_name, _, message = str(exc).partition(": ")
            raise InputError(path, message, line=line, field=field_name) from None
        lines[id(docs[-1])] = line
        unread.update(entry_notes(obj))
    if not docs:
        raise InputError(path, "catalog holds no tools")
    try:
        catalog = make_catalog(without_repeats(docs, path), aliases, source)
    except ToolCollision as exc:
        where = f"entries at lines {lines[id(exc.first)]} and {lines[id(exc.second)]}"
        raise InputError(path, f"{where}: {exc}", field="name") from None
    if examples:
        catalog = with_examples_file(catalog, Path(path).parent / EXAMPLES_FILE)
        warn_undocumented(catalog, path, unread)
    return catalog


def warn_undocumented(catalog: Catalog, source: str | Path, unread: Mapping[str, int] | None = None) -> None:
    """Warn once about tools with neither a description nor example requests; name the entries' unread fields.

    Such tools are routed on their names alone, which a user may not have
    meant: a converter that wrote the description under another key
    (``desc``, ``api_description``) is told which keys were not read. With
    every tool documented, the unread fields (an MCP entry's ``title``,
    ``annotations``) are only noted.

    Parameters
    ----------
    catalog : Catalog
        The catalog as read.
    source : str or Path
        Where it was read from, for the message.
    unread : mapping of str to int or None
        Keys of its entries that were not read, with the number of entries holding each, and the descriptions
        cut (:func:`entry_notes`).
    """
    unread = dict(unread or {})
    if cut := unread.pop(DESCRIPTION_CUT, 0):
        warn_once(log, f"{source}: {cut} descriptions are longer than {MAX_DESCRIPTION:,} characters, what a "
                       "compendium carries, and are cut to that length (MiniLM reads about the first 1,000): a "
                       "converter should put what tells a tool apart first")
    bare = [d.name for d in catalog.tools if not d.description and not d.examples]
    fields = ", ".join(f"{k!r} ({n} {'entry' if n == 1 else 'entries'})" for k, n in sorted(unread.items()))
    if bare:
        shown = ", ".join(repr(n) for n in bare[:3]) + (", ..." if len(bare) > 3 else "")
        not_read = f"; fields of the entries not read: {fields} (docs/formats.md)" if fields else ""
        warn_once(log, f"{source}: {len(bare)} of {len(catalog)} tools have neither a description nor example "
                       f"requests ({shown}): they are routed on their names alone{not_read}")
    elif fields:
        log_once(log, f"{source}: fields of the catalog's entries not read (docs/formats.md): {fields}", logging.INFO)
