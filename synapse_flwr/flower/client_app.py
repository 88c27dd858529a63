"""Flower ClientApp: an organisation returns its privatised compendium, not weights.

On each train message the client decodes and validates the incoming global
compendium, loads its own private experience (deployment: ``--node-config
'data-path="..." org="..."'``; simulation: partition ``partition-id`` of the
configured dataset, with run config ``inject`` > 0 corrupting that share of
it for robustness experiments), optionally replays that traffic with the global
compendium so that the outcomes become new experience (run config
``replay = true``: the feedback loop), builds and privatises its compendium,
and replies with the artifact's wire bytes plus metrics (after round 1 a
delta against the artifact it sent before, when the server holds that one:
run config ``wire-delta``). On the round's evaluate message (its vote phase)
it receives the global merged from that artifact, and the records it
released cast their fusion votes against it (:func:`org_vote`); the reply is
the same artifact with the votes. The raw experience never leaves it.
"""

from __future__ import annotations

import functools
import logging
import math
import secrets
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from synapse_flwr.core.builder import (
    build_compendium,
    derive_seed,
    vote_noise,
    window_seed,
)
from synapse_flwr.core.catalog import Catalog, load_catalog
from synapse_flwr.core.delta import encode_delta, make_delta, sha256_hex
from synapse_flwr.core.embed import Embedder, get_embedder
from synapse_flwr.core.errors import InputError
from synapse_flwr.core.experience import Event, load_experience
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.release import (
    PRIVATE_FILE_MODE,
    ReleaseCacheError,
    ReleaseState,
    add_votes,
    as_sent,
    cast_votes,
    holds_release,
    load_release_state,
    logged_keys,
    may_vote,
    record_keys,
    release_round,
    release_settings,
    save_release_state,
    vote_refusal,
    with_votes,
    without_votes,
)
from synapse_flwr.core.replay import replay_events
from synapse_flwr.core.router import Router
from synapse_flwr.core.schema import Compendium
from synapse_flwr.core.signing import ARTIFACT, GLOBAL, SERVER, Registry
from synapse_flwr.core.wire import Artifact, ArtifactError, decode, encode, unwrap
from synapse_flwr.data.check import DataError
from synapse_flwr.data.federation import load_dataset, load_partition
from synapse_flwr.flower.calibration import build_config, planned_releases
from synapse_flwr.flower.capture import capture_mod
from synapse_flwr.flower.config import RunConfig, RunConfigError, release_cache_dir
from synapse_flwr.flower.keys import key_refusal, registry_for, signer_for
from synapse_flwr.strategies.base import DELTA_BASE, DELTA_KEY
from synapse_flwr.strategies.records import (
    attach_signature,
    from_record,
    signature_problem,
    to_record,
)

log = logging.getLogger(__name__)

app = ClientApp(mods=[capture_mod])  # the mod is a pass-through unless run config capture-dir is set


@dataclass(frozen=True)
class OrgData:
    """This node's organisation, catalog and private experience.

    ``keys`` name its records in the release cache, one per event: a log's are
    taken as logged (:func:`~synapse_flwr.core.release.logged_keys`), so a
    catalog that renames a tool does not make its records new; by default
    those of the events themselves.
    """

    org: str
    catalog: Catalog
    events: list[Event]
    keys: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.keys:
            object.__setattr__(self, "keys", record_keys(self.events))
        if len(self.keys) != len(self.events):
            raise ValueError(f"{len(self.keys)} record keys for {len(self.events)} events")


