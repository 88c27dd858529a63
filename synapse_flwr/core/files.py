"""Reading record files (JSON list or JSONL) and writing outputs atomically."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from synapse_flwr.core.errors import InputError


def read_records(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Yield ``(line, record)`` from a JSON list or a JSONL file.

    Parameters
    ----------
    path : str or Path
        A ``.json`` file holding a list of objects, or a JSONL file with one
        object a line (blank lines are skipped).

    Raises
    ------
    InputError
        If the file is missing, unreadable, or a record is not a JSON object;
        the message names the file and line.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # tolerate a BOM
    except FileNotFoundError:
        raise InputError(path, "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read file: {exc}") from None
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(path, f"invalid JSON: {exc.msg}", line=exc.lineno) from None
        except (ValueError, RecursionError) as exc:  # huge number, nesting too deep
            raise InputError(path, f"invalid JSON: {exc}") from None
        for i, item in enumerate(items, start=1):
            if not isinstance(item, dict):
                raise InputError(path, f"item {i} is not a JSON object", line=i)
            yield i, item
        return
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InputError(path, f"invalid JSON: {exc.msg}", line=lineno) from None
        except (ValueError, RecursionError) as exc:  # huge number, nesting too deep
            raise InputError(path, f"invalid JSON: {exc}", line=lineno) from None
        if not isinstance(item, dict):
            raise InputError(path, "not a JSON object", line=lineno)
        yield lineno, item


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` so that a failure never leaves a partial file.

    The bytes go to a temporary file in the same folder, are flushed to disk,
    and replace ``path`` in one rename.

    Parameters
    ----------
    path : str or Path
        Destination; its folder is created if needed.
    data : bytes or str
        Content (str is written as UTF-8).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
