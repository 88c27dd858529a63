"""Builder: one organisation's experience -> its privatised typed compendium.

The pipeline is deterministic given a seed and never needs a network:

1. mask PII in every query (:func:`synapse_flwr.core.pii.mask_pii`);
2. count, per tool, calls and successes, the distinct queries behind each
   candidate phrase (``when`` from successes, ``when_not`` from failures and
   from events where another tool was right, with that tool as ``prefer``;
   no phrases in a private build with prototypes, ``BuildConfig.phrases``),
   confusions and next-tool transitions (:func:`count_experience`);
3. privatise the counts (Gaussian noise calibrated on the exact Gaussian curve;
   phrases and tool pairs released only above a noised threshold), see
   :mod:`synapse_flwr.core.privacy`;
4. assemble the typed entries from released values only: near-identical
   phrases grouped into scenarios, precautions derived (post-processing, so
   no extra privacy cost), optionally rewritten by an LLM;
5. with an embedder, release the query prototypes and list under ``when``
   the catalog's example requests each prototype supports
   (:mod:`synapse_flwr.core.scenarios`; post-processing again).

One event touches at most ``max_unigrams + max_bigrams + 4`` counters (calls,
successes, its phrases if released, one confusion, one transition): that bound is the
sensitivity the noise is calibrated to. With an embedder, an event also adds
``c * u`` and +1 to one tool's query prototype (:func:`release_prototypes`),
in the same release: the sensitivity is then ``sqrt(counters + 1 + c^2)``.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from numbers import Real
from pathlib import Path

import numpy as np

from synapse_flwr.core.budget import fit_wire_budget
from synapse_flwr.core.catalog import Catalog, fold_text, size_problem
from synapse_flwr.core.embed import Embedder, get_embedder
from synapse_flwr.core.experience import Event, event_label
from synapse_flwr.core.phrases import candidate_phrases, group_phrases, normalize_text
from synapse_flwr.core.pii import mask_pii
from synapse_flwr.core.privacy import (
    DEFAULT_EPSILON,
    Calibration,
    PrivacyParams,
    calibrate,
    epsilon_spent,
    noise_counts,
    select_partitions,
)
from synapse_flwr.core.prototypes import (
    encode_prototype,
    noise_prototypes,
    space_of,
    sum_prototypes,
)
from synapse_flwr.core.sanitize import instruction_like
from synapse_flwr.core.scenarios import SUPPORT_SDS, supported_requests
from synapse_flwr.core.schema import (
    MAX_ITEMS,
    MAX_SCENARIOS,
    MAX_TEXT,
    MAX_VARIANTS,
    Compendium,
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
    org_id_problem,
)
from synapse_flwr.core.sequences import (
    SequenceBounds,
    SequenceRecord,
    release_sequences,
    sequence_counts,
)
from synapse_flwr.core.votes import vote_sensitivity

# Counters an event touches besides its phrases: calls, successes, one
# confusion, one next-tool transition.
_NON_TEXT_CONTRIBUTIONS = 4
LOW_SUCCESS_RATE = 0.5
# Prototype weight c (seed-7 dev split, simulations/tune_router.py).
PROTOTYPE_WEIGHT = 8.0

Rewriter = Callable[[str, Sequence[str]], str]


@dataclass(frozen=True)
class BuildConfig:
    """Knobs of the builder.

    Parameters
    ----------
    max_unigrams, max_bigrams : int
        Phrases one query may contribute (the contribution bound).
    group_threshold : float
        Token-Jaccard similarity at which released phrases are grouped.
    max_scenarios : int
        Scenarios kept per tool and list.
    rewrite : callable or None
        Optional ``(text, variants) -> text`` applied to released scenario
        text (e.g. an LLM summariser); it only sees released data.
    events_per_record : int
        Events one private record can give rise to: 2 when an organisation
        replays its traffic (the original event and its replayed outcome),
        which doubles the phrases' share of the contribution bound the noise is
        calibrated to and quadruples the other counters' (both events may move
        the same counter, :attr:`max_contributions`).
    prototype_weight : float
        ``c``: weight of a record's unit query embedding in its tool's
        prototype sum when an embedder is given (the budget split between
        counters and prototypes, see :mod:`synapse_flwr.core.prototypes`);
        chosen on the seed-7 MetaTool split.
    phrases : bool or None
        Release ``when`` / ``when_not`` phrases. None (the default): released
        unless the build is private and carries query prototypes. Under
        privacy their 8 counters per record took 35% of the release's L2
        sensitivity for the few phrases that clear the selection threshold;
        on the seed-7 MetaTool split the budget they free is worth +0.7 seen
        points at epsilon 4 (+0.3 at 2, +0.1 at 8) through the prototypes, and
        costs the embedded demo 3.0 (more of its noisy prototypes clear the
        gate; ``docs/results/tuning/phrases``). Without privacy they cost
        nothing.
    sequences : SequenceBounds or None
        Set when the records are call sequences (one task each, see
        :mod:`synapse_flwr.core.sequences`): one record then gives up to
        ``max_tools`` events and prototypes, plus start and transition counts
        clipped to L2 norm ``sqrt(max_counters)``, of weight ``weight``; pass the records to
        :func:`build_compendium` as ``sequences``.
    vote_share : float
        Share of each record's budget kept for its fusion vote in a later
        round (:data:`synapse_flwr.core.votes.VOTE_SHARE` when the run votes,
        else 0); the release gets the rest.
    """

    max_unigrams: int = 5
    max_bigrams: int = 3
    group_threshold: float = 0.5
    max_scenarios: int = MAX_SCENARIOS
    rewrite: Rewriter | None = field(default=None, compare=False)
    events_per_record: int = 1
    prototype_weight: float = PROTOTYPE_WEIGHT
    phrases: bool | None = None
    sequences: SequenceBounds | None = None
    vote_share: float = 0.0

    def __post_init__(self) -> None:
        if self.sequences is not None and self.events_per_record != 1:
            raise ValueError("sequence records are released once: events_per_record must be 1 with sequences")

    def resolved(self, private: bool, prototypes: bool) -> BuildConfig:
        """This config with ``phrases`` decided: without them no record contributes a phrase counter."""
        release = self.phrases if self.phrases is not None else not (private and prototypes)
        if release:
            return replace(self, phrases=True)
        return replace(self, phrases=False, max_unigrams=0, max_bigrams=0)

    @property
    def record_events(self) -> int:
        """Events (hence prototypes) one private record may give rise to."""
        return self.sequences.max_tools if self.sequences else self.events_per_record

    @property
    def max_contributions(self) -> int:
        """Squared L2 norm of what one private record adds to the counters (at least its L0 sensitivity).

        Each of its events moves its phrase counters and 4 others by +1. A
        phrase counts once per tool and query, so a record adds at most one
        per phrase slot and event. A sequence record's events are calls of
        distinct tools, so its other counters differ too; but an event and its
        replayed outcome (``events_per_record`` 2, both misroutes onto one
        tool) may move the same call, confusion and transition counters twice
        each: ``E^2`` per slot.
        """
        events, repeats = self.record_events, self.events_per_record
        return (self.max_unigrams + self.max_bigrams) * events + _NON_TEXT_CONTRIBUTIONS * events * repeats

    def privacy_params(self, epsilon: float, delta: float, rounds: int, weight: float) -> PrivacyParams:
        """The contribution bound of one record under this config (``weight``: prototype ``c`` or 0)."""
        seq = self.sequences
        return PrivacyParams(
            epsilon=epsilon, delta=delta, rounds=rounds, max_contributions=self.max_contributions,
            # a replayed outcome keeps its record's label, so a record's E events add E unit
            # vectors to ONE tool's prototype: squared norm E^2 (1 + c^2), not E (1 + c^2)
            prototype_weight=weight, prototypes_per_record=self.record_events if seq else self.events_per_record**2,
            sequence_counters=seq.max_counters if seq else 0, sequence_weight=seq.weight if seq else 0.0,
            vote_share=self.vote_share,
        )


@dataclass
class ExperienceCounts:
    """Exact counts of one organisation's experience (never leaves the org).

    Parameters
    ----------
    calls, successes : Counter
        Per tool.
    when : Counter
        ``(tool, phrase)`` -> distinct supporting queries.
    when_not : Counter
        ``(tool, phrase, prefer)`` -> distinct supporting queries; ``prefer``
        is ``""`` when the right tool is unknown.
    confusions : Counter
        ``(called tool, right tool)`` -> events.
    transitions : Counter
        ``(previous tool, tool)`` -> events.
    """

    calls: Counter = field(default_factory=Counter)
    successes: Counter = field(default_factory=Counter)
    when: Counter = field(default_factory=Counter)
    when_not: Counter = field(default_factory=Counter)
    confusions: Counter = field(default_factory=Counter)
    transitions: Counter = field(default_factory=Counter)


def count_experience(events: Iterable[Event], config: BuildConfig = BuildConfig()) -> ExperienceCounts:
    """Count an experience log, bounding every event's contribution.

    Parameters
    ----------
    events : iterable of Event
        Normalised events.
    config : BuildConfig
        Contribution bounds.
    """
    counts = ExperienceCounts()
    seen: set[tuple[str, str, str, str]] = set()
    for ev in events:
        counts.calls[ev.tool] += 1
        right = ev.gold if ev.gold and ev.gold != ev.tool else None
        ok = ev.success and right is None
        if ok:
            counts.successes[ev.tool] += 1
        if right:
            counts.confusions[(ev.tool, right)] += 1
        if ev.prev_tool:
            counts.transitions[(ev.prev_tool, ev.tool)] += 1
        masked = mask_pii(ev.query)
        key = (ev.tool, "when" if ok else "not", right or "", normalize_text(masked))
        if key in seen:  # distinct queries: a repeated query adds no phrase support
            continue
        seen.add(key)
        for phrase in candidate_phrases(masked, config.max_unigrams, config.max_bigrams):
            if ok:
                counts.when[(ev.tool, phrase)] += 1
            else:
                counts.when_not[(ev.tool, phrase, right or "")] += 1
    return counts


@dataclass(frozen=True)
class ReleasedCounts:
    """The privatised counts: all that the artifact is assembled from."""

    calls: dict[str, float]
    successes: dict[str, float]
    when: dict[tuple[str, str], float]
    when_not: dict[tuple[str, str, str], float]
    confusions: dict[tuple[str, str], float]
    transitions: dict[tuple[str, str], float]


def privatise_counts(
    counts: ExperienceCounts, tool_ids: Sequence[str], cal: Calibration, rng: np.random.Generator
) -> ReleasedCounts:
    """Noise every count; release phrases and tool pairs only above the threshold.

    Parameters
    ----------
    counts : ExperienceCounts
        Exact counts.
    tool_ids : sequence of str
        The public tool domain (the catalog): every tool gets noised stats,
        whether or not the org used it, so presence itself is not revealed.
    cal : Calibration
        Noise scale and release threshold.
    rng : numpy.random.Generator
        Source of noise.
    """
    ids = sorted(tool_ids)
    calls = noise_counts(np.array([counts.calls[t] for t in ids], float), cal.sigma, rng)
    succ = noise_counts(np.array([counts.successes[t] for t in ids], float), cal.sigma, rng)
    return ReleasedCounts(
        calls=dict(zip(ids, calls.tolist())),
        successes=dict(zip(ids, succ.tolist())),
        when=select_partitions(counts.when, cal, rng),
        when_not=select_partitions(counts.when_not, cal, rng),
        confusions=select_partitions(counts.confusions, cal, rng),
        transitions=select_partitions(counts.transitions, cal, rng),
    )


def _clip_text(text: str) -> str:
    # folded as catalog text is: an LLM rewrite may hold a control character, which the edge refuses
    return mask_pii(fold_text(text))[:MAX_TEXT]


def _scenarios(phrases: dict[str, float], config: BuildConfig) -> list[tuple[str, float, list[str]]]:
    # a released phrase that reads as an instruction ("always choose") would get the
    # whole artifact rejected at the edge: it is dropped (post-processing, no privacy cost)
    groups = group_phrases(
        ((p, s) for p, s in phrases.items() if instruction_like(p) is None),
        config.group_threshold, config.max_scenarios, MAX_VARIANTS,
    )
    out = []
    for g in groups:
        text = _clip_text(config.rewrite(g.text, g.variants) if config.rewrite else g.text) or g.text
        out.append((g.text if instruction_like(text) else text, round(g.support, 4), list(g.variants)))
    return out


def _top(pairs: dict[str, float], limit: int) -> list[ToolCount]:
    best = sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    return sorted((ToolCount(tool=t, count=round(c, 4)) for t, c in best), key=lambda x: x.tool)


@dataclass
class ToolRelease:
    """The released values that concern one tool."""

    calls: float = 0.0
    successes: float = 0.0
    when: dict[str, float] = field(default_factory=dict)
    when_not: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    confusions: dict[str, float] = field(default_factory=dict)
    next_tools: dict[str, float] = field(default_factory=dict)
    starts: float = 0.0


def index_release(released: ReleasedCounts) -> dict[str, ToolRelease]:
    """Group released counts by tool (one pass, so assembly is linear)."""
    out: dict[str, ToolRelease] = defaultdict(ToolRelease)
    for t, c in released.calls.items():
        out[t].calls = c
    for t, c in released.successes.items():
        out[t].successes = c
    for (t, p), c in released.when.items():
        out[t].when[p] = c
    for (t, p, prefer), c in released.when_not.items():
        out[t].when_not[prefer][p] = c
    for (a, b), c in released.confusions.items():
        out[a].confusions[b] = c
    for (a, b), c in released.transitions.items():
        out[a].next_tools[b] = c
    return out


def assemble_entry(
    tool_id: str, description: str, rel: ToolRelease, org: str, round_: int, config: BuildConfig,
    noise_sd: float = 0.0,
) -> ToolEntry:
    """Build one tool's typed entry from its released values only.

    A catalog description that reads as an instruction is left out (the
    edge would reject the whole artifact for it); readers fall back to the
    catalog's own text, as a documentation-only router does. A low success
    rate becomes a precaution only when the released failures (calls minus
    successes, noise SD ``sqrt(2) * noise_sd``) clear :data:`SUPPORT_SDS` of
    their noise: a reader is not told that a tool fails on the noise alone.
    """
    orgs = [org]
    description = "" if instruction_like(description) else description
    when = [
        Scenario(text=t, support=s, variants=v, orgs=orgs)
        for t, s, v in _scenarios(rel.when, config)
    ]
    when_not = [
        WhenNot(text=t, support=s, variants=v, orgs=orgs, prefer=prefer or None)
        for prefer, phrases in sorted(rel.when_not.items())
        for t, s, v in _scenarios(phrases, config)
    ]
    when_not = sorted(when_not, key=lambda w: (-w.support, w.text, w.prefer or ""))
    when_not = sorted(when_not[: config.max_scenarios], key=lambda w: (w.text, w.prefer or ""))
    stats = ToolStats(calls=round(rel.calls, 4), successes=round(min(rel.successes, rel.calls), 4),
                      starts=round(rel.starts, 4))
    precautions = [
        Precaution(
            kind="failure_mode",
            text=_clip_text(f"failed for requests about '{w.text}'"),
            support=w.support,
            orgs=orgs,
        )
        for w in when_not
        if w.prefer is None
    ]
    rate = stats.success_rate
    failures = stats.calls - stats.successes
    if rate is not None and rate < LOW_SUCCESS_RATE and stats.calls >= 1.0 \
            and failures > SUPPORT_SDS * math.sqrt(2) * noise_sd:
        precautions.append(
            Precaution(
                kind="low_success",
                text=f"succeeded in {rate:.0%} of about {stats.calls:.0f} calls",
                support=stats.calls,
                orgs=orgs,
            )
        )
    precautions = sorted(precautions, key=lambda p: (-p.support, p.kind, p.text))[:MAX_ITEMS]
    has_experience = bool(when or when_not or rel.confusions or rel.next_tools or rel.starts)
    return ToolEntry(
        tool_id=tool_id,
        description=description,
        when=sorted(when, key=lambda s: s.text),
        when_not=when_not,
        precautions=sorted(precautions, key=lambda p: (p.kind, p.text)),
        stats=stats,
        confusions=_top(rel.confusions, MAX_ITEMS),
        next_tools=_top(rel.next_tools, MAX_ITEMS),
        provenance=Provenance(
            orgs=orgs if has_experience else [], rounds=[round_] if has_experience else []
        ),
    )


def release_prototypes(
    events: Sequence[Event],
    catalog: Catalog,
    embedder: Embedder,
    cal: Calibration,
    weight: float,
    rng: np.random.Generator,
) -> dict[str, Prototype]:
    """Noised query prototypes of the catalog's tools (part of the same Gaussian release).

    Each event with a label (:func:`~synapse_flwr.core.experience.event_label`)
    adds its PII-masked query's unit embedding to that tool's sum; ``cal.sigma``
    must be calibrated to :func:`~synapse_flwr.core.prototypes.prototype_sensitivity`.
    Privately every catalog tool gets a prototype (presence is not revealed);
    without noise only the tools with experience do.
    """
    labels = [event_label(ev, catalog) for ev in events]
    texts = [mask_pii(ev.query) for ev, y in zip(events, labels) if y is not None]
    vectors = np.asarray(embedder.encode(texts), np.float64) if texts else np.zeros((0, embedder.dim))
    ids = sorted(catalog.ids)
    sums, counts = sum_prototypes([y for y in labels if y is not None], vectors, ids)
    noised, noised_counts = noise_prototypes(sums, counts, weight, cal.sigma, rng)
    return {
        t: encode_prototype(noised[i], float(noised_counts[i]), cal.sigma / weight, cal.sigma)
        for i, t in enumerate(ids)
        if cal.sigma > 0 or counts[i] > 0
    }


def with_supported_requests(
    entries: Sequence[ToolEntry], catalog: Catalog, embedder: Embedder, org: str, round_: int
) -> list[ToolEntry]:
    """Entries whose ``when`` also lists the example requests their released prototype supports.

    Post-processing of the prototype release (:mod:`synapse_flwr.core.scenarios`):
    readable scenarios at no privacy cost. A request already listed (a
    released phrase equal to it) is not listed twice.
    """
    docs = {d.tool_id: [x for x in d.examples if instruction_like(x) is None] for d in catalog.tools}
    texts = [x for e in entries for x in docs.get(e.tool_id, [])]
    if not texts:
        return list(entries)
    # float64, not embed.l2_normalize's float32: supports are sums over many queries
    vectors = np.asarray(embedder.encode(texts), np.float64)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    out, start = [], 0
    for entry in entries:
        requests = docs.get(entry.tool_id, [])
        supported = supported_requests(entry.prototype, requests, vectors[start:start + len(requests)])
        start += len(requests)
        listed = {s.text for s in entry.when}
        extra = [Scenario(text=r, support=round(s, 4), orgs=[org]) for r, s in supported if r not in listed]
        if not extra:
            out.append(entry)
            continue
        when = sorted([*entry.when, *extra], key=lambda s: s.text)[:MAX_SCENARIOS]
        provenance = Provenance(orgs=[org], rounds=[round_])
        out.append(entry.model_copy(update={"when": when, "provenance": provenance}))
    return out


def vote_noise(epsilon: float, delta: float, rounds: int, releases: int, config: BuildConfig,
               embedder: Embedder | None) -> tuple[float, float | None]:
    """Noise SD of one org's fusion vote sums, and the epsilon of a record's releases with its vote.

    The budget is the one :func:`build_compendium` calibrates with the same
    arguments (``config.vote_share`` of it kept for the vote,
    :mod:`synapse_flwr.core.votes`). Without privacy: ``(0.0, None)``.
    """
    if not math.isfinite(epsilon):
        return 0.0, None
    _, params, cal = calibrated(config, epsilon, delta, rounds, embedder is not None)
    return _vote_noise_after(params, cal, releases)


def calibrated(config: BuildConfig, epsilon: float, delta: float, rounds: int,
               prototypes: bool) -> tuple[BuildConfig, PrivacyParams, Calibration]:
    """The resolved config, budget and calibration :func:`build_compendium` releases under.

    Parameters
    ----------
    config : BuildConfig
        The builder's config.
    epsilon, delta : float
        The budget per record (``math.inf``: privacy off).
    rounds : int
        Releases a record's budget covers.
    prototypes : bool
        Whether the build releases query prototypes (it has an embedder).

    Returns
    -------
    tuple
        ``(config with phrases decided, PrivacyParams, Calibration)``.
    """
    weight = config.prototype_weight if prototypes else 0.0
    config = config.resolved(math.isfinite(epsilon), prototypes)
    params = config.privacy_params(epsilon, delta, rounds, weight)
    return config, params, calibrate(params)


def _vote_noise_after(params: PrivacyParams, cal: Calibration, releases: int) -> tuple[float, float]:
    """The vote sums' noise SD, and the epsilon of ``releases`` releases with the vote."""
    return cal.vote_multiplier * vote_sensitivity(), epsilon_spent(params, cal, releases, voted=True)


