"""An experiment's config: the ``[experiment]`` table of a TOML file, read and checked, and what it may name.

Every mistake is a :class:`~synapse_flwr.core.errors.SynapseError` naming the
key, raised before any work starts (:meth:`ExperimentConfig.from_toml`).
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import json
import math
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from synapse_flwr.core.embed import EMBEDDERS
from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.merge import FLAT_MAJORITY, TYPED
from synapse_flwr.core.privacy import DEFAULT_DELTA, DEFAULT_EPSILON
from synapse_flwr.core.router import RENDERS, RERANKERS
from synapse_flwr.data.federation import KNOWN_DATASETS, own_orgs

# K for a benchmark that comes pooled (MetaTool, tau-bench): the paper's protocol
DEFAULT_ORGS = 5


ARMS = ("local_only", "docs_only", "federated", "federated_private", "centralized", "classifier",
        "oracle", "fedavg_dp")
#: The arms the LLM sample reranks (those of ``arms`` among them).
LLM_ARMS = ("docs_only", "federated", "centralized")


MERGES = (TYPED, FLAT_MAJORITY)


SPLITS = ("seen", "heldout")


def resolve_dataset(dataset: str, config: Path | None = None) -> str:
    """A built-in dataset's name as it is; any other ``dataset`` as the absolute path of its folder.

    ``demo``, ``metatool`` and ``taubench`` always name the built-in datasets,
    whatever folder of that name the working folder holds (``./demo`` names
    the folder). A relative folder is read from the working folder, like a
    config's ``output`` and ``cache``; one not there but beside ``config`` is
    the one beside it, so a dataset kept next to its config is found from
    anywhere. The path is made absolute here, once, so that the experiment
    driver and its Flower clients (in another working folder) read the same
    folder, and a folder is never taken for a built-in name.

    Parameters
    ----------
    dataset : str
        The config's ``dataset``.
    config : Path or None
        The config file, if any.

    Returns
    -------
    str
        The name, or the folder's absolute path (symbolic links kept).
    """
    if dataset in KNOWN_DATASETS:
        return dataset
    path = Path(dataset)
    if config is not None and not path.is_absolute() and not path.exists() and (config.parent / path).is_dir():
        path = config.parent / path
    return os.path.abspath(path)


@dataclass(frozen=True)
class ExperimentConfig:
    """An experiment, as read from the ``[experiment]`` table of a TOML file.

    Parameters
    ----------
    dataset : str
        ``metatool``, ``taubench``, ``demo`` or a dataset folder (made
        absolute, see :func:`resolve_dataset`).
    name : str
        Title of the tables (default: the dataset's name).
    seeds : list of int
        One split, partition and noise draw per seed.
    orgs : int
        Organisations (K), each a simulated Flower SuperNode; 0 (the
        default): the dataset's own organisations (a folder's
        ``org_*.jsonl`` logs, the demo's three), else (a pooled benchmark,
        or a folder with a single log) :data:`DEFAULT_ORGS`. Any other K
        re-partitions the pooled experience non-IID.
    alpha : float
        Dirichlet concentration of the non-IID partition.
    rounds : int
        Federation rounds.
    epsilon : float
        Budget of the private arms (``federated_private``, ``fedavg_dp``).
    delta : float
        Their delta.
    embedder : str
        Embedder of every router arm (and of the ``fedavg_dp`` head).
    reranker : str
        Reranker of every router arm.
    k : int
        Candidates retrieved (recall is recall@k).
    arms : list of str
        Arms to run (see :data:`ARMS`).
    rates : list of float
        Contradiction rates; 0 is the clean setting. Only ``[0.0]`` by
        default: each other rate is two more Flower runs per seed (one per
        merge), which on a 2-core machine more than doubles a run; the sweep
        is opt-in, e.g. ``rates = [0.0, 0.2, 0.4, 0.6]``.
    merges : list of str
        Merge policies of the 2x2 and of the contradiction sweep (both run only
        with the ``federated`` arm: they are its ablations).
    renders : list of str
        Renders of the 2x2.
    sweep_epsilon : float
        Budget of the 2x2 and contradiction federations (``inf``: privacy
        off, which isolates the merge).
    replay : bool
        Also run the feedback loop (clients replay their traffic with the
        last global; outcomes become experience) for the per-round figure.
    llm_model : str
        litellm model of the LLM-reranker sample.
    llm_sample : int
        Queries per split for the LLM reranker (first seed only; 0: off).
    fedavg : dict
        Extra keyword arguments of :func:`synapse_flwr.eval.baselines.fedavg_dp_arm`.
    output : str
        Folder of the results (default ``docs/results/<name>``).
    cache : str
        Folder of the resumable cache, Flower outputs and per-unit JSON
        (default ``runs/experiments/<name>``).
    timeout : float
        Seconds one Flower simulation may take.
    """

    dataset: str
    name: str = ""
    seeds: list[int] = field(default_factory=lambda: [42, 123, 456])
    orgs: int = 0
    alpha: float = 0.5
    rounds: int = 3
    epsilon: float = DEFAULT_EPSILON
    delta: float = DEFAULT_DELTA
    embedder: str = "minilm"
    reranker: str = "fields"
    k: int = 5
    arms: list[str] = field(default_factory=lambda: list(ARMS))
    rates: list[float] = field(default_factory=lambda: [0.0])
    merges: list[str] = field(default_factory=lambda: list(MERGES))
    renders: list[str] = field(default_factory=lambda: list(RENDERS))
    sweep_epsilon: float = math.inf
    replay: bool = True
    llm_model: str = "local/smollm2"
    llm_sample: int = 0
    fedavg: dict = field(default_factory=dict)
    output: str = ""
    cache: str = ""
    timeout: float = 1800.0

    @classmethod
    def from_toml(cls, path: Path) -> ExperimentConfig:
        """Read and check a config; every mistake is a :class:`SynapseError` naming the key.

        A dataset folder stands for the one-line config ``dataset = "<folder>"``
        (a folder, even one named like a built-in dataset).
        """
        if path.is_dir():
            cfg = cls(dataset=os.path.abspath(path))
            cfg.check(path)
            return cfg
        try:
            # utf-8-sig: an editor's byte order mark is no TOML mistake (it read as 'Invalid statement' at 1:1)
            raw = tomllib.loads(path.read_text(encoding="utf-8-sig"))
        except OSError as exc:
            raise SynapseError(f"cannot read experiment config {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SynapseError(f"{path}: not valid TOML: {exc}") from None
        table = raw.get("experiment")
        if not isinstance(table, dict):
            found = [k for k, v in raw.items() if isinstance(v, dict)]
            seen = f" (it holds {', '.join(f'[{k}]' for k in found)})" if found else ""
            raise SynapseError(f"{path}: needs an [experiment] table{seen}")
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(table) - known):
            # a misspelt key (seed for seeds, epsilson) is named with the key meant
            close = [f"{k} -> {m[0]}" for k in unknown if (m := difflib.get_close_matches(k, known, 1, 0.75))]
            meant = f"; did you mean {', '.join(close)}?" if close else ""
            raise SynapseError(f"{path}: unknown keys in [experiment]: {', '.join(unknown)}{meant} "
                               f"(known: {', '.join(sorted(known))})")
        for key in ("epsilon", "sweep_epsilon"):
            if table.get(key) == "inf":
                table[key] = math.inf
        if "dataset" not in table:
            raise SynapseError(f"{path}: [experiment] needs dataset = \"demo\", \"metatool\", \"taubench\" or a folder")
        annotations = {f.name: str(f.type) for f in fields(cls)}
        # a budget given as a word ("infinity", "none") is told the one word read
        wrong = [p + (' (a number, or "inf": privacy off)' if k in ("epsilon", "sweep_epsilon") else "")
                 for k, v in table.items() if (p := _wrong_type(k, v, annotations[k]))]
        if wrong:
            raise SynapseError(f"{path}: " + "; ".join(wrong))
        dataset = resolve_dataset(table["dataset"], path)
        if dataset not in KNOWN_DATASETS and not os.path.exists(dataset):
            raise SynapseError(f"{path}: {_missing_dataset(table['dataset'], path)}")
        cfg = cls(**{**table, "dataset": dataset})
        cfg.check(path)
        return cfg

    def __post_init__(self) -> None:
        # a folder as an absolute path: the same folder for the driver and every Flower client
        object.__setattr__(self, "dataset", resolve_dataset(str(self.dataset)))
        if not self.orgs:  # keep the organisations a dataset folder comes with
            object.__setattr__(self, "orgs", own_orgs(str(self.dataset)) or DEFAULT_ORGS)
        if not self.name:  # a title only: a config may name just its dataset
            object.__setattr__(self, "name", Path(str(self.dataset)).name or str(self.dataset))
        slug = re.sub(r"[^a-z0-9_.-]+", "_", self.name.lower()).strip("_.") or "experiment"
        if not self.output:
            object.__setattr__(self, "output", f"docs/results/{slug}")
        if not self.cache:
            object.__setattr__(self, "cache", f"runs/experiments/{slug}")

    @property
    def sweeps(self) -> bool:
        """Whether the 2x2 and the contradiction sweep run: they are ablations of the federated arm.

        A config that leaves ``federated`` out of ``arms`` to save time would
        otherwise still pay for their Flower runs (one per merge and rate).
        """
        return "federated" in self.arms

    def check(self, where: Path | str = "config") -> None:
        """Reject impossible settings with a message naming the key."""
        # an empty list runs nothing of its kind: a results folder without its table, not a choice
        problems = [f"{key}: an empty list; name at least one, or leave the key out for the default"
                    for key in ("arms", "rates", "merges", "renders") if not getattr(self, key)]
        if bad := sorted(set(self.arms) - set(ARMS)):
            problems.append(f"arms: unknown {bad}; choose from {', '.join(ARMS)}")
        if bad := sorted(set(self.merges) - set(MERGES)):
            problems.append(f"merges: unknown {bad}; choose from {', '.join(MERGES)}")
        if bad := sorted(set(self.renders) - set(RENDERS)):
            problems.append(f"renders: unknown {bad}; choose from {', '.join(RENDERS)}")
        if problem := _seeds_problem(self.seeds):
            problems.append(problem)
        if any(not 0.0 <= r < 1.0 for r in self.rates):
            problems.append(f"rates: each must be in [0, 1), got {self.rates}")
        if len(set(self.rates)) < len(self.rates):  # one rate's runs twice, and its table row twice
            problems.append(f"rates: each rate once, got {self.rates}")
        if self.orgs < 2:
            problems.append(f"orgs: a federation needs at least 2 organisations, got {self.orgs}")
        if self.rounds < 1 or self.k < 1:
            problems.append(f"rounds and k must be at least 1, got rounds {self.rounds}, k {self.k}")
        if not self.epsilon > 0 or not self.sweep_epsilon > 0:
            problems.append("epsilon and sweep_epsilon must be positive ('inf' turns privacy off), got epsilon "
                            f"{self.epsilon}, sweep_epsilon {self.sweep_epsilon}")
        if self.merges and TYPED not in self.merges:
            problems.append("merges: must include 'typed' (the main arm)")
        # an infinite alpha gives NaN Dirichlet shares: a partition of garbage, not an IID one
        if not 0 < self.alpha < math.inf or not 0 < self.delta < 1 or not self.timeout > 0:
            problems.append(f"alpha must be a finite number > 0, timeout positive and delta in (0, 1), got alpha "
                            f"{self.alpha}, delta {self.delta}, timeout {self.timeout}")
        if self.embedder not in EMBEDDERS:
            problems.append(f"embedder: unknown {self.embedder!r}; choose from {', '.join(sorted(EMBEDDERS))}")
        if self.reranker not in RERANKERS:
            problems.append(f"reranker: unknown {self.reranker!r}; choose from {', '.join(RERANKERS)}")
        problems += self._llm_problems() + self._run_problems() + _fedavg_problems(self.fedavg)
        if problems:
            raise SynapseError(f"{where}: " + "; ".join(problems))

    def _llm_problems(self) -> list[str]:
        """The LLM sample's size and model, named now: the model is first loaded after every Flower run."""
        from synapse_flwr.core.router import DOCS_CANDIDATES, check_router_args

        if self.llm_sample < 0:
            return [f"llm_sample: queries per split, 0 (off) or more, got {self.llm_sample}"]
        if not self.llm_sample and self.reranker != "llm":
            return []
        if self.llm_sample and not set(LLM_ARMS) & set(self.arms):
            return [f"llm_sample: reranks the arms {', '.join(LLM_ARMS)}, and arms holds none of them"]
        try:
            check_router_args("llm", self.k, "typed", self.llm_model, "auto", None, DOCS_CANDIDATES)
        except ValueError as exc:
            return [f"llm_model: {exc}"]
        from synapse_flwr.core.llm import LLMError, call_timeout

        try:
            call_timeout()
        except LLMError as exc:
            return [str(exc)]
        return []

    def _run_problems(self) -> list[str]:
        """What every Flower run of the experiment would refuse, named by this config's keys.

        A run config is first made after the dataset loads, and a budget that
        no noise meets fails inside the ClientApps, after the first Flower run.
        """
        from synapse_flwr.core.privacy import gaussian_noise_multiplier
        from synapse_flwr.flower.config import RunConfig

        problems = []
        for key, run_key in (("rounds", "num-rounds"), ("orgs", "min-nodes"), ("delta", "delta"), ("alpha", "alpha")):
            try:
                RunConfig.from_mapping({run_key: getattr(self, key)})
            except SynapseError as exc:
                problems.append(f"{key}: {exc}")
        for key in ("epsilon", "sweep_epsilon"):
            budget = getattr(self, key)
            if 0 < budget < math.inf and 0 < self.delta < 1:
                try:  # the calibration depends on epsilon and delta only, not on the releases
                    gaussian_noise_multiplier(budget, self.delta, 1)
                except ValueError as exc:
                    problems.append(f"{key}: {exc}")
        return problems

    def fedavg_option(self, key: str) -> Any:
        """The fedavg_dp arm's option ``key``: this config's ``fedavg`` table, else the arm's default."""
        return self.fedavg.get(key, _fedavg_options()[key])

    def fingerprint(self) -> str:
        """Hash of everything that changes a measurement (not output or cache paths)."""
        keep = {k: v for k, v in asdict(self).items() if k not in ("output", "cache", "name", "timeout")}
        return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