def org_data(context: Context, cfg: RunConfig) -> OrgData:
    """Find this node's experience: its node config in deployment, its partition in simulation.

    Parameters
    ----------
    context : flwr.app.Context
        ``node_config`` holds ``data-path`` (+ ``org``, optional
        ``catalog-path``) on a real SuperNode, or ``partition-id`` and
        ``num-partitions`` under the simulation engine.
    cfg : RunConfig
        The run config (names the dataset).
    """
    nc = context.node_config
    if "data-path" in nc:
        data_path = Path(str(nc["data-path"]))
        catalog_path = nc.get("catalog-path")
        if catalog_path:
            catalog = load_catalog(str(catalog_path))
        else:
            catalog = load_dataset(cfg.dataset, cfg.seed).catalog
        org = str(nc.get("org", data_path.stem.removeprefix("org_")))
        return OrgData(org, catalog, load_experience(data_path, catalog), logged_keys(data_path))
    k = int(nc["num-partitions"])
    org, ds = load_partition(cfg.dataset, k, int(nc["partition-id"]), cfg.seed, cfg.alpha, cfg.inject)
    return OrgData(org, ds.catalog, ds.orgs[org])


def cache_settings(cfg: RunConfig, org: str, own_data: bool = False) -> dict[str, str]:
    """The settings a release cache belongs to: a cache made under others is not reused.

    ``num-rounds`` is one of them only with replay on, the one case where it sets
    the calibration (one release per round): without replay a record is released
    once whatever the rounds, so a run resumed with more rounds keeps its cache
    (its new records wait for the next window, :func:`window_due`) instead of
    releasing every record again.
    Nor is the budget share kept for fusion votes (run config ``fusion-votes``):
    records released without it are marked and never vote. With ``own_data``
    (the node's own ``data-path``, a deployment) the split's settings
    (``dataset``, ``seed``, ``alpha``, ``inject``) shape no record, so they are
    left out too: an operator who changes them does not make another run.
    Nor is the catalog (:func:`~synapse_flwr.core.release.with_catalog`).
    """
    split = {} if own_data else {"dataset": cfg.dataset, "seed": cfg.seed, "alpha": cfg.alpha, "inject": cfg.inject}
    return release_settings(org, {**split, "epsilon": cfg.epsilon, "delta": cfg.delta,
                                  "num-rounds": cfg.num_rounds if cfg.replay else None, "replay": cfg.replay,
                                  "embedder": cfg.embedder})


def cache_path(cfg: RunConfig, context: Context, org: str) -> Path:
    """Where this org keeps its release cache: node config, else run config, else under the output dir."""
    folder = str(context.node_config.get("release-cache", "")) or cfg.release_cache
    return release_cache_dir(cfg.output_dir, folder) / f"{org}.json"


def fails_now(cfg: RunConfig, org: str, server_round: int) -> bool:
    """Whether run config fault injection fails ``org`` in ``server_round`` (``fail-round``, ``fail-orgs``).

    ``fail-orgs`` is comma-separated; the blanks around each name are not part
    of it (``"a, b"`` names ``a`` and ``b``).
    """
    return cfg.fail_round == server_round and org in {name.strip() for name in cfg.fail_orgs.split(",")}


def load_state(path: Path, settings: Mapping[str, str], pinned: bool = False) -> ReleaseState:
    """:func:`~synapse_flwr.core.release.load_release_state`; a refused pinned cache is told to the server.

    ``pinned``: the organisation set node config ``release-cache``, so the
    cache is its ledger and the operator's run config cannot replace it.

    Raises
    ------
    ReasonForServer
        For a pinned cache that is unreadable or made under other settings
        (the path and the problem stay in this org's log).
    """
    try:
        return load_release_state(path, settings, pinned)
    except ReleaseCacheError as exc:
        log.error("%s", exc)
        raise ReasonForServer("this organisation's pinned release cache holds releases made under other settings "
                              "or is unreadable: it does not release its records again (see its log)") from None


