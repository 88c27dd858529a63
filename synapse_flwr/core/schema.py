"""The typed compendium: the single source of truth for what crosses the wire.

Every artifact an organisation sends, and every global compendium the server
broadcasts, is a :class:`Compendium`. The models are strict (unknown fields are
rejected) and bounded (explicit limits on counts, list lengths and text sizes),
so that an edge node can validate an untrusted artifact before merging it.
The JSON Schema exported by :func:`json_schema` is generated from these models.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    model_serializer,
    model_validator,
)

SCHEMA_VERSION = "1.0"

# Limits. They bound the cost of validating and merging an untrusted artifact.
MAX_TOOLS = 20_000
MAX_SCENARIOS = 64  # per tool, per list (when / when_not)
MAX_ITEMS = 32  # per tool, per other list (precautions, confusions, next tools)
MAX_VARIANTS = 8  # alternative phrasings kept with one scenario
MAX_ORGS = 1_000
MAX_INPUTS = MAX_ORGS * 100  # organisation artifacts behind one global
ConflictField = Literal["when", "stats", "prototype"]
# The conflict log is bounded per tool and field (so it grows with the tools, never past one global
# constant); the merge keeps the best-supported and counts the rest in ``conflicts_dropped``.
MAX_CONFLICTS_PER_FIELD = 16
MAX_CONFLICTS = MAX_TOOLS * len(ConflictField.__args__) * MAX_CONFLICTS_PER_FIELD
MAX_CLAIMS = 16
MAX_TEXT = 300  # characters in one scenario / precaution text
MAX_DESCRIPTION = 2_000
MAX_COUNT = 1e12
MAX_DIM = 4096  # width of a prototype embedding space
MAX_SCALE = 1e6  # int8 step of a prototype vector (bounds every coordinate by 127 * MAX_SCALE)
VOTE_NOISE_SDS = 6.0  # fusion votes further than this from what the release allows are refused


def vote_bounds(records: float, sd: float) -> tuple[float, float]:
    """The range a setting's right routes may take among ``records`` voters with noise SD ``sd``."""
    return -VOTE_NOISE_SDS * sd, records + VOTE_NOISE_SDS * math.sqrt(2) * sd

MAX_TOOL_ID = 128  # characters of a tool id (longer normalised names are cut to it)
MAX_ORG_ID = 64
TOOL_ID_PATTERN = r"^[a-z0-9][a-z0-9_.\-]*$"
ToolId = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_TOOL_ID, pattern=TOOL_ID_PATTERN)
]
OrgId = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_ORG_ID, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
]
#: :data:`OrgId` in words, for the messages refusing one.
ORG_ID_RULE = f"1-{MAX_ORG_ID} of A-Z a-z 0-9 _ . -, starting with a letter or digit"
#: Issuer ids of the merged global and of the server's key: no organisation may claim them.
RESERVED_ORGS = ("global", "server")
Text = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT)]
Count = Annotated[float, Field(ge=0.0, le=MAX_COUNT, allow_inf_nan=False)]
Rate = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
_ORG_ID = TypeAdapter(OrgId)


def org_id_problem(org: str) -> str | None:
    """Why ``org`` cannot be an organisation's id, or None when it can (never raises).

    It must match :data:`ORG_ID_RULE` and not be one of :data:`RESERVED_ORGS`.

    Parameters
    ----------
    org : str
        The candidate id.
    """
    try:
        _ORG_ID.validate_python(org)
    except ValidationError:
        return f"use {ORG_ID_RULE}"
    if org in RESERVED_ORGS:
        return f"{org!r} is reserved (the merged global and the server's key use {' and '.join(RESERVED_ORGS)})"
    return None


def _sorted_unique(values: list[str]) -> list[str]:
    if values != sorted(set(values)):
        raise ValueError("must be sorted and free of duplicates")
    return values


