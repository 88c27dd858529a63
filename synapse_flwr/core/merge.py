"""Merge policies: many validated compendia -> one global compendium.

All policies are pure, deterministic and order-independent: inputs are
de-duplicated by content hash and visited in hash order, sums use
:func:`math.fsum` (exactly rounded, so independent of order), and every list
is emitted in a canonical order. A global compendium records the hashes of
the organisation artifacts it contains, so merging it again (alone, or with
an artifact it already holds) changes nothing.

Invariant: the merged prototype of a tool is the exact (order-independent,
:func:`math.fsum`) sum of its inputs' prototypes, its count the sum of their
counts, its noise SD the root sum of squares of theirs (``robust``: of
its inputs' capped prototypes, a lone dissenter's left out); inputs in
different embedding spaces are refused. Every merged count saturates at the
schema's :data:`~synapse_flwr.core.schema.MAX_COUNT` (and a prototype sum at
its int8 range, direction kept) rather than fail the merge, and every merged
global fits the wire's budget (:func:`~synapse_flwr.core.budget.fit_wire_budget`).

Policies
--------
``typed``
    Field-wise union; near-identical scenarios are de-duplicated with their
    support summed; a scenario that is one org's ``when`` and another's
    ``when_not``, a scenario claimed by two tools with very unequal support,
    or success rates that disagree, become typed
    :class:`~synapse_flwr.core.schema.Conflict` entries; the minority side is
    kept as a ``dissent`` precaution rather than voted away. Query
    prototypes add: sums and counts are summed across orgs (the signal grows
    K-fold, independent noise by sqrt K: noise SDs add in quadrature), and
    two orgs whose prototypes of one tool point apart (both above noise) are
    a ``prototype`` conflict.
``support-weighted``
    ``typed`` after scaling every organisation's support so that none
    weighs more than ``max_share`` times the (lower) median organisation: one
    loud (or malicious) org cannot dominate, of two orgs too.
``robust``
    ``typed`` with every organisation's influence bounded, for federations
    that may hold one poisoning (or badly broken) org: (1) each org's
    support mass is capped at ``max_share`` x the lower median org's (as
    ``support-weighted``); (2) per tool, no org may claim more than
    ``tool_share`` x the lower median of the tool's holders
    (:func:`~synapse_flwr.core.influence.clip_tool_influence`: every count,
    support and prototype of that entry is scaled down alike; an org's mass
    on a tool is the largest of its counts and its prototype's length in
    queries); (3) a claim only
    one org makes cannot displace a claim backed by several: between a
    ``when`` and a ``when_not`` of one tool, and between two tools claiming
    one scenario, the side with more backing orgs (one versus two or more)
    wins whatever the supports; a prototype only one org holds that
    points away from two or more other holders' is left out, and so is every
    prototype of the one org whose prototypes, pooled over all tools, point
    away from the others' (:func:`~synapse_flwr.core.influence.pooled_dissenter`:
    under privacy one tool's prototypes are too noisy to compare, hundreds
    of tools are not); each such
    single-org claim is logged as a :class:`~synapse_flwr.core.schema.Conflict`
    and its text kept as a ``dissent`` precaution. So one org moves any
    merged count by at most ``tool_share`` x the median holder's, and the
    merged prototype's direction of a tool held by two or more others not at
    all unless it agrees with them. It reads only released artifacts:
    post-processing of the DP releases, privacy unchanged. Its cost on clean
    data is measured in ``docs/results/security/poisoning/``.
``flat-majority``
    The paper's untyped baseline: each org's tools rendered as one flat
    string, clauses unioned, a "use when X" versus "avoid when X" clash
    decided by the number of orgs, the minority dropped, no conflict log.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from synapse_flwr.core.budget import bounded_log, conflict_key, fit_wire_budget
from synapse_flwr.core.influence import (
    clip_tool_influence,
    entry_counts,
    lone_dissenters,
    pooled_dissenter,
    scale_compendium,
)
from synapse_flwr.core.phrases import normalize_text, set_jaccard, token_set
from synapse_flwr.core.prototypes import (
    above_noise,
    decode_prototype,
    merge_prototypes,
    prototype_cosine,
)
from synapse_flwr.core.render import (
    FLAT_SEPARATOR,
    flat_clause_key,
    is_contested,
    render_flat,
)
from synapse_flwr.core.schema import (
    MAX_CLAIMS,
    MAX_COUNT,
    MAX_INPUTS,
    MAX_ITEMS,
    MAX_ORGS,
    MAX_SCENARIOS,
    MAX_TEXT,
    MAX_TOOLS,
    MAX_VARIANTS,
    Claim,
    Compendium,
    Conflict,
    EmbeddingSpace,
    FlatCompendium,
    Issuer,
    Precaution,
    PrivacyBlock,
    Prototype,
    Provenance,
    Scenario,
    ToolCount,
    ToolEntry,
    ToolStats,
    WhenNot,
)
from synapse_flwr.core.votes import sum_votes
from synapse_flwr.core.wire import content_hash

GLOBAL_ORG = "global"
# The merge policies' names, declared once (strategies, run config and CLI read them).
TYPED, SUPPORT_WEIGHTED, ROBUST, FLAT_MAJORITY = "typed", "support-weighted", "robust", "flat-majority"
MIN_DISPUTE_SUPPORT = 2.0


@dataclass(frozen=True)
class MergeConfig:
    """Knobs shared by the typed policies.

    Parameters
    ----------
    similarity : float
        Token-Jaccard similarity at which scenarios count as near-identical.
    rate_gap : float
        Success rates further apart than this (between orgs with at least
        ``min_calls`` calls) are a conflict.
    min_calls : float
        Calls an org needs for its success rate to be compared ...
    noise_calls : float
        ... plus this many times the org's noise sigma.
    min_dissent : float
        The weaker side of a when/when_not clash needs at least this share of
        the stronger side's support to count as a conflict.
    max_share : float
        ``support-weighted`` only: the most support mass an org may carry,
        relative to the median org.
    prototype_cosine : float
        Two orgs' prototypes of one tool whose (noise-corrected) cosine is
        below this are a conflict ...
    prototype_sds : float
        ... when both counts clear this many noise SDs (also the ``robust``
        policy's bar for an org to hold a tool).
    tool_share : float
        ``robust`` only: the most mass an org may carry on one tool, relative
        to the lower median of the tool's holders.
    pooled_ratio : float
        ``robust`` only: an org whose prototypes, pooled over all tools, agree
        with the others' at a cosine below this share of the others' median
        has them all left out (chosen on the seed-7 MetaTool split).
    by_orgs : bool
        Rank competing claims by backing orgs (one versus several) before
        support, and leave out a lone org's dissenting prototype (set by the
        ``robust`` policy).
    """

    similarity: float = 0.5
    rate_gap: float = 0.5
    min_calls: float = 5.0
    noise_calls: float = 10.0
    min_dissent: float = 0.2
    max_share: float = 1.0
    prototype_cosine: float = 0.5
    prototype_sds: float = 3.0
    tool_share: float = 2.0
    pooled_ratio: float = 0.5
    by_orgs: bool = False


def _r(x: float) -> float:
    return round(x, 4)


def _count(total: float) -> float:
    # a merged sum as the schema stores it: counts each within MAX_COUNT can sum past it, and the merge saturates
    # there rather than fail (one org claiming the bound must not stop a round)
    return min(_r(total), MAX_COUNT)


def _sorted_union(lists: Iterable[Iterable[str]], limit: int = MAX_ORGS) -> list[str]:
    return sorted({x for xs in lists for x in xs})[:limit]


def checked_compendia(compendia: Iterable[Compendium], flat: bool = False) -> list[Compendium]:
    """``compendia`` as a list, refusing before any work what is not an artifact (a path, a dict, one artifact).

    Parameters
    ----------
    compendia : iterable of Compendium
        The merge's inputs.
    flat : bool
        FlatCompendium inputs are accepted too (the flat-majority baseline).

    Returns
    -------
    list of Compendium (or FlatCompendium when ``flat``)
        The inputs.

    Raises
    ------
    TypeError
        Saying what was expected and what was given.
    """
    kinds = (Compendium, FlatCompendium) if flat else (Compendium,)
    expected = "Compendium or FlatCompendium" if flat else "Compendium"
    hint = "load artifacts with wire.load_artifact(path)"
    # one artifact is itself iterable (pydantic yields its fields): refuse it rather than merge its fields
    if isinstance(compendia, (*kinds, str, bytes, dict)) or not isinstance(compendia, Iterable):
        raise TypeError(f"compendia must be a list of {expected} objects ({hint}), got {type(compendia).__name__}")
    items = list(compendia)
    wrong = next((c for c in items if not isinstance(c, kinds)), None)
    if wrong is not None:
        raise TypeError(f"compendia must be {expected} objects ({hint}), got {type(wrong).__name__}")
    return items


def unique_inputs(compendia: Iterable[Compendium]) -> list[tuple[str, Compendium]]:
    """Drop duplicate deliveries and artifacts a global input already contains.

    Parameters
    ----------
    compendia : iterable of Compendium
        The merge's inputs.

    Returns
    -------
    list of (str, Compendium)
        ``(content hash, input)`` pairs in hash order (the canonical visiting
        order); every input is hashed once.

    Raises
    ------
    TypeError
        If ``compendia`` is not an iterable of Compendium (:func:`checked_compendia`).
    """
    by_hash = {content_hash(c): c for c in checked_compendia(compendia)}
    contained = {h for c in by_hash.values() if c.kind == "global" for h in c.inputs}
    return [(h, by_hash[h]) for h in sorted(by_hash) if h not in contained]


def leaf_hashes(inputs: Sequence[tuple[str, Compendium]]) -> list[str]:
    """Hashes of the organisation artifacts behind hashed inputs (see :func:`unique_inputs`)."""
    return sorted({h for own, c in inputs for h in (c.inputs if c.kind == "global" else [own])})


def input_orgs(inputs: Iterable[Compendium]) -> list[str]:
    """The organisations behind ``inputs``: each org artifact's issuer, each global's ``orgs`` (sorted)."""
    return sorted({org for c in inputs for org in (c.orgs if c.kind == "global" else [c.issuer.org])})


def merge_privacy(blocks: Sequence[PrivacyBlock]) -> PrivacyBlock:
    """The guarantee of a merge is the loosest of its inputs'."""
    private = all(b.mechanism == "gaussian" for b in blocks)
    if not private:
        return PrivacyBlock()
    eps = [b.epsilon for b in blocks]
    targets = [b.epsilon_target for b in blocks]
    return PrivacyBlock(
        mechanism="gaussian",
        clip=max(b.clip for b in blocks),
        sigma=min(b.sigma for b in blocks),
        noise_multiplier=min(b.noise_multiplier for b in blocks),
        epsilon=None if None in eps else max(eps),
        epsilon_target=None if None in targets else max(targets),
        delta=max(b.delta for b in blocks),
        rounds_planned=max(b.rounds_planned for b in blocks),
        threshold=min(b.threshold for b in blocks),
        text_policy="pii-masked+dp-partition-selection",
        prototype_weight=max(b.prototype_weight for b in blocks),
        sequence_weight=min(b.sequence_weight for b in blocks),
        vote_share=max(b.vote_share for b in blocks),
    )


