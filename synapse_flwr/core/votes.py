"""Fusion votes: the federation measures, under DP, how much its router should trust experience.

The router adds a tool's prototype evidence and a count prior to its
documentation score with constants chosen on MetaTool's seed-7 split
(:class:`~synapse_flwr.core.fusion.Fusion`). On other data experience may
help less, or hurt: on the embedded demo, whose test queries are paraphrases
unlike its logs, the count prior cost 5 seen points at epsilon 4. So every
organisation also measures, on its own records, which of a few settings
(:data:`SETTINGS`, from documentation only up to the MetaTool constants)
routes them right, and the router follows the federation's majority.

Leave-one-out. A record votes against a global that already holds its own
release. Its unit query vector is taken out of its tool's prototype sum (and
1 out of the count) before it is routed, so it is scored as an unseen query
from the same traffic would be; the documentation, the other tools and the
gates are the global's. The retrieval order decides (the ``none`` reranker).

Privacy. A record votes once in its life, in a round after the one that
released it. Its contribution is the vector (1, correct under setting 1, ...,
correct under setting G), each entry 0 or 1: L2 sensitivity ``sqrt(G + 1)``.
The sums get Gaussian noise at the vote multiplier of the record's budget
(:attr:`~synapse_flwr.core.privacy.Calibration.vote_multiplier`): the
builder keeps :data:`VOTE_SHARE` of the squared GDP ``mu`` for it, so a
record's releases and its vote together meet the run's epsilon. Choosing the
setting from released sums is post-processing.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from synapse_flwr.core.prototypes import shrunk_directions, stacked_prototypes
from synapse_flwr.core.schema import MAX_COUNT, FusionSetting, FusionVotes, vote_bounds

if TYPE_CHECKING:
    from synapse_flwr.core.router import Router

#: The settings voted on (prototype weight, count prior): documentation only first, a tie goes to the earlier one.
SETTINGS: tuple[FusionSetting, ...] = (
    FusionSetting(prototype=0.0, prior=0.0),
    *(FusionSetting(prototype=w, prior=p) for p in (0.0, 0.5) for w in (1.0, 2.0, 4.0, 8.0)),
)
# Share of a record's budget (squared GDP mu) kept for its vote, and how many
# noise SDs (of the difference of two vote sums) the best setting must beat
# documentation only by before the router reads experience at all.
# Seed-7 dev split (simulations/fusion_votes.py, docs/results/tuning/votes):
# seen top-1 minus docs_only at epsilon 4, 6 noise draws each on the demo and
# MetaTool. Without votes: demo -4.85 points, MetaTool +10.30. From a margin
# of 2 SDs the demo routes exactly as its documentation in every draw at
# shares 0.02, 0.05 and 0.1 (margins 0 and 1 let experience through that cost
# it up to 2.3 points); MetaTool keeps its defaults in every draw at every
# share and margin up to 3 (+10.23 / +10.03 / +9.77: the share's extra noise
# on the release). 0.05 rather than 0.02: its votes are less noisy (SD 35 vs
# 56 records over 5 orgs; 27 over the demo's 3) for a fifth of a point. The
# rival rule, the first setting within the margin of the best, ties this one
# except at share 0.02 and margin 3 (MetaTool -1.3 points: noisy votes fell
# back to weaker settings); it was compared after it picked (4, 0.5) on one
# reported MetaTool seed (456), not chosen on it.
VOTE_SHARE = 0.05
VOTE_SDS = 2.0
#: Records routed at once when voting.
LOO_CHUNK = 1024


def vote_sensitivity() -> float:
    """L2 norm of one record's vote: its count and one 0/1 per setting of :data:`SETTINGS`."""
    return math.sqrt(len(SETTINGS) + 1)


def loo_correct(router: Router, queries: Sequence[str], labels: Sequence[str]) -> np.ndarray:
    """Whether each record is routed to its label under each of :data:`SETTINGS`, leaving it out.

    Parameters
    ----------
    router : Router
        A router over the global that holds the records' release (its fusion
        constants other than the prototype weight and prior are used).
    queries, labels : sequence of str
        The voting records' queries and the tools they served (in the catalog).

    Returns
    -------
    numpy.ndarray
        ``(len(queries), len(SETTINGS))`` booleans.
    """
    row = {t: i for i, t in enumerate(router.tool_ids)}
    y = np.array([row[label] for label in labels], dtype=int)
    queries = list(queries)
    stacked = (stacked_prototypes([e.prototype for e in router.entries.values()], router.prototypes[0].shape[1])
               if router.prototypes is not None else None)
    # in chunks: a few (records x tools) arrays per chunk, whatever the org's log size
    return np.concatenate([_loo_chunk(router, queries[i:i + LOO_CHUNK], y[i:i + LOO_CHUNK], stacked)
                           for i in range(0, len(y), LOO_CHUNK)] or [np.zeros((0, len(SETTINGS)), bool)])


