"""Experience logs (routing events) and test sets.

An experience log is JSONL, one routing event a line::

    {"query": "...", "tool": "get_weather", "success": true,
     "gold": "get_weather", "org": "acme", "ts": "2026-01-02T10:00:00Z",
     "prev_tool": "geocode"}

``gold`` (the right tool, when known), ``org``, ``ts`` and ``prev_tool`` are
optional. A labelled dataset is just events with ``success: true``.

A test set is JSONL with ``query`` and ``gold`` (one tool id or a list of
acceptable ids).

Fields outside these are ignored, a query that is a chat transcript is read
as its last user message, a query longer than :data:`MAX_QUERY` characters is
cut to it, and a record whose query holds no letter or digit is skipped (each
named once per file in the log).
"""

from __future__ import annotations

import json
import logging
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from synapse_flwr.core.catalog import MAX_NAME, Catalog, normalize_tool_id
from synapse_flwr.core.errors import InputError, warn_once
from synapse_flwr.core.files import read_records
from synapse_flwr.core.phrases import is_text

RecordT = TypeVar("RecordT", bound=BaseModel)

MAX_QUERY = 4000


def _has_word(query: str) -> str:
    # "???" or "..." embeds to noise that routes somewhere: a converter's placeholder, not a request
    if not is_text(query):
        raise PydanticCustomError("no_word", "a request without a letter or digit (nothing to route on)")
    return query


Query = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_QUERY),
                  AfterValidator(_has_word)]
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_NAME)]

log = logging.getLogger(__name__)


class Event(BaseModel):
    """One routing event.

    Parameters
    ----------
    query : str
        The user request the agent routed.
    tool : str
        The tool that was called.
    success : bool
        Whether the call served the request.
    gold : str or None
        The right tool, when known.
    org : str or None
        The organisation that logged it.
    ts : str, float or None
        Timestamp.
    prev_tool : str or None
        The tool called just before, for multi-step agents.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    query: Query
    tool: Name
    success: bool
    gold: Name | None = None
    org: Name | None = None
    ts: str | float | int | None = None
    prev_tool: Name | None = None


def event_label(event: Event, catalog: Catalog | None = None) -> str | None:
    """The tool an event teaches: its gold tool, else the tool of a successful call.

    A failed call without gold says which tool is wrong, not which is right,
    so it has no label.

    Parameters
    ----------
    event : Event
        A routing event.
    catalog : Catalog or None
        When given, the label is resolved through it (aliases collapse).

    Returns
    -------
    str or None
        The label (a catalog tool id when ``catalog`` is given), or None for a
        failed call without gold, or a label the catalog does not know.
    """
    name = event.gold or (event.tool if event.success else None)
    if catalog is None or not name:
        return name
    return catalog.resolve(name)


class TestItem(BaseModel):
    """One evaluation query with its acceptable answers.

    Parameters
    ----------
    query : str
        The request.
    gold : tuple of str
        Acceptable tool ids (normalised).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    query: Query
    gold: tuple[Name, ...] = Field(min_length=1)


#: The note :func:`known_fields` gives a record whose query it cut.
QUERY_CUT = "query cut"
#: The note :func:`known_fields` gives a record whose query holds no letter or digit; readers skip the record.
NO_WORDS = "query without words"
#: The note :func:`known_fields` gives a record whose query was a chat transcript (:func:`transcript_request`).
TRANSCRIPT = "query a chat transcript"
#: The roles a chat transcript's user messages carry (OpenAI and Anthropic "user", ShareGPT "human").
USER_ROLES = ("user", "human")
#: A message's role and content keys: OpenAI / Anthropic, and ShareGPT's (ToolACE and other chat datasets).
MESSAGE_KEYS = (("role", "content"), ("from", "value"))


