"""Release-once: each private record is released in one window, then re-sent.

An organisation's experience grows. A window is released on a schedule that
does not look at the data (the caller's ``due``): it holds the records not
released before (with the full per-record budget), noise alone when there are
none, and is combined with the earlier releases; a round in which no window
is due re-sends the cached release. Whether records arrived must not decide
whether a window goes out: the artifact would change exactly when one did,
and that bit is no DP release. Windows hold disjoint records, so they compose
in parallel: the per-record guarantee over the whole run is the one of a
single window (docs/privacy.md). Re-sending and combining released artifacts
is post-processing and costs nothing.

A record is identified by the content of its event and its occurrence among
identical events (:func:`record_keys`); an outcome derived from a record later
(a replayed event) is released under a key of its own but counts as that
record, which the caller accounts for by calibrating for that many releases.

The catalog may change between releases (a tool added, removed or documented
anew): it shapes no record's calibration, so it is not part of the settings a
cache belongs to; what is sent always carries today's catalog
(:func:`with_catalog`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from synapse_flwr.core.builder import BuildConfig
from synapse_flwr.core.catalog import Catalog
from synapse_flwr.core.embed import Embedder
from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.experience import Event, event_label, load_experience
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.pii import mask_pii
from synapse_flwr.core.router import Router
from synapse_flwr.core.sanitize import instruction_like
from synapse_flwr.core.schema import (
    SCHEMA_VERSION,
    Compendium,
    FusionVotes,
    Issuer,
    ToolEntry,
)
from synapse_flwr.core.votes import (
    SETTINGS,
    VOTE_SHARE,
    loo_correct,
    release_votes,
    sum_votes,
)
from synapse_flwr.core.wire import Artifact, content_hash

log = logging.getLogger(__name__)


class ReleaseState(BaseModel):
    """What an organisation has released so far (kept on its own disk, never sent).

    Parameters
    ----------
    fingerprint : str
        The settings the releases were made under (dataset, budget, builder);
        a cache with another fingerprint belongs to another run.
    settings : dict of str to str
        Those settings by name (:func:`release_settings`), to tell a refused
        run which of them differ.
    released : list of str
        Keys of the records already released, sorted.
    windows : int
        Windows released so far (with records or noise alone).
    artifact : Compendium or None
        The combined release, re-sent in the rounds in which no window is due.
    voted : list of str
        Keys of the records whose fusion vote was released, sorted
        (:mod:`synapse_flwr.core.votes`: one vote per record).
    no_vote : list of str
        Keys of the records released privately without a share of their
        budget kept for a vote (a run planned for one round, resumed with
        more), sorted: they never vote.
    run : str
        The Flower run of the latest window ('' outside Flower): a window is
        due in the first round of another run.
    window_round : int
        The server round of the latest window (0: none): with replay a round
        that runs again after a crash does not release a second one.
    votes_due : bool
        A window went out whose records' votes have not: the next vote is
        released even when none of them can vote (noise alone), since its
        absence would say that the window held no labelled record.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    fingerprint: str
    settings: dict[str, str] = Field(default_factory=dict)
    released: list[str] = Field(default_factory=list)
    windows: int = Field(default=0, ge=0)
    artifact: Compendium | None = None
    voted: list[str] = Field(default_factory=list)
    no_vote: list[str] = Field(default_factory=list)
    run: str = ""
    window_round: int = Field(default=0, ge=0)
    votes_due: bool = False


class ReleaseCacheError(SynapseError):
    """A release cache that cannot be the organisation's ledger: unreadable, or made under other settings."""


#: How a cache names its records (:func:`logged_keys`); a cache that named them otherwise is another ledger.
RECORD_KEYS = "as logged"


def release_settings(org: str, named: Mapping[str, object]) -> dict[str, str]:
    """The settings a release cache belongs to, by name: ``org``, ``named``, the builder, the schema and the keys.

    A cache made under other settings belongs to another run (its records
    were released under another calibration, or into another space). The
    catalog is not one of them: one record adds to one tool whatever the
    catalog holds, and :func:`with_catalog` brings a cached release up to date.
    """
    # the vote share's constant too: records released under one share must not vote at another's noise
    return {"org": org, **{k: str(v) for k, v in named.items()},
            "builder": f"{BuildConfig()!r} vote share {VOTE_SHARE}", "schema": SCHEMA_VERSION,
            "record_keys": RECORD_KEYS}