SortedOrgs = Annotated[
    list[OrgId], Field(max_length=MAX_ORGS), AfterValidator(_sorted_unique)
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class Scenario(_Strict):
    """A situation in which a tool is (or is not) the right call.

    Parameters
    ----------
    text : str
        A representative phrase, or one of the catalog's public example
        requests (never a raw user query).
    support : float
        Noised number of distinct supporting queries; for an example request,
        the similarity-weighted number read off the tool's released prototype
        (:mod:`synapse_flwr.core.scenarios`).
    variants : list of str
        Other released phrases grouped with this one.
    orgs : list of str
        Organisations whose experience supports it (sorted).
    """

    text: Text
    support: Count
    variants: list[Text] = Field(default_factory=list, max_length=MAX_VARIANTS)
    orgs: SortedOrgs = Field(default_factory=list)


class WhenNot(Scenario):
    """A scenario in which the tool should not be called.

    Parameters
    ----------
    prefer : str or None
        The tool to use instead, when the experience says which.
    """

    prefer: ToolId | None = None


PrecautionKind = Literal["failure_mode", "dissent", "confusion", "low_success"]


class Precaution(_Strict):
    """A caveat attached to a tool: a failure mode or a minority view.

    Parameters
    ----------
    kind : {"failure_mode", "dissent", "confusion", "low_success"}
        What sort of caveat it is; ``dissent`` records a view that lost a
        conflict but is kept rather than voted away.
    text : str
        The caveat in words.
    support : float
        Noised support (number of events or orgs behind it).
    orgs : list of str
        Organisations that hold this view.
    """

    kind: PrecautionKind
    text: Text
    support: Count
    orgs: SortedOrgs = Field(default_factory=list)


class ToolStats(_Strict):
    """Noised call statistics.

    Parameters
    ----------
    calls : float
        Noised number of calls.
    successes : float
        Noised number of successful calls (at most ``calls``).
    starts : float
        Noised number of call sequences (e.g. tasks) whose first call is this
        tool: the start transition; 0 where no sequences were released.
    """

    calls: Count = 0.0
    successes: Count = 0.0
    starts: Count = 0.0

    @model_validator(mode="after")
    def _successes_within_calls(self) -> ToolStats:
        if self.successes > self.calls + 1e-9:
            raise ValueError("successes must not exceed calls")
        return self

    @property
    def success_rate(self) -> float | None:
        """Successes over calls, or None without calls."""
        return self.successes / self.calls if self.calls > 0 else None


class ToolCount(_Strict):
    """A weighted pointer to another tool (a confusion or a next call).

    Parameters
    ----------
    tool : str
        The other tool's id.
    count : float
        Noised number of events.
    """

    tool: ToolId
    count: Count


class Provenance(_Strict):
    """Where a tool entry's knowledge came from.

    Parameters
    ----------
    orgs : list of str
        Organisations that contributed experience for this tool.
    rounds : list of int
        Federation rounds in which it was contributed.
    """

    orgs: SortedOrgs = Field(default_factory=list)
    rounds: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=10_000)


class EmbeddingSpace(_Strict):
    """The embedding space prototypes live in: a router may use them only in the same space.

    Parameters
    ----------
    model : str
        Embedder id (e.g. ``all-MiniLM-L6-v2``).
    dim : int
        Width of every vector.
    normalization : {"l2"}
        How each query embedding was normalised before it was summed.
    """

    model: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    dim: Annotated[int, Field(ge=1, le=MAX_DIM)]
    normalization: Literal["l2"] = "l2"


def _int8_vector(data: str) -> str:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not base64: {exc}") from exc
    if not raw:
        raise ValueError("empty vector")
    return data