def node_refusal(cfg: RunConfig, node_config: Mapping[str, object]) -> str | None:
    """Why this organisation refuses the run's privacy settings, or None when it takes part (never raises).

    The run config is the operator's, so on its own the server could weaken
    an organisation's privacy. The node config is the organisation's:

    * ``max-epsilon``: a run whose ``epsilon`` exceeds it (``inf`` included:
      privacy off) is refused;
    * ``max-delta``: likewise a run whose ``delta`` exceeds it;
    * on a node with its own ``data-path``, seeded noise (run config
      ``noise = "seeded"``, which the server can regenerate and remove) is
      refused unless the node config says ``noise = "seeded"`` too;
    * a node config that names its own ``keys-file`` or ``signing-key``
      refuses a run that would not use them (:func:`~synapse_flwr.flower.keys.key_refusal`).
    """
    for name, asked in (("epsilon", cfg.epsilon), ("delta", cfg.delta)):
        if refusal := cap_refusal(name, asked, node_config.get(f"max-{name}")):
            return refusal
    if "data-path" in node_config and cfg.noise == "seeded" and node_config.get("noise") != "seeded":
        return ("the run asks for seeded noise, which the server could regenerate and remove; this organisation's "
                "node config does not allow it (node config noise=\"seeded\")")
    return key_refusal(cfg, node_config)


def cap_refusal(name: str, asked: float, cap: object) -> str | None:
    """Why the run's ``name`` (``epsilon``, ``delta``) exceeds node config ``max-<name>``; None within it.

    Parameters
    ----------
    name : str
        The run-config key the cap bounds.
    asked : float
        The run config's value.
    cap : object
        The node config's ``max-<name>``; None (absent): no cap, the run config is obeyed.
    """
    if cap is None:
        return None
    try:
        limit = float(cap)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        limit = math.nan
    if not limit > 0:
        return f"node config max-{name} must be a positive number, got {cap!r}"
    if asked > limit:
        return f"the run asks for {name} {asked:g}, above this organisation's node config max-{name} {limit:g}"
    return None


def global_problem(content: RecordDict, registry: Registry | None, run: int, server_round: int) -> str | None:
    """Why this organisation must not use the global in ``content``; None when the server signed it.

    Only the server may sign a global: every organisation's key is in the
    registry too, and a global signed by one (a valid signature of that org)
    must not pass for the server's.

    Parameters
    ----------
    content : RecordDict
        The train or evaluate message's content (``arrays`` and its signature).
    registry : Registry or None
        The registered keys (None: the run config turns signing off).
    run : int
        The current Flower run: a signature from another run is a replay.
    server_round : int
        The current round: an older signature is a replay.
    """
    return signature_problem(content, registry, GLOBAL, run, server_round, from_record(content["arrays"]),
                             signer=SERVER)


def noise_seed(cfg: RunConfig) -> int:
    """The seed of this organisation's DP noise this round.

    Secret by default: drawn from the OS's random source, never written
    anywhere, so that no one else can regenerate the noise. With run config
    ``noise = "seeded"`` it is the run's seed, which the server knows too: it
    could regenerate each organisation's noise from the seed, org and round
    and remove it, so seeded noise is for reproducible experiments only.
    """
    return cfg.seed if cfg.noise == "seeded" else secrets.randbits(63)


def window_due(cfg: RunConfig, state: ReleaseState, server_round: int, run: int) -> bool:
    """Whether this round releases a window, decided without looking at the records.

    Once per run, in its first round (a node that misses it waits for the
    next run), and with replay on in every round after the latest window's
    (each round's outcomes are new records; a round that runs again after a
    crash re-sends) up to ``num-rounds`` windows (a server that announces more
    rounds gets the cached release); an organisation that released nothing
    yet always releases. A window that went out only when records had arrived
    would tell the server that they had (docs/privacy.md). A cache holding
    ``max-windows`` windows releases no more: each window adds its noise to
    the cached release, and the server refuses noise claimed beyond them
    (:mod:`synapse_flwr.core.noise_claims`).

    Parameters
    ----------
    cfg : RunConfig
        The run config (``replay``, ``max-windows``).
    state : ReleaseState
        The release cache: whether, in which run and in which round a window went out.
    server_round : int
        The federation's round.
    run : int
        The Flower run (``Context.run_id``).
    """
    return window_scheduled(cfg, state, server_round, run) and not windows_full(cfg, state)


def window_scheduled(cfg: RunConfig, state: ReleaseState, server_round: int, run: int) -> bool:
    """Whether the schedule of :func:`window_due` has a window in this round, ``max-windows`` aside."""
    if state.artifact is None:
        return True
    if cfg.replay:  # never past the releases each record's budget covers, whatever rounds a server announces
        return server_round > state.window_round and state.windows < planned_releases(cfg)
    return server_round == 1 and state.run != str(run)