def _message_text(content: object) -> str:
    """A chat message's text: a string, or the text parts of a list of content parts (OpenAI, Anthropic)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def transcript_request(query: object) -> str | None:
    """The last user message of a query that is a chat transcript, else None.

    A converter of a chat benchmark may write the conversation where the
    request belongs: a list of ``{"role", "content"}`` (or ShareGPT's
    ``{"from", "value"}``) messages, or an object holding it under
    ``messages`` or ``conversations``, as JSON or as its JSON text. Embedded as
    it stands, the system prompt and the JSON syntax lead the text and the
    request is read last or not at all (a folder's docs_only fell 0.808 ->
    0.667 with its test queries written so); the last user message is what
    the agent routes now.

    Parameters
    ----------
    query : object
        A record's ``query`` as read from JSON.

    Returns
    -------
    str or None
        The last non-empty user message, or None when ``query`` is no
        transcript (or holds no user message).
    """
    if isinstance(query, str):
        text = query.strip()
        if not text.startswith(("[", "{")):
            return None
        try:
            query = json.loads(text)
        except ValueError:
            return None
    if isinstance(query, dict):
        query = query.get("messages", query.get("conversations"))
    if not isinstance(query, list) or not query or not all(isinstance(m, dict) for m in query):
        return None
    keys = next(((r, c) for r, c in MESSAGE_KEYS if all(r in m for m in query)), None)
    if keys is None:
        return None
    said = [_message_text(m.get(keys[1])).strip() for m in query if str(m[keys[0]]).lower() in USER_ROLES]
    return next((t for t in reversed(said) if t), None)


def cut_query(query: str) -> str:
    """``query`` as it is read: unchanged, or stripped and cut to its first :data:`MAX_QUERY` characters when
    longer (an embedder reads a few hundred tokens; a served request of megabytes held a router for seconds).

    Parameters
    ----------
    query : str
        A logged, tested or routed request.

    Returns
    -------
    str
        ``query`` itself when it is short enough (so ``is`` tells whether it was cut).
    """
    return query if len(query.strip()) <= MAX_QUERY else query.strip()[:MAX_QUERY]


def known_fields(obj: dict, model: type[BaseModel]) -> tuple[dict, list[str]]:
    """A record as ``model`` (:class:`Event` or :class:`TestItem`) reads it, and what was left out.

    Logs and test sets converted from other benchmarks often carry fields of
    their own (an id, a category), and agent logs may hold requests longer
    than :data:`MAX_QUERY` characters; the fields are ignored, a chat
    transcript is read as its last user message (:func:`transcript_request`)
    and a longer query is cut (an embedder reads its first few hundred tokens
    only) rather than the folder refused. A record whose query holds no letter or
    digit (``""``, ``"???"``, an emoji) has nothing to route on or learn from:
    it is noted :data:`NO_WORDS` and readers skip it rather than refuse a
    whole benchmark for one placeholder. A test item's single ``gold`` id
    becomes a list of one. The notes (``'<field>'`` per ignored field,
    :data:`TRANSCRIPT`, :data:`QUERY_CUT`, :data:`NO_WORDS`) let readers
    name them once per file (:func:`warn_ignored`), so a misspelt field is
    still seen.
    """
    known = model.model_fields
    out = {k: v for k, v in obj.items() if k in known}
    notes = sorted(f"'{k}'" for k in obj if k not in known)
    if (request := transcript_request(out.get("query"))) is not None:
        out["query"] = request
        notes.append(TRANSCRIPT)
    query = out.get("query")
    if isinstance(query, str) and (cut := cut_query(query)) is not query:
        out["query"] = cut
        notes.append(QUERY_CUT)
    if isinstance(out.get("query"), str) and not is_text(out["query"]):  # after the cut: what is read has no word
        notes.append(NO_WORDS)
    if model is TestItem and isinstance(out.get("gold"), str):
        out["gold"] = [out["gold"]]
    return out, notes


def warn_ignored(path: Path, notes: Counter[str]) -> None:
    """Log, once per file and process, what :func:`known_fields` left out of its records (with the records' counts)."""
    fields = ", ".join(f"{k} ({n} records)" for k, n in sorted(notes.items())
                       if k not in (TRANSCRIPT, QUERY_CUT, NO_WORDS))
    if fields:
        warn_once(log, f"{path}: ignored fields outside the format (docs/formats.md): {fields}")
    if notes[TRANSCRIPT]:
        warn_once(log, f"{path}: {notes[TRANSCRIPT]} queries are chat transcripts (a list of role/content messages): "
                       "each is read as its last user message; a converter should write the request alone")
    if notes[QUERY_CUT]:
        warn_once(log, f"{path}: {notes[QUERY_CUT]} queries longer than {MAX_QUERY} characters cut to that length")
    if notes[NO_WORDS]:
        warn_once(log, f"{path}: {notes[NO_WORDS]} records skipped: a query without a letter or digit "
                       "(nothing to route on or learn from)")


#: What a record lacking a required field should give there (a converter that leaves out ``success`` wrote
#: labelled examples, which the format states as successful calls).
MISSING_HINTS = {
    "query": "the user request, a string",
    "tool": "the id of the tool that was called",
    "success": 'whether the call served the request, true or false; a labelled example is "success": true',
    "gold": "the right tool's id, or a list of acceptable ids",
}


#: pydantic's messages that name a Python type the formats do not have (a test item's ``gold`` is a tuple to
#: pydantic, a JSON string or list to the user), in the format's words.
UNION_MEMBERS = {"str": "a string", "float": "a number", "int": "a number"}  # pydantic's names of union members
FORMAT_MESSAGES = {
    "tuple_type": "expected a tool id or a list of tool ids",
    "too_short": "expected at least one tool id",
    # a converter that writes every value as text ("true", "1")
    "bool_type": "expected true or false, written without quotes",
    "string_type": "expected a string",
}


def first_error(exc: ValidationError) -> tuple[str, str]:
    """The field path and message of a record's first validation error, with the value given (cut to 40 characters).

    A missing field is named with what it should hold (:data:`MISSING_HINTS`).
    """
    errors = exc.errors()
    err = errors[0]
    # a union (``ts``: a string or a number) fails once per member, each named by the member's type
    members = [e["loc"][-1] for e in errors if e["loc"][:-1] == err["loc"][:-1] and e["loc"][-1] in UNION_MEMBERS]
    if len(members) > 1:
        kinds = " or ".join(dict.fromkeys(UNION_MEMBERS[m] for m in members))
        return ".".join(str(p) for p in err["loc"][:-1]), f"expected {kinds}, got {repr(err['input'])[:40]}"
    where = ".".join(str(p) for p in err["loc"]) or "(record)"
    if err["type"] == "missing":
        return where, err["msg"] + (f": {hint}" if (hint := MISSING_HINTS.get(where)) else "")
    got = f", got {repr(err['input'])[:40]}" if "input" in err else ""
    return where, FORMAT_MESSAGES.get(err["type"], err["msg"]) + got


def _resolver(catalog: Catalog | None, path: Path, line: int):
    def resolve(name: str, field_name: str) -> str:
        if catalog is None:
            try:
                return normalize_tool_id(name)
            except ValueError as exc:
                raise InputError(path, str(exc), line=line, field=field_name) from None
        tool_id = catalog.resolve(name)
        if tool_id is None:
            raise InputError(path, f"tool {name!r} is not in the catalog", line=line, field=field_name)
        return tool_id

    return resolve


def resolve_event(event: Event, catalog: Catalog | None, path: Path, line: int) -> Event:
    """Normalise the tool names of an event (through the catalog, when given)."""
    resolve = _resolver(catalog, path, line)
    return event.model_copy(
        update={
            "tool": resolve(event.tool, "tool"),
            "gold": resolve(event.gold, "gold") if event.gold else None,
            "prev_tool": resolve(event.prev_tool, "prev_tool") if event.prev_tool else None,
        }
    )


def _read_models(path: Path, model: type[RecordT], warn: bool) -> Iterator[tuple[int, RecordT]]:
    """Every record of ``path`` validated as ``model``, with its line; fields outside the model are named at the end.

    Raises
    ------
    InputError
        Naming file, line and field of the first record that fails.
    """
    ignored = Counter[str]()
    for line, raw in read_records(path):
        obj, extra = known_fields(raw, model)
        ignored.update(extra)
        if NO_WORDS in extra:
            continue
        try:
            record = model.model_validate(obj)
        except ValidationError as exc:
            field_name, message = first_error(exc)
            raise InputError(path, message, line=line, field=field_name) from None
        yield line, record
    if warn:
        warn_ignored(path, ignored)


def load_experience(path: str | Path, catalog: Catalog | None = None, warn: bool = True) -> list[Event]:
    """Load and normalise an experience log.

    Parameters
    ----------
    path : str or Path
        JSONL (or JSON list) of events.
    catalog : Catalog or None
        When given, every tool name must resolve in it (aliases collapse).
    warn : bool
        Name ignored fields, cut queries and skipped records
        (:func:`warn_ignored`); False where a folder check has already named them.

    Raises
    ------
    InputError
        Naming file, line and field of the first bad event.
    """
    path = Path(path)
    return [resolve_event(event, catalog, path, line) for line, event in _read_models(path, Event, warn)]


def load_testset(path: str | Path, catalog: Catalog | None = None, warn: bool = True) -> list[TestItem]:
    """Load a test set (``query`` + ``gold`` id or list of ids).

    Parameters
    ----------
    path : str or Path
        JSONL (or JSON list) of test items.
    catalog : Catalog or None
        When given, every gold name must resolve in it (aliases collapse, a
        name listed twice is kept once).
    warn : bool
        Name ignored fields, cut queries and skipped records
        (:func:`warn_ignored`); False where a folder check has already named them.

    Returns
    -------
    list of TestItem
        The items, in file order, less those whose query holds no letter or digit.
        Items repeating an earlier item's query (compared Unicode-composed,
        case-folded, whitespace collapsed) are merged into it, every gold of
        the query acceptable: a converter writing one line per (query, tool)
        pair would otherwise score the query twice, right at most once (a
        warning counts them).

    Raises
    ------
    InputError
        Naming file, line and field of the first bad item.
    """
    path = Path(path)
    items: dict[str, TestItem] = {}
    repeats = 0
    for line, item in _read_models(path, TestItem, warn):
        resolve = _resolver(catalog, path, line)
        golds = tuple(resolve(g, "gold") for g in item.gold)
        key = " ".join(unicodedata.normalize("NFC", item.query).casefold().split())
        if key in items:
            repeats += 1
            golds = items[key].gold + golds
            item = items[key]
        items[key] = item.model_copy(update={"gold": tuple(dict.fromkeys(golds))})
    if repeats:
        warn_once(log, f"{path}: {repeats} items repeat an earlier item's query; each is merged into it (the "
                       "query is scored once, every gold given for it acceptable)")
    return list(items.values())


def write_jsonl(records: Iterable[BaseModel]) -> str:
    """Serialise models as JSONL text (None fields left out)."""
    return "".join(r.model_dump_json(exclude_none=True) + "\n" for r in records)