class Prototype(_Strict):
    """A tool's noised query prototype: the sum of the unit query embeddings of its calls.

    The vector is ``scale * int8`` per coordinate (base64 of the int8 bytes),
    so it is bounded by ``127 * scale``; its length is checked against the
    compendium's :class:`EmbeddingSpace`.

    Parameters
    ----------
    count : float
        Noised number of summed queries.
    scale : float
        Float step of the int8 coordinates.
    data : str
        Base64 of ``dim`` signed bytes.
    sum_sd : float
        Noise standard deviation of every coordinate of the sum.
    count_sd : float
        Noise standard deviation of ``count``.
    """

    count: Count
    scale: Annotated[float, Field(ge=0.0, le=MAX_SCALE, allow_inf_nan=False)]
    data: Annotated[
        str, StringConstraints(min_length=4, max_length=4 * (MAX_DIM // 3 + 1)), AfterValidator(_int8_vector)
    ]
    sum_sd: Count = 0.0
    count_sd: Count = 0.0

    @property
    def dim(self) -> int:
        """Number of coordinates."""
        return len(base64.b64decode(self.data))


class ToolEntry(_Strict):
    """Everything the compendium knows about one tool.

    Parameters
    ----------
    tool_id : str
        Normalised tool id.
    description : str
        The tool's documentation (from the catalog).
    when, when_not : list
        Scenarios for and against calling it.
    precautions : list of Precaution
        Failure modes and dissenting views.
    stats : ToolStats
        Noised call statistics.
    confusions : list of ToolCount
        Tools this one is mistaken for (the right tool when this one was called).
    next_tools : list of ToolCount
        Tools called right after this one.
    provenance : Provenance
        Contributing organisations and rounds.
    prototype : Prototype or None
        Noised sum of the tool's query embeddings (in the compendium's
        ``embedding`` space), or None.
    """

    tool_id: ToolId
    description: str = Field(default="", max_length=MAX_DESCRIPTION)
    when: list[Scenario] = Field(default_factory=list, max_length=MAX_SCENARIOS)
    when_not: list[WhenNot] = Field(default_factory=list, max_length=MAX_SCENARIOS)
    precautions: list[Precaution] = Field(default_factory=list, max_length=MAX_ITEMS)
    stats: ToolStats = Field(default_factory=ToolStats)
    confusions: list[ToolCount] = Field(default_factory=list, max_length=MAX_ITEMS)
    next_tools: list[ToolCount] = Field(default_factory=list, max_length=MAX_ITEMS)
    provenance: Provenance = Field(default_factory=Provenance)
    prototype: Prototype | None = None


class Issuer(_Strict):
    """Who produced the artifact.

    Parameters
    ----------
    org : str
        Organisation id, or ``"global"`` for a merged compendium.
    round : int
        Federation round (0 for a standalone build).
    """

    org: OrgId
    round: Annotated[int, Field(ge=0)] = 0


class PrivacyBlock(_Strict):
    """How the artifact was privatised.

    Parameters
    ----------
    mechanism : {"gaussian", "none"}
        Noise mechanism on numeric fields.
    clip : float
        L2 sensitivity bound of one event's contribution (sqrt of the number
        of counters one event may touch, plus ``1 + c^2`` with prototypes).
    sigma : float
        Standard deviation of the Gaussian noise on every count.
    noise_multiplier : float
        sigma / clip.
    epsilon : float or None
        Epsilon spent so far (None means no formal guarantee: privacy off).
    epsilon_target : float or None
        The budget for the planned rounds (None: off).
    delta : float
        Total delta (accounting plus partition selection).
    rounds_planned : int
        Rounds the budget was calibrated for.
    threshold : float
        Noised support a phrase needs to be released.
    text_policy : str
        How text fields are released.
    prototype_weight : float
        ``c``: each event adds ``c * u`` (``u`` a unit query embedding) to one
        tool's prototype sum in the same Gaussian release as the counts, so
        ``clip = sqrt(counters + 1 + c^2)`` (the ``+ 1`` is the prototype
        count) and the stored sum, divided by ``c``, carries noise
        ``sigma / c``; 0 when no prototypes are released.
    sequence_weight : float
        ``w`` of the start and transition counters of sequence records
        (:mod:`synapse_flwr.core.sequences`): the released ``starts`` and
        ``next_tools`` counts carry noise ``sigma / w``; 0 when the records
        are events.
    vote_share : float
        Share of the budget kept for each record's fusion vote
        (:mod:`synapse_flwr.core.votes`); 0 when the run does not vote.
    """

    mechanism: Literal["gaussian", "none"] = "none"
    clip: Count = 0.0
    sigma: Count = 0.0
    noise_multiplier: Count = 0.0
    epsilon: Count | None = None
    epsilon_target: Count | None = None
    delta: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    rounds_planned: Annotated[int, Field(ge=1)] = 1
    threshold: Count = 1.0
    text_policy: Literal["pii-masked+dp-partition-selection", "pii-masked"] = "pii-masked"
    prototype_weight: Annotated[float, Field(ge=0.0, le=100.0, allow_inf_nan=False)] = 0.0
    sequence_weight: Annotated[float, Field(ge=0.0, le=100.0, allow_inf_nan=False)] = 0.0
    vote_share: Annotated[float, Field(ge=0.0, le=0.5, allow_inf_nan=False)] = 0.0

    @model_validator(mode="after")
    def _within_budget(self) -> PrivacyBlock:
        # a release that claims more than its budget is broken or dishonest, never valid
        if self.epsilon is not None and self.epsilon_target is not None and \
                self.epsilon > self.epsilon_target * (1 + 1e-9):
            raise ValueError(f"epsilon {self.epsilon} exceeds the budget, epsilon_target {self.epsilon_target}")
        return self


class Claim(_Strict):
    """One side of a conflict.

    Parameters
    ----------
    view : str
        What this side claims (e.g. ``"when"``, ``"when_not"``, ``"rate=0.91"``).
    support : float
        Support behind the claim.
    orgs : list of str
        Organisations that make it.
    """

    view: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT)]
    support: Count
    orgs: SortedOrgs = Field(default_factory=list)


