"""Reading record files (JSON list, ``{"tools": [...]}`` or JSONL) and writing outputs atomically."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Self

from synapse_flwr.core.errors import InputError

_UMASK = os.umask(0o022)  # reading the umask sets it: put it back at once
os.umask(_UMASK)


class WriteError(InputError, OSError):
    """An output path that cannot be written: the user's to fix (an :class:`InputError`), and still an OSError."""


def json_kind(value: object) -> str:
    """What a parsed JSON value is, in words ("a JSON object", "a JSON list", "a string", ...), for shape errors.

    Parameters
    ----------
    value : object
        A value :func:`json.loads` returned.

    Returns
    -------
    str
    """
    kinds = ((dict, "a JSON object"), (list, "a JSON list"), (str, "a string"), (bool, "true/false"),
             ((int, float), "a number"))
    return next((word for kind, word in kinds if isinstance(value, kind)), "null")


def read_problem(exc: Exception) -> str:
    """Why a file could not be read, in one line; a file that is not UTF-8 is named with its first bad byte and line.

    Parameters
    ----------
    exc : Exception
        What reading (:func:`read_text`) raised.

    Returns
    -------
    str
    """
    if isinstance(exc, UnicodeDecodeError):
        if exc.object[:2] in (b"\xff\xfe", b"\xfe\xff"):  # Windows tools often save as UTF-16
            return "UTF-16 text (it starts with a UTF-16 byte order mark): save it as UTF-8"
        line = exc.object[: exc.start].count(b"\n") + 1
        return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} on line {line}): save it as UTF-8"
    return f"cannot read file: {exc}"


class ItemLine(int):
    """Where a record of a JSON document starts: its line, remembering its number in the document's list.

    It is the line (compares, sorts and serialises as one) and prints as
    ``"12 (item 3)"``, so every message that names a record's line names its
    item too: a pretty-printed catalog needs the line, a one-line
    ``json.dumps`` list the item.

    Parameters
    ----------
    line : int
        1-based line on which the item's text starts.
    item : int
        1-based position of the item in the list.
    """

    item: int

    def __new__(cls, line: int, item: int) -> Self:
        self = super().__new__(cls, line)
        self.item = item
        return self

    def __getnewargs__(self) -> tuple[int, int]:  # type: ignore[override]  # pickles with its item
        return int(self), self.item

    def __str__(self) -> str:
        return f"{int(self)} (item {self.item})"

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else int(self).__format__(spec)

    def __repr__(self) -> str:
        return f"ItemLine({int(self)}, item={self.item})"


_JSON_SPACE = re.compile(r"[ \t\n\r]*")


class NonstandardJson(ValueError):
    """Text Python's ``json`` reads but the JSON standard refuses: a key given twice, ``NaN`` or ``Infinity``."""


def _unique_members(pairs: list[tuple[str, object]]) -> dict:
    # json.loads keeps the last of a key given twice, unsaid: a converter's slip would pass as a valid record
    found = dict(pairs)
    if len(found) < len(pairs):  # rare: find the key given twice only then
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise NonstandardJson(f"key {key!r} appears twice in one object (keep one)")
            seen.add(key)
    return found


def _no_constant(name: str) -> float:
    # json.loads reads NaN and Infinity, which no JSON writer but Python's emits: a record's field would hold one
    raise NonstandardJson(f"{name} is not a JSON value (write a number or null)")


def _finite(text: str) -> float:
    if math.isfinite(value := float(text)):
        return value
    raise NonstandardJson(f"{text} is too large for a number (it reads as infinity)")


def loads_records(text: str) -> object:
    """:func:`json.loads` for a dataset's files (records, alias and example tables), refusing what JSON refuses.

    Raises
    ------
    NonstandardJson
        For a key given twice (naming it), ``NaN``, ``Infinity``, ``-Infinity`` or a number too large for a float;
        as :func:`json.loads`, ``ValueError`` or ``RecursionError`` for text that is not JSON.
    """
    return json.loads(text, object_pairs_hook=_unique_members, parse_constant=_no_constant, parse_float=_finite)


def _python_reads(text: str) -> bool:
    """Whether Python's lenient ``json`` reads ``text`` as one document (NaN, keys given twice and all)."""
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def _skip(text: str, pos: int) -> int:
    return _JSON_SPACE.match(text, pos).end()  # type: ignore[union-attr]  # matches the empty string


