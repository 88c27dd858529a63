"""The run config: every key of ``[tool.flwr.app.config]``, typed, in one place.

The ClientApp, the ServerApp, ``synapse simulate``, ``synapse deploy-local``
and the experiment driver all read the federation's settings through
:class:`RunConfig`. Each key has one type, one default (the value written in
``pyproject.toml``, which a test keeps equal to :data:`KEYS`), a range and a
help text. An unknown key, a value of the wrong type or one out of range is a
:class:`RunConfigError` naming the key, never a silent default.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from synapse_flwr.core.embed import EMBEDDERS, LEXICAL
from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.merge import FLAT_MAJORITY, POLICIES
from synapse_flwr.core.privacy import DEFAULT_DELTA, DEFAULT_EPSILON, MAX_DELTA

# Embedders whose space is fixed (TF-IDF's is fitted per corpus, so it cannot carry prototypes).
SPACES = (*(name for name in EMBEDDERS if name != LEXICAL), "none")


class RunConfigError(SynapseError, ValueError):
    """A run-config key that is unknown, of the wrong type or out of range."""


def _between(low: float, high: float, low_open: bool = False) -> Callable[[float], str | None]:
    def check(value: float) -> str | None:
        below = value <= low if low_open else value < low
        if below or value > high or (isinstance(value, float) and math.isnan(value)):
            left = "(" if low_open else "["
            return f"must be in {left}{low}, {high}]"
        return None

    return check


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str | None]:
    return lambda value: None if value in choices else f"must be one of {', '.join(choices)}"


def _non_empty(value: str) -> str | None:
    return None if value.strip() else "must not be empty"


@dataclass(frozen=True)
class Key:
    """One run-config key.

    Parameters
    ----------
    name : str
        The key as written in TOML (``num-rounds``).
    type : type
        ``int``, ``float``, ``str`` or ``bool``.
    default : Any
        The value in ``pyproject.toml``.
    help : str
        What it does, in one line.
    check : callable or None
        Returns why a (well-typed) value is out of range, or None.
    """

    name: str
    type: type
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None

    @property
    def field(self) -> str:
        """The :class:`RunConfig` attribute (``num_rounds``)."""
        return self.name.replace("-", "_")

    def parse(self, value: Any) -> Any:
        """The value as this key's type, or a :class:`RunConfigError` naming the key."""
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, self.type) or (self.type is int and isinstance(value, bool)):
            raise RunConfigError(
                f"run config {self.name!r}: expected {self.type.__name__}, got {value!r} "
                f"({type(value).__name__}); {self.help}"
            )
        problem = self.check(value) if self.check else None
        if problem:
            raise RunConfigError(f"run config {self.name!r} {problem}, got {value!r}; {self.help}")
        return value