class Conflict(_Strict):
    """A typed disagreement between organisations, kept rather than voted away.

    Parameters
    ----------
    tool_id : str
        The tool concerned.
    field : {"when", "stats", "prototype"}
        The field the claims disagree on.
    subject : str
        What they disagree about (a scenario text, ``"success_rate"``, or
        ``"query_prototype"``).
    claims : list of Claim
        The competing claims with their support.
    resolution : str
        What the merge did.
    policy : str
        The merge policy that resolved it.
    """

    tool_id: ToolId
    field: ConflictField
    subject: Text
    claims: list[Claim] = Field(min_length=2, max_length=MAX_CLAIMS)
    resolution: Text
    policy: Annotated[str, StringConstraints(min_length=1, max_length=64)]


class DroppedConflicts(_Strict):
    """Conflicts of one tool and field found but not logged (over :data:`MAX_CONFLICTS_PER_FIELD`).

    Parameters
    ----------
    tool_id : str
        The tool concerned.
    field : {"when", "stats", "prototype"}
        The field of the conflicts.
    count : int
        How many were left out of the log (merging globals again keeps the
        largest count of any input, so it is a lower bound there).
    """

    tool_id: ToolId
    field: ConflictField
    count: Annotated[int, Field(ge=1, le=10**12)]


class FusionSetting(_Strict):
    """One way a router may add experience to the documentation (see ``fusion.Fusion``).

    Parameters
    ----------
    prototype : float
        Weight of the prototype evidence (0: documentation only).
    prior : float
        Weight of the count prior ``log(1 + n)``.
    """

    prototype: Annotated[float, Field(ge=0.0, le=100.0, allow_inf_nan=False)]
    prior: Annotated[float, Field(ge=0.0, le=10.0, allow_inf_nan=False)]


Vote = Annotated[float, Field(ge=-MAX_COUNT, le=MAX_COUNT, allow_inf_nan=False)]


