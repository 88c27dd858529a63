"""The FedAvg + DP-SGD baseline's Flower apps: a cosine head over frozen sentence embeddings.

The model (:class:`CosineHead`) scores a query against every tool's
description embedding through a learned linear map ``W`` (initialised to the
identity, so at round 0 it is plain description retrieval and tools without
any training label still get scores). Only ``W`` travels.

A run is a *job folder* (:meth:`FedAvgJob.save`): the public tool embeddings,
one shard per organisation (its labelled query embeddings and DP-SGD noise
multiplier), the embedded test sets with their gold ids, the training
settings and the number of rounds. Both apps read their configuration from
there and from Flower's messages and context, never from the caller's state:

* :func:`server_app` is the ServerApp of a job folder: ``FedAvg.start`` for
  the job's rounds, every organisation training every round; the train config
  names the folder and carries the :class:`TrainSettings`; the global head is
  evaluated on the test sets before the first round and after each
  (:class:`HeadEvaluator`), and the :class:`FedAvgOutcome` is written back to
  the folder;
* :data:`client_app` finds its shard by its ``partition-id``, trains the head
  (DP-SGD with opacus when its shard has noise, see :func:`train_local`),
  keeps its accountant's step count in its node state and replies with the
  weights and a ``MetricRecord`` of ``num-examples``, ``loss`` and its
  cumulative ``epsilon``.

:func:`run_job` runs one job under Flower's simulation runtime, in a fresh
interpreter.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from synapse_flwr.core.metrics import ranking_metrics, top_ids
from synapse_flwr.core.privacy import rdp_alphas
from synapse_flwr.flower.processes import single_threaded_blas

log = logging.getLogger(__name__)

STATE_KEY = "dp-accounting"  # node-state record of the DP-SGD steps taken so far
JOB_FILE = "job.json"
TOOLS_FILE = "tools.npy"
OUTCOME_FILE = "outcome.json"


# ------------------------------------------------------------------ model


class CosineHead(nn.Module):
    """Scores queries against tool descriptions through a learned linear map.

    ``logits = cos(W x, d_t) / temperature`` for every tool ``t``; ``W``
    starts as the identity, so the untrained head is description retrieval
    and tools without labels keep non-zero scores.

    Parameters
    ----------
    tool_vectors : torch.Tensor
        ``(tools, dim)`` description embeddings (a non-persistent buffer:
        shared by everyone, never sent).
    temperature : float
        Softmax temperature of the cosine logits, ``> 0``.
    """

    def __init__(self, tool_vectors: torch.Tensor, temperature: float) -> None:
        super().__init__()
        dim = tool_vectors.shape[1]
        self.proj = nn.Linear(dim, dim, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(torch.eye(dim))
        self.register_buffer("tools", F.normalize(tool_vectors, dim=1), persistent=False)
        self.scale = 1.0 / temperature

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, tools)`` of query embeddings ``x`` ``(batch, dim)``."""
        return self.scale * F.normalize(self.proj(x), dim=1) @ self.tools.T


def head_scores(weight: np.ndarray, queries: np.ndarray, tools: np.ndarray) -> np.ndarray:
    """Cosine scores of :class:`CosineHead` with ``proj.weight = weight``, in numpy.

    Parameters
    ----------
    weight : numpy.ndarray
        ``(dim, dim)`` linear map.
    queries : numpy.ndarray
        ``(n, dim)`` query embeddings.
    tools : numpy.ndarray
        ``(tools, dim)`` description embeddings.

    Returns
    -------
    numpy.ndarray
        ``(n, tools)`` cosine similarities.
    """
    mapped = queries @ weight.T
    mapped /= np.maximum(np.linalg.norm(mapped, axis=1, keepdims=True), 1e-12)
    unit = tools / np.maximum(np.linalg.norm(tools, axis=1, keepdims=True), 1e-12)
    return mapped @ unit.T


# ------------------------------------------------------------------ job