def settings_fingerprint(settings: Mapping[str, str]) -> str:
    """A short hash of :func:`release_settings`."""
    return hashlib.sha256(json.dumps(dict(settings), sort_keys=True).encode()).hexdigest()[:32]


def load_release_state(path: Path, settings: Mapping[str, str], pinned: bool = False) -> ReleaseState:
    """The cached releases at ``path``, or a fresh state when there is none for these settings.

    ``pinned``: the organisation chose the cache's place, so the cache is its
    ledger across runs. A pinned cache made under other settings, or
    unreadable, is then refused rather than replaced: another run would
    release the same records again, and only the organisation may allow that
    (by moving the cache). Unpinned, the run's settings decide and a fresh
    state starts.

    Raises
    ------
    ReleaseCacheError
        For a pinned cache that is unreadable or made under other settings
        (naming those that differ).
    """
    fresh = ReleaseState(fingerprint=settings_fingerprint(settings), settings=dict(settings))
    try:
        state = read_release_state(path)
    except FileNotFoundError:
        return fresh
    except ReleaseCacheError as exc:
        problem = str(exc)
    else:
        if state.fingerprint == fresh.fingerprint:
            return state
        problem = f"release cache {path} was made under other settings ({_differences(state.settings, settings)})"
    if pinned:
        raise ReleaseCacheError(f"{problem}; releasing its records again would spend their budget again: move the "
                                "cache away to allow it")
    log.warning("%s; starting a new one", problem)
    return fresh


def read_release_state(path: Path) -> ReleaseState:
    """The release cache at ``path``.

    Raises
    ------
    FileNotFoundError
        When there is none.
    ReleaseCacheError
        When it cannot be read as a cache (the first reason, in one line).
    """
    try:
        return ReleaseState.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        reason = f"{first['msg']}{f' at {where}' if where else ''}"
    except FileNotFoundError:
        raise
    except OSError as exc:
        reason = exc.strerror or str(exc)
    raise ReleaseCacheError(f"release cache {path} is unreadable ({reason})")


def _differences(cached: Mapping[str, str], now: Mapping[str, str]) -> str:
    # what a refused run is told: each differing setting, cached value first
    if not cached:
        return "another run; this cache does not record its settings"
    names = [k for k in {**cached, **now} if cached.get(k) != now.get(k)]
    shown = [f"{k}: {cached.get(k, '-')} in the cache, {now.get(k, '-')} now" for k in names if k != "builder"]
    if "builder" in names:
        shown.append("the builder's constants (another version of synapse-flwr)")
    return "; ".join(shown) or "another run"


#: Mode of an organisation's own files (the release cache, the last artifact it sent): its account only.
PRIVATE_FILE_MODE = 0o600


def save_release_state(path: Path, state: ReleaseState) -> Path:
    """Write the cache atomically (before the release leaves: a crash never makes a record go out twice).

    Readable by its owner only (:data:`PRIVATE_FILE_MODE`): it lists which
    records were released and holds the last artifact.
    """
    return write_atomic(path, state.model_dump_json(), mode=PRIVATE_FILE_MODE)


def without_votes(before: ReleaseState, after: ReleaseState) -> ReleaseState:
    """``after`` with the records released since ``before`` marked as never voting (no vote share kept)."""
    fresh = set(after.released) - set(before.released)
    return after.model_copy(update={"no_vote": sorted(set(after.no_vote) | fresh)}) if fresh else after


def may_vote(state: ReleaseState, keys: Sequence[str]) -> list[bool]:
    """Per record key: released before and neither voted nor released without a vote share."""
    done, skip = set(state.released), set(state.voted) | set(state.no_vote)
    return [k in done and k not in skip for k in keys]


def record_keys(events: Sequence[Event]) -> list[str]:
    """A stable key per event: a hash of its content and its occurrence among identical events."""
    seen: Counter[str] = Counter()
    keys = []
    for event in events:
        digest = hashlib.sha256(event.model_dump_json().encode()).hexdigest()[:32]
        keys.append(f"{digest}.{seen[digest]}")
        seen[digest] += 1
    return keys


def logged_keys(path: Path) -> list[str]:
    """:func:`record_keys` of the log at ``path`` with its tool names as logged, not as a catalog resolves them.

    A catalog may rename a tool and keep the old name as an alias: the log
    still loads, but keys of the resolved events would change, and a release
    cache would release those records again. Aligned with the events of
    ``load_experience(path, catalog)`` (one per record read, in order: both
    skip the same records, :data:`~synapse_flwr.core.experience.NO_WORDS`); for a log that
    names tools by their ids the keys are those of the resolved events.
    """
    return record_keys(load_experience(path, warn=False))


