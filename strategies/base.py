"""The validating, merging Flower strategy that all merge policies share."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING
from numbers import Integral

from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from synapse_flwr.strategies.records import (
    attach_signature,
    from_record,
    signature_from,
    to_record,
)

from synapse_flwr.core.delta import apply_delta, sha256_hex
from synapse_flwr.core.noise_claims import NoiseBound, noise_claim_problem
from synapse_flwr.core.schema import (
    MAX_TOOLS,
    Compendium,
    EmbeddingSpace,
    FlatCompendium,
)
from synapse_flwr.core.signing import ARTIFACT, GLOBAL, Registry, Signer
from synapse_flwr.core.votes import SETTINGS
from synapse_flwr.core.wire import (
    MAX_WIRE_BYTES,
    ArtifactError,
    decode,
    encode,
    parse_body,
    unwrap,
    wire_limit,
)

Merged = Compendium | FlatCompendium
MergeFn = Callable[[Sequence[Compendium]], Merged]


@dataclass
class Rejection:
    """A reply that was not merged.

    Parameters
    ----------
    round : int
        Server round.
    node_id : int
        The node the round's message went to (also for errors the SuperLink
        answers in its name, which come from node 1).
    reason : str
        Why it was rejected.
    org : str or None
        The organisation that node spoke for in an earlier round (None: unknown).
    """

    round: int
    node_id: int
    reason: str
    org: str | None = None


@dataclass
class RoundReport:
    """What happened to one round's replies (read by the server app).

    Parameters
    ----------
    round : int
        Server round (after any resume offset).
    accepted : list of int
        Node ids whose artifacts were merged.
    rejected : list of Rejection
        Replies that were not.
    bytes_in : int
        Wire bytes of all received artifacts.
    artifacts_in : int
        Replies that carried an artifact (valid or not).
    deltas_in : int
        Accepted replies that came as a delta against the org's previous artifact.
    bytes_out : int
        Wire bytes of the broadcast global.
    epsilon : float or None
        Largest epsilon spent among accepted artifacts (None: privacy off).
    conflicts : int
        Size of the global's conflict log.
    merged : bool
        False when too few valid artifacts arrived and the global was kept.
    votes_accepted : list of int
        Node ids whose vote-phase replies (their artifacts with their records'
        fusion votes) were merged into the round's global.
    votes_rejected : list of Rejection
        Vote-phase replies that were not (the node's train artifact stays merged).
    votes_bytes_in : int
        Wire bytes of all vote-phase replies.
    merge_error : str or None
        Why the round's merge (or its vote phase's) failed; the previous
        global was kept and the replies it would have merged are listed as
        rejected with this reason (None: no failure).
    """

    round: int
    accepted: list[int] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    bytes_in: int = 0
    artifacts_in: int = 0
    deltas_in: int = 0
    bytes_out: int = 0
    epsilon: float | None = None
    conflicts: int = 0
    merged: bool = False
    votes_accepted: list[int] = field(default_factory=list)
    votes_rejected: list[Rejection] = field(default_factory=list)
    votes_bytes_in: int = 0
    merge_error: str | None = None


@dataclass
class Intake:
    """The replies of one phase of a round: accepted node ids, rejections, bytes and deltas."""

    accepted: list[int] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    bytes_in: int = 0
    artifacts_in: int = 0
    deltas_in: int = 0


DELTA_KEY = "delta"  # the reply's ArrayRecord when it carries a delta instead of the full artifact
DELTA_BASE = "delta-base"  # config key: sha256 of the artifact the server holds from the node's org


def reply_body(msg: Message, max_bytes: int, base: bytes | None) -> tuple[bytes | None, int, str | None]:
    """The canonical JSON a reply carries, rebuilt from ``base`` when it is a delta: ``(body, size, reason)``.

    Never raises; a delta the server has no base for is rejected with a reason
    that tells the client to send its full artifact.
    """
    is_delta = DELTA_KEY in msg.content.array_records
    try:
        raw = from_record(msg.content[DELTA_KEY if is_delta else "artifact"], max_bytes)
    except (KeyError, AttributeError, TypeError, ValueError) as exc:
        return None, 0, f"reply carries no artifact ({type(exc).__name__}: {exc})"
    if is_delta and base is None:
        return None, len(raw), "invalid delta: the server holds no base for this node's org; send the full artifact"
    try:
        return (apply_delta(base, raw, max_bytes) if is_delta else unwrap(raw, max_bytes)), len(raw), None
    except ArtifactError as exc:
        return None, len(raw), f"invalid {'delta' if is_delta else 'artifact'}: {exc}"


# Flower's simulation engine reports a ClientApp exception as the Ray task error:
# colour codes, the actor's repr and two tracebacks around the app's own message.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_APP_MESSAGE = "occurred. Message: "
MAX_REASON_CHARS = 500


def client_error_reason(code: int, reason: str) -> str:
    """One readable line for a client error: the ClientApp's own message where Flower wraps it. Never raises."""
    text = _ANSI.sub("", str(reason))
    if _APP_MESSAGE in text:
        text = text.rsplit(_APP_MESSAGE, 1)[1].removesuffix("'>")
    text = " ".join(text.split())
    return f"client error {code}: {text}"[:MAX_REASON_CHARS]