def windows_full(cfg: RunConfig, state: ReleaseState) -> bool:
    """Whether the release cache holds the run's ``max-windows`` windows (or more): it releases no further one."""
    return state.windows >= cfg.max_windows


def windows_refusal(cfg: RunConfig, state: ReleaseState) -> str | None:
    """Why this cache cannot take part under the run's ``max-windows``, or None (never raises).

    A cache holding more windows than the run allows (``max-windows`` lowered,
    or a cache from before the cap) carries more noise than the server
    accepts (:mod:`synapse_flwr.core.noise_claims`); re-sending it every round
    would only be refused every round.
    """
    if state.windows <= cfg.max_windows:
        return None
    return (f"this release cache holds {state.windows} release windows, more than the run's max-windows "
            f"{cfg.max_windows}: the server would refuse the noise they carry; the operator can raise max-windows "
            f"to {state.windows} or more (run config)")


def replay_refusal(cfg: RunConfig, state: ReleaseState, server_round: int, run: int) -> str | None:
    """Why this cache cannot start a new federation with replay on, or None when it can (never raises).

    With replay on, each record is calibrated for ``num-rounds`` releases in
    one federation (its own and its replays, keyed by round). A new federation
    (its round 1, another run) on a cache that already holds windows would
    release each record's replays again: more releases than its budget
    covers. A resumed federation continues its rounds and keeps its cache;
    one that crashed in its first round starts again at round 1 and is told
    apart from a new one by no one, so it is refused too.

    Parameters
    ----------
    cfg : RunConfig
        The run config (``replay``).
    state : ReleaseState
        The release cache.
    server_round : int
        The federation's round.
    run : int
        The Flower run (``Context.run_id``).
    """
    if cfg.replay and server_round == 1 and state.windows and state.run != str(run):
        return ("this release cache holds replay windows of another run (an earlier federation, or one that "
                "stopped in its first round); with replay on a record's budget covers one federation's rounds, so "
                "this run would release its records again: move the cache away (a new ledger) to allow it")
    return None


def org_release(
    data: OrgData,
    cfg: RunConfig,
    state: ReleaseState,
    server_round: int,
    replayed: list[Event],
    embedder: Embedder | None,
    incoming: Artifact | None = None,
    run: int = 0,
) -> tuple[Compendium, ReleaseState, int]:
    """This round's artifact: each record released once, the cached release re-sent.

    A window goes out when :func:`window_due` says so, noise alone when no
    record is new. Replayed outcomes are released under keys of their own
    round, but count as their record: with replay on, the budget covers one
    release per round. When the run votes and ``incoming`` (the global this
    round started from) holds an earlier window whose votes are still due,
    its records that have not voted cast their fusion votes against it
    (:func:`cast_votes`). ``run``: the Flower run (``Context.run_id``).
    """
    keyed = list(zip(data.keys, data.events))
    keyed += [(f"{k}/replay{server_round}", e) for k, e in zip(record_keys(replayed), replayed)]
    rounds = planned_releases(cfg)
    config = build_config(cfg)
    due = window_due(cfg, state, server_round, run)
    if windows_full(cfg, state) and window_scheduled(cfg, state, server_round, run):  # due, but for the cap
        log.warning("org %s: its release cache holds %d windows, the run's max-windows (%d): no record that arrived "
                    "since is released (docs/privacy.md, Release once)", data.org, state.windows, cfg.max_windows)
    releases = min(state.windows + due, rounds)  # a record's releases after this round
    # each window its own noise, also when seeded: two windows with the same draws would cancel in a difference
    seed = window_seed(noise_seed(cfg), state.windows)

    def build(events: list[Event]) -> Compendium:
        return build_compendium(
            events, data.catalog, data.org, round_=server_round, epsilon=cfg.epsilon, delta=cfg.delta,
            rounds=rounds, releases=releases, seed=seed, embedder=embedder, config=config,
        )

    before = state
    artifact, state, released = release_round(keyed, state, build, server_round, data.catalog, due=due,
                                              run=str(run))
    if cfg.private and not config.vote_share:
        state = without_votes(before, state)
    # records that missed the vote phase of the round that released them (a node down then), once the
    # global holds their release: leave-one-out takes each record out of a sum that must hold it
    late = before.votes_due and holds_release(incoming, before.artifact, server_round)
    voters = [(k, e) for k, e, ok in zip(data.keys, data.events, may_vote(before, data.keys)) if ok] if late else []
    # a late vote draws noise of its own: two vote releases of one round with the same draws would cancel
    artifact, state, _ = vote_round(data, cfg, artifact, state, voters, releases, seed, server_round, embedder,
                                    incoming, due=late, phase="late votes")
    # the window released now votes in this round's vote phase (when its records kept a share for it)
    owed = state.votes_due or (cfg.votes and state.windows > before.windows)
    return artifact, state.model_copy(update={"votes_due": owed}), released