# --------------------------------------------------------------------------- typed


@dataclass
class _Group:
    text: str
    members: list[Scenario]


class _SimilarityIndex:
    """Token sets in insertion order; finds the first one similar to a query set.

    Prefix filtering (Chaudhuri et al. 2006): with tokens in one fixed order
    (rarest first), two sets of Jaccard at least ``t`` share a token among
    the first ``|x| - ceil(t |x|) + 1`` of each. Only those prefix tokens are
    indexed and probed, and every candidate is then checked exactly, so a
    lookup costs the (short) postings of rare tokens, not one comparison per set.
    """

    def __init__(self, similarity: float, corpus: Iterable[frozenset[str]]) -> None:
        self.similarity = similarity
        self.freq = Counter(t for toks in corpus for t in toks)
        self.sets: list[frozenset[str]] = []
        self.postings: dict[str, list[int]] = defaultdict(list)

    def _prefix(self, toks: frozenset[str]) -> list[str]:
        # the margin keeps float error from shortening the prefix (a longer one is only slower)
        keep = len(toks) - math.ceil(self.similarity * len(toks) - 1e-9) + 1
        return sorted(toks, key=lambda t: (self.freq[t], t))[:max(keep, 0)]

    def add(self, toks: frozenset[str]) -> int:
        for t in self._prefix(toks):
            self.postings[t].append(len(self.sets))
        self.sets.append(toks)
        return len(self.sets) - 1

    def candidates(self, toks: frozenset[str]) -> list[int]:
        """Indices, ascending, of every set that may reach the threshold against ``toks``."""
        if self.similarity <= 0:
            return list(range(len(self.sets)))  # Jaccard 0 reaches it: every set is a candidate
        return sorted({i for t in self._prefix(toks) for i in self.postings.get(t, ())})

    def first_similar(self, toks: frozenset[str]) -> int | None:
        return next((i for i in self.candidates(toks) if set_jaccard(toks, self.sets[i]) >= self.similarity), None)