KEYS: tuple[Key, ...] = (
    Key("num-rounds", int, 3, "federation rounds", _between(1, 10_000)),
    Key("dataset", str, "demo", "demo | metatool | taubench | a folder in the generic format", _non_empty),
    Key("catalog", str, "", "the federation's tool catalog file, which every artifact's tools must be from (empty: "
        "the catalog of dataset); in a deployment whose organisations pass catalog-path, name that file here"),
    Key("policy", str, "typed", "merge policy: " + " | ".join(POLICIES), _one_of(tuple(POLICIES))),
    Key("min-nodes", int, 2, "fewest valid artifacts a round merges", _between(1, 100_000)),
    Key("epsilon", float, DEFAULT_EPSILON, "privacy budget per record over the whole run; inf turns privacy off",
        _between(0.0, math.inf, low_open=True)),
    Key("delta", float, DEFAULT_DELTA, "privacy delta per record over the whole run", _between(0.0, MAX_DELTA, low_open=True)),
    Key("alpha", float, 0.5, "Dirichlet skew when experience is re-partitioned", _between(0.0, 1e6, low_open=True)),
    Key("seed", int, 42, "seed of the data split (and of the noise when noise is seeded)", _between(0, 2**63 - 1)),
    Key("noise", str, "secret", "where each organisation's DP noise comes from: secret (a seed from the OS's "
        "random source, drawn by the organisation) | seeded (from seed, org and round: reproducible experiments "
        "only, since anyone who knows them, the server included, can regenerate the noise and remove it)",
        _one_of(("secret", "seeded"))),
    Key("output-dir", str, "runs/latest", "where the server writes globals and metrics.json", _non_empty),
    Key("release-cache", str, "", "client release cache folder (empty: <output-dir>/release-cache)"),
    Key("round-timeout", float, 600.0, "seconds a round waits for replies", _between(0.0, 86_400.0, low_open=True)),
    Key("replay", bool, False, "feedback loop: replay own traffic with the global, outcomes become experience"),
    Key("max-windows", int, 16, "most release windows an organisation's cache may hold: a client releases no "
        "window past them and the server refuses noise claimed beyond them (docs/privacy.md)", _between(1, 10_000)),
    Key("embedder", str, "minilm", "the federation's embedding space (query prototypes, replay, evaluation): "
        + " | ".join(SPACES) + " (none: no prototypes)", _one_of(SPACES)),
    Key("fusion-votes", bool, True, "after each round's merge its records vote, under DP, for how much the router "
        "trusts experience (5% of the budget; needs an embedder)"),
    Key("evaluate", bool, True, "server-side evaluation of each round's global on the dataset's test queries"),
    Key("inject", float, 0.0, "share of each org's events corrupted (robustness experiments)", _between(0.0, 1.0)),
    Key("sign", bool, True, "sign every artifact and global and verify them against keys-file (false turns it off)"),
    Key("keys-file", str, "", "public-key registry from `synapse keygen` (empty: the demo key set, not secrets)"),
    Key("wire-delta", bool, True, "after round 1 send a delta against the org's previous artifact (false: always full)"),
    Key("fail-round", int, 0, "fault injection: the round in which the fail-orgs' ClientApps raise (0: never)",
        _between(0, 10_000)),
    Key("fail-orgs", str, "", "fault injection: comma-separated orgs that fail in fail-round"),
    Key("fail-delay", float, 0.0, "fault injection: seconds the fail-orgs' ClientApps hang in fail-round before "
        "they raise (a stalled node)", _between(0.0, 86_400.0)),
    Key("capture-dir", str, "", "privacy audit: folder where each ClientApp writes every message it sends "
        "(empty: off)"),
)
BY_NAME: dict[str, Key] = {k.name: k for k in KEYS}