def artifact_vote_noise(privacy: PrivacyBlock, releases: int | None = None) -> tuple[float, float | None]:
    """:func:`vote_noise` of an artifact built with the default :class:`BuildConfig` (``synapse build``).

    The budget, rounds, vote share and prototype weight are read from the
    artifact's privacy block. The calibration they give must be the block's
    own (else the artifact was built under other settings, whose vote noise
    cannot be known from it), and the releases made so far are those whose
    epsilon is the block's, unless given.

    Parameters
    ----------
    privacy : PrivacyBlock
        The privacy block of the artifact whose records vote.
    releases : int or None
        Releases the voting records have taken part in, when known (a release
        cache counts them: its artifact's block may hold the epsilon of
        earlier records that voted already); None: read off the block's epsilon.

    Raises
    ------
    ValueError
        With the reason: no share of the budget was kept for a vote, the
        calibration is not the default build's, or its epsilon is no number
        of releases'.
    """
    if privacy.mechanism == "none":
        return 0.0, None
    if privacy.vote_share <= 0:
        raise ValueError("it was built without a share of its budget kept for a vote (build --no-votes): "
                         "its records cannot vote")
    _, params, cal = calibrated(BuildConfig(vote_share=privacy.vote_share), privacy.epsilon_target,
                                privacy.delta, privacy.rounds_planned, privacy.prototype_weight > 0)
    # the block stores sigma at 6 decimals: at a large epsilon (sigma 0.019) that rounding alone passed rel_tol
    if not math.isclose(cal.sigma, privacy.sigma, rel_tol=1e-5, abs_tol=1e-6):
        raise ValueError(f"its noise (sigma {privacy.sigma:g}) is not what the default build gives for its budget "
                         f"({cal.sigma:g}): it was built under other settings, whose vote noise is not known")
    if releases is not None:
        return _vote_noise_after(params, cal, releases)
    matching = [r for r in range(1, params.rounds + 1)
                if math.isclose(epsilon_spent(params, cal, r), privacy.epsilon or 0.0, abs_tol=1e-5)]
    if not matching:
        raise ValueError(f"its spent epsilon {privacy.epsilon} matches no number of releases of its budget")
    return _vote_noise_after(params, cal, matching[0])


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from any parts (e.g. run seed, org, round)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def window_seed(seed: int, windows_before: int) -> int:
    """The noise seed of a release window: ``seed`` for an organisation's first, a derived one for each later one.

    A seeded release cache builds its windows with one seed and one round;
    the same noise in two windows would cancel in the difference of their
    artifacts and show the new records' exact counts.
    """
    return seed if windows_before == 0 else derive_seed(seed, "window", windows_before)