def group_scenarios(items: Iterable[Scenario], similarity: float) -> list[_Group]:
    """Greedy grouping of near-identical scenarios (highest support first).

    Each scenario joins the first group (in creation order) whose text reaches
    ``similarity`` token-Jaccard with its own, else starts a group. Texts are
    tokenised once; only groups sharing a token are compared; and a token
    set's group is remembered, since groups only ever get appended (the first
    similar one cannot change).
    """
    ordered = sorted(items, key=lambda s: (-s.support, s.text, s.orgs))
    sets = [token_set(s.text) for s in ordered]
    groups: list[_Group] = []
    index = _SimilarityIndex(similarity, sets)
    seen: dict[frozenset[str], int] = {}
    memo = 0 < similarity <= 1  # a set then always joins the group it started or first joined
    for item, toks in zip(ordered, sets):
        at = seen.get(toks) if memo and toks else None
        if at is None:
            at = index.first_similar(toks)
            if at is None:
                at = index.add(toks)
                groups.append(_Group(item.text, []))
            if memo and toks:
                seen[toks] = at
        groups[at].members.append(item)
    return groups


def _merged_scenario(group: _Group, prefer: str | None) -> Scenario:
    variants = sorted(
        {v for m in group.members for v in (m.text, *m.variants)} - {group.text}
    )[:MAX_VARIANTS]
    fields = dict(
        text=group.text,
        support=_count(math.fsum(m.support for m in group.members)),
        variants=variants,
        orgs=_sorted_union(m.orgs for m in group.members),
    )
    return Scenario(**fields) if prefer is None else WhenNot(**fields, prefer=prefer or None)


def _top_by_support(items: list, limit: int, key: Callable) -> list:
    best = sorted(items, key=lambda s: (-s.support, key(s)))[:limit]
    return sorted(best, key=key)


def _when_key(s: Scenario) -> tuple:
    return (s.text,)


def _when_not_key(s: WhenNot) -> tuple:
    return (s.text, s.prefer or "")


def _dissent_text(view: str, s: Scenario) -> str:
    if view == "when":
        text = f"other orgs ({', '.join(s.orgs)}) report it works for '{s.text}'"
    else:
        prefer = f"; they prefer {s.prefer}" if getattr(s, "prefer", None) else ""
        text = f"other orgs ({', '.join(s.orgs)}) report it fails for '{s.text}'{prefer}"
    return clip_words(text)