def org_vote(
    data: OrgData,
    cfg: RunConfig,
    state: ReleaseState,
    server_round: int,
    embedder: Embedder | None,
    incoming: Artifact,
) -> tuple[Compendium, ReleaseState, int]:
    """The vote phase of a round: the artifact sent in its train phase, with the votes of its records.

    Every released record that has not voted votes against ``incoming``, the
    global this round merged from that artifact (each record is left out of
    it when scored); nothing is released again. When ``incoming`` was not
    merged from it (the train reply was rejected), the artifact goes back
    without votes.

    Parameters
    ----------
    data : OrgData
        This organisation's records.
    cfg : RunConfig
        The run config (budget, rounds, replay, noise).
    state : ReleaseState
        The release cache after this round's train phase.
    server_round : int
        The round (stamped into the artifact's issuer block).
    embedder : Embedder or None
        The federation's embedding space (None: no votes).
    incoming : Artifact
        The global the server merged this round.

    Returns
    -------
    (Compendium, ReleaseState, int)
        The artifact to send, the new state and the number of records that voted.

    Raises
    ------
    ReasonForServer
        When this organisation has released nothing in this run (no cache).
    """
    if state.artifact is None:
        raise ReasonForServer("vote phase: this organisation holds no release of this run (its release cache is "
                              "empty), so it has nothing to vote with")
    sent = as_sent(state.artifact, server_round)
    if refusal := vote_refusal(sent, incoming, counted=True):
        log.info("%s round %d: no votes: %s", data.org, server_round, refusal)
        return sent, state, 0
    voters = [(k, e) for k, e, ok in zip(data.keys, data.events, may_vote(state, data.keys)) if ok]
    # the window's own seed (:func:`window_seed`): a vote phase of another run's round 1 draws other noise
    return vote_round(data, cfg, sent, state, voters, min(state.windows, planned_releases(cfg)),
                      window_seed(noise_seed(cfg), state.windows - 1), server_round, embedder, incoming,
                      due=state.votes_due)


