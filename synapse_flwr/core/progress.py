"""Progress lines for long loops: a count, a percentage and a rough time left, every so often.

A long embedding or LLM scoring pass runs for minutes; without these lines
it looks hung. A short one stays quiet: nothing is logged before
:data:`PROGRESS_EVERY_S` seconds have passed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Seconds between two progress lines of one job (read at each ``advance``, so tests can lower it).
PROGRESS_EVERY_S = 30.0


def format_duration(seconds: float) -> str:
    """A short rough duration: ``"45s"``, ``"2m"``, ``"1h05m"``.

    Parameters
    ----------
    seconds : float
        The duration; negative values count as 0.

    Returns
    -------
    str
        Seconds under a minute, whole minutes under an hour, else hours and minutes.
    """
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    minutes = round(s / 60)
    if minutes < 60:
        return f"{minutes}m"
    return f"{minutes // 60}h{minutes % 60:02d}m"


class Progress:
    """Counts the work done in a long loop and logs it at INFO now and then.

    A line such as ``"embedding: 1,200/5,000 texts (24%), ~2m left"`` is
    logged at most every :data:`PROGRESS_EVERY_S` seconds, from ``advance``;
    the time left assumes the rate so far holds. ``done`` logs a closing line
    only when a periodic one was logged, so a short job logs nothing.

    Parameters
    ----------
    label : str
        What the job is, at the start of each line (``"embedding"``).
    total : int
        Units of work in the whole job (``>= 0``).
    unit : str
        Name of a unit, after the counts (``"texts"``, ``"queries"``).
    logger : logging.Logger or None
        Where the lines go; ``None`` means this module's logger.
    clock : callable
        Seconds from a monotonic clock; tests pass a fake one.

    Raises
    ------
    ValueError
        If ``total`` is negative.
    """

    def __init__(
        self,
        label: str,
        total: int,
        unit: str = "items",
        logger: logging.Logger | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if total < 0:
            raise ValueError(f"progress total must be >= 0, got {total}")
        self.label = label
        self.total = total
        self.unit = unit
        self.count = 0
        self.lines = 0
        self._log = logger if logger is not None else log
        self._clock = clock
        self._start = clock()
        self._last = self._start

    def _counts(self) -> str:
        counts = f"{self.label}: {self.count:,}/{self.total:,} {self.unit}"
        return f"{counts} ({100 * self.count // self.total}%)" if self.total else counts

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more units done; log a line if the last one is old enough.

        Parameters
        ----------
        n : int
            Units just finished.
        """
        self.count += n
        now = self._clock()
        if now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        self.lines += 1
        elapsed = now - self._start
        left = self.total - self.count
        if self.count > 0 and left > 0:
            eta = f", ~{format_duration(elapsed / self.count * left)} left"
        else:
            eta = ""
        self._log.info("%s%s", self._counts(), eta)

    def done(self) -> None:
        """Close the job: one last line with the time taken, only if a periodic line was logged."""
        if self.lines:
            self._log.info("%s, done in %s", self._counts(), format_duration(self._clock() - self._start))