# What a TOML value of each annotated config type may be (bool is an int to Python, not to a config).
_SCALARS: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "dict": lambda v: isinstance(v, dict),
}


def _missing_dataset(dataset: str, config: Path) -> str:
    """Why a config's ``dataset`` names nothing, with every place it was looked for (:func:`resolve_dataset`).

    Found first after the config was read, it named only the working folder's path, not the config's folder a
    relative one is also read from.
    """
    places = [f"{os.path.abspath(dataset)} (from the working folder)"]
    if not Path(dataset).is_absolute():
        places.append(f"{os.path.abspath(config.parent / dataset)} (beside the config)")
    return (f"dataset: no folder {' nor '.join(places)}; name {', '.join(map(repr, KNOWN_DATASETS))} or a "
            "dataset folder")


def _fedavg_options() -> dict[str, Any]:
    """Keyword options of the fedavg_dp arm a config's ``fedavg`` table may set (not those the experiment sets),
    with their defaults."""
    from synapse_flwr.eval.baselines import fedavg_dp_arm

    given = {"embedder", "seed", "extra_tests", "k"}
    return {n: p.default for n, p in inspect.signature(fedavg_dp_arm).parameters.items()
            if p.default is not p.empty and n not in given}


def _seeds_problem(seeds: list[int]) -> str | None:
    """Why ``seeds`` cannot be run, or None: each is one split and noise draw, so none may be negative or repeated.

    A negative seed is refused by numpy's generators, first after the first seed's Flower runs; a repeated one
    would be reported as a draw it is not.
    """
    if not seeds:
        return "seeds: at least one seed is needed"
    if negative := [s for s in seeds if s < 0]:
        return f"seeds: each must be an integer >= 0, got {negative[0]}"
    if repeated := sorted({s for s in seeds if seeds.count(s) > 1}):
        return f"seeds: each seed is one draw, listed once; {repeated[0]} is listed {seeds.count(repeated[0])} times"
    return None