def _item_offsets(text: str, pos: int, decoder: json.JSONDecoder) -> tuple[list[int], int]:
    """The offsets of the items of the JSON list opening at ``pos``, and the offset just past it."""
    offsets, pos = [], _skip(text, pos + 1)
    while text[pos] != "]":
        offsets.append(pos)
        pos = _skip(text, decoder.raw_decode(text, pos)[1])
        if text[pos] == ",":
            pos = _skip(text, pos + 1)
    return offsets, pos + 1


def _record_offsets(text: str) -> list[int]:
    """The offsets of the records of a document already parsed: a list's items, or those of an object's ``"tools"``."""
    decoder, pos = json.JSONDecoder(), len(text) - len(text.lstrip())
    if text[pos] == "[":
        return _item_offsets(text, pos, decoder)[0]
    offsets, pos = [], _skip(text, pos + 1)
    while text[pos] != "}":
        key, pos = decoder.raw_decode(text, pos)
        pos = _skip(text, _skip(text, pos) + 1)  # past the colon
        if key == "tools":  # the last one wins, as in json.loads
            offsets, pos = _item_offsets(text, pos, decoder)
        else:
            pos = decoder.raw_decode(text, pos)[1]
        pos = _skip(text, pos)
        if text[pos] == ",":
            pos = _skip(text, pos + 1)
    return offsets


def _item_lines(text: str) -> list[ItemLine]:
    """Where each record of a parsed JSON document starts (:class:`ItemLine`)."""
    lines, line, last = [], 1, 0
    for item, offset in enumerate(_record_offsets(text), start=1):
        line += text.count("\n", last, offset)
        last = offset
        lines.append(ItemLine(line, item))
    return lines


def document_items(path: str | Path, text: str, catalog: bool = False) -> list[tuple[ItemLine, object]] | None:
    """The items of a file that is one JSON document, each with where it starts, or None for JSONL.

    One document is a JSON list, or, in a catalog, an object whose
    ``"tools"`` is a list (an MCP ``tools/list`` result, a ``{"tools": [...]}``
    export). Any other object spanning several lines is an error naming the
    shapes read. A log or test set of one record on one line is JSONL, even
    when the record has a ``tools`` field (converted benchmarks list each
    request's candidate tools there: its one record was read as a catalog).

    Raises
    ------
    InputError
        If a JSON list does not parse, or the file is one object of another shape.
    """
    stripped = text.strip()
    if not stripped.startswith(("[", "{")):
        return None
    try:
        doc = loads_records(stripped)
    except (json.JSONDecodeError, NonstandardJson) as exc:
        # several objects (JSONL), or an object read again on its own line; but a pretty-printed document that
        # only JSON's own rules refuse (NaN, a key twice) is said so, not parsed again line by line
        if stripped.startswith("{") and not (isinstance(exc, NonstandardJson) and "\n" in stripped
                                             and _python_reads(stripped)):
            return None
        raise InputError(path, f"invalid JSON: {getattr(exc, 'msg', exc)}", line=getattr(exc, "lineno", None)) from None
    except (ValueError, RecursionError) as exc:  # huge number, nesting too deep
        raise InputError(path, f"invalid JSON: {exc}") from None
    if isinstance(doc, list):
        return list(zip(_item_lines(text), doc, strict=True))
    if catalog and isinstance(doc, dict) and "tools" in doc:
        if not isinstance(doc["tools"], list):
            raise InputError(path, f'"tools" is {json_kind(doc["tools"])}: expected a JSON list of objects '
                                   '({"tools": [...]})')
        return list(zip(_item_lines(text), doc["tools"], strict=True))
    if "\n" in stripped:
        keys = ", ".join(map(repr, list(doc)[:5]))
        shapes = 'one object a line (JSONL), or {"tools": [...]}' if catalog else "or one object a line (JSONL)"
        raise InputError(path, f"one JSON object (keys {keys}) where records were expected: write a JSON list of "
                               f"objects, {shapes}")
    return None  # one object on one line: a one-record JSONL file


def jsonl_lines(text: str) -> list[str]:
    """The lines of a JSONL text: split at line feeds and carriage returns (CRLF, or a CR alone as old Mac files
    end lines), never elsewhere.

    JSON strings may hold U+2028, U+2029 and U+0085 unescaped (``json.dumps``
    with ``ensure_ascii=False`` writes them so), which ``str.splitlines``
    splits at: a valid record became two invalid lines. A raw CR is no part of
    a valid JSON string, so splitting at it splits no record.
    """
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def read_text(path: Path) -> str:
    """A record file's text: UTF-8 (a BOM tolerated), gunzipped first when it is gzip (by its bytes, not its name).

    Raises
    ------
    OSError, UnicodeDecodeError
        As reading, decompressing or decoding raise them.
    """
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.decode("utf-8-sig")


