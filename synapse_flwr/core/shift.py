"""Query shift: whether the queries a router serves sit where the federation's experience was gathered.

Experience is learnt from the organisations' logs. Where the queries routed
are phrased unlike them (a test set written apart from the logs, another
population of users), the prototypes pull queries to the tools that had
traffic and route them below the documentation alone, and the fusion votes
cannot see it: they are cast on the logs' own records. Seed-7 splits,
noiseless pooled compendium, the router without votes, seen top-1
(documentation alone -> with experience): the demo 0.764 -> 0.727 and
tau-bench retail written as a folder 0.559 -> 0.441, while MetaTool, its
folder shapes and three rehearsal folders gain 2 to 26 points.

The statistic is read off the released prototypes alone (post-processing:
no privacy cost). For a query whose gate is open (its documentation-best
tool has a prototype the router reads), ``z = cos(q, d_t) - c_t``, ``t`` the
read tool whose direction ``d_t`` is nearest, and ``c_t`` the cosine one of
``t``'s own queries has with ``d_t`` on average, estimated from the released
sum ``S`` and count ``n``: ``|mu|^2 = (A^2 - n) / (n (n - 1))`` is unbiased
for the squared length of the mean unit query ``mu`` (``A^2 = |S|^2 - dim
sd^2`` the sum's energy less its noise's), and a query of ``t`` scores
``mu . S / |S| = n |mu|^2 / |S|`` on average. Over the logs' own queries
its mean is near 0. Mean over the open-gate test queries of both splits
(docs/experiments.md, "Query shift"): MetaTool -0.015, its folder shapes and
three rehearsal folders -0.087 to 0.014, the demo -0.189, the tau-bench
folder -0.412; at epsilon 4 -0.098 to 0.033 against -0.206 and -0.371.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from synapse_flwr.core.prototypes import signal_energies

#: A mean ``z`` below this over the window routes on the documentation alone (between the gaining datasets'
#: lowest, -0.098, and the losing ones' highest, -0.189; seed-7 splits, without noise and at epsilon 4)
SHIFT_Z = -0.15
#: Open-gate queries the window needs before it decides (fewer: experience is read)
MIN_QUERIES = 20
#: Open-gate queries the window keeps (an experiment observes its whole test set first)
WINDOW = 20_000
#: The window of a served router (``synapse serve``): its traffic moves, and a decision should follow it
SERVE_WINDOW = 1_000


def own_cosines(sums: np.ndarray, sds: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per tool, the mean cosine of its own queries with its released direction ``S / |S|`` (nan: unknown).

    Parameters
    ----------
    sums : numpy.ndarray
        ``(n_tools, dim)`` noised prototype sums, in units of queries.
    sds : numpy.ndarray
        ``(n_tools,)`` their noise SD per coordinate.
    counts : numpy.ndarray
        ``(n_tools,)`` their noised counts (a tool of fewer than 2 queries has no estimate).
    """
    energy = np.einsum("ij,ij->i", sums, sums)
    signal = np.maximum(signal_energies(sums, sds), 0.0)
    known = (counts > 1) & (energy > 0)
    n = np.where(known, counts, 2.0)
    squared_mean = np.maximum(signal - n, 0.0) / (n * (n - 1))  # |mu|^2, unbiased
    # a query of the tool scores mu . S / |S| = n |mu|^2 / |S| on average: the sum's direction strays from mu
    # by its few queries and by its noise, both in |S|
    return np.where(known, n * squared_mean / np.sqrt(np.where(known, energy, 1.0)), np.nan)


class ShiftMonitor:
    """The ``z`` of the open-gate queries a router has seen, over a window, and whether they have shifted.

    Thread-safe: a server routes its requests concurrently.

    Parameters
    ----------
    sums, sds, counts : numpy.ndarray
        The compendium's prototypes (:func:`~synapse_flwr.core.prototypes.stacked_prototypes`).
    read : numpy.ndarray
        ``(n_tools,)`` booleans: the prototypes the router reads.
    window : int
        Open-gate queries kept (the latest).
    """

    def __init__(self, sums: np.ndarray, sds: np.ndarray, counts: np.ndarray, read: np.ndarray,
                 window: int = WINDOW) -> None:
        own = own_cosines(sums, sds, counts)
        self.tools = np.flatnonzero(read & np.isfinite(own))
        norms = np.linalg.norm(sums[self.tools], axis=1, keepdims=True)
        self.dirs = (sums[self.tools] / np.maximum(norms, 1e-12)).astype(np.float32)
        self.own = own[self.tools]
        self._z: deque[float] = deque(maxlen=window)
        self._off = False
        self._lock = threading.Lock()

    @property
    def off(self) -> bool:
        """The decision :meth:`state` last returned (False before any): whether experience is off."""
        return self._off

    def observe(self, q: np.ndarray, gate_open: np.ndarray) -> None:
        """Add the ``z`` of the queries ``q`` (unit embeddings) whose gate is open."""
        if not len(self.tools) or not gate_open.any():
            return
        cos = q[gate_open] @ self.dirs.T
        best = cos.argmax(axis=1)
        z = cos[np.arange(len(best)), best] - self.own[best]
        with self._lock:
            self._z.extend(z.tolist())

    def state(self) -> tuple[int, float | None, bool]:
        """``(queries in the window, their mean z or None, shifted)``.

        Shifted when at least :data:`MIN_QUERIES` are in and their mean is
        below :data:`SHIFT_Z`; once shifted, until the mean is back above half
        of it (a served router's mean wavering about the threshold turned
        experience off and on with every few requests).
        """
        with self._lock:
            n = len(self._z)
            mean = float(np.mean(self._z)) if n else None
            self._off = mean is not None and n >= MIN_QUERIES and mean < (SHIFT_Z / 2 if self._off else SHIFT_Z)
            return n, mean, self._off
