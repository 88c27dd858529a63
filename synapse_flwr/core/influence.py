"""Bounding one organisation's influence on a merge (the ``robust`` policy's pre-processing).

Everything here reads released artifacts only (post-processing of the DP
releases: no raw data, privacy unchanged) and is order-independent: a
per-tool cap is a median over the orgs, and every sum is taken over orgs in
sorted order (:func:`math.fsum` in
:func:`~synapse_flwr.core.prototypes.merge_prototypes`).

Three steps, applied by :func:`~synapse_flwr.core.merge.merge_robust` after
the ``support-weighted`` cap on each org's total mass:

1. per-tool mass: an org's *mass* on a tool is the largest count it claims
   for it (any count :func:`scale_entry` scales: calls, starts, scenario and
   precaution supports, confusions, next tools, prototype count) or the
   length of its prototype in units of queries, less what its noise alone
   may add (:func:`prototype_mass`: a sum of ``n`` unit vectors is at most
   ``n`` long, so an honest org's mass is essentially its count; the edge
   lets a sum be longer than its count by six SDs of the count's noise,
   which a claimed count SD makes as long as it likes, so the count alone
   does not bound the vector); among the orgs whose mass clears
   ``sds`` noise SDs (the tool's *holders*), none may carry more than
   ``share`` times the lower median of the holders' masses; a larger claim
   is scaled down, every count, support and prototype of that entry alike
   (:func:`clip_tool_influence`), so the cap bounds the prototype's length
   as well as its counts;
2. lone dissent, per federation: an org whose prototypes, pooled over every
   tool, point away from the other orgs' (:func:`pooled_dissenter`) has all
   its prototypes left out; under privacy a single tool's prototypes are
   mostly too noisy to compare, but the sum over hundreds of tools is not;
3. lone dissent, per tool: a prototype only one org holds that points away
   from the combined prototype of at least two other holders is left out
   (:func:`lone_dissenters`).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from synapse_flwr.core.prototypes import (
    above_noise,
    decode_prototype,
    merge_prototypes,
    prototype_cosine,
    scale_prototype,
)
from synapse_flwr.core.schema import (
    Compendium,
    FusionVotes,
    Prototype,
    ToolEntry,
    ToolStats,
)

#: Noise SDs of a prototype's squared length that :func:`prototype_mass` leaves as noise.
PROTOTYPE_NOISE_SDS = 3.0


def _r(x: float) -> float:
    return round(x, 4)


def scale_entry(e: ToolEntry, factor: float) -> ToolEntry:
    """One tool entry with every count, support and its prototype weighted by ``factor``."""
    def sc(x: float) -> float:
        return _r(x * factor)

    return e.model_copy(
        update={
            "when": [s.model_copy(update={"support": sc(s.support)}) for s in e.when],
            "when_not": [s.model_copy(update={"support": sc(s.support)}) for s in e.when_not],
            "precautions": [p.model_copy(update={"support": sc(p.support)}) for p in e.precautions],
            # rounded apart, successes within the schema's tolerance of calls could end above them
            "stats": ToolStats(calls=sc(e.stats.calls), successes=min(sc(e.stats.successes), sc(e.stats.calls)),
                               starts=sc(e.stats.starts)),
            "confusions": [t.model_copy(update={"count": sc(t.count)}) for t in e.confusions],
            "next_tools": [t.model_copy(update={"count": sc(t.count)}) for t in e.next_tools],
            "prototype": e.prototype and scale_prototype(e.prototype, factor),
        }
    )


def scale_votes(v: FusionVotes | None, factor: float) -> FusionVotes | None:
    """Fusion votes weighted by ``factor``: voters, right routes and their noise SD alike."""
    if v is None:
        return None
    return v.model_copy(update={"records": _r(v.records * factor), "correct": [_r(x * factor) for x in v.correct],
                                "sd": round(v.sd * factor, 6)})


def scale_compendium(c: Compendium, factor: float) -> Compendium:
    """An artifact with every tool entry and its fusion votes scaled by ``factor`` (see :func:`scale_entry`).

    An organisation weighed down in every sum is weighed down in the vote on fusion too.
    """
    return c.model_copy(update={"tools": [scale_entry(e, factor) for e in c.tools],
                                "votes": scale_votes(c.votes, factor)})


def entry_counts(e: ToolEntry) -> list[float]:
    """Every count of an entry that :func:`scale_entry` scales, but successes (never above calls).

    Calls, starts, the supports of scenarios and precautions, confusion and
    next-tool counts, and the prototype's count.
    """
    return [e.stats.calls, e.stats.starts, *(s.support for s in (*e.when, *e.when_not, *e.precautions)),
            *(t.count for t in (*e.confusions, *e.next_tools)), e.prototype.count if e.prototype else 0.0]


def prototype_mass(p: Prototype) -> float:
    """A prototype's length in units of queries, less what its noise alone may add.

    ``sqrt(max(0, |x|^2 - (dim + k sqrt(2 dim)) sd^2))`` with ``k =``
    :data:`PROTOTYPE_NOISE_SDS`: ``|x|^2 - dim sd^2`` is unbiased for the
    true sum's squared length (at most ``count^2``: a sum of ``count`` unit
    vectors), and noise alone lifts it by more than ``k sqrt(2 dim) sd^2``
    (``k`` SDs) only rarely, so an honest org's mass is essentially its
    count, noisy or not. A claimed noise SD buys little reach: the cap bounds
    the noise-corrected energy a router reads
    (:func:`~synapse_flwr.core.prototypes.shrunk_directions`), so a sum
    turned against honest ones longer than the cap keeps at most the ``k``
    noise SDs of energy that noise alone may have.
    """
    x = decode_prototype(p)
    energy = float(x @ x) - (x.size + PROTOTYPE_NOISE_SDS * math.sqrt(2 * x.size)) * p.sum_sd**2
    return math.sqrt(energy) if energy > 0 else 0.0


def tool_mass(e: ToolEntry) -> float:
    """An entry's influence on a tool: the largest of its counts (:func:`entry_counts`) and its prototype's length.

    The length (:func:`prototype_mass`) is there because the count alone does
    not bound the vector: the edge admits a sum up to six count SDs longer
    than its count, so a small count with a large claimed count SD could
    otherwise carry a long vector past the cap and turn the merged direction.
    """
    return max([*entry_counts(e), prototype_mass(e.prototype) if e.prototype else 0.0])


def clip_tool_influence(inputs: Sequence[Compendium], share: float, sds: float) -> list[Compendium]:
    """Scale each org's entry of a tool down to ``share`` x the lower median of the tool's holders.

    Parameters
    ----------
    inputs : sequence of Compendium
        Artifacts; global inputs are aggregates and pass unchanged.
    share : float
        The most mass an org may carry on one tool, relative to the lower
        median holder (``statistics.median_low``: with two holders, the
        smaller one).
    sds : float
        A holder's mass exceeds ``sds`` times its artifact's noise sigma
        (any positive mass without privacy).

    Returns
    -------
    list of Compendium
        The inputs in the same order; a tool with fewer than two holders is
        left as it is (there is no one to compare it with).
    """
    # each entry's mass once (it decodes the prototype)
    masses = [[tool_mass(e) for e in c.tools] if c.kind == "org" else [] for c in inputs]
    holders: dict[str, list[float]] = defaultdict(list)
    for c, ms in zip(inputs, masses):
        for e, m in zip(c.tools, ms):
            if m > sds * c.privacy.sigma and m > 0:
                holders[e.tool_id].append(m)
    caps = {t: share * statistics.median_low(ms) for t, ms in holders.items() if len(ms) >= 2}
    out = []
    for c, ms in zip(inputs, masses):
        if c.kind != "org":
            out.append(c)
            continue
        tools = [scale_entry(e, caps[e.tool_id] / m) if e.tool_id in caps and m > caps[e.tool_id] else e
                 for e, m in zip(c.tools, ms)]
        out.append(c.model_copy(update={"tools": tools}))
    return out


def lone_dissenters(
    org_protos: Sequence[tuple[str, Prototype]], cosine: float, sds: float
) -> dict[str, tuple[float, list[str]]]:
    """Orgs whose prototype of one tool points away from at least two other holders' combined one.

    Parameters
    ----------
    org_protos : sequence of (str, Prototype)
        Each org's prototype of the tool.
    cosine : float
        A noise-corrected cosine below this with the others' summed
        prototype is dissent.
    sds : float
        Only prototypes whose count clears this many noise SDs take part
        (:func:`~synapse_flwr.core.prototypes.above_noise`).

    Returns
    -------
    dict
        Dissenting org -> (its cosine with the others, the others), sorted
        keys; an org is dissenting only when at least two others hold the
        tool and it alone disagrees with them.
    """
    rated = sorted((org, p) for org, p in org_protos if above_noise(p, sds))
    out: dict[str, tuple[float, list[str]]] = {}
    for org, p in rated:
        others = [(o, q) for o, q in rated if o != org]
        if len(others) < 2:
            continue
        cos = prototype_cosine(p, merge_prototypes([q for _, q in others]))
        if cos < cosine:
            out[org] = (cos, [o for o, _ in others])
    # two or more dissenters disagree among themselves as much as with the rest: no lone claim
    return out if len(out) == 1 else {}


def pooled_dissenter(inputs: Sequence[Compendium], ratio: float) -> tuple[str, float, list[str]] | None:
    """The one org whose prototypes, pooled over all tools, point away from the other orgs'.

    For org ``o`` with sums ``S_o,t`` and the others' combined sums
    ``R_o,t``, the pooled cosine is ``sum_t <S_o,t, R_o,t>`` over the square
    root of the product of ``sum_t (|S_o,t|^2 - dim sd^2)`` and the same for
    ``R`` (independent noise leaves the inner products unbiased; the
    subtraction removes the noise energy). Summed over hundreds of tools, the
    noise that hides one tool's prototype under privacy averages out. Orgs
    whose tool mixes differ (non-IID) have pooled cosines well below 1 even
    when every tool's directions agree, so dissent is relative: an org
    dissents when its pooled cosine is below ``ratio`` times the median of
    the other orgs' (on the seed-7 MetaTool split at epsilon 4, honest orgs
    scored 0.40-0.64, at least 0.67 of the others' median; the poisoner 0.19).

    Parameters
    ----------
    inputs : sequence of Compendium
        Artifacts in canonical (content-hash) order; only org artifacts with
        prototypes take part, one per org.
    ratio : float
        A pooled cosine below ``ratio`` x the median of the others' is dissent.

    Returns
    -------
    (str, float, list of str) or None
        The dissenting org, its pooled cosine and the other orgs, when at
        least three orgs take part and exactly one of them dissents.
    """
    sums: dict[str, dict[str, tuple[np.ndarray, float]]] = {}
    for c in inputs:
        if c.kind == "org" and any(e.prototype for e in c.tools):
            sums[c.issuer.org] = {e.tool_id: (decode_prototype(e.prototype), e.prototype.sum_sd ** 2)
                                  for e in c.tools if e.prototype is not None}
    if len(sums) < 3:
        return None
    pooled: dict[str, float] = {}
    for org, own in sorted(sums.items()):
        others = [o for o in sorted(sums) if o != org]
        inner = own_energy = rest_energy = 0.0
        for tool, (x, var) in own.items():
            rest = [sums[o][tool] for o in others if tool in sums[o]]
            if not rest:
                continue
            r = np.sum([v for v, _ in rest], axis=0)
            inner += float(x @ r)
            own_energy += float(x @ x) - x.size * var
            rest_energy += float(r @ r) - r.size * math.fsum(w for _, w in rest)
        if own_energy > 0 and rest_energy > 0:
            pooled[org] = inner / math.sqrt(own_energy * rest_energy)
    found = [(org, cos, [o for o in sorted(sums) if o != org]) for org, cos in sorted(pooled.items())
             if len(pooled) >= 3 and cos < ratio * statistics.median(c for o, c in pooled.items() if o != org)]
    return found[0] if len(found) == 1 else None
