"""Call sequences as private records: start and next-tool counts over the public tool domain.

A sequence record is one task: the user's instruction and the tools called
for it, in order (:class:`SequenceRecord`). One record is the unit of privacy
(docs/privacy.md), and its contribution is bounded by :class:`SequenceBounds`:

* experience events: one per *distinct* tool among its first ``max_tools``
  distinct tools (query = the instruction), so every counter of the
  builder's release (calls, successes, phrases, prototype) moves by at most 1
  per record (:func:`record_events`);
* sequence counters: +1 to the start counter of its first tool and +n to
  transition ``(a, b)`` when the record makes it n times, the whole vector
  scaled down to L2 norm ``sqrt(max_counters)`` when longer (per-record
  clipping, :func:`record_counters`), so repeated calls keep their weight and
  one record moves the counters by at most ``sqrt(max_counters)`` in L2.

The tool ids are public catalog text, so the start and transition counters
are released densely over the whole domain (every tool, every ordered pair):
no partition selection, and presence of a pair is not revealed. They are in
the same Gaussian release as the builder's counters, weighted by ``w``
(:func:`release_sequences`): the squared L2 sensitivity grows by
``w^2 * max_counters`` and the released counts, divided by ``w``, carry noise
``sigma / w``. Clamping at 0 and dropping counts below ``floor_sds`` noise SDs
are post-processing (free in privacy: the domain is public).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from synapse_flwr.core.experience import Event
from synapse_flwr.core.privacy import bound_contributions, noise_counts


@dataclass(frozen=True)
class SequenceRecord:
    """One private record: an instruction and the tools called for it, in order.

    Parameters
    ----------
    query : str
        The instruction (the query of every event derived from the record).
    tools : tuple of str
        Catalog ids of the calls, in order.
    """

    query: str
    tools: tuple[str, ...]


@dataclass(frozen=True)
class SequenceBounds:
    """How much one sequence record may contribute.

    Parameters
    ----------
    max_tools : int
        Distinct tools (hence events and prototypes) one record contributes, ``>= 1``.
    max_counters : int
        ``B^2``: the squared L2 norm a record's start and transition counts are
        clipped to (e.g. 8 distinct transitions, or one repeated ~3 times), ``>= 1``.
    weight : float
        ``w``: weight of the sequence counters in the release (``1 <= w <= 100``).
    floor_sds : float
        Released counts below this many noise SDs are dropped (post-processing):
        most ordered pairs are zero, and their clamped noise would otherwise
        add up over the merged organisations.
    """

    max_tools: int = 6
    max_counters: int = 8
    weight: float = 4.0
    floor_sds: float = 1.0

    def __post_init__(self) -> None:
        if self.max_tools < 1 or self.max_counters < 1:
            raise ValueError(f"max_tools and max_counters must be >= 1, got {self.max_tools}, {self.max_counters}")
        if not 1 <= self.weight <= 100:
            raise ValueError(f"weight must satisfy 1 <= weight <= 100, got {self.weight!r}")
        if not self.floor_sds >= 0:
            raise ValueError(f"floor_sds must be >= 0, got {self.floor_sds!r}")


def record_events(record: SequenceRecord, bounds: SequenceBounds) -> list[Event]:
    """The record's experience events: one successful call per distinct tool, at most ``max_tools``.

    Parameters
    ----------
    record : SequenceRecord
        The record.
    bounds : SequenceBounds
        Its contribution bound.
    """
    tools = bound_contributions(record.tools, bounds.max_tools) if record.tools else []
    return [Event(query=record.query, tool=t, success=True, gold=t) for t in tools]


def record_counters(record: SequenceRecord, bounds: SequenceBounds) -> dict[tuple[str | None, str], float]:
    """One record's start and transition counts, clipped to L2 norm ``sqrt(max_counters)``.

    Keys are ``(None, first)`` and ``(a, b)``; values the record's counts,
    scaled by ``min(1, sqrt(max_counters) / norm)``.
    """
    if not record.tools:
        return {}
    counts = Counter([(None, record.tools[0]), *itertools.pairwise(record.tools)])
    norm = math.sqrt(sum(v * v for v in counts.values()))
    scale = min(1.0, math.sqrt(bounds.max_counters) / norm)
    return {k: v * scale for k, v in counts.items()}


def sequence_counts(
    records: Iterable[SequenceRecord], bounds: SequenceBounds
) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    """Clipped start counts per tool and transition counts per ordered pair, summed over records.

    Parameters
    ----------
    records : iterable of SequenceRecord
        The organisation's records.
    bounds : SequenceBounds
        Counters per record.

    Returns
    -------
    (Counter, Counter)
        Starts per tool; transitions per ordered pair (float: clipped).
    """
    starts: Counter[str] = Counter()
    transitions: Counter[tuple[str, str]] = Counter()
    for record in records:
        for (prev, tool), value in record_counters(record, bounds).items():
            if prev is None:
                starts[tool] += value
            else:
                transitions[(prev, tool)] += value
    return starts, transitions


def release_sequences(
    starts: Counter[str],
    transitions: Counter[tuple[str, str]],
    tool_ids: Sequence[str],
    sigma: float,
    weight: float,
    rng: np.random.Generator,
    floor_sds: float = 1.0,
) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """Gaussian release of the start and transition counts over the public domain.

    Each count enters the release as ``weight * count`` with ``N(0, sigma^2)``
    noise; dividing by ``weight`` leaves noise ``sigma / weight``. Counts
    below ``floor_sds`` of that noise (or 0 without noise) are dropped.

    Parameters
    ----------
    starts, transitions : Counter
        Exact counts from :func:`sequence_counts`.
    tool_ids : sequence of str
        The catalog (the public domain: every tool, every ordered pair).
    sigma : float
        Noise SD of the release, ``>= 0``.
    weight : float
        ``w`` of the sequence counters, ``> 0``.
    rng : numpy.random.Generator
        Source of noise.
    floor_sds : float
        Drop threshold in noise SDs (>= 0).

    Returns
    -------
    (dict, dict)
        Released starts per tool and counts per pair, positive values only.
    """
    ids = sorted(tool_ids)
    pairs = [(a, b) for a in ids for b in ids]
    raw = np.array([starts[t] for t in ids] + [transitions[p] for p in pairs], np.float64) * weight
    sd = sigma / weight
    noised = noise_counts(raw, sigma, rng) / weight
    noised[noised < max(floor_sds * sd, 1e-12)] = 0.0
    keys: list = [*ids, *pairs]
    kept = {k: float(v) for k, v in zip(keys, noised) if v > 0}
    return ({k: v for k, v in kept.items() if isinstance(k, str)},
            {k: v for k, v in kept.items() if isinstance(k, tuple)})