def _loo_chunk(router: Router, queries: list[str], y: np.ndarray,
               stacked: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> np.ndarray:
    """:func:`loo_correct` for one chunk of records, ``y`` their labels' rows, ``stacked`` the global's
    prototype sums, noise SDs and counts (None without a readable prototype)."""
    q = router._embed(queries)
    desc = router.evidence(queries, q)["description"]
    if stacked is None:  # no readable prototype: every setting routes as the documentation does
        return np.repeat((desc.argmax(1) == y)[:, None], len(SETTINGS), axis=1)
    dirs, gain, _ = router.prototypes
    used = gain > 0
    sums, sds, counts = stacked
    margin = router.fusion.margin
    cosine = np.maximum(q @ dirs.T - margin, 0.0) * gain
    # the record's own tool, read as the router would read it without the record
    own_dirs, own_gain = shrunk_directions(sums[y] - q, sds[y], router.fusion.shrink)
    kept = used[y] & (own_gain > 0)
    own = np.maximum(np.einsum("ij,ij->i", q, own_dirs) - margin, 0.0) * own_gain * kept
    gate = (used[np.argmax(desc, axis=1)] & router.unnamed(queries))[:, None]  # as Router.gate reads prototypes
    prior_rows = np.log1p(counts) * used
    own_prior = np.log1p(np.maximum(counts[y] - 1.0, 0.0)) * kept
    rows = np.arange(len(y))
    out = np.zeros((len(y), len(SETTINGS)), dtype=bool)
    for j, s in enumerate(SETTINGS):
        extra = s.prototype * cosine + s.prior * prior_rows
        extra[rows, y] = s.prototype * own + s.prior * own_prior
        out[:, j] = np.argmax(desc + extra * gate, axis=1) == y
    return out


def release_votes(correct: np.ndarray, sd: float, rng: np.random.Generator) -> FusionVotes | None:
    """The Gaussian release of the vote sums: the records, and those routed right under each setting.

    With no record it is noise alone, since a release that goes out only when
    someone votes would say that someone did; None only without noise.

    Parameters
    ----------
    correct : numpy.ndarray
        Records x :data:`SETTINGS` (two dimensions, also with no record): whether each record is routed right.
    sd : float
        Noise SD of every sum (0: no noise).
    rng : numpy.random.Generator
        The noise source.
    """
    if not len(correct) and sd <= 0:
        return None
    sums = np.concatenate([[len(correct)], correct.sum(axis=0)]).astype(np.float64)
    if sd > 0:
        sums = sums + rng.normal(0.0, sd, size=sums.shape)
    return FusionVotes(settings=list(SETTINGS), correct=[round(float(x), 4) for x in sums[1:]],
                       records=round(float(sums[0]), 4), sd=round(sd, 6))


def sum_votes(votes: Sequence[FusionVotes | None]) -> FusionVotes | None:
    """Sums of the votes on the most common list of settings (another list is left out).

    Sums are exactly rounded (:func:`math.fsum`) and the choice of list does
    not depend on the inputs' order.
    """
    given = [v for v in votes if v is not None]
    if not given:
        return None
    def grid(v: FusionVotes) -> tuple[tuple[float, float], ...]:
        return tuple((s.prototype, s.prior) for s in v.settings)

    lists = Counter(map(grid, given))
    best = min(lists, key=lambda k: (-lists[k], k))
    same = [v for v in given if grid(v) == best]

    def bounded(x: float, low: float = -MAX_COUNT) -> float:
        # a sum past the schema's bound saturates there (each input is valid; their sum may not be)
        return min(max(x, low), MAX_COUNT)

    records = bounded(round(math.fsum(v.records for v in same), 4))
    sd = bounded(round(math.sqrt(math.fsum(v.sd**2 for v in same)), 6), 0.0)
    # each input's right routes may exceed its voters by 6 sqrt(2) of its SD (vote_bounds); summed, those excesses add up
    # while the SD adds in quadrature, so the sum is kept where a global's own check expects it (post-processing)
    low, high = vote_bounds(records, sd)
    return FusionVotes(
        settings=same[0].settings,
        correct=[min(max(bounded(round(math.fsum(v.correct[j] for v in same), 4)), low), high)
                 for j in range(len(best))],
        records=records,
        sd=sd,
    )


def chosen_setting(votes: FusionVotes | None, sds: float = VOTE_SDS) -> FusionSetting | None:
    """The setting to route with, or None without votes.

    The setting with the most noised right routes (ties: the earlier), if it
    beats the first setting (documentation only in :data:`SETTINGS`) by more
    than ``sds`` noise SDs of their difference (``sqrt(2) * sd``); else the
    first: experience is read only where its votes beat the noise. Votes
    whose noised voter count is not positive are noise as a whole: the first
    (before 2026-12-05 they counted as no votes, and the router read
    experience at the MetaTool defaults).
    """
    if votes is None:
        return None
    if votes.records <= 0:
        return votes.settings[0]
    best = max(range(len(votes.settings)), key=lambda j: (votes.correct[j], -j))
    if votes.correct[best] - votes.correct[0] <= sds * math.sqrt(2) * votes.sd:
        return votes.settings[0]
    return votes.settings[best]
