"""User-facing errors: bad input is reported by file, line and field, never as a traceback."""

from __future__ import annotations

import logging
from pathlib import Path

_SAID: set[str] = set()


def log_once(log: logging.Logger, message: str, level: int = logging.INFO) -> None:
    """Log a message at ``level`` once per process (later repeats go to debug).

    An experiment reloads and rechecks a folder for every unit of work: say it once.
    """
    if message in _SAID:
        log.debug(message)
    else:
        _SAID.add(message)
        log.log(level, message)


def warn_once(log: logging.Logger, message: str) -> None:
    """Warn about an input once per process (:func:`log_once` at WARNING)."""
    log_once(log, message, logging.WARNING)


class SynapseError(Exception):
    """Base class for errors caused by user input or configuration."""


class InputError(SynapseError):
    """An input file is malformed.

    Parameters
    ----------
    path : str or Path
        The offending file.
    message : str
        What is wrong.
    line : int or None
        1-based line number (in a JSON document an
        :class:`~synapse_flwr.core.files.ItemLine`: the line and the item), when known.
    field : str or None
        Dotted field path, when known.
    """

    def __init__(
        self, path: str | Path, message: str, line: int | None = None, field: str | None = None
    ) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.message = message
        where = self.path + (f":{line}" if line is not None else "")
        what = f" field '{field}':" if field else ""
        super().__init__(f"{where}:{what} {message}")