@dataclass(frozen=True)
class RunConfig:
    """The federation's settings; see :data:`KEYS` for each key's meaning and range."""

    num_rounds: int
    dataset: str
    catalog: str
    policy: str
    min_nodes: int
    epsilon: float
    delta: float
    alpha: float
    seed: int
    noise: str
    output_dir: str
    release_cache: str
    round_timeout: float
    replay: bool
    max_windows: int
    embedder: str
    fusion_votes: bool
    evaluate: bool
    inject: float
    sign: bool
    keys_file: str
    wire_delta: bool
    fail_round: int
    fail_orgs: str
    fail_delay: float
    capture_dir: str

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RunConfig:
        """Validate a run config (Flower's ``context.run_config``); missing keys take their default.

        Raises
        ------
        RunConfigError
            For an unknown key (listing the known ones), a wrong type or a value out of range.
        """
        check_overrides(values)
        return cls(**{k.field: k.parse(values[k.name]) if k.name in values else k.default for k in KEYS})

    def to_mapping(self) -> dict[str, Any]:
        """The TOML-keyed form (``{"num-rounds": 3, ...}``)."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in fields(self)}

    @property
    def private(self) -> bool:
        """Whether the artifacts carry a DP guarantee (finite epsilon)."""
        return math.isfinite(self.epsilon)

    @property
    def votes(self) -> bool:
        """Whether orgs cast fusion votes: asked for, and prototypes to vote on.

        A flat-majority global keeps no prototypes, so under that policy the
        records keep no budget share for a vote they could never cast. Records
        vote in the round that released them (the round's vote phase), so one
        round is enough.
        """
        return self.fusion_votes and self.embedder != "none" and self.policy != FLAT_MAJORITY


# Keys a run may change when it resumes an output folder: more rounds, how long to wait
# and for how many nodes, what is measured, votes switched on later (docs/privacy.md:
# records released without the vote share never vote), where new noise comes from (what was
# released stays as released), how many windows a cache may hold (a cache holding more than a
# lowered max-windows refuses the run, naming both), the server's catalog (what it accepts from
# now on; what it holds stays), and the fault injection of tests.
# Every other key shaped the artifacts on disk (and the release cache their privacy rests on).
RESUMABLE = frozenset({"num-rounds", "max-windows", "catalog", "output-dir", "round-timeout", "min-nodes",
                       "evaluate", "fusion-votes", "noise", "fail-round", "fail-orgs", "fail-delay", "capture-dir"})


def release_cache_dir(output_dir: str | Path, folder: str = "") -> Path:
    """The folder of the ClientApps' release caches: ``folder`` (a node's or the run's ``release-cache``), or
    ``<output-dir>/release-cache`` when it is empty."""
    return Path(folder or Path(output_dir) / "release-cache")


def resume_conflict(output_dir: str | Path, recorded: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """Why a run may not resume the rounds recorded in ``output_dir``; None when it may.

    Parameters
    ----------
    output_dir : str or Path
        The output folder (named in the message).
    recorded : mapping
        The run config its ``metrics.json`` recorded (TOML keys).
    current : mapping
        The new run's whole run config (TOML keys); keys missing from either side are not compared.
    """
    def effective(config: Mapping[str, Any], key: str) -> Any:
        # the release caches' folder: '' is <output-dir>/release-cache, where the ClientApps keep them
        if key == "release-cache":
            return str(release_cache_dir(output_dir, str(config[key])).resolve())
        return config[key]

    # under replay each window is calibrated for num-rounds releases (privacy.md): the caches of another count are
    # another run's, which the ClientApps would start afresh, releasing every record again
    resumable = RESUMABLE - {"num-rounds"} if recorded.get("replay") or current.get("replay") else RESUMABLE
    changed = [f"{key} {recorded[key]!r} -> {current[key]!r}"
               for key in sorted((set(recorded) & set(current)) - resumable)
               if effective(recorded, key) != effective(current, key)]
    if not changed:
        return None
    # (moving it aside keeps the organisations' release caches: removed, a later run would release every record again)
    return (f"{output_dir} holds rounds of a run with other settings ({'; '.join(changed)}); resuming would "
            "mix the two: set another output-dir (flwr run: --run-config \"output-dir='PATH'\"; synapse "
            "simulate / deploy-local: --set output-dir=PATH), or move that folder aside, keeping the release "
            "caches it may hold")


class RecordedRunError(SynapseError):
    """A run's ``metrics.json`` that exists but cannot be read as the rounds it recorded."""


def recorded_run(metrics_path: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """The rounds and run config a run's ``metrics.json`` recorded; None when there is no such file.

    The launchers read it before they start anything and the ServerApp when
    it resumes, so an unreadable one is named here instead of failing the
    ServerApp with a bare ``JSONDecodeError`` after every process started.

    Parameters
    ----------
    metrics_path : str or Path
        ``<output-dir>/metrics.json``.

    Returns
    -------
    (list of dict, dict) or None
        Its round records (each with an integer ``round``) and its
        ``run_config`` (empty when it recorded none).

    Raises
    ------
    RecordedRunError
        If it exists but cannot be read, is not JSON, or is not an object
        with a list of ``rounds``, naming the file and what is wrong.
    """
    path = Path(metrics_path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # a folder, no permission, not UTF-8, not JSON
        problem: str | None = f"{type(exc).__name__}: {exc}"
    else:
        problem = _metrics_problem(doc)
    if problem:
        raise RecordedRunError(
            f"{path} cannot be read as the metrics of the rounds in that folder ({problem}), so no run can "
            "resume from it: remove that folder or set another output-dir (flwr run: --run-config "
            "\"output-dir='PATH'\"; synapse simulate / deploy-local: --set output-dir=PATH)")
    return doc["rounds"], doc.get("run_config", {})


def _metrics_problem(doc: Any) -> str | None:
    """What in a parsed ``metrics.json`` a resumed run could not use; None when nothing."""
    if not (isinstance(doc, dict) and isinstance(doc.get("rounds"), list)):
        return 'expected a JSON object with a list of "rounds"'
    for i, record in enumerate(doc["rounds"]):
        if not (isinstance(record, dict) and type(record.get("round")) is int):  # bool is not a round
            return f'rounds[{i}] is not a round record with an integer "round"'
    if not isinstance(doc.get("run_config", {}), dict):
        return f'"run_config" must be an object, got {type(doc["run_config"]).__name__}'
    return None


def check_overrides(values: Mapping[str, Any]) -> dict[str, Any]:
    """Validate run-config overrides before any work; returns them parsed.

    Raises
    ------
    RunConfigError
        For an unknown key (listing the known ones), a wrong type or a value out of range.
    """
    unknown = sorted(set(values) - set(BY_NAME))
    if unknown:
        raise RunConfigError(
            f"unknown run-config key(s) {', '.join(map(repr, unknown))}; known keys: {', '.join(BY_NAME)}"
        )
    return {name: BY_NAME[name].parse(value) for name, value in values.items()}
