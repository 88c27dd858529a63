"""tau-bench retail per-step tool-call scoring, with composition knowledge as a prior.

Every gold call of a test task is one step: the query is the instruction plus
the gold calls made so far (:func:`~synapse_flwr.data.taubench.taubench_step_items`),
``prev_tool`` the previous gold call (None at the first step), and the task is
to name the next tool.

Two predictions are scored per step by :func:`step_accuracy`:

``router``
    the router's ranking as it is;
``transition``
    the router's candidate scores plus a transition prior ``P(next | prev)``
    estimated from the compendium's ``next_tools`` counts (see
    :func:`transition_prior` and :func:`rerank_with_transitions`).

The experiment driver (:mod:`synapse_flwr.simulations.experiment`) builds the
arms and calls :func:`step_accuracy` on each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

from synapse_flwr.core.router import Router, RouteResult
from synapse_flwr.core.schema import Compendium, ToolEntry

# Weight of the log-lift of the transition prior, added to the router's
# candidate scores (sums of cosines, whose top candidates are typically a few
# tenths apart). At 0.1 a strong transition (lift ~5, log ~1.6) moves a tool by
# ~0.16 and a transition never seen after ``prev`` costs ~0.15: enough to
# settle a near tie, not to overturn a clear retrieval win. Fixed a priori,
# not tuned on the test split.
TRANSITION_WEIGHT = 0.1
# Laplace pseudo-count per tool when estimating P(next | prev) from counts.
TRANSITION_SMOOTHING = 1.0
# The two predictions of every step: the keys of step_accuracy's result.
VARIANTS = ("router", "transition")

Knowledge = Compendium | Mapping[str, ToolEntry]


class Step(Protocol):
    """What :func:`step_accuracy` reads of a step.

    :class:`~synapse_flwr.data.taubench.StepItem` is one; typed by shape so
    that evaluation imports nothing from the data layer.
    """

    @property
    def query(self) -> str: ...

    @property
    def prev_tool(self) -> str | None: ...

    @property
    def gold(self) -> str: ...


def _entries(knowledge: Knowledge) -> Mapping[str, ToolEntry]:
    """Tool id -> entry of a compendium, or the mapping itself."""
    if isinstance(knowledge, Compendium):
        return {e.tool_id: e for e in knowledge.tools}
    return knowledge


def transition_prior(
    knowledge: Knowledge, prev_tool: str | None, smoothing: float = TRANSITION_SMOOTHING
) -> dict[str, float]:
    """Smoothed ``P(next | prev)`` over the tools of a compendium.

    ``P(b | a) = (c(a, b) + s) / (C(a) + s * T)`` with ``c(a, b)`` the
    (possibly noised) count of ``b`` in ``a``'s ``next_tools``, ``C(a)`` their
    sum, ``s`` the smoothing and ``T`` the number of tools. Without a previous
    tool, or when it has no ``next_tools``, the prior is uniform.

    Parameters
    ----------
    knowledge : Compendium or mapping of str to ToolEntry
        The compendium (or the router's ``entries``) whose counts are used.
    prev_tool : str or None
        The tool called just before.
    smoothing : float
        Pseudo-count added to every tool (> 0).

    Returns
    -------
    dict of str to float
        Probability of every tool of the compendium; sums to one.
    """
    if smoothing <= 0:
        raise ValueError(f"smoothing must be positive, not {smoothing}")
    entries = _entries(knowledge)
    entry = entries.get(prev_tool) if prev_tool else None
    counts = {c.tool: max(c.count, 0.0) for c in entry.next_tools} if entry else {}
    total = math.fsum(counts.get(t, 0.0) for t in entries) + smoothing * len(entries)
    return {t: (counts.get(t, 0.0) + smoothing) / total for t in entries}


def rerank_with_transitions(
    result: RouteResult,
    knowledge: Knowledge,
    prev_tool: str | None,
    weight: float = TRANSITION_WEIGHT,
    smoothing: float = TRANSITION_SMOOTHING,
) -> list[str]:
    """Rank tools by router score plus ``weight`` times the transition log-lift.

    A tool's combined score is ``score + weight * log(T * P(tool | prev))``,
    ``T`` the number of tools (so a uniform prior shifts nothing). Candidates
    keep their router score; tools the router did not retrieve enter at the
    lowest candidate score, so a strong transition can still bring them into
    the ranking. Ties keep the router's order.

    Parameters
    ----------
    result : RouteResult
        The router's answer (candidates best first).
    knowledge : Compendium or mapping of str to ToolEntry
        Source of the ``next_tools`` counts.
    prev_tool : str or None
        The tool called just before; None leaves the router's order.
    weight : float
        Weight of the log-lift (>= 0); 0 leaves the router's order.
    smoothing : float
        Laplace pseudo-count of :func:`transition_prior`.

    Returns
    -------
    list of str
        Tool ids, best first: the candidates and every tool of the compendium.
    """
    if weight < 0:
        raise ValueError(f"weight must be non-negative, not {weight}")
    prior = transition_prior(knowledge, prev_tool, smoothing)
    floor = min((c.score for c in result.candidates), default=0.0)
    scores = {c.tool_id: c.score for c in result.candidates}
    for tool in prior:
        scores.setdefault(tool, floor)
    if weight == 0 or not prior:
        return list(scores)
    n_tools = len(prior)
    combined = {
        t: s + (weight * math.log(n_tools * prior[t]) if t in prior else 0.0)
        for t, s in scores.items()
    }
    order = {t: i for i, t in enumerate(scores)}
    return sorted(combined, key=lambda t: (-combined[t], order[t]))


def _metrics(rankings: Sequence[Sequence[str]], golds: Sequence[str], k: int) -> dict[str, float]:
    """Top-1 accuracy, recall@k and count of rankings against their gold tools."""
    n = len(golds)
    if not n:
        return {"acc": 0.0, "r5": 0.0, "n": 0}
    acc = sum(bool(r) and r[0] == g for r, g in zip(rankings, golds, strict=True))
    recall = sum(g in r[:k] for r, g in zip(rankings, golds, strict=True))
    return {"acc": acc / n, "r5": recall / n, "n": n}


def step_accuracy(
    router: Router,
    items: Sequence[Step],
    transition_weight: float = TRANSITION_WEIGHT,
    k: int = 5,
    oracle: bool = False,
) -> dict[str, dict[str, float]]:
    """Next-tool accuracy of a router over task steps, alone and with the transition prior.

    Parameters
    ----------
    router : Router
        The router; its compendium (``router.entries``) also supplies the
        ``next_tools`` counts of the prior.
    items : sequence of Step
        Steps to predict (the query already carries the calls so far).
    transition_weight : float
        Weight of the prior, see :func:`rerank_with_transitions`.
    k : int
        Cut-off of the recall (``r5`` is recall@k).
    oracle : bool
        Force each step's gold tool into the candidates (oracle retrieval).

    Returns
    -------
    dict
        ``{"router": {"acc", "r5", "n"}, "transition": {"acc", "r5", "n"}}``.
    """
    force = [(i.gold,) for i in items] if oracle else None
    results = router.route_many([i.query for i in items], force=force)
    golds = [i.gold for i in items]
    alone = [[c.tool_id for c in r.candidates] for r in results]
    with_prior = [
        rerank_with_transitions(r, router.entries, i.prev_tool, transition_weight)
        for r, i in zip(results, items, strict=True)
    ]
    return {"router": _metrics(alone, golds, k), "transition": _metrics(with_prior, golds, k)}