def read_records(path: str | Path, catalog: bool = False) -> Iterator[tuple[int, dict]]:
    """Yield ``(line, record)`` from a JSON list, a catalog's ``{"tools": [...]}`` object or a JSONL file.

    Parameters
    ----------
    path : str or Path
        A ``.json`` file holding a list of objects (or, with ``catalog``, an
        object whose ``"tools"`` is one), or a JSONL file with one object a
        line (blank lines are skipped; :func:`jsonl_lines`). In a JSON
        document, ``line`` is an :class:`ItemLine`.
    catalog : bool
        The file is a tool catalog (:func:`document_items`).

    Raises
    ------
    InputError
        If the file is missing, unreadable, or a record is not a JSON object;
        the message names the file and line.
    """
    path = Path(path)
    try:
        text = read_text(path)
    except FileNotFoundError:
        raise InputError(path, "file not found") from None
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # EOFError: a truncated gzip
        raise InputError(path, read_problem(exc)) from None
    items = document_items(path, text, catalog)
    if items is not None:
        for line, item in items:
            if not isinstance(item, dict):
                raise InputError(path, f"not a JSON object (found {json_kind(item)})", line=line)
            yield line, item
        return
    for lineno, raw in enumerate(jsonl_lines(text), start=1):
        if not raw.strip():
            continue
        try:
            item = loads_records(raw)
        except json.JSONDecodeError as exc:
            raise InputError(path, f"invalid JSON: {exc.msg}", line=lineno) from None
        except (ValueError, RecursionError) as exc:  # huge number, nesting too deep
            raise InputError(path, f"invalid JSON: {exc}", line=lineno) from None
        if not isinstance(item, dict):
            raise InputError(path, f"not a JSON object (found {json_kind(item)})", line=lineno)
        yield lineno, item


def write_problem(path: str | Path, folder: bool = False) -> str | None:
    """Why ``path`` could not be written (a file, or a folder with ``folder``), or None when it looks writable.

    Checked before any slow work, so that a command that cannot save its
    result says so at once rather than after minutes: the path itself must
    not be a folder (a file) or a file (a folder), and its nearest existing
    folder must be one this process may create files in.

    Parameters
    ----------
    path : str or Path
        The file (or folder) to write.
    folder : bool
        ``path`` is a folder to write files into.

    Returns
    -------
    str or None
    """
    path = Path(path)
    if path.is_dir() and not folder:
        return "is a folder; name a file to write"
    if folder and path.exists() and not path.is_dir():
        return "is a file; name a folder"
    ancestor = path if folder and path.is_dir() else path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot be written: {ancestor} is a file, not a folder"
    try:  # a nameless file made and gone at once: root ignores permission bits, not /proc or a read-only disk
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as exc:
        return f"cannot be written: folder {ancestor} takes no new files ({exc.strerror or exc})"
    return None


def write_atomic(path: str | Path, data: bytes | str, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` so that a failure never leaves a partial file.

    The bytes go to a temporary file in the same folder, are flushed to disk,
    and replace ``path`` in one rename.

    Parameters
    ----------
    path : str or Path
        Destination; its folder is created if needed.
    data : bytes or str
        Content (str is written as UTF-8).
    mode : int or None
        Permission bits; None: a plain ``open()``'s (0o666 less the umask),
        since artifacts and results are meant to be shared. A private key
        passes 0o600.

    Raises
    ------
    InputError
        If ``path`` is a folder; :class:`WriteError` (an InputError and an
        OSError) if it cannot be written (a parent that is a file, a
        read-only folder, a full disk), naming the reason.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(path, "is a folder; name a file to write")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:  # a parent that is a file, a read-only folder, /proc: the user's path, not a bug
        raise WriteError(path, write_problem(path) or f"cannot be written: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, 0o666 & ~_UMASK if mode is None else mode)  # mkstemp's own mode is 0o600
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # a full disk, a quota: nothing partial is left behind
        Path(tmp).unlink(missing_ok=True)
        raise WriteError(path, f"cannot be written: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