def clip_words(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` within ``limit`` characters, cut at a space: a word cut short may read as another.

    Cut mid-word, a quoted "... must choosey" became "... must choose", an
    instruction every client refuses a global for (security review).
    """
    return text if len(text) <= limit else text[:limit + 1].rsplit(" ", 1)[0][:limit]


def backing(s: Scenario) -> int:
    """How many orgs back a claim, as ``robust`` ranks it: 1 (one org or none) or 2 (several)."""
    return min(len(s.orgs), 2)


def _strength(s: Scenario, by_orgs: bool) -> tuple[float, ...]:
    return (backing(s), s.support) if by_orgs else (s.support,)


def _by(winner: Scenario, loser: Scenario, by_orgs: bool) -> str:
    if by_orgs and backing(winner) > backing(loser):
        return f"backing orgs ({len(winner.orgs)} vs {len(loser.orgs)}; supports {_r(winner.support)} vs {_r(loser.support)})"
    return f"support ({_r(winner.support)} vs {_r(loser.support)})"


def resolve_scenario_conflicts(
    tool_id: str,
    when: list[Scenario],
    when_not: list[WhenNot],
    similarity: float,
    policy: str,
    min_dissent: float = 0.2,
    by_orgs: bool = False,
) -> tuple[list[Scenario], list[WhenNot], list[Conflict], list[Precaution]]:
    """Find scenarios that orgs place on opposite sides; keep the majority side.

    A ``when`` and a ``when_not`` scenario of the same tool conflict when they
    are near-identical, not held by exactly the same orgs (one org seeing
    both outcomes is ordinary noise), and the weaker side has at least
    ``min_dissent`` of the stronger side's support and at least
    :data:`MIN_DISPUTE_SUPPORT` supporting queries. The side with more support stays in its
    list (ties go to ``when_not``: the conservative reading); the other leaves
    its list and becomes a ``dissent`` precaution, and the disagreement is
    logged as a :class:`Conflict`. With ``by_orgs`` the side backed by more
    orgs (several versus one, :func:`backing`) wins whatever the supports,
    and the ``min_dissent`` exemption applies only between equally backed
    sides: a lone claim against several orgs is always a conflict.
    """
    conflicts: list[Conflict] = []
    dissent: list[Precaution] = []
    drop_when: set[int] = set()
    drop_not: set[int] = set()
    when_sets, not_sets = [token_set(s.text) for s in when], [token_set(w.text) for w in when_not]
    index = _SimilarityIndex(similarity, [*when_sets, *not_sets])
    for toks in not_sets:
        index.add(toks)
    for i, (s, toks) in enumerate(zip(when, when_sets)):
        for j in index.candidates(toks):
            w = when_not[j]
            if j in drop_not or set_jaccard(toks, index.sets[j]) < similarity or s.orgs == w.orgs:
                continue
            keep_when = _strength(s, by_orgs) > _strength(w, by_orgs)
            winner, loser = (s, w) if keep_when else (w, s)
            even = not by_orgs or backing(s) == backing(w)
            if min(s.support, w.support) < MIN_DISPUTE_SUPPORT or (even and loser.support < min_dissent * winner.support):
                continue  # a stray outcome, or one against a strong consensus, is noise
            loser_view = "when_not" if keep_when else "when"
            (drop_not if keep_when else drop_when).add(j if keep_when else i)
            winner_view = "when" if keep_when else "when_not"
            conflicts.append(
                Conflict(
                    tool_id=tool_id,
                    field="when",
                    subject=s.text,
                    claims=[
                        Claim(view="when", support=s.support, orgs=s.orgs),
                        Claim(
                            view="when_not" + (f" (prefer {w.prefer})" if w.prefer else ""),
                            support=w.support,
                            orgs=w.orgs,
                        ),
                    ],
                    resolution=f"kept in {winner_view} by {_by(winner, loser, by_orgs)}; "
                    f"minority {loser_view} kept as a dissent precaution",
                    policy=policy,
                )
            )
            dissent.append(
                Precaution(
                    kind="dissent",
                    text=_dissent_text(loser_view, loser),
                    support=loser.support,
                    orgs=loser.orgs,
                )
            )
            if not keep_when:
                break
    return (
        [s for i, s in enumerate(when) if i not in drop_when],
        [w for j, w in enumerate(when_not) if j not in drop_not],
        conflicts,
        dissent,
    )


def _pooled(entries: Sequence[tuple[ToolStats, float]]) -> tuple[float, float, float]:
    """One org's calls, successes and their noise SD over its entries (a lone entry's own values)."""
    if len(entries) == 1:
        (stats, sigma), = entries
        return stats.calls, stats.successes, sigma
    return (math.fsum(s.calls for s, _ in entries), math.fsum(s.successes for s, _ in entries),
            math.sqrt(math.fsum(sigma**2 for _, sigma in entries)))


def rate_conflict(
    tool_id: str, org_stats: Sequence[tuple[str, ToolStats, float]], config: MergeConfig, policy: str
) -> tuple[Conflict, list[Precaution]] | None:
    """Log success rates that disagree across orgs; the outliers become precautions."""
    # A rate is compared only when its calls dwarf the org's noise: noised counts
    # of a handful of calls give rates anywhere in [0, 1] and spurious conflicts.
    # windows of one org (its own releases, combined) are not a disagreement between orgs: pooled first
    by_org: defaultdict[str, list[tuple[ToolStats, float]]] = defaultdict(list)
    for org, s, sigma in org_stats:
        by_org[org].append((s, sigma))
    pooled = [(org, *_pooled(entries)) for org, entries in by_org.items()]
    rated = [(org, successes / calls, calls) for org, calls, successes, sigma in pooled
             if calls >= config.min_calls + config.noise_calls * sigma]
    if len(rated) < 2:
        return None
    rates = [r for _, r, _ in rated]
    if max(rates) - min(rates) <= config.rate_gap:
        return None
    pooled = math.fsum(r * c for _, r, c in rated) / math.fsum(c for _, _, c in rated)
    claims = [
        Claim(view=f"success_rate={r:.2f}", support=_r(c), orgs=[org])
        for org, r, c in sorted(rated, key=lambda x: (-x[2], x[0]))[:MAX_CLAIMS]
    ]
    # The minority is whoever sits far from the median org, not from the pooled
    # rate (which the minority itself drags).
    typical = statistics.median(rates)
    outliers = [(org, r, c) for org, r, c in rated if abs(r - typical) > config.rate_gap / 2]
    precautions = [
        Precaution(
            kind="dissent",
            text=f"success rate differs across orgs: {org} sees {r:.0%} (typical {typical:.0%})",
            support=_r(c),
            orgs=[org],
        )
        for org, r, c in outliers
    ]
    conflict = Conflict(
        tool_id=tool_id,
        field="stats",
        subject="success_rate",
        claims=sorted(claims, key=lambda c: (c.orgs, c.view)),
        resolution=f"pooled success rate {pooled:.2f}; outlying orgs kept as dissent precautions",
        policy=policy,
    )
    return conflict, precautions


def _apart_pairs(rated: Sequence[tuple[str, Prototype]], threshold: float) -> list[tuple[str, str, float]]:
    # Every pair's noise-corrected cosine from one Gram matrix (each prototype decoded once); a
    # pair within 1e-9 of the threshold is recomputed by prototype_cosine, which decides exactly.
    if len(rated) < 2:
        return []
    x = np.stack([decode_prototype(p) for _, p in rated])
    energy = np.einsum("ij,ij->i", x, x) - x.shape[1] * np.array([p.sum_sd for _, p in rated]) ** 2
    live = energy > 0
    root = np.sqrt(np.where(live, energy, 1.0))
    cos = np.where(np.outer(live, live), np.clip((x @ x.T) / np.outer(root, root), -1.0, 1.0), 0.0)
    i, j = np.triu_indices(len(rated), 1)
    near = np.abs(cos[i, j] - threshold) < 1e-9
    out = []
    for a, b, c, exact in zip(i.tolist(), j.tolist(), cos[i, j].tolist(), near.tolist()):
        c = prototype_cosine(rated[a][1], rated[b][1]) if exact else c
        if c < threshold:
            out.append((rated[a][0], rated[b][0], c))
    return out


def prototype_conflict(
    tool_id: str, org_protos: Sequence[tuple[str, Prototype]], config: MergeConfig, policy: str
) -> Conflict | None:
    """Log orgs whose prototypes of one tool disagree (low cosine, both above noise)."""
    rated = sorted(((org, p) for org, p in org_protos if above_noise(p, config.prototype_sds)), key=lambda x: x[0])
    # pairs within one org (its own release windows, combined) are not a disagreement between orgs
    apart = [(a, b, cos) for a, b, cos in _apart_pairs(rated, config.prototype_cosine) if a != b]
    if not apart:
        return None
    orgs = sorted({o for a, b, _ in apart for o in (a, b)})[:MAX_CLAIMS]
    counts = dict(rated)
    worst = min(cos for _, _, cos in apart)
    return Conflict(
        tool_id=tool_id,
        field="prototype",
        subject="query_prototype",
        claims=[Claim(view=f"queries of {org}", support=_r(counts[org].count), orgs=[org]) for org in orgs],
        resolution=f"prototypes summed; lowest cosine between orgs {worst:.2f}"[:MAX_TEXT],
        policy=policy,
    )


def drop_lone_prototypes(
    tool_id: str, protos: Sequence[tuple[Compendium, Prototype]], config: MergeConfig, policy: str
) -> tuple[list[tuple[Compendium, Prototype]], list[Conflict]]:
    """Leave out the prototype of a lone org that points away from two or more other holders'.

    See :func:`~synapse_flwr.core.influence.lone_dissenters`; the left-out
    claim is logged as a ``prototype`` :class:`Conflict`.
    """
    lone = lone_dissenters([(c.issuer.org, p) for c, p in protos if c.kind == "org"],
                           config.prototype_cosine, config.prototype_sds)
    conflicts = []
    for org, (cos, others) in sorted(lone.items()):
        counts = {c.issuer.org: p.count for c, p in protos}
        conflicts.append(Conflict(
            tool_id=tool_id, field="prototype", subject="query_prototype",
            claims=[Claim(view=f"queries of {org}", support=_r(counts[org]), orgs=[org]),
                    Claim(view="queries of the other holders", support=_count(math.fsum(counts[o] for o in others)),
                          orgs=others[:MAX_ORGS])],
            # the org's id never follows "only": an org named "pick" made "only pick", a command every
            # reader's instruction check refuses, so the merged global failed and every round's replies with it
            resolution=f"left out the prototype of {org}, whose direction no other holder shares (cosine "
            f"{cos:.2f} with {len(others)} other holders')"[:MAX_TEXT],
            policy=policy,
        ))
    return [(c, p) for c, p in protos if not (c.kind == "org" and c.issuer.org in lone)], conflicts


def merged_space(inputs: Sequence[Compendium]) -> EmbeddingSpace | None:
    """The one embedding space of the inputs' prototypes (None if none has any).

    Raises
    ------
    ValueError
        If inputs put their prototypes in different spaces.
    """
    spaces = {c.embedding for c in inputs if c.embedding is not None}
    if len(spaces) > 1:
        named = ", ".join(sorted(f"{s.model} ({s.dim} dims, {s.normalization})" for s in spaces))
        raise ValueError(f"cannot merge prototypes from different embedding spaces: {named}")
    return next(iter(spaces), None)


def _merge_precautions(items: Iterable[Precaution]) -> list[Precaution]:
    acc: dict[tuple[str, str], list[Precaution]] = defaultdict(list)
    for p in items:
        acc[(p.kind, normalize_text(p.text))].append(p)
    merged = [
        Precaution(
            kind=ps[0].kind,
            text=min(p.text for p in ps),
            support=_count(math.fsum(p.support for p in ps)),
            orgs=_sorted_union(p.orgs for p in ps),
        )
        for ps in acc.values()
    ]
    return _top_by_support(merged, MAX_ITEMS, key=lambda p: (p.kind, p.text))


def _merge_counts(lists: Iterable[Iterable[ToolCount]]) -> list[ToolCount]:
    acc: dict[str, list[float]] = defaultdict(list)
    for xs in lists:
        for x in xs:
            acc[x.tool].append(x.count)
    best = sorted(acc.items(), key=lambda kv: (-math.fsum(kv[1]), kv[0]))[:MAX_ITEMS]
    return sorted((ToolCount(tool=t, count=_count(math.fsum(c))) for t, c in best), key=lambda x: x.tool)


def _pick_description(descriptions: Iterable[str]) -> str:
    counts: dict[str, int] = defaultdict(int)
    for d in descriptions:
        if d:
            counts[d] += 1
    if not counts:
        return ""
    return min(counts, key=lambda d: (-counts[d], -len(d), d))


def merge_tool(
    tool_id: str,
    entries: Sequence[tuple[Compendium, ToolEntry]],
    config: MergeConfig,
    policy: str,
) -> tuple[ToolEntry, list[Conflict]]:
    """Merge one tool's entries from several artifacts, field by field."""
    when_groups = group_scenarios((s for _, e in entries for s in e.when), config.similarity)
    when = [_merged_scenario(g, None) for g in when_groups]
    by_prefer: dict[str, list[WhenNot]] = defaultdict(list)
    for _, e in entries:
        for w in e.when_not:
            by_prefer[w.prefer or ""].append(w)
    when_not = [
        _merged_scenario(g, prefer)
        for prefer in sorted(by_prefer)
        for g in group_scenarios(by_prefer[prefer], config.similarity)
    ]
    when, when_not, conflicts, precautions = resolve_scenario_conflicts(
        tool_id, when, when_not, config.similarity, policy, config.min_dissent, config.by_orgs
    )
    org_stats = [(c.issuer.org, e.stats, c.privacy.sigma) for c, e in entries if c.kind == "org"]
    rated = rate_conflict(tool_id, org_stats, config, policy)
    if rated:
        conflicts.append(rated[0])
        precautions.extend(rated[1])
    protos = [(c, e.prototype) for c, e in entries if e.prototype is not None]
    if config.by_orgs:
        protos, lone = drop_lone_prototypes(tool_id, protos, config, policy)
        conflicts.extend(lone)
    clash = prototype_conflict(tool_id, [(c.issuer.org, p) for c, p in protos if c.kind == "org"], config, policy)
    if clash:
        conflicts.append(clash)
    calls = _count(math.fsum(e.stats.calls for _, e in entries))
    successes = min(calls, _count(math.fsum(e.stats.successes for _, e in entries)))
    entry = ToolEntry(
        tool_id=tool_id,
        description=_pick_description(e.description for _, e in entries),
        when=_top_by_support(when, MAX_SCENARIOS, _when_key),
        when_not=_top_by_support(when_not, MAX_SCENARIOS, _when_not_key),
        precautions=_merge_precautions([*(p for _, e in entries for p in e.precautions), *precautions]),
        stats=ToolStats(calls=calls, successes=successes, starts=_count(math.fsum(e.stats.starts for _, e in entries))),
        confusions=_merge_counts(e.confusions for _, e in entries),
        next_tools=_merge_counts(e.next_tools for _, e in entries),
        provenance=Provenance(
            orgs=_sorted_union(e.provenance.orgs for _, e in entries),
            rounds=sorted({r for _, e in entries for r in e.provenance.rounds})[:10_000],
        ),
        prototype=merge_prototypes([p for _, p in protos]) if protos else None,
    )
    return entry, conflicts


def resolve_cross_tool_claims(
    tools: Sequence[ToolEntry], policy: str, min_dissent: float = 0.2, by_orgs: bool = False
) -> tuple[list[ToolEntry], list[Conflict]]:
    """Find scenarios that several tools claim in ``when``; demote the weak claims.

    A claim with less than ``min_dissent`` of the strongest claim's support
    (the same scenario text, another tool) is a minority: it leaves the weaker
    tool's ``when`` list, stays on that tool as a ``dissent`` precaution, and
    the disagreement is logged as a :class:`Conflict`. Claims closer than that
    are genuine ambiguity and both stay. With ``by_orgs`` the strongest claim
    is the one backed by the most orgs (several versus one, :func:`backing`),
    then by support, and a single-org claim against a claim backed by several
    is a minority whatever its support. Without this, an org that credits
    other tools' requests to the wrong tool (a mislabelled log, a poisoned
    one) hands each wrong tool phrases that only it seems to release.
    """
    claims: dict[str, list[tuple[int, Scenario]]] = defaultdict(list)
    for i, entry in enumerate(tools):
        for s in entry.when:
            claims[normalize_text(s.text)].append((i, s))
    demoted: dict[int, list[Scenario]] = defaultdict(list)
    conflicts: list[Conflict] = []
    for key in sorted(claims):
        group = claims[key]
        if len(group) < 2:
            continue
        top_i, top = max(group, key=lambda x: (*_strength(x[1], by_orgs), tools[x[0]].tool_id))
        for i, s in group:
            outvoted = by_orgs and backing(s) < backing(top)
            if i == top_i or (s.support >= min_dissent * top.support and not outvoted):
                continue
            demoted[i].append(s)
            conflicts.append(Conflict(
                tool_id=tools[i].tool_id,
                field="when",
                subject=s.text,
                claims=[Claim(view=f"when: {tools[top_i].tool_id}"[:MAX_TEXT], support=top.support, orgs=top.orgs),
                        Claim(view=f"when: {tools[i].tool_id}"[:MAX_TEXT], support=s.support, orgs=s.orgs)],
                resolution=f"kept on {tools[top_i].tool_id} by {_by(top, s, by_orgs)}; "
                "the minority claim is kept as a dissent precaution"[:MAX_TEXT],
                policy=policy,
            ))
    out = []
    for i, entry in enumerate(tools):
        if i not in demoted:
            out.append(entry)
            continue
        gone = {id(s) for s in demoted[i]}
        dissent = [Precaution(kind="dissent", support=s.support, orgs=s.orgs,
                              text=clip_words(f"other orgs ({', '.join(s.orgs)}) report it works for '{s.text}', "
                                              "which is mostly another tool's"))
                   for s in demoted[i]]
        out.append(entry.model_copy(update={
            "when": [s for s in entry.when if id(s) not in gone],
            "precautions": _merge_precautions([*entry.precautions, *dissent]),
        }))
    return out, conflicts


def check_merge_size(inputs: Sequence[tuple[str, Compendium]]) -> None:
    """Refuse, before any work, a merge whose result the schema would not accept.

    Raises
    ------
    ValueError
        Naming the count and the limit: more distinct tools than
        :data:`MAX_TOOLS`, or more organisation artifacts than :data:`MAX_INPUTS`.
    """
    tools = len({e.tool_id for _, c in inputs for e in c.tools})
    if tools > MAX_TOOLS:
        raise ValueError(f"cannot merge: the inputs hold {tools} distinct tools, a compendium at most {MAX_TOOLS}")
    leaves = len(leaf_hashes(inputs))
    if leaves > MAX_INPUTS:
        raise ValueError(f"cannot merge: {leaves} organisation artifacts, a global records at most {MAX_INPUTS}")


def merge_typed(
    compendia: Iterable[Compendium],
    config: MergeConfig = MergeConfig(),
    policy: str = TYPED,
) -> Compendium:
    """Merge typed compendia field by field, keeping disagreements as a conflict log.

    Parameters
    ----------
    compendia : iterable of Compendium
        Validated org artifacts and/or earlier global compendia.
    config : MergeConfig
        Similarity and conflict thresholds.
    policy : str
        Name recorded in the output and in each conflict.

    Raises
    ------
    ValueError
        If there is nothing to merge.
    """
    return _merge_unique(unique_inputs(compendia), config, policy)


def _merge_unique(
    hashed: list[tuple[str, Compendium]],
    config: MergeConfig,
    policy: str,
    extra: Sequence[Conflict] = (),
    recorded: Sequence[tuple[str, Compendium]] | None = None,
) -> Compendium:
    # the typed merge of de-duplicated inputs, given with their hashes in hash order; ``extra`` conflicts found
    # before the merge join the log, and ``recorded`` (default: ``hashed``) are the inputs the global names, so
    # the budget is fitted to the artifact as it is sent
    if not hashed:
        raise ValueError("nothing to merge: no compendia given")
    recorded = hashed if recorded is None else recorded
    check_merge_size(recorded)
    inputs = [c for _, c in hashed]
    space = merged_space(inputs)
    per_tool: dict[str, list[tuple[Compendium, ToolEntry]]] = defaultdict(list)
    for c in inputs:
        for e in c.tools:
            per_tool[e.tool_id].append((c, e))
    tools: list[ToolEntry] = []
    conflicts: dict[tuple, Conflict] = {}
    for c in inputs:
        for k in c.conflicts:
            conflicts[conflict_key(k)] = k
    for tool_id in sorted(per_tool):
        entry, found = merge_tool(tool_id, per_tool[tool_id], config, policy)
        tools.append(entry)
        for k in found:
            conflicts[conflict_key(k)] = k
    for k in extra:
        conflicts[conflict_key(k)] = k
    tools, found = resolve_cross_tool_claims(tools, policy, config.min_dissent, config.by_orgs)
    for k in found:
        conflicts[conflict_key(k)] = k
    logged, dropped = bounded_log(conflicts, inputs)
    return fit_wire_budget(Compendium(
        kind="global",
        issuer=Issuer(org=GLOBAL_ORG, round=max(c.issuer.round for c in inputs)),
        privacy=merge_privacy([c.privacy for c in inputs]),
        tools=tools,
        conflicts=logged,
        conflicts_dropped=dropped,
        policy=policy,
        inputs=leaf_hashes(recorded),
        orgs=input_orgs(inputs),
        embedding=space,
        votes=sum_votes([c.votes for c in inputs]),
    ))


# --------------------------------------------------------------- support-weighted


def _support_mass(c: Compendium) -> float:
    # every count the cap scales (calls, starts, supports, confusions, next tools, prototype counts), so a count
    # left out here cannot carry an org's weight past the cap
    return math.fsum(x for e in c.tools for x in entry_counts(e))


def cap_org_support(compendia: Sequence[Compendium], max_share: float) -> list[Compendium]:
    """Scale down any org artifact whose support mass exceeds ``max_share`` x the lower median.

    Global inputs are already aggregates and pass unchanged. The scaling keeps
    an org's relative preferences but bounds its weight in every sum. The
    lower median, because with two orgs the median is their mean, which a loud
    one lifts with itself (x100 kept 98% of the merged calls); with an odd
    count of orgs both are the middle one.
    """
    orgs = [c for c in compendia if c.kind == "org"]
    if len(orgs) < 2:
        return list(compendia)
    cap = max_share * statistics.median_low(_support_mass(c) for c in orgs)
    out = []
    for c in compendia:
        mass = _support_mass(c) if c.kind == "org" else 0.0
        out.append(scale_compendium(c, cap / mass) if mass > cap > 0 else c)
    return out


def merge_support_weighted(
    compendia: Iterable[Compendium], config: MergeConfig = MergeConfig()
) -> Compendium:
    """``typed`` merge after capping every org's support mass (robust to one loud org).

    Parameters
    ----------
    compendia : iterable of Compendium
        Validated artifacts.
    config : MergeConfig
        Thresholds; ``max_share`` sets the cap.

    Notes
    -----
    The recorded input hashes are those of the artifacts as received, not of
    their scaled copies.
    """
    inputs = unique_inputs(compendia)
    scaled = cap_org_support([c for _, c in inputs], config.max_share)
    # only the scaled copies are new content: hash those, the others keep their hash
    copies = {h if s is c else content_hash(s): s for (h, c), s in zip(inputs, scaled)}
    return _merge_unique(sorted(copies.items()), config, SUPPORT_WEIGHTED, recorded=inputs)


# ------------------------------------------------------------------------ robust


def merge_robust(compendia: Iterable[Compendium], config: MergeConfig = MergeConfig()) -> Compendium:
    """``typed`` merge with every org's influence bounded (see the module docstring, ``robust``).

    Parameters
    ----------
    compendia : iterable of Compendium
        Validated artifacts.
    config : MergeConfig
        Thresholds: ``max_share`` caps an org's total support mass,
        ``tool_share`` its mass on one tool, ``prototype_cosine`` and
        ``prototype_sds`` define a lone org's dissenting prototype.

    Notes
    -----
    The recorded input hashes are those of the artifacts as received, not of
    their bounded copies.
    """
    inputs = unique_inputs(compendia)
    capped = clip_tool_influence(cap_org_support([c for _, c in inputs], config.max_share), config.tool_share,
                                 config.prototype_sds)
    capped, lone = drop_pooled_dissenter(capped, config, ROBUST)
    # the pooled dissenter's conflicts join the log before it is bounded and fitted to the wire's budget
    return _merge_unique(unique_inputs(capped), replace(config, by_orgs=True), ROBUST, extra=lone, recorded=inputs)


def drop_pooled_dissenter(
    inputs: Sequence[Compendium], config: MergeConfig, policy: str
) -> tuple[list[Compendium], list[Conflict]]:
    """Leave out every prototype of the one org whose prototypes, pooled, point away from the others'.

    See :func:`~synapse_flwr.core.influence.pooled_dissenter`; one
    ``prototype`` :class:`Conflict` is logged per tool it held a prototype for.
    """
    found = pooled_dissenter(inputs, config.pooled_ratio)
    if found is None:
        return list(inputs), []
    org, cos, others = found
    counts: dict[str, list[float]] = defaultdict(list)
    for c in inputs:
        if c.kind == "org" and c.issuer.org in others:
            for e in c.tools:
                if e.prototype is not None:
                    counts[e.tool_id].append(e.prototype.count)
    out, conflicts = [], []
    for c in inputs:
        if c.kind != "org" or c.issuer.org != org:
            out.append(c)
            continue
        # its votes measured how its own experience routes: left out with it
        out.append(c.model_copy(update={"tools": [e.model_copy(update={"prototype": None}) for e in c.tools],
                                        "votes": None}))
        conflicts += [Conflict(
            tool_id=e.tool_id, field="prototype", subject="query_prototype",
            claims=[Claim(view=f"queries of {org}", support=_r(e.prototype.count), orgs=[org]),
                    Claim(view="queries of the other orgs", support=_count(math.fsum(counts[e.tool_id])),
                          orgs=others[:MAX_ORGS])],
            resolution=f"left out every prototype of {org}: pooled over all tools its prototypes agree with "
            f"those of {len(others)} other orgs at cosine {cos:.2f}"[:MAX_TEXT],
            policy=policy,
        ) for e in c.tools if e.prototype is not None and e.prototype.count > 0]
    return out, conflicts


# ----------------------------------------------------------------- flat-majority


def flatten(c: Compendium) -> FlatCompendium:
    """Render every tool of a typed compendium as one flat string."""
    return FlatCompendium(
        kind=c.kind,
        issuer=c.issuer,
        privacy=c.privacy,
        texts={e.tool_id: render_flat(e) for e in c.tools},
        policy=c.policy,
    )


def _vote_clauses(texts: Sequence[str]) -> str:
    """Union the clauses of one tool's flat strings; clashes go to the majority."""
    votes: dict[str, Counter[str]] = defaultdict(Counter)
    for text in texts:
        for clause in set(text.split(FLAT_SEPARATOR)):
            votes[flat_clause_key(clause)][clause] += 1
    kept: list[tuple[int, str]] = []
    for key, clauses in votes.items():
        if is_contested(key):
            # e.g. "use when X" against "avoid when X": the side with more orgs wins.
            best = min(clauses, key=lambda cl: (-clauses[cl], cl))
            kept.append((clauses[best], best))
        else:
            kept.extend((n, cl) for cl, n in clauses.items())
    kept.sort(key=lambda nc: (not nc[1].startswith("about:"), -nc[0], nc[1]))
    return FLAT_SEPARATOR.join(cl for _, cl in kept)


def merge_flat_majority(compendia: Iterable[Compendium | FlatCompendium]) -> FlatCompendium:
    """The untyped baseline: majority over flat strings, no conflict log.

    Parameters
    ----------
    compendia : iterable of Compendium or FlatCompendium
        Typed artifacts are flattened first.

    Raises
    ------
    ValueError
        If there is nothing to merge.
    """
    flats = [c if isinstance(c, FlatCompendium) else flatten(c) for c in checked_compendia(compendia, flat=True)]
    if not flats:
        raise ValueError("nothing to merge: no compendia given")
    by_hash = {content_hash(f): f for f in flats}
    flats = [by_hash[h] for h in sorted(by_hash)]
    per_tool: dict[str, list[str]] = defaultdict(list)
    for f in flats:
        for tool_id, text in f.texts.items():
            per_tool[tool_id].append(text)
    return FlatCompendium(
        kind="global",
        issuer=Issuer(org=GLOBAL_ORG, round=max(f.issuer.round for f in flats)),
        privacy=merge_privacy([f.privacy for f in flats]),
        texts={t: _vote_clauses(sorted(texts)) for t, texts in sorted(per_tool.items())},
        policy=FLAT_MAJORITY,
    )


POLICIES: dict[str, Callable[..., Compendium | FlatCompendium]] = {
    TYPED: merge_typed,
    SUPPORT_WEIGHTED: merge_support_weighted,
    ROBUST: merge_robust,
    FLAT_MAJORITY: merge_flat_majority,
}


def merge(compendia: Iterable[Compendium], policy: str = TYPED) -> Compendium | FlatCompendium:
    """Merge with the named policy (one of :data:`POLICIES`).

    Parameters
    ----------
    compendia : iterable of Compendium
        Validated org artifacts and/or earlier global compendia (the
        flat-majority policy also takes FlatCompendium inputs).
    policy : str
        The merge policy's name, one of :data:`POLICIES` (default: the typed merge).

    Returns
    -------
    Compendium or FlatCompendium
        The global artifact; a FlatCompendium for the flat-majority policy.

    Raises
    ------
    ValueError
        For an unknown policy name, listing the valid ones, or when there is
        nothing to merge.
    TypeError
        If ``compendia`` is not an iterable of artifacts.
    """
    try:
        fn = POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown merge policy {policy!r}; choose one of {', '.join(POLICIES)}") from None
    return fn(compendia)