def _fedavg_problems(table: dict) -> list[str]:
    """Unknown keys of the ``fedavg`` table, and values that are not the option's type or not positive.

    Checked here because the fedavg_dp arm first reads them after every Flower run of the experiment.
    """
    defaults = _fedavg_options()
    if bad := sorted(set(table) - set(defaults)):
        return [f"fedavg: unknown {bad}; choose from {', '.join(sorted(defaults))}"]
    problems = []
    for key, value in sorted(table.items()):
        kind = type(defaults[key]).__name__
        if defaults[key] is None and not isinstance(value, dict):  # backend_config: Flower's backend table
            problems.append(f"fedavg.{key}: expected a table ({{...}}, Flower's simulation backend config), "
                            f"got {value!r}")
        if kind not in ("int", "float"):
            continue
        if problem := _wrong_type(f"fedavg.{key}", value, kind):
            problems.append(problem)
        elif not 0 < value < math.inf:
            problems.append(f"fedavg.{key}: must be a finite number > 0, got {value!r}")
    return problems


def _wrong_type(key: str, value: Any, annotation: str) -> str | None:
    """Why a config value does not have its key's type (``"4"`` for a number, ``42`` for a list), or None."""
    inner = annotation.removeprefix("list[").removesuffix("]")
    if inner != annotation:
        if isinstance(value, list) and all(_SCALARS[inner](v) for v in value):
            return None
        return f"{key}: expected a list of {inner}, got {value!r}"
    return None if _SCALARS[annotation](value) else f"{key}: expected {annotation}, got {value!r}"