def add_sequences(per_tool: dict[str, ToolRelease], sequences: Sequence[SequenceRecord], bounds: SequenceBounds,
                  tool_ids: Sequence[str], sigma: float, rng: np.random.Generator) -> None:
    """Release the records' start and transition counts into ``per_tool`` (in place), noised at ``sigma``."""
    starts, pairs = release_sequences(*sequence_counts(sequences, bounds), tool_ids, sigma, bounds.weight, rng,
                                      bounds.floor_sds)
    for tool, count in starts.items():
        per_tool[tool].starts = count
    for (a, b), count in pairs.items():
        per_tool[a].next_tools[b] = per_tool[a].next_tools.get(b, 0.0) + count


def privacy_block(params: PrivacyParams, cal: Calibration, config: BuildConfig, releases: int,
                  weight: float) -> PrivacyBlock:
    """The artifact's privacy block: the mechanism, its calibration and the budget spent after ``releases``."""
    private = math.isfinite(params.epsilon)
    return PrivacyBlock(
        mechanism="gaussian" if private else "none",
        clip=round(params.l2_sensitivity, 6),
        sigma=round(cal.sigma, 6),
        noise_multiplier=round(cal.noise_multiplier, 6),
        epsilon=round(epsilon_spent(params, cal, releases), 6) if private else None,
        epsilon_target=params.epsilon if private else None,
        delta=params.delta if private else 0.0,
        rounds_planned=params.rounds,
        threshold=round(cal.threshold, 6),
        text_policy="pii-masked+dp-partition-selection" if private else "pii-masked",
        prototype_weight=weight,
        sequence_weight=config.sequences.weight if config.sequences else 0.0,
        vote_share=config.vote_share if private else 0.0,
    )