@dataclass(frozen=True)
class TrainSettings:
    """Hyper-parameters every organisation trains with (sent in the train config).

    Parameters
    ----------
    batch_size : int
        Expected examples per DP-SGD step (Poisson sampling when private).
    local_epochs : int
        Passes over the local data per round.
    learning_rate : float
        Adam step size.
    max_grad_norm : float
        Per-example gradient clipping bound (private only).
    temperature : float
        Cosine-logit temperature.
    delta : float
        Delta the organisations account epsilon at.
    seed : int
        Base seed of sampling and noise.
    """

    batch_size: int
    local_epochs: int
    learning_rate: float
    max_grad_norm: float
    temperature: float
    delta: float
    seed: int

    def to_config(self) -> dict[str, int | float]:
        """The settings as train-config entries (``batch-size``, ``local-epochs``, ...).

        Returns
        -------
        dict
            Hyphenated key -> value, ints and floats as Flower records take them.
        """
        return {"batch-size": int(self.batch_size), "local-epochs": int(self.local_epochs),
                "learning-rate": float(self.learning_rate), "max-grad-norm": float(self.max_grad_norm),
                "temperature": float(self.temperature), "delta": float(self.delta), "seed": int(self.seed)}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TrainSettings:
        """Read the settings back from a train config (see :meth:`to_config`).

        Parameters
        ----------
        config : mapping
            A ``ConfigRecord`` holding at least the keys of :meth:`to_config`.

        Returns
        -------
        TrainSettings
            The settings.
        """
        return cls(int(config["batch-size"]), int(config["local-epochs"]), float(config["learning-rate"]),
                   float(config["max-grad-norm"]), float(config["temperature"]), float(config["delta"]),
                   int(config["seed"]))


@dataclass(frozen=True)
class OrgShard:
    """One organisation's training data as the ClientApp sees it.

    Parameters
    ----------
    x : numpy.ndarray
        ``(n, dim)`` float32 query embeddings.
    y : numpy.ndarray
        ``(n,)`` int64 catalog indices of the labels.
    noise_multiplier : float
        DP-SGD noise ``z`` (0 when privacy is off).
    """

    x: np.ndarray
    y: np.ndarray
    noise_multiplier: float


@dataclass(frozen=True)
class EvalSplit:
    """One test set the ServerApp evaluates the global head on.

    Parameters
    ----------
    queries : numpy.ndarray
        ``(n, dim)`` float32 query embeddings.
    golds : tuple of tuple of str
        The acceptable tool ids of each query.
    """

    queries: np.ndarray
    golds: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class FedAvgJob:
    """One FedAvg + DP-SGD run: everything its apps read from the job folder.

    Parameters
    ----------
    shards : tuple of OrgShard
        One per organisation, in partition-id order.
    tools : numpy.ndarray
        ``(tools, dim)`` float32 description embeddings.
    tool_ids : tuple of str
        Tool id of each row of ``tools`` (the label indices of the shards).
    splits : mapping of str to EvalSplit
        Test sets, by name.
    settings : TrainSettings
        Training hyper-parameters.
    rounds : int
        Federation rounds.
    k : int
        Recall cut-off of the evaluations (``r5`` is recall@k).
    """

    shards: tuple[OrgShard, ...]
    tools: np.ndarray
    tool_ids: tuple[str, ...]
    splits: Mapping[str, EvalSplit]
    settings: TrainSettings
    rounds: int
    k: int = 5

    def save(self, folder: Path) -> Path:
        """Write the job folder: ``job.json``, ``tools.npy``, ``org_<i>.npz``, ``split_<i>.npy``.

        Parameters
        ----------
        folder : Path
            The folder (created if needed).

        Returns
        -------
        Path
            ``folder``.
        """
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / TOOLS_FILE, self.tools)
        for pid, shard in enumerate(self.shards):
            np.savez(folder / f"org_{pid}.npz", x=shard.x, y=shard.y,
                     noise_multiplier=np.float64(shard.noise_multiplier))
        for i, split in enumerate(self.splits.values()):
            np.save(folder / f"split_{i}.npy", split.queries)
        meta = {"rounds": self.rounds, "k": self.k, "orgs": len(self.shards), "tool_ids": list(self.tool_ids),
                "settings": self.settings.to_config(),
                "splits": [[name, [list(g) for g in split.golds]] for name, split in self.splits.items()]}
        (folder / JOB_FILE).write_text(json.dumps(meta), encoding="utf-8")
        return folder