def vote_round(
    data: OrgData,
    cfg: RunConfig,
    artifact: Compendium,
    state: ReleaseState,
    voters: list[tuple[str, Event]],
    releases: int,
    seed: int,
    server_round: int,
    embedder: Embedder | None,
    incoming: Artifact | None,
    due: bool,
    phase: str = "votes",
) -> tuple[Compendium, ReleaseState, int]:
    """``artifact`` and ``state`` after the records ``voters`` cast their votes against ``incoming``.

    Nothing happens unless the run votes and ``incoming`` carries prototypes.
    A vote that is ``due`` is released even when no voter has a label (noise
    alone): whether it went out must not say what the window held.

    Parameters
    ----------
    data : OrgData
        This organisation's records.
    cfg : RunConfig
        The run config.
    artifact : Compendium
        What this organisation sends (the votes are added to it).
    state : ReleaseState
        The release cache (the voters are recorded in it).
    voters : list of (str, Event)
        The records that vote, with their record keys (those
        :func:`~synapse_flwr.core.release.may_vote` allows).
    releases : int
        Releases a record has had, this round's included (the artifact's
        epsilon becomes theirs with the vote).
    seed : int
        This organisation's noise seed this round.
    server_round : int
        The round (part of the votes' noise seed).
    embedder : Embedder or None
        The federation's embedding space.
    incoming : Artifact or None
        The global the records vote against (it holds their release).
    due : bool
        Whether a window's vote is owed (``ReleaseState.votes_due``).
    phase : str
        Part of the votes' noise seed: each vote release of a round draws its own.

    Returns
    -------
    (Compendium, ReleaseState, int)
        The artifact, the state and the number of records that voted.
    """
    if not (cfg.votes and embedder is not None and isinstance(incoming, Compendium) and incoming.embedding):
        return artifact, state, 0
    sd, epsilon = vote_noise(cfg.epsilon, cfg.delta, planned_releases(cfg), max(releases, 1), build_config(cfg),
                             embedder)
    if not voters and not due:
        if artifact.votes is not None and epsilon is not None and epsilon > (artifact.privacy.epsilon or 0.0):
            # records that voted in an earlier round compose their vote with this round's releases (asked of
            # the votes released, which a schedule decides, not of who voted: none voting must not show)
            artifact = add_votes(artifact, None, epsilon)
            state = state.model_copy(update={"artifact": artifact})
        return artifact, state, 0
    votes = cast_votes([e for _, e in voters], data.catalog, incoming, embedder, sd,
                       np.random.default_rng(derive_seed(seed, data.org, server_round, phase)))
    artifact, state = with_votes(artifact, state, votes, [k for k, _ in voters], epsilon)
    return artifact, state, len(voters)


def reply_metrics(payload: bytes, wire: bytes, artifact: Artifact) -> MetricRecord:
    """What a reply reports beside its artifact: functions of the release and the run config alone.

    No count of the organisation's records (its events, those released this
    round, its misrouted replays) goes to the server: each moves by one with
    one record and none is noised, so any of them would undo the release's
    guarantee. The artifact's noised counts say what the federation may know.
    """
    epsilon = artifact.privacy.epsilon
    return MetricRecord({"bytes-sent": len(payload), "bytes-full": len(wire),
                         "epsilon": epsilon if epsilon is not None else -1.0})


def reply_payload(cfg: RunConfig, org: str, wire: bytes, held: str | None, sent_path: Path) -> tuple[str, bytes]:
    """The reply's record key and bytes: a delta against what this org sent last, when the server holds it.

    Parameters
    ----------
    cfg : RunConfig
        ``wire-delta`` turns deltas on.
    org : str
        This organisation (named in the log).
    wire : bytes
        The full artifact's wire bytes.
    held : str or None
        sha256 of the artifact the server holds from this org (its ``delta-base``), None when none.
    sent_path : Path
        This org's copy of the canonical JSON it sent last (kept locally, never sent).
    """
    body = unwrap(wire)
    last = sent_path.read_bytes() if sent_path.is_file() else None
    # before replying: the next round's base is what the server may accept now; owner-only, like the cache
    write_atomic(sent_path, body, mode=PRIVATE_FILE_MODE)
    if not cfg.wire_delta:
        return "artifact", wire
    if held is None:
        log.info("%s: the server holds no earlier artifact of this org (first round, new server or lost "
                 "state); sending the full artifact", org)
        return "artifact", wire
    if last is None or sha256_hex(last) != held:
        log.info("%s: the server's base %s... is not the artifact this org sent last; sending the full artifact",
                 org, held[:16])
        return "artifact", wire
    return DELTA_KEY, encode_delta(make_delta(last, body))


def federation_embedder(cfg: RunConfig) -> Embedder | None:
    """The federation's embedding space (prototypes, replay, evaluation); None when off."""
    return None if cfg.embedder == "none" else _loaded_embedder(cfg.embedder)