def verify_reply(
    msg: Message, max_bytes: int, registry: Registry | None = None, round_: int = 0, base: bytes | None = None,
    run: int = 0,
) -> tuple[Compendium | None, bytes | None, int, str | None]:
    """:func:`check_reply` that also returns the artifact's canonical JSON (the next round's delta base)."""
    if msg.has_error():
        return None, None, 0, client_error_reason(msg.error.code, msg.error.reason)
    body, size, reason = reply_body(msg, max_bytes, base)
    if body is None:
        return None, None, size, reason
    sig = None
    if registry is not None:
        sig, reason = signature_from(msg.content)
        reason = reason or registry.verify(sig, ARTIFACT, body, run, round_)
        if reason:
            return None, None, size, f"rejected signature: {reason}"
    try:
        art = parse_body(body)
    except ArtifactError as exc:
        return None, None, size, f"invalid artifact: {exc}"
    if not isinstance(art, Compendium) or art.kind != "org":
        return None, None, size, "invalid artifact: expected a typed org compendium"
    if sig is not None and art.issuer.org != sig.signer:
        return None, None, size, f"rejected signature: issuer.org {art.issuer.org!r} is not the signer {sig.signer!r}"
    if round_ and art.issuer.round > round_:  # the global takes the largest: one org could name any round for it
        return None, None, size, f"invalid artifact: issuer.round {art.issuer.round} is ahead of the server's {round_}"
    return art, body, size, None


def check_reply(
    msg: Message, max_bytes: int, registry: Registry | None = None, round_: int = 0, base: bytes | None = None,
    run: int = 0,
) -> tuple[Compendium | None, int, str | None]:
    """Validate one reply at the edge: ``(artifact, size, reason_if_rejected)``. Never raises.

    A reply carries its artifact's wire bytes, or a delta against ``base``
    (the canonical JSON the server accepted from the node's org last), which is
    rebuilt and checked against its target digest first. With a ``registry``
    the signature is checked on the (rebuilt) JSON bytes before they are parsed
    (unsigned, unknown key, wrong org, other run or round, forged), and the
    artifact's issuer must be the signer.

    Parameters
    ----------
    msg : Message
        The node's reply.
    max_bytes : int
        Largest accepted payload, compressed or not.
    registry : Registry or None
        Public keys the signature must verify under (None: signing off).
    round_ : int
        The current server round.
    base : bytes or None
        The delta base: the org's last accepted canonical JSON.
    run : int
        The current Flower run id.
    """
    art, _, size, reason = verify_reply(msg, max_bytes, registry, round_, base, run)
    return art, size, reason