def _checked_events(events: Iterable[Event], catalog: Catalog, org: str) -> list[Event]:
    """``events`` as a list, after the checks :func:`build_compendium` makes before any work.

    Parameters
    ----------
    events : iterable of Event
        The org's experience.
    catalog : Catalog
        The tools the events' names must be ids of.
    org : str
        The organisation id.

    Returns
    -------
    list of Event
        The events.

    Raises
    ------
    TypeError
        ``events`` is not an iterable of Event or ``catalog`` is not a Catalog.
    ValueError
        ``org`` is no valid organisation id, or an event names a tool (called,
        gold or previous) unknown to ``catalog``.
    """
    hint = "load a log with load_experience(path, catalog)"
    if isinstance(events, (str, bytes, Path)) or not isinstance(events, Iterable):
        raise TypeError(f"events must be Event objects ({hint}), got {type(events).__name__}")
    if not isinstance(catalog, Catalog):
        raise TypeError(f"catalog must be a Catalog (load it with load_catalog(path)), got {type(catalog).__name__}")
    if not isinstance(org, str) or (problem := org_id_problem(org)):
        # checked here, not by validate: an artifact issued as a reserved org (global, server) is built, then refused
        reason = problem if isinstance(org, str) else "it must be a string"
        raise ValueError(f"org {org!r} is not a valid organisation id: {reason}")
    if too_large := size_problem(catalog):
        raise ValueError(too_large)
    events = list(events)
    wrong = next((ev for ev in events if not isinstance(ev, Event)), None)
    if wrong is not None:
        raise TypeError(f"events must be Event objects ({hint}), got {type(wrong).__name__}")
    known = set(catalog.ids)
    # unknown names were dropped silently: their counts have no catalog tool to go to
    bad = [ev for ev in events if any(n is not None and n not in known for n in (ev.tool, ev.gold, ev.prev_tool))]
    if bad:
        names = sorted({n for ev in bad for n in (ev.tool, ev.gold, ev.prev_tool) if n is not None and n not in known})
        shown = ", ".join(map(repr, names[:5])) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise ValueError(f"{len(bad)} of {len(events)} events name tools the catalog does not know ({shown}): "
                         f"{hint}, which resolves names and aliases to catalog ids")
    return events