@functools.lru_cache(maxsize=2)
def decoded_global(wire: bytes) -> Artifact:
    """The validated global of these wire bytes, decoded once per client process.

    Under the simulation engine one actor serves many organisations a round,
    all with the same global (1.2 s to decode and validate at K=200 on
    MetaTool); the cache is keyed by the exact bytes, whose signature each
    organisation still verifies itself. Callers must not modify the result.
    """
    return decode(wire)


def load_failure_reason(exc: InputError | DataError) -> str:
    """What the server is told when this org's experience cannot be loaded: which field, never what or where.

    The message stays in the organisation's log: it may quote a record's
    value (a query, a tool name outside the public catalog) or a file path,
    none of which is released under DP; nor is the line, which moves by one
    with each record before it.
    """
    first = exc.report.problems[0] if isinstance(exc, DataError) else exc
    field = f" (field {first.field!r})" if first.field else ""
    return f"invalid local experience data{field}; the organisation's log says where and what is wrong"


@functools.cache
def _loaded_embedder(name: str) -> Embedder:
    # one model load per client process, not one per round
    return get_embedder(name)


class ReasonForServer(RuntimeError):
    """A failure whose message may go to the server: it quotes no record, value or local path."""


def server_safe(handler: Callable[[Message, Context], Message]) -> Callable[[Message, Context], Message]:
    """``handler`` whose failures tell the server only what is safe to tell it.

    Flower sends a failed ClientApp's exception message to the server. A
    :class:`ReasonForServer`, a run-config error (the operator's own values)
    and an :class:`ArtifactError` (an invalid global, the server's own bytes,
    or the size or encoding of this org's own artifact) pass unchanged; any other
    exception may quote private data (a query in a ``KeyError``, a value in a
    validation error), so the server gets its type and the organisation's
    log keeps the rest.
    """
    @functools.wraps(handler)
    def guarded(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except (ReasonForServer, RunConfigError, ArtifactError):
            raise
        except Exception as exc:
            log.exception("this organisation's round failed")
            raise ReasonForServer(f"the ClientApp failed ({type(exc).__name__}); the organisation's log "
                                  "has the details") from None

    return guarded


def replay_round(cfg: RunConfig, data: OrgData, state: ReleaseState, incoming: Artifact,
                 embedder: Embedder | None) -> list[Event]:
    """This round's replayed outcomes (run config ``replay``): the released records routed by ``incoming``."""
    # a typed global has tools, a flat-majority one texts; round 1's global has neither
    if not (cfg.replay and (getattr(incoming, "tools", None) or getattr(incoming, "texts", None))):
        return []
    router = Router(incoming, data.catalog, embedder=embedder or get_embedder("static"))
    # only records released in an earlier window: an event and its replay in one window
    # would double the record's contribution to that release (its calibration assumes one)
    done = set(state.released)
    return replay_events([e for k, e in zip(data.keys, data.events) if k in done], router)


def log_to_node() -> None:
    """Send this package's INFO records to stderr, the SuperNode's log, when nothing else handles them.

    A ``flwr-clientapp`` process configures Flower's own logger only: Python
    then printed this package's warnings and errors alone, and the per-round
    counts (released, replayed, voted) never reached the organisation's log.
    A process whose logging is set up (a test, an embedding program) is left
    as it is, and so is a simulation's Ray worker, whose stderr is the
    operator's console, not an organisation's log.
    """
    package = logging.getLogger("synapse_flwr")
    if logging.getLogger().handlers or package.handlers or "ray" in sys.modules:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    package.addHandler(handler)
    package.setLevel(logging.INFO)


def lost_cache_refusal(state: ReleaseState, incoming: Artifact, org: str, path: Path) -> str | None:
    """Why this organisation may not release: the global already holds a release of it, and its cache none.

    A cache lost or deleted before a resume released every record again,
    and the run still reported the one budget; so did one made under other
    settings (a replay run resumed with more rounds), which a node starts
    afresh. None when the cache holds a release, or the global none of this
    organisation's (a flat-majority global, or one from before globals named
    their organisations, holds none). The reason goes to the server: it names
    no local path (the path is in this organisation's log).
    """
    if state.artifact is not None or org not in getattr(incoming, "orgs", ()):
        return None
    stale = path.exists()
    log.error("release cache %s: %s", path, "made under other settings (above)" if stale else "missing")
    what = "was made under other settings" if stale else "holds none"
    return (f"the global already holds a release of organisation {org!r}, but its release cache {what} (see its "
            "log): releasing again would spend its records' budget a second time; restore the cache, or start a "
            "new federation in another output-dir")


def respond(msg: Message, context: Context, vote_phase: bool) -> Message:
    """Validate the global; reply with this org's compendium (or a delta): released (train) or voted (vote phase)."""
    log_to_node()
    cfg = RunConfig.from_mapping(context.run_config)
    if refusal := node_refusal(cfg, context.node_config):
        log.error("refusing the run: %s", refusal)
        raise ReasonForServer(refusal)
    server_round = int(msg.content["config"]["server-round"])
    if problem := global_problem(msg.content, registry_for(cfg, context.node_config), context.run_id,
                                 server_round):
        raise ReasonForServer(f"global rejected: {problem}")
    incoming = decoded_global(from_record(msg.content["arrays"]))  # raises on an invalid global
    try:
        data = org_data(context, cfg)
    except (InputError, DataError) as exc:
        log.error("cannot load this org's experience: %s", exc)
        raise ReasonForServer(load_failure_reason(exc)) from None
    embedder = federation_embedder(cfg)
    path = cache_path(cfg, context, data.org)
    nc = context.node_config
    state = load_state(path, cache_settings(cfg, data.org, own_data="data-path" in nc),
                       pinned=bool(nc.get("release-cache")))
    if refusal := (replay_refusal(cfg, state, server_round, context.run_id) or windows_refusal(cfg, state)
                   or lost_cache_refusal(state, incoming, data.org, path)):
        log.error("refusing the run: %s", refusal)
        raise ReasonForServer(refusal)
    if vote_phase:
        artifact, new_state, voted = org_vote(data, cfg, state, server_round, embedder, incoming)
        done = f"vote phase: {voted} records voted"
    else:
        replayed = replay_round(cfg, data, state, incoming, embedder)
        artifact, new_state, released = org_release(data, cfg, state, server_round, replayed, embedder, incoming,
                                                    context.run_id)
        done = f"{len(data.events)} events, {released} released now, {len(replayed)} replayed"
    if new_state is not state:
        save_release_state(path, new_state)  # before replying: a restart never re-releases
    if not vote_phase and fails_now(cfg, data.org, server_round):
        time.sleep(cfg.fail_delay)  # a stalled node: its round cannot end before the delay (tests kill it there)
        raise ReasonForServer(f"fault injection: org {data.org} fails in round {server_round} (run config fail-orgs)")
    wire = encode(artifact)
    key, payload = reply_payload(cfg, data.org, wire, msg.content["config"].get(DELTA_BASE),
                                 path.with_name(f"{data.org}.sent.json"))
    # the counts stay in this org's own log: replay keeps only misroutes, so "replayed" counts those
    log.info("%s round %d: %s -> %d bytes as %s (global in: %d tools)", data.org, server_round, done,
             len(payload), key, len(getattr(incoming, "tools", [])))
    content = RecordDict({key: to_record(payload), "metrics": reply_metrics(payload, wire, artifact)})
    signer = signer_for(cfg, data.org, context.node_config)  # signing: over the artifact, org, run and round
    return Message(content=attach_signature(content, signer, ARTIFACT, context.run_id, server_round, wire),
                   reply_to=msg)


@app.train()
@server_safe
def train(msg: Message, context: Context) -> Message:
    """Validate the global, release this org's new experience, reply with its compendium (or a delta)."""
    return respond(msg, context, vote_phase=False)


@app.evaluate()
@server_safe
def vote(msg: Message, context: Context) -> Message:
    """The round's vote phase (Flower's evaluate message): this org's records vote against the new global."""
    return respond(msg, context, vote_phase=True)