def dropped_nodes(
    sent: Sequence[Message], replies: Sequence[Message], latest: dict[str, tuple[int | None, Compendium]],
) -> list[tuple[int, str]]:
    """Nodes that did not answer this round: ``(node id, reason)``, sorted by node id.

    A message without a reply timed out; an organisation that contributed
    before but whose node was not sent anything is no longer connected.
    """
    answered = {m.metadata.reply_to_message_id for m in replies}
    senders = {m.metadata.src_node_id for m in replies}
    out = [(m.metadata.dst_node_id, "no reply within the round timeout (run config round-timeout)")
           for m in sent if m.metadata.message_id not in answered and m.metadata.dst_node_id not in senders]
    addressed = {m.metadata.dst_node_id for m in sent}
    out += [(owner, "node no longer connected") for owner, _ in latest.values()
            if owner is not None and owner not in addressed]
    return sorted(out)


def same_release(before: Compendium | None, after: Compendium) -> bool:
    """Whether ``after`` is ``before`` re-sent: equal but for the issuer's round (never raises)."""
    return before is not None and after.model_copy(update={"issuer": before.issuer}) == before


def claim_problem(org: str, node: int, owner: int | None, node_org: str | None) -> str | None:
    """Why ``node`` may not send an artifact as ``org``, or None when it may (never raises).

    Parameters
    ----------
    org : str
        The artifact's ``issuer.org``.
    node : int
        The node the reply came from.
    owner : int or None
        The node ``org`` was accepted from before (None: none, or unknown after a restart).
    node_org : str or None
        The organisation ``node`` was accepted for before (None: none yet).
    """
    if owner is not None and owner != node:
        return f"org {org!r} already belongs to node {owner}"
    # one node, one organisation: a node that claimed a new org each round would back every contest alone
    if node_org is not None and node_org != org:
        return f"node {node} already sends as org {node_org!r}; one node speaks for one organisation, not also {org!r}"
    return None


def space_name(space: EmbeddingSpace) -> str:
    """An embedding space in words: ``model (dim dims, normalization)``."""
    return f"{space.model} ({space.dim} dims, {space.normalization})"


def majority_space(spaces: Iterable[EmbeddingSpace | None]) -> EmbeddingSpace | None:
    """The most common space of ``spaces`` (None entries ignored; None if there is none).

    Ties go to the first in sorted order of ``(model, dim, normalization)``, so
    the result does not depend on the order the spaces come in.
    """
    counts = Counter(s for s in spaces if s is not None)
    if not counts:
        return None
    return min(counts, key=lambda s: (-counts[s], s.model, s.dim, s.normalization))


def federation_space(
    configured: EmbeddingSpace | None, held: Iterable[Compendium], arrived: Iterable[Compendium]
) -> tuple[EmbeddingSpace | None, str]:
    """The embedding space every merged artifact must share, and where it comes from.

    The run's configured space; else that of the artifacts already held
    (accepted in earlier rounds, merged again with this round's); else the
    majority of the round's valid arrivals (:func:`majority_space`). Never raises.
    """
    if configured is not None:
        return configured, "the run's"
    if (space := majority_space(a.embedding for a in held)) is not None:
        return space, "that of the artifacts already merged"
    return majority_space(a.embedding for a in arrived), "the majority of this round's artifacts"


def space_problem(art: Compendium, space: EmbeddingSpace | None, source: str) -> str | None:
    """Why ``art`` cannot be merged in ``space`` (named by ``source``), or None (never raises)."""
    if space is None or art.embedding is None or art.embedding == space:
        return None
    return (f"embedding space {space_name(art.embedding)} differs from the federation's {space_name(space)} "
            f"({source}); prototypes of different spaces cannot be merged")


OUTSIDE_CATALOG = "not in the federation's catalog"  # what a catalog refusal says (a round of nothing else: logged)