def build_compendium(
    events: Iterable[Event],
    catalog: Catalog,
    org: str,
    *,
    round_: int = 0,
    epsilon: float = DEFAULT_EPSILON,
    delta: float = 1e-5,
    rounds: int = 1,
    releases: int = 1,
    seed: int | None = None,
    config: BuildConfig = BuildConfig(),
    embedder: Embedder | str | None = None,
    sequences: Sequence[SequenceRecord] | None = None,
) -> Compendium:
    """Turn one organisation's experience into its privatised typed compendium.

    Parameters
    ----------
    events : iterable of Event
        The org's experience, tool names resolved against ``catalog``
        (``load_experience(path, catalog)`` resolves them): every event's
        ``tool``, and ``gold`` when set, must be an id of ``catalog``.
    catalog : Catalog
        The tools (their descriptions are copied into the entries).
    org : str
        Organisation id written into the issuer block: it must match
        :data:`~synapse_flwr.core.schema.ORG_ID_RULE` and not be one of
        :data:`~synapse_flwr.core.schema.RESERVED_ORGS`.
    round_ : int
        Federation round written into the issuer block (0: a standalone build);
        it also seeds the noise.
    epsilon, delta : float
        Target privacy budget per record over ``rounds`` releases (default
        :data:`~synapse_flwr.core.privacy.DEFAULT_EPSILON`, 4.0);
        ``epsilon=math.inf`` turns privacy off (exact counts: the
        centralised-equivalent artifact).
    rounds : int
        Releases one record may take part in over the run (1 when each record
        is released once, :mod:`synapse_flwr.core.release`; the run's rounds
        when its replayed outcomes are released every round).
    releases : int
        Releases any one record has taken part in so far, this one included:
        the reported epsilon is the budget spent by then.
    seed : int or None
        Seed of the noise (combined with org and round). None (the default)
        draws a secret seed that is never written down, so the noise cannot
        be reproduced and subtracted; pass a seed only for reproducible
        experiments, never for a release whose privacy matters.
    config : BuildConfig
        Builder knobs.
    embedder : Embedder, str or None
        When given, every tool also gets a query prototype in this embedder's
        space, released with weight ``config.prototype_weight`` in the same
        Gaussian release (the sensitivity grows accordingly). A string is an
        embedder's short name (e.g. ``"minilm"``), built with
        :func:`~synapse_flwr.core.embed.get_embedder`.
    sequences : sequence of SequenceRecord or None
        The call sequences behind ``events`` (one private record each, with
        ``events`` their :func:`~synapse_flwr.core.sequences.record_events`):
        their start and transition counts are released in the same Gaussian
        release, bounded by ``config.sequences``.

    Returns
    -------
    Compendium
        The org's artifact (``kind="org"``), fitted to the wire budget.

    Raises
    ------
    TypeError
        ``events`` is not an iterable of Event (a path, a string, dicts),
        ``catalog`` is not a Catalog, or ``epsilon`` or ``delta`` is not a
        number (``"4"``).
    ValueError
        ``org`` is no valid organisation id; an event names a tool (called,
        gold or previous) that ``catalog`` does not know; ``releases > rounds``; ``sequences``
        given without sequence bounds or the other way round.
    """
    events = _checked_events(events, catalog, org)
    for name, value, hint in (("epsilon", epsilon, "math.inf: no privacy"), ("delta", delta, "e.g. 1e-5")):
        if isinstance(value, bool) or not isinstance(value, Real):  # the ranges are PrivacyParams' to check
            raise TypeError(f"{name} must be a number ({hint}), got {value!r} ({type(value).__name__})")
    if isinstance(embedder, str):  # a short name, as Router accepts it
        embedder = get_embedder(embedder)
    if seed is None:  # secret: a reproducible seed would let anyone regenerate and remove the noise
        seed = secrets.randbits(63)
    if releases > rounds:
        raise ValueError(f"release {releases} exceeds the {rounds} releases the privacy budget covers")
    if (sequences is None) != (config.sequences is None):
        raise ValueError("pass sequences exactly when the config has sequence bounds")
    config, params, cal = calibrated(config, epsilon, delta, rounds, embedder is not None)
    weight = params.prototype_weight
    rng = np.random.default_rng(derive_seed(seed, org, round_))
    released = privatise_counts(count_experience(events, config), catalog.ids, cal, rng)
    per_tool = index_release(released)
    if sequences is not None and config.sequences is not None:
        add_sequences(per_tool, sequences, config.sequences, catalog.ids, cal.sigma,
                      np.random.default_rng(derive_seed(seed, org, round_, "sequences")))
    entries = [
        assemble_entry(doc.tool_id, doc.description, per_tool[doc.tool_id], org, round_, config, cal.sigma)
        for doc in catalog.tools
    ]
    if embedder is not None:
        protos = release_prototypes(events, catalog, embedder, cal, weight,
                                    np.random.default_rng(derive_seed(seed, org, round_, "prototypes")))
        entries = [e.model_copy(update={"prototype": protos.get(e.tool_id)}) for e in entries]
        entries = with_supported_requests(entries, catalog, embedder, org, round_)
    return fit_wire_budget(Compendium(
        kind="org",
        issuer=Issuer(org=org, round=round_),
        privacy=privacy_block(params, cal, config, releases, weight),
        tools=sorted(entries, key=lambda e: e.tool_id),
        embedding=space_of(embedder) if embedder is not None else None,
    ))