def read_shard(folder: Path, partition: int) -> OrgShard:
    """One organisation's shard of a job folder.

    Parameters
    ----------
    folder : Path
        The job folder.
    partition : int
        The organisation's partition id.

    Returns
    -------
    OrgShard
        Its embeddings, labels and noise multiplier.
    """
    with np.load(folder / f"org_{partition}.npz") as data:
        return OrgShard(data["x"], data["y"], float(data["noise_multiplier"]))


def read_splits(folder: Path, meta: Mapping[str, Any]) -> dict[str, EvalSplit]:
    """The test sets of a job folder.

    Parameters
    ----------
    folder : Path
        The job folder.
    meta : mapping
        Its ``job.json``.

    Returns
    -------
    dict of str to EvalSplit
        By name, in the job's order.
    """
    return {name: EvalSplit(np.load(folder / f"split_{i}.npy"), tuple(tuple(g) for g in golds))
            for i, (name, golds) in enumerate(meta["splits"])}


@dataclass(frozen=True)
class FedAvgOutcome:
    """What a job's ServerApp recorded.

    Parameters
    ----------
    train : dict of int to dict
        Per round, the aggregated train metrics (see :func:`aggregate_train_metrics`).
    evaluations : dict of int to dict
        Per round (0: before training), per split name, ``acc``, ``r5`` and
        ``n`` of the global head.
    """

    train: dict[int, dict[str, float]]
    evaluations: dict[int, dict[str, dict[str, float]]]

    def save(self, folder: Path) -> None:
        """Write ``outcome.json`` to the job folder.

        Parameters
        ----------
        folder : Path
            The job folder.
        """
        doc = {"train": self.train, "evaluations": self.evaluations}
        (folder / OUTCOME_FILE).write_text(json.dumps(doc), encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> FedAvgOutcome:
        """Read ``outcome.json`` back (empty when the ServerApp wrote none).

        Parameters
        ----------
        folder : Path
            The job folder.

        Returns
        -------
        FedAvgOutcome
            Rounds as ints again.
        """
        path = folder / OUTCOME_FILE
        doc = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        return cls({int(r): m for r, m in doc.get("train", {}).items()},
                   {int(r): m for r, m in doc.get("evaluations", {}).items()})


# ------------------------------------------------------------------ ClientApp


def _seed(*parts: int) -> int:
    """A 32-bit seed mixed from ``parts``."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


def _make_private(
    model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader, shard: OrgShard,
    settings: TrainSettings, state: RecordDict, noise_seed: int,
) -> tuple[PrivacyEngine, nn.Module, torch.optim.Optimizer, DataLoader]:
    """Wrap model, optimizer and loader for DP-SGD, its accountant resumed from the node state.

    Parameters
    ----------
    model : torch.nn.Module
        The head.
    optimizer : torch.optim.Optimizer
        Its optimizer.
    loader : torch.utils.data.DataLoader
        The shard's loader; its length gives the sample rate.
    shard : OrgShard
        Its noise multiplier.
    settings : TrainSettings
        The clipping bound.
    state : flwr.app.RecordDict
        The node state; its ``dp-accounting`` record holds the steps taken so far.
    noise_seed : int
        Seed of the Gaussian noise.

    Returns
    -------
    tuple
        The privacy engine and the wrapped model, optimizer and (Poisson) loader.
    """
    engine = PrivacyEngine(accountant="rdp")
    done = state.metric_records.get(STATE_KEY, MetricRecord({"steps": 0}))
    if int(done["steps"]):
        engine.accountant.history = [(shard.noise_multiplier, 1.0 / len(loader), int(done["steps"]))]
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=loader,
        noise_multiplier=shard.noise_multiplier, max_grad_norm=settings.max_grad_norm,
        poisson_sampling=True, noise_generator=torch.Generator().manual_seed(noise_seed),
    )
    return engine, model, optimizer, loader


def train_local(
    weight: torch.Tensor,
    shard: OrgShard,
    tools: torch.Tensor,
    settings: TrainSettings,
    state: RecordDict,
    server_round: int,
    partition: int,
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """One organisation's local training of the head, DP-SGD when its shard has noise.

    Parameters
    ----------
    weight : torch.Tensor
        Global ``proj.weight`` received this round.
    shard : OrgShard
        The organisation's data and noise multiplier.
    tools : torch.Tensor
        Description embeddings.
    settings : TrainSettings
        Shared hyper-parameters.
    state : flwr.app.RecordDict
        The node's persistent state; its ``dp-accounting`` record carries the
        DP-SGD steps taken in earlier rounds.
    server_round : int
        Current round (seeds sampling and noise).
    partition : int
        The organisation's partition id (seeds sampling and noise).

    Returns
    -------
    tuple of (dict, dict)
        The trained state dict, and metrics ``loss`` (mean over steps) and
        ``epsilon`` (cumulative at ``settings.delta``; ``inf`` without noise).
    """
    torch.manual_seed(_seed(settings.seed, partition, server_round))
    model = CosineHead(tools, settings.temperature)
    model.load_state_dict({"proj.weight": weight})
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.learning_rate)
    # copies: arrays arriving through Ray are read-only views of its object store
    dataset = TensorDataset(torch.tensor(shard.x), torch.tensor(shard.y))
    generator = torch.Generator().manual_seed(_seed(settings.seed, partition, server_round, 1))
    loader = DataLoader(dataset, batch_size=settings.batch_size, shuffle=True, generator=generator)
    # Benign, known opacus warnings: secure RNG is off (an experiment, seeded), and
    # its backward hooks fire on a first layer whose input needs no gradient.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG.*")
        warnings.filterwarnings("ignore", message="Full backward hook is firing.*")
        engine = None
        if shard.noise_multiplier > 0:
            engine, model, optimizer, loader = _make_private(
                model, optimizer, loader, shard, settings, state,
                _seed(settings.seed, partition, server_round, 2))
        losses = []
        model.train()
        for _ in range(settings.local_epochs):
            for xb, yb in loader:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                optimizer.step()
                losses.append(loss.detach().item())
    metrics = {"loss": float(np.mean(losses)) if losses else 0.0, "epsilon": math.inf}
    if engine is not None:
        state[STATE_KEY] = MetricRecord({"steps": sum(s for _, _, s in engine.accountant.history)})
        metrics["epsilon"] = float(engine.accountant.get_epsilon(delta=settings.delta, alphas=rdp_alphas()))
        model = model._module
    return {"proj.weight": model.proj.weight.detach().clone()}, metrics


#: Flower's records about what this baseline chose: ``run_simulation`` (deprecated in favour of ``flwr run``; run
#: here in a child interpreter, :func:`run_job`), no federated evaluation (the ServerApp evaluates the global head),
#: and the end of each Ray actor when the simulation stops (Ray forwards that one to the caller's output).
_CHOSEN = ("DEPRECATED FEATURE", "fraction_evaluate is set to 0.0", "Manually terminating")


def _not_chosen(record: logging.LogRecord) -> bool:
    """Logging filter: False for Flower's records about this baseline's own choices (:data:`_CHOSEN`)."""
    return not str(record.msg).lstrip().startswith(_CHOSEN)


def _quiet_flower() -> None:
    """Keep :data:`_CHOSEN` records out of this process's Flower log (once per process)."""
    flwr_log = logging.getLogger("flwr")
    if _not_chosen not in flwr_log.filters:
        flwr_log.addFilter(_not_chosen)


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the head on this node's shard of the job the train config names.

    Parameters
    ----------
    msg : flwr.app.Message
        ``arrays`` (the global head) and ``config`` (``job-dir``,
        ``server-round`` and the :class:`TrainSettings`).
    context : flwr.app.Context
        ``node_config["partition-id"]`` picks the shard; ``state`` keeps the
        DP-SGD step count across rounds.

    Returns
    -------
    flwr.app.Message
        The trained ``arrays`` and ``metrics`` (``num-examples``, ``loss``,
        ``epsilon``).
    """
    _quiet_flower()  # in the Ray actor, which does not inherit the caller's filter
    config = msg.content["config"]
    job_dir = Path(str(config["job-dir"]))
    partition = int(context.node_config["partition-id"])
    shard = read_shard(job_dir, partition)
    weights, metrics = train_local(
        msg.content["arrays"].to_torch_state_dict()["proj.weight"], shard,
        torch.from_numpy(np.load(job_dir / TOOLS_FILE)), TrainSettings.from_config(config),
        context.state, int(config["server-round"]), partition,
    )
    reply = RecordDict({
        "arrays": ArrayRecord(weights),
        "metrics": MetricRecord({"num-examples": len(shard.y), **metrics}),
    })
    return Message(content=reply, reply_to=msg)


# ------------------------------------------------------------------ ServerApp


def aggregate_train_metrics(records: list[RecordDict], weighting_key: str) -> MetricRecord:
    """Round metrics over organisations: mean loss (weighted), largest epsilon, count.

    Parameters
    ----------
    records : list of flwr.app.RecordDict
        The organisations' replies.
    weighting_key : str
        Metric holding each reply's example count.

    Returns
    -------
    flwr.app.MetricRecord
        ``loss``, ``epsilon`` (max over organisations), ``orgs``, and the summed
        ``weighting_key``.
    """
    metrics = [next(iter(r.metric_records.values())) for r in records]
    total = sum(float(m[weighting_key]) for m in metrics)
    return MetricRecord({
        "loss": sum(float(m["loss"]) * float(m[weighting_key]) for m in metrics) / total,
        "epsilon": max(float(m["epsilon"]) for m in metrics),
        "orgs": len(metrics),
        weighting_key: int(total),
    })


class HeadEvaluator:
    """Central evaluation of the global head (``FedAvg.start``'s ``evaluate_fn``).

    Parameters
    ----------
    tools : numpy.ndarray
        ``(tools, dim)`` description embeddings.
    tool_ids : sequence of str
        Tool id of each row of ``tools``.
    splits : mapping of str to EvalSplit
        Test sets, by name.
    k : int
        Recall cut-off.
    """

    def __init__(self, tools: np.ndarray, tool_ids: Sequence[str], splits: Mapping[str, EvalSplit],
                 k: int = 5) -> None:
        self.tools = tools
        self.tool_ids = list(tool_ids)
        self.splits = dict(splits)
        self.k = k
        self.evaluations: dict[int, dict[str, dict[str, float]]] = {}

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Top-1 accuracy and recall@k of the head in ``arrays`` on every split.

        Parameters
        ----------
        server_round : int
            The round just aggregated (0: the initial head).
        arrays : flwr.app.ArrayRecord
            The global ``proj.weight``.

        Returns
        -------
        flwr.app.MetricRecord
            ``<split>-acc``, ``<split>-r5``, ``<split>-n``; kept per round in
            ``evaluations``.
        """
        weight = arrays.to_numpy_ndarrays()[0]
        self.evaluations[server_round] = {
            name: ranking_metrics(top_ids(head_scores(weight, split.queries, self.tools), self.tool_ids, self.k),
                                  split.golds, self.k)
            for name, split in self.splits.items()
        }
        return MetricRecord({f"{name}-{key}": float(value)
                             for name, m in self.evaluations[server_round].items()
                             for key, value in m.items()})


def serve_job(grid: Grid, context: Context, job_dir: Path) -> None:
    """ServerApp main of a job: FedAvg over its rounds, central evaluation, ``outcome.json``.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        The federation.
    context : flwr.app.Context
        The ServerApp's context (unused: the job folder configures the run).
    job_dir : Path
        The job folder.
    """
    meta = json.loads((job_dir / JOB_FILE).read_text(encoding="utf-8"))
    tools = np.load(job_dir / TOOLS_FILE)
    settings = TrainSettings.from_config(meta["settings"])
    evaluator = HeadEvaluator(tools, meta["tool_ids"], read_splits(job_dir, meta), int(meta["k"]))
    orgs = int(meta["orgs"])
    strategy = FedAvg(
        fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=orgs,
        min_available_nodes=orgs, train_metrics_aggr_fn=aggregate_train_metrics,
    )
    init = CosineHead(torch.from_numpy(tools), settings.temperature).state_dict()
    result = strategy.start(
        grid=grid, initial_arrays=ArrayRecord(init), num_rounds=int(meta["rounds"]),
        train_config=ConfigRecord({"job-dir": str(job_dir), **settings.to_config()}), evaluate_fn=evaluator,
    )
    train_metrics = {rnd: dict(m) for rnd, m in result.train_metrics_clientapp.items()}
    FedAvgOutcome(train_metrics, evaluator.evaluations).save(job_dir)


def server_app(job_dir: Path) -> ServerApp:
    """The baseline's ServerApp for the job in ``job_dir`` (see :func:`serve_job`).

    Parameters
    ----------
    job_dir : Path
        A folder written by :meth:`FedAvgJob.save`.

    Returns
    -------
    flwr.serverapp.ServerApp
        An app whose main runs that job.
    """
    app = ServerApp()
    app.main()(partial(serve_job, job_dir=Path(job_dir)))
    return app


def _simulate(folder: str, num_supernodes: int, backend_config: dict) -> None:
    """Flower's simulation of the job saved in ``folder`` (in :func:`run_job`'s child interpreter).

    Flower's own records below WARNING stay out of the caller's log, as the CLI
    keeps them out in its own interpreter: the spawned child does not inherit
    that filter, and Flower's per-round INFO and DEBUG lines (written twice, by
    two handlers) buried the experiment's summary. ``run_job``'s caller logs
    the outcome. So do the warnings about this baseline's own choices
    (:data:`_CHOSEN`).
    """
    logging.getLogger("flwr").setLevel(logging.WARNING)
    _quiet_flower()
    warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
    run_simulation(server_app=server_app(Path(folder)), client_app=client_app,
                   num_supernodes=num_supernodes, backend_config=backend_config)


def run_job(job: FedAvgJob, backend_config: Mapping[str, Any] | None = None) -> FedAvgOutcome:
    """Run a job under Flower's simulation runtime, one SuperNode per organisation.

    The simulation runs in a fresh interpreter with single-threaded BLAS: a
    second Ray simulation in one interpreter hangs (flwr 1.42 + ray), and Ray
    forks from the interpreter that starts it, where OpenBLAS's fork handler
    can deadlock (:func:`~synapse_flwr.flower.processes.single_threaded_blas`).

    Parameters
    ----------
    job : FedAvgJob
        The run.
    backend_config : mapping or None
        Flower simulation backend config; default one CPU per ClientApp.

    Returns
    -------
    FedAvgOutcome
        What the ServerApp recorded (empty if it recorded nothing).
    """
    config = dict(backend_config) if backend_config is not None else {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    }
    with tempfile.TemporaryDirectory(prefix="synapse-fedavg-") as tmp:
        folder = job.save(Path(tmp))
        with single_threaded_blas(), ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            pool.submit(_simulate, str(folder), len(job.shards), config).result()
        return FedAvgOutcome.load(folder)


def run_in_process(job: FedAvgJob) -> FedAvgOutcome:
    """Run a job's FedAvg schedule in this process, without Flower: for sweeps over many settings.

    The same schedule as :func:`server_app` (every organisation trains every
    round with :func:`train_local`, its DP-SGD accountant kept in its own
    node state; the heads are averaged weighted by example count, as
    ``FedAvg`` does; the global head is evaluated before the first round and
    after each), without the per-run start-up of a Flower simulation.

    Parameters
    ----------
    job : FedAvgJob
        The run.

    Returns
    -------
    FedAvgOutcome
        Per-round train metrics and evaluations, as the ServerApp records them.
    """
    tools = torch.from_numpy(job.tools)
    evaluator = HeadEvaluator(job.tools, job.tool_ids, job.splits, job.k)
    weight = CosineHead(tools, job.settings.temperature).state_dict()["proj.weight"]
    evaluator(0, ArrayRecord({"proj.weight": weight}))
    states = [RecordDict() for _ in job.shards]
    sizes = [len(shard.y) for shard in job.shards]
    train: dict[int, dict[str, float]] = {}
    for rnd in range(1, job.rounds + 1):
        replies = [train_local(weight, shard, tools, job.settings, states[p], rnd, p)
                   for p, shard in enumerate(job.shards)]
        weight = sum(w["proj.weight"] * n for (w, _), n in zip(replies, sizes)) / sum(sizes)
        train[rnd] = {"loss": sum(m["loss"] * n for (_, m), n in zip(replies, sizes)) / sum(sizes),
                      "epsilon": max(m["epsilon"] for _, m in replies), "orgs": len(replies)}
        evaluator(rnd, ArrayRecord({"proj.weight": weight}))
    return FedAvgOutcome(train, evaluator.evaluations)