def catalog_problem(art: Compendium, catalog: Collection[str] | None) -> str | None:
    """Why ``art``'s tools are not the federation's (ids outside ``catalog``), or None (never raises)."""
    if catalog is None:
        return None
    unknown = [t.tool_id for t in art.tools if t.tool_id not in catalog]
    if not unknown:
        return None
    more = f" (+{len(unknown) - 3} more)" if len(unknown) > 3 else ""
    return (f"{len(unknown)} tool ids {OUTSIDE_CATALOG} of {len(catalog)} tools: "
            f"{', '.join(map(repr, unknown[:3]))}{more} (run config catalog names the federation's catalog file)")


def votes_problem(art: Compendium) -> str | None:
    """Why ``art``'s fusion votes cannot be summed with the federation's, or None (never raises).

    Votes sum setting by setting over the most common list of settings, so an
    organisation's own list, winning a tie, would replace every other's votes
    with its own (a prior of 10, say): only this package's settings are taken.
    """
    if art.votes is None or art.votes.settings == list(SETTINGS):
        return None
    return (f"votes.settings: {len(art.votes.settings)} settings other than the federation's {len(SETTINGS)} "
            "(votes.SETTINGS)")


def tool_union_problems(
    held: Mapping[str, Compendium], arrived: Sequence[tuple[int, Compendium]], limit: int = MAX_TOOLS
) -> dict[int, str]:
    """Nodes whose artifact would bring the merge's distinct tools over ``limit``, with the reason.

    The merge takes every org's latest artifact: ``held`` (org -> artifact kept
    from earlier rounds), each replaced by its org's accepted arrival. Arrivals
    are admitted fewest new tools first (ties by org), so which are refused does
    not depend on arrival order and one artifact of made-up tools cannot crowd
    out the others. Never raises.
    """
    counts = Counter(t.tool_id for art in held.values() for t in art.tools)
    order = sorted(arrived, key=lambda na: (sum(t.tool_id not in counts for t in na[1].tools), na[1].issuer.org))
    out: dict[int, str] = {}
    for node, art in order:
        trial = counts.copy()
        if (old := held.get(art.issuer.org)) is not None:
            trial.subtract(t.tool_id for t in old.tools)
        trial.update(t.tool_id for t in art.tools)
        size = sum(n > 0 for n in trial.values())
        if size > limit:
            out[node] = (f"its {len(art.tools)} tools would bring the merged tool union to {size} distinct tools, "
                         f"over the schema's limit of {limit}")
        else:
            counts = trial
    return out