class FusionVotes(_Strict):
    """Noised leave-one-out votes for how a router should fuse experience (:mod:`synapse_flwr.core.votes`).

    Parameters
    ----------
    settings : list of FusionSetting
        The settings voted on, in the order a tie is broken (least experience first).
    correct : list of float
        Per setting, the noised number of the voters' records it routes right
        when the record's own contribution is taken out of the global; noise
        may make one negative.
    records : float
        Noised number of records that voted (released with the sums, same
        noise; may be negative).
    sd : float
        Standard deviation of the noise on each sum and on ``records``.
    """

    settings: list[FusionSetting] = Field(min_length=1, max_length=MAX_ITEMS)
    correct: list[Vote] = Field(min_length=1, max_length=MAX_ITEMS)
    records: Vote = 0.0
    sd: Count = 0.0

    @model_validator(mode="after")
    def _one_sum_per_setting(self) -> FusionVotes:
        if len(self.correct) != len(self.settings):
            raise ValueError(f"{len(self.correct)} vote sums for {len(self.settings)} settings")
        return self


class Compendium(_Strict):
    """A typed tool-routing compendium: one org's artifact or the global merge.

    Parameters
    ----------
    schema_version : str
        Must equal :data:`SCHEMA_VERSION`.
    kind : {"org", "global"}
        One organisation's artifact, or a merge of several.
    issuer : Issuer
        Who produced it, in which round.
    privacy : PrivacyBlock
        How it was privatised (for a global: the loosest input guarantee).
    tools : list of ToolEntry
        One entry per tool, sorted by ``tool_id``, ids unique.
    conflicts : list of Conflict
        The typed conflict log (global compendia only), at most
        :data:`MAX_CONFLICTS_PER_FIELD` per tool and field.
    conflicts_dropped : list of DroppedConflicts
        Per tool and field, the conflicts left out of the log (sorted).
    policy : str or None
        Merge policy that produced a global compendium.
    inputs : list of str
        Content hashes of the artifacts merged into a global (sorted).
    orgs : list of str
        The organisations behind a global (sorted; empty for an org artifact,
        and left out of its JSON). With them a merge can refuse two inputs that
        hold one organisation's records (a global and that organisation's voted
        artifact), which would count its records twice.
    embedding : EmbeddingSpace or None
        The space of every tool's prototype; required when any tool has one.
    votes : FusionVotes or None
        Leave-one-out votes for the router's fusion setting (rounds after the
        first; None before any). Refused when they count more voters than the
        prototypes count released records, or a setting more right routes
        than voters, beyond :data:`VOTE_NOISE_SDS` noise SDs.
    """

    schema_version: Literal["1.0"] = SCHEMA_VERSION
    kind: Literal["org", "global"] = "org"
    issuer: Issuer
    privacy: PrivacyBlock = Field(default_factory=PrivacyBlock)
    tools: list[ToolEntry] = Field(default_factory=list, max_length=MAX_TOOLS)
    conflicts: list[Conflict] = Field(default_factory=list, max_length=MAX_CONFLICTS)
    conflicts_dropped: list[DroppedConflicts] = Field(
        default_factory=list, max_length=MAX_TOOLS * len(ConflictField.__args__)
    )
    policy: Annotated[str, StringConstraints(max_length=64)] | None = None
    inputs: list[Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]] = Field(
        default_factory=list, max_length=MAX_INPUTS
    )
    orgs: Annotated[list[OrgId], Field(max_length=MAX_INPUTS), AfterValidator(_sorted_unique)] = Field(
        default_factory=list)
    embedding: EmbeddingSpace | None = None
    votes: FusionVotes | None = None

    @model_serializer(mode="wrap")
    def _without_empty_orgs(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # an org artifact's JSON (and so its content hash) is what it was before globals named their orgs
        out = handler(self)
        if not out.get("orgs"):
            out.pop("orgs", None)
        return out

    @model_validator(mode="after")
    def _tools_sorted_unique(self) -> Compendium:
        ids = [t.tool_id for t in self.tools]
        if ids != sorted(set(ids)):
            raise ValueError("tools must be sorted by tool_id, ids unique")
        if self.kind == "org" and (self.conflicts or self.conflicts_dropped):
            raise ValueError("an org artifact carries no conflict log")
        if self.kind == "org" and self.orgs:
            raise ValueError("an org artifact names no orgs (its issuer is its org)")
        per_field = Counter((c.tool_id, c.field) for c in self.conflicts)
        crowded = [k for k, n in per_field.items() if n > MAX_CONFLICTS_PER_FIELD]
        if crowded:
            tool, field = min(crowded)
            raise ValueError(f"tool {tool!r} has {per_field[tool, field]} {field!r} conflicts, "
                             f"at most {MAX_CONFLICTS_PER_FIELD} per tool and field")
        keys = [(d.tool_id, d.field) for d in self.conflicts_dropped]
        if keys != sorted(set(keys)):
            raise ValueError("conflicts_dropped must be sorted by (tool_id, field), pairs unique")
        return self

    @model_validator(mode="after")
    def _prototypes_in_space(self) -> Compendium:
        for t in self.tools:
            if t.prototype is None:
                continue
            if self.embedding is None:
                raise ValueError(f"tool {t.tool_id!r} has a prototype but the compendium names no embedding space")
            if t.prototype.dim != self.embedding.dim:
                raise ValueError(
                    f"tool {t.tool_id!r}: prototype has {t.prototype.dim} dimensions, "
                    f"the embedding space {self.embedding.model!r} has {self.embedding.dim}"
                )
        return self

    @model_validator(mode="after")
    def _votes_plausible(self) -> Compendium:
        # Each voter is a released, labelled record: an organisation's votes cannot outnumber its
        # released prototype counts, nor a setting's right routes the voters (beyond VOTE_NOISE_SDS
        # noise SDs), so one organisation's votes weigh at most what its release does. (A global's
        # counts may be bounded below its votes by a robust merge, which clips counts tool by tool.)
        v = self.votes
        if v is None:
            return self
        protos = [t.prototype for t in self.tools if t.prototype is not None]
        counts = sum(p.count for p in protos)
        spread = VOTE_NOISE_SDS * math.sqrt(v.sd**2 + sum(p.count_sd**2 for p in protos))
        if self.kind == "org" and v.records > counts + spread:
            raise ValueError(f"votes from {v.records:g} records, but the prototypes count {counts:g} released records")
        low, high = vote_bounds(v.records, v.sd)
        for setting, correct in zip(v.settings, v.correct):
            if not low <= correct <= high:
                raise ValueError(f"votes: {correct:g} right routes under (prototype {setting.prototype:g}, prior "
                                 f"{setting.prior:g}) from {v.records:g} voters is outside [{low:g}, {high:g}]")
        return self

    def tool(self, tool_id: str) -> ToolEntry | None:
        """Return the entry for ``tool_id``, or None."""
        for entry in self.tools:
            if entry.tool_id == tool_id:
                return entry
        return None


class FlatCompendium(_Strict):
    """The untyped ablation: one free-text string per tool.

    Parameters
    ----------
    schema_version : str
        Must equal :data:`SCHEMA_VERSION`.
    kind : {"org", "global"}
        As for :class:`Compendium`.
    issuer : Issuer
        Who produced it.
    privacy : PrivacyBlock
        How it was privatised.
    texts : dict of str to str
        Tool id to its flat text.
    policy : str or None
        Merge policy for a global.
    """

    schema_version: Literal["1.0"] = SCHEMA_VERSION
    kind: Literal["org", "global"] = "org"
    issuer: Issuer
    privacy: PrivacyBlock = Field(default_factory=PrivacyBlock)
    texts: dict[ToolId, Annotated[str, StringConstraints(max_length=20_000)]] = Field(
        default_factory=dict, max_length=MAX_TOOLS
    )
    policy: Annotated[str, StringConstraints(max_length=64)] | None = None


def json_schema() -> dict:
    """JSON Schema of :class:`Compendium`, generated from the models."""
    schema = Compendium.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://synapse-flwr.dev/schema/compendium-{SCHEMA_VERSION}.json"
    return schema