def combine(previous: Compendium, window: Compendium) -> Compendium:
    """One organisation's combined release: its earlier release and a new window.

    Counts, supports, prototype sums and fusion votes add up (the typed
    merge's field-wise sums); the result is the organisation's artifact with
    the window's issuer, the looser privacy block and the window's embedding space (every window is calibrated alike, in
    the federation's one space). The merge's conflict
    log is dropped: disagreements between one organisation's own windows are
    not disagreements between organisations.
    """
    merged = merge_typed([previous, window])
    # a record that voted spent its vote share too: the loosest of the two blocks
    privacy = max(previous.privacy, window.privacy, key=lambda p: p.epsilon or 0.0)
    return Compendium(kind="org", issuer=window.issuer, privacy=privacy, tools=merged.tools,
                      embedding=window.embedding, votes=merged.votes)


def with_catalog(artifact: Compendium, catalog: Catalog) -> Compendium:
    """``artifact`` as today's catalog documents it: public text renewed, renamed tools renamed, removed ones left out.

    A cached release was made under the catalog of its day. Documentation is
    public, so renewing it from the catalog, following a tool's rename (its
    old id now an alias of the new one, which has no entry yet) and leaving
    out what concerns a tool the catalog no longer lists is post-processing:
    no record is released again. A tool the catalog gained has no entry until
    a window releases one; routers read its documentation meanwhile.
    """
    held = {e.tool_id for e in artifact.tools}

    def current(tool_id: str) -> str | None:
        new = catalog.resolve(tool_id)
        return new if new == tool_id or (new is not None and new not in held) else None

    docs = catalog.descriptions()
    tools = sorted((_documented(e, new, current, docs[new]) for e in artifact.tools if (new := current(e.tool_id))),
                   key=lambda e: e.tool_id)
    return artifact if tools == artifact.tools else artifact.model_copy(update={"tools": tools})


def _documented(entry: ToolEntry, tool_id: str, current: Callable[[str], str | None], description: str) -> ToolEntry:
    # as the builder writes it: a description that reads as an instruction is left out
    when_not = [w.model_copy(update={"prefer": w.prefer and current(w.prefer)}) for w in entry.when_not]
    return entry.model_copy(update={
        "tool_id": tool_id,
        "description": "" if instruction_like(description) else description,
        "when_not": when_not,
        "confusions": [c.model_copy(update={"tool": t}) for c in entry.confusions if (t := current(c.tool))],
        "next_tools": [c.model_copy(update={"tool": t}) for c in entry.next_tools if (t := current(c.tool))],
    })


def release_round(
    keyed: Sequence[tuple[str, Event]],
    state: ReleaseState,
    build: Callable[[list[Event]], Compendium],
    round_: int,
    catalog: Catalog,
    due: bool = True,
    run: str = "",
) -> tuple[Compendium, ReleaseState, int]:
    """This round's artifact: the cached release, plus a new window when one is due.

    Parameters
    ----------
    keyed : sequence of (str, Event)
        The organisation's experience with each event's record key.
    state : ReleaseState
        What was released before (a fresh state releases everything).
    build : callable
        Builds and privatises the artifact of a list of events (one window).
    round_ : int
        Server round, written into the re-sent artifact's issuer block.
    catalog : Catalog
        Today's catalog (:func:`with_catalog`; the window is built with it).
    due : bool
        Whether the schedule releases a window now, decided without looking
        at the records: the window holds the unreleased records, or noise
        alone. Not due, the cached release is re-sent and new records wait;
        an organisation that released nothing yet always releases.
    run : str
        The Flower run the window is released in (kept in the state).

    Returns
    -------
    (Compendium, ReleaseState, int)
        The artifact to send, the new state and the number of records released
        this round (0 when the cached release is re-sent, or the window holds noise alone).
    """
    released = set(state.released)
    if not due and state.artifact is not None:
        current = with_catalog(state.artifact, catalog)
        artifact = as_sent(current, round_)
        # the cache holds what was sent: a record votes against the global its release went into
        return artifact, state if current is state.artifact else state.model_copy(update={"artifact": current}), 0
    fresh = [(k, e) for k, e in keyed if k not in released]
    window = build([e for _, e in fresh])
    artifact = window if state.artifact is None else combine(with_catalog(state.artifact, catalog), window)
    new_state = state.model_copy(update={
        "released": sorted(released | {k for k, _ in fresh}), "windows": state.windows + 1, "artifact": artifact,
        "run": run, "window_round": round_})
    return artifact, new_state, len(fresh)