def check_strategy_args(min_nodes: int, max_bytes: int) -> None:
    """Refuse, before a run starts, a node count or byte limit no round could work with.

    Parameters
    ----------
    min_nodes : int
        Nodes to wait for, and valid artifacts needed to merge: an integer >= 1
        (0 would merge a round in which no artifact arrived).
    max_bytes : int
        Largest accepted artifact: a positive integer.

    Raises
    ------
    ValueError
        Naming the argument, its value and the valid range.
    """
    # bool is an int to Python, but min_nodes=True is a mistake, not 1
    if isinstance(min_nodes, bool) or not isinstance(min_nodes, Integral) or min_nodes < 1:
        raise ValueError(f"min_nodes must be an integer >= 1, got {min_nodes!r}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, Integral) or max_bytes < 1:
        raise ValueError(f"max_bytes must be a positive integer (bytes, >= 1), got {max_bytes!r}")


class CompendiumStrategy(Strategy):
    """Broadcast the global compendium, validate every reply, merge the valid ones.

    Each round every connected node receives the current global compendium
    (an ``ArrayRecord`` holding its wire bytes) and replies with its own
    artifact. Replies that error, carry no artifact, are oversized, carry no
    valid signature (when a registry is set), fail validation, come from a
    node for an org that is another node's (or for a second org), or that the
    merge could not take (another embedding space, tools outside the catalog,
    votes on other settings, noise claimed beyond the run's bound, a tool
    union over the schema's limit) are rejected
    with node id and reason, logged and counted, as are nodes that did not
    answer within the round's timeout and contributors no longer connected
    (each under the id of the node the message went to, with its org once
    known); they never break the round. A reply may be a delta against the artifact
    the server accepted from the node's org last (each node is told that
    artifact's sha256 as ``delta-base``); it is rebuilt, then checked exactly
    like a full artifact. When at least ``min_nodes`` valid artifacts
    arrived, the latest valid artifact of every organisation seen so far is
    merged into the new global (an org that misses a round keeps contributing
    its last artifact); otherwise the previous global is kept. A merge that
    still fails keeps the previous global too: the error is logged and its
    reason recorded, and the server goes on.

    With ``vote_phase`` each round that merged has a second exchange (Flower's
    evaluate messages): the nodes merged in it receive the new global, their
    records released in it cast their fusion votes against it
    (:mod:`synapse_flwr.core.votes`), and each replies with its artifact
    carrying those votes, checked like a train reply; the round's global is
    merged again from them. So the global a round ends with already says how
    much to trust experience (before, votes came one round later and a first
    round's global could route below the documentation alone).

    Parameters
    ----------
    merge_fn : callable
        Pure merge policy: a sequence of org compendia -> global.
    policy : str
        Name of the policy (sent to clients, logged).
    min_nodes : int
        Nodes to wait for before a round starts, and valid artifacts needed to
        merge.
    max_bytes : int
        Largest accepted artifact, compressed or not.
    compress : bool
        Whether to gzip the broadcast global.
    round_offset : int
        Rounds already completed (when resuming): Flower's round ``r`` is
        round ``round_offset + r`` of the federation.
    wait_timeout : float
        Seconds to wait for ``min_nodes`` nodes to connect.
    registry : Registry or None
        Public keys every reply's signature is verified against (None: signing off).
    signer : Signer or None
        The server's key, which signs every broadcast global (None: signing off).
    run_id : int
        The Flower run this strategy serves (its ``Context.run_id``): globals are
        signed for it and replies must be signed for it.
    vote_phase : bool
        Whether each round ends with the vote exchange (the run votes: typed
        globals with prototypes).
    embedding : EmbeddingSpace or None
        The run's embedding space: artifacts in another are refused (None: the
        space of the artifacts already merged, see :func:`federation_space`).
    catalog : collection of str or None
        The federation's tool ids: artifacts with others are refused, and no
        reply may be larger than an artifact of these tools may be
        (:func:`~synapse_flwr.core.wire.wire_limit`, when below ``max_bytes``)
        (None: only artifacts that would push the tool union over the schema's
        limit are refused).
    noise_bound : NoiseBound or None
        The largest noise SDs an artifact may claim in this run: one claiming
        more is refused (None: no check; see
        :mod:`synapse_flwr.core.noise_claims`).

    Raises
    ------
    ValueError
        If ``min_nodes`` is not an integer >= 1 or ``max_bytes`` not a
        positive integer (:func:`check_strategy_args`).
    """

    def __init__(
        self,
        merge_fn: MergeFn,
        policy: str,
        min_nodes: int = 2,
        max_bytes: int = MAX_WIRE_BYTES,
        compress: bool = True,
        round_offset: int = 0,
        wait_timeout: float = 300.0,
        registry: Registry | None = None,
        signer: Signer | None = None,
        run_id: int = 0,
        vote_phase: bool = False,
        embedding: EmbeddingSpace | None = None,
        catalog: Collection[str] | None = None,
        noise_bound: NoiseBound | None = None,
    ) -> None:
        check_strategy_args(min_nodes, max_bytes)
        self.merge_fn = merge_fn
        self.policy = policy
        self.min_nodes = min_nodes
        self.catalog = None if catalog is None else frozenset(catalog)
        # what an artifact of the federation's tools may take: a payload that inflates past it is never parsed
        self.max_bytes = max_bytes if self.catalog is None else min(max_bytes, wire_limit(len(self.catalog)))
        self.compress = compress
        self.round_offset = round_offset
        self.wait_timeout = wait_timeout
        self.registry = registry
        self.signer = signer
        self.run_id = run_id
        self.vote_phase = vote_phase
        self.embedding = embedding
        self.noise_bound = noise_bound
        self.current: ArrayRecord | None = None  # the latest global merged (a vote phase's, after it)
        self.latest: dict[str, tuple[int | None, Compendium]] = {}
        self.bases: dict[str, tuple[str, bytes]] = {}  # org -> (sha256, canonical JSON) of its latest artifact
        self.reports: dict[int, RoundReport] = {}
        self._sent: list[Message] = []  # this round's messages, whose ids Flower sets when it pushes them
        self._released: list[int] = []  # nodes merged this round with a new release (the vote phase's)

    def restore(self, latest: dict[str, Compendium]) -> None:
        """Resume: each org's latest accepted artifact (owner unknown: new node ids after a restart)."""
        self.latest = {org: (None, art) for org, art in latest.items()}

    def org_of(self, node: int) -> str | None:
        """The organisation a node's artifact was accepted for, if any."""
        return next((org for org, (owner, _) in self.latest.items() if owner == node), None)

    def summary(self) -> None:
        """Log the strategy's settings."""
        log(
            INFO,
            "\t├── %s(policy=%s, min_nodes=%d, max_bytes=%d, round_offset=%d)",
            type(self).__name__, self.policy, self.min_nodes, self.max_bytes, self.round_offset,
        )

    def _node_ids(self, grid: Grid) -> list[int]:
        deadline = time.monotonic() + self.wait_timeout
        while len(ids := sorted(grid.get_node_ids())) < self.min_nodes:
            if time.monotonic() > deadline:
                log(WARNING, "only %d of %d nodes connected; proceeding", len(ids), self.min_nodes)
                break
            time.sleep(1.0)
        return ids

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the global compendium (signed when a signer is set) and the round's config to every node."""
        self._sent = self._messages(server_round, self.global_record(arrays), config, self._node_ids(grid),
                                    MessageType.TRAIN)
        return self._sent

    def global_record(self, arrays: ArrayRecord) -> ArrayRecord:
        """The global to broadcast and record: the latest merged here (a vote phase's), else Flower's ``arrays``."""
        return arrays if self.current is None else self.current

    def _messages(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, nodes: Sequence[int],
                  message_type: str) -> list[Message]:
        rnd = self.round_offset + server_round
        config = ConfigRecord({**dict(config), "server-round": rnd, "policy": self.policy})
        content = attach_signature(RecordDict({"arrays": arrays, "config": config}), self.signer, GLOBAL,
                                   self.run_id, rnd, from_record(arrays))
        held = {node: self.bases[org][0] for org, (node, _) in self.latest.items() if org in self.bases}
        return [Message(content=self._for_node(content, held.get(node)), message_type=message_type, dst_node_id=node)
                for node in nodes]

    @staticmethod
    def _for_node(content: RecordDict, base: str | None) -> RecordDict:
        # the node's own delta base travels in its copy of the config; the signed global is shared
        if base is None:
            return content
        config = ConfigRecord({**dict(content["config"]), DELTA_BASE: base})
        return RecordDict({**{k: v for k, v in content.items() if k != "config"}, "config": config})

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, merge the valid artifacts, report accepted and rejected."""
        rnd = self.round_offset + server_round
        saved = dict(self.latest), dict(self.bases)
        before = {org: art for org, (_, art) in self.latest.items()}
        intake = self._intake(rnd, replies, self.latest)
        # an org whose artifact is the one it sent before (but for the round) released nothing to vote with
        self._released = [node for org, (node, art) in self.latest.items()
                          if node in intake.accepted and not same_release(before.get(org), art)]
        report = RoundReport(round=rnd, accepted=intake.accepted, rejected=intake.rejected, bytes_in=intake.bytes_in,
                             artifacts_in=intake.artifacts_in, deltas_in=intake.deltas_in)
        self.reports[rnd] = report
        record = None
        if len(report.accepted) < self.min_nodes:
            log(WARNING, "round %d: %d valid artifacts, %d needed; global kept",
                rnd, len(report.accepted), self.min_nodes)
            if report.rejected and all(OUTSIDE_CATALOG in r.reason for r in report.rejected):
                log(ERROR, "round %d: every artifact was refused for tools outside the federation's catalog of %d "
                    "tools: if the organisations read a catalog of their own (node config catalog-path), name that "
                    "file in the run config's catalog", rnd, len(self.catalog or ()))
        elif (record := self._merge(report)) is None:
            self._revert(saved, rnd, report.accepted, report.rejected, report.merge_error or "merge failed")
            self._released = []
        metrics = {"accepted": len(report.accepted), "rejected": len(report.rejected),
                   "bytes-in": report.bytes_in}
        if record is None:
            return None, MetricRecord(metrics)
        return record, MetricRecord({**metrics, "bytes-out": report.bytes_out, "conflicts": report.conflicts})

    def _intake(self, rnd: int, replies: Iterable[Message],
                latest: dict[str, tuple[int | None, Compendium]]) -> Intake:
        """Check every reply to :attr:`_sent`; accepted artifacts become their org's latest.

        Each reply is checked on its own first (:meth:`_verified`), then the
        valid ones together against what the merge needs (:meth:`_unmergeable`),
        so what is refused there does not depend on the order replies arrived in.
        """
        intake = Intake()
        replies = list(replies)
        for node, reason in dropped_nodes(self._sent, replies, latest):
            self._reject(intake.rejected, rnd, node, reason)
        valid = self._verified(rnd, replies, intake)
        refused = self._unmergeable([(node, art) for node, art, _, _ in valid])
        for node, art, body, is_delta in valid:
            if node in refused:
                self._reject(intake.rejected, rnd, node, refused[node])
                continue
            self.latest[art.issuer.org] = (node, art)
            self.bases[art.issuer.org] = (sha256_hex(body), body)
            intake.deltas_in += is_delta
            intake.accepted.append(node)
        return intake

    def _verified(self, rnd: int, replies: Sequence[Message],
                  intake: Intake) -> list[tuple[int, Compendium, bytes, bool]]:
        """The replies valid on their own, as ``(node, artifact, canonical JSON, came as a delta)``; the rest rejected."""
        owners = {org: node for org, (node, _) in self.latest.items()}
        node_orgs = {node: org for org, node in owners.items() if node is not None}
        sent_to = {m.metadata.message_id: m.metadata.dst_node_id for m in self._sent}
        valid = []
        for msg in replies:
            # the SuperLink answers for an unavailable node from node 1: name the node the message went to
            node = sent_to.get(msg.metadata.reply_to_message_id, msg.metadata.src_node_id)
            base = self.bases.get(node_orgs.get(node, ""), (None, None))[1]
            art, body, size, reason = verify_reply(msg, self.max_bytes, self.registry, rnd, base, self.run_id)
            intake.bytes_in += size
            intake.artifacts_in += size > 0
            if reason is None and art is not None:
                reason = claim_problem(art.issuer.org, node, owners.get(art.issuer.org), node_orgs.get(node))
            if reason is not None or art is None or body is None:
                self._reject(intake.rejected, rnd, node, reason or "invalid artifact")
                continue
            owners[art.issuer.org], node_orgs[node] = node, art.issuer.org  # a second claim this round is refused too
            valid.append((node, art, body, DELTA_KEY in msg.content.array_records))
        return valid

    def _unmergeable(self, arrived: Sequence[tuple[int, Compendium]]) -> dict[int, str]:
        """Nodes whose valid artifact the merge could not take with the others, with the reason (never raises).

        Another embedding space than the federation's (:func:`federation_space`),
        tools outside the catalog, votes on other settings (:func:`votes_problem`),
        noise claimed beyond the run's bound (:func:`noise_claim_problem`), or a
        tool union over the schema's limit (:func:`tool_union_problems`).
        """
        held = {org: art for org, (_, art) in self.latest.items()}
        space, source = federation_space(self.embedding, held.values(), [art for _, art in arrived])
        out = {node: reason for node, art in arrived
               if (reason := space_problem(art, space, source) or catalog_problem(art, self.catalog)
                   or votes_problem(art) or noise_claim_problem(art, self.noise_bound))}
        out.update(tool_union_problems(held, [(node, art) for node, art in arrived if node not in out]))
        return out

    def _merge(self, report: RoundReport) -> ArrayRecord | None:
        """Merge every org's latest artifact into the round's global (:attr:`current`); the report gets its size.

        None when the merge fails, or its global would not validate as every
        client validates it: :attr:`current` stays the previous global and
        ``report.merge_error`` says why (the intake refuses what the merge is
        known to refuse; this keeps the server up through anything else).
        """
        try:
            merged = self.merge_fn([art for _, art in self.latest.values()])
            wire = encode(merged, compress=self.compress)
            decode(wire)  # as every client will: a global they would refuse is never broadcast
        except Exception as exc:  # noqa: BLE001 - one round's failed merge must not stop the federation
            report.merge_error = f"merge failed, previous global kept: {type(exc).__name__}: {exc}"[:MAX_REASON_CHARS]
            log(ERROR, "round %d: %s", report.round, report.merge_error)
            return None
        report.merged = True
        report.bytes_out = len(wire)
        report.conflicts = len(getattr(merged, "conflicts", []))
        report.epsilon = merged.privacy.epsilon
        log(INFO, "round %d: merged %d artifacts (%s), %d conflicts, %d bytes out",
            report.round, len(self.latest), self.policy, report.conflicts, report.bytes_out)
        self.current = to_record(wire)
        return self.current

    def _reject(self, rejected: list[Rejection], rnd: int, node: int, reason: str) -> None:
        org = self.org_of(node)
        rejected.append(Rejection(rnd, node, reason, org))
        log(WARNING, "round %d: rejected reply from node %d%s: %s", rnd, node, f" (org {org!r})" if org else "", reason)

    def _revert(self, saved: tuple[dict[str, tuple[int | None, Compendium]], dict[str, tuple[str, bytes]]], rnd: int,
                accepted: list[int], rejected: list[Rejection], reason: str) -> None:
        """Undo a phase whose merge failed: each org's latest and delta base as before it, its accepted rejected.

        Kept, an artifact the merge cannot take would fail every later round too.
        """
        self.latest, self.bases = dict(saved[0]), dict(saved[1])
        for node in accepted:
            self._reject(rejected, rnd, node, reason)
        accepted.clear()

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The vote phase: the round's new global to the nodes merged in it with a new release.

        None without ``vote_phase``, and none to an org whose artifact is the
        one it sent before (its records have voted already, or vote at its
        next train reply if its node missed a vote phase).

        The server evaluates the global itself; Flower's evaluate messages
        carry the vote exchange instead.
        """
        report = self.reports.get(self.round_offset + server_round)
        if not self.vote_phase or report is None or not report.merged or not self._released:
            self._sent = []
            return []
        self._sent = self._messages(server_round, self.global_record(arrays), config, self._released,
                                    MessageType.EVALUATE)
        return self._sent

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Check the vote-phase replies like train replies; merge the round's global again from the accepted ones."""
        report = self.reports.get(self.round_offset + server_round)
        if not self._sent or report is None:
            return None
        saved = dict(self.latest), dict(self.bases)
        # only this phase's addressees: an org that missed the round is not "no longer connected"
        intake = self._intake(report.round, replies, {})
        # a failed merge keeps the round's train global, and its orgs' artifacts as the train phase took them
        if intake.accepted and self._merge(report) is None:
            self._revert(saved, report.round, intake.accepted, intake.rejected, report.merge_error or "merge failed")
        report.votes_accepted, report.votes_rejected = intake.accepted, intake.rejected
        report.votes_bytes_in = intake.bytes_in
        return MetricRecord({"votes-accepted": len(intake.accepted), "votes-rejected": len(intake.rejected),
                             "votes-bytes-in": intake.bytes_in})