def with_votes(
    artifact: Compendium, state: ReleaseState, votes: FusionVotes | None, keys: Sequence[str], epsilon: float | None
) -> tuple[Compendium, ReleaseState]:
    """The artifact and state after the records ``keys`` cast their fusion votes (released as ``votes``).

    The artifact is :func:`add_votes`'s; the keys are recorded so that no
    record votes twice.
    """
    voted = add_votes(artifact, votes, epsilon)
    new_state = state.model_copy(update={"voted": sorted(set(state.voted) | set(keys)), "artifact": voted,
                                         "votes_due": False})
    return voted, new_state


def add_votes(artifact: Compendium, votes: FusionVotes | None, epsilon: float | None) -> Compendium:
    """The artifact with ``votes`` added to those it carries.

    ``epsilon`` (a record's releases and its vote, None without privacy)
    becomes the artifact's spent epsilon.
    """
    privacy = artifact.privacy if epsilon is None else artifact.privacy.model_copy(update={"epsilon": round(epsilon, 6)})
    return artifact.model_copy(update={"votes": sum_votes([artifact.votes, votes]), "privacy": privacy})


def vote_refusal(own: Artifact, global_: Artifact, counted: bool = False) -> str | None:
    """Why the records released in ``own`` cannot vote against ``global_``, or None when they can (never raises).

    They vote once, against a global that holds their release (leave-one-out
    takes each record out of it) and carries prototypes to vote on. Without a
    record of who voted, "once" is per artifact: one that carries votes is
    refused; ``counted``: a release cache counts each record's vote, so an
    artifact with votes may take those of its records that have not voted.
    """
    if not isinstance(own, Compendium) or own.kind != "org":
        return "it is not an organisation's typed compendium"
    if not isinstance(global_, Compendium) or global_.kind != "global":
        return "the global is not a merged typed compendium"
    if own.votes is not None and not counted:
        return "it already carries its records' votes (a record votes once)"
    if content_hash(own) not in global_.inputs:
        return "the global was not merged from it (records vote against the global their release went into)"
    if not any(t.prototype for t in global_.tools):
        return "the global carries no prototypes: every setting would route as the documentation does"
    return None


def as_sent(release: Compendium, round_: int) -> Compendium:
    """``release`` as an organisation sends it in round ``round_``: only the issuer's round changes."""
    return release.model_copy(update={"issuer": Issuer(org=release.issuer.org, round=round_)})


def holds_release(global_: Artifact | None, release: Compendium | None, before_round: int) -> bool:
    """Whether ``global_`` was merged from ``release`` as sent in one of the rounds before ``before_round``.

    A re-sent release differs only in its issuer's round (:func:`as_sent`), so
    each earlier round's stamp is tried, the latest first. Never raises.
    """
    if not isinstance(global_, Compendium) or release is None:
        return False
    inputs = set(global_.inputs)
    return any(content_hash(as_sent(release, r)) in inputs for r in range(before_round - 1, -1, -1))


def cast_votes(events: Sequence[Event], catalog: Catalog, incoming: Compendium, embedder: Embedder, sd: float,
               rng: np.random.Generator) -> FusionVotes | None:
    """The released fusion votes of ``events`` (those with a label) against the global ``incoming``.

    Parameters
    ----------
    events : sequence of Event
        The voting records: released into ``incoming`` and not voted before.
    catalog : Catalog
        The federation's tools.
    incoming : Compendium
        The global holding the records' release (each is left out of it when scored).
    embedder : Embedder
        The embedder of ``incoming``'s prototype space.
    sd : float
        Noise SD of the vote sums (:func:`~synapse_flwr.core.builder.vote_noise`; 0 without privacy).
    rng : numpy.random.Generator
        The noise source.
    """
    # the query as its release embedded it (PII masked), so leave-one-out takes out exactly its vector
    labelled = [(mask_pii(e.query), label) for e in events if (label := event_label(e, catalog)) is not None]
    if not labelled:  # noise alone under privacy (:func:`release_votes`)
        return release_votes(np.zeros((0, len(SETTINGS))), sd, rng)
    router = Router(incoming, catalog, embedder=embedder, reranker="none")
    queries, labels = zip(*labelled)
    return release_votes(loo_correct(router, queries, labels), sd, rng)
