"""Baseline arms the compendium is compared against.

``tfidf_svm_arm``
    The query classifier of the MetaTool paper: TF-IDF (word uni- and
    bigrams, sublinear tf) and a linear SVM trained on the pooled labelled
    events, without federation. It can only ever answer with a tool it saw
    a label for.

``fedavg_dp_arm``
    A weights-based federated baseline: a cosine-similarity head over frozen
    sentence embeddings, trained with Flower's ``FedAvg`` (Message API,
    simulation runtime) and DP-SGD (opacus) at each organisation. The head
    scores a query against every tool's description embedding through a
    learned linear map ``W`` (initialised to the identity), so tools without
    any training label still get scores; at round 0 it is plain description
    retrieval.

Privacy of ``fedavg_dp_arm`` (example-level DP at each organisation)
---------------------------------------------------------------------
Each organisation runs DP-SGD on its own events: Poisson sampling at rate
``q = 1 / ceil(n / batch_size)``, per-example gradients clipped to
``max_grad_norm``, Gaussian noise ``z * max_grad_norm``. ``z`` is calibrated
up front (opacus' RDP accountant) so that all ``rounds * local_epochs /
q`` steps of the run meet ``(epsilon, delta)``; the model an organisation
sends after each round is post-processing of its DP-SGD steps, so one event's
influence on everything it releases is bounded as in the compendium arm's
event-level guarantee. Each organisation keeps its accountant history in its
Flower node state and reports the epsilon it has spent so far; the arm
reports the largest over organisations after the last round.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from opacus import PrivacyEngine
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.svm import LinearSVC
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from synapse_flwr.core.catalog import Catalog
from synapse_flwr.core.embed import Embedder, get_embedder
from synapse_flwr.core.experience import Event, TestItem, event_label

log = logging.getLogger(__name__)

#: Recall cut-off, as in :func:`synapse_flwr.core.router.evaluate_routes`.
TOP_K = 5
_STATE_KEY = "dp-accounting"
# RDP orders for calibration and reporting: opacus' defaults stop at 63, too low
# for small sample rates and large noise (as in synapse_flwr.core.privacy).
RDP_ALPHAS = [*RDPAccountant.DEFAULT_ALPHAS, 80, 96, 128, 192, 256, 512, 1024]


def labelled_pairs(events: Sequence[Event], catalog: Catalog) -> tuple[list[str], list[str]]:
    """Queries and tool ids of the events that carry a label (see :func:`event_label`).

    Parameters
    ----------
    events : sequence of Event
        Routing events.
    catalog : Catalog
        Tools.

    Returns
    -------
    tuple of (list of str, list of str)
        Queries and their labels, in event order.
    """
    queries, labels = [], []
    for event in events:
        label = event_label(event, catalog)
        if label is not None:
            queries.append(event.query)
            labels.append(label)
    if len(labels) < len(events):
        log.info("%d of %d events carry no usable label", len(events) - len(labels), len(events))
    return queries, labels


def tool_text(tool_id: str, description: str) -> str:
    """What a tool's description embeds as: its id in words, then the description.

    Parameters
    ----------
    tool_id : str
        The tool id.
    description : str
        Its documentation (may be empty).

    Returns
    -------
    str
        As :func:`synapse_flwr.core.router.doc_text` renders a documentation entry.
    """
    words = tool_id.replace("_", " ").replace("-", " ")
    return f"{words}: {description}" if description else words


def ranking_metrics(
    scores: np.ndarray, columns: Sequence[str], test: Sequence[TestItem], k: int = TOP_K
) -> dict[str, float]:
    """Top-1 accuracy and recall@k of score rows, as :func:`~synapse_flwr.core.router.evaluate_routes`.

    Parameters
    ----------
    scores : numpy.ndarray
        ``(len(test), len(columns))`` scores, higher is better.
    columns : sequence of str
        Tool id of each column; only these tools can be ranked.
    test : sequence of TestItem
        The queries' acceptable gold ids.
    k : int
        Recall cut-off.

    Returns
    -------
    dict
        ``acc`` (top-1 in gold), ``r5`` (any of the top ``k`` in gold), ``n``;
        zeros for an empty test set. Ties keep column order.
    """
    if not test:
        return {"acc": 0.0, "r5": 0.0, "n": 0}
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    ids = np.asarray(columns, dtype=object)[order]
    hits = sum(ranked[0] in item.gold for ranked, item in zip(ids, test, strict=True))
    recall = sum(any(t in item.gold for t in ranked) for ranked, item in zip(ids, test, strict=True))
    return {"acc": hits / len(test), "r5": recall / len(test), "n": len(test)}


def tfidf_svm_arm(
    train: Sequence[Event], catalog: Catalog, test: Sequence[TestItem], C: float = 1.0
) -> dict[str, float]:
    """Centralised TF-IDF + linear SVM query classifier (the MetaTool paper's baseline).

    The classes are the tools that have at least one labelled training event;
    ranking (top-1 and top-5) runs over those classes only, so a tool without
    a training label can never be predicted and its queries score 0 by
    construction: on held-out-tool test sets the arm's accuracy and recall
    are 0.

    Parameters
    ----------
    train : sequence of Event
        Training events, pooled; labels as in :func:`event_label`.
    catalog : Catalog
        Tools; labels resolve through it.
    test : sequence of TestItem
        Evaluation queries with their gold ids.
    C : float
        SVM regularisation (inverse strength), ``> 0``.

    Returns
    -------
    dict
        ``acc``, ``r5`` (from the top 5 of ``decision_function``) and ``n``.

    Raises
    ------
    ValueError
        If ``C`` is not positive or fewer than two tools have a training label.
    """
    if not C > 0:
        raise ValueError(f"C must be > 0, got {C!r}")
    queries, labels = labelled_pairs(train, catalog)
    classes = sorted(set(labels))
    if len(classes) < 2:
        raise ValueError(f"need labelled training events of at least 2 tools, got {len(classes)}")
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    svm = LinearSVC(C=C).fit(vectorizer.fit_transform(queries), labels)
    log.info("tfidf_svm: %d training queries, %d of %d tools have labels",
             len(queries), len(classes), len(catalog))
    if not test:
        return ranking_metrics(np.zeros((0, len(classes))), classes, test)
    scores = svm.decision_function(vectorizer.transform([item.query for item in test]))
    if scores.ndim == 1:  # binary: one margin, positive for classes_[1]
        scores = np.stack([-scores, scores], axis=1)
    return ranking_metrics(scores, list(svm.classes_), test)


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
class TrainSettings:
    """Hyper-parameters every organisation trains with.

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


def steps_per_epoch(n: int, batch_size: int) -> int:
    """DP-SGD steps per epoch, ``ceil(n / batch_size)``; the sample rate is its inverse."""
    return math.ceil(n / batch_size)


@lru_cache(maxsize=64)
def calibrate_noise(
    n: int, batch_size: int, steps: int, epsilon: float, delta: float
) -> float:
    """Noise multiplier for ``steps`` Poisson-sampled DP-SGD steps at ``(epsilon, delta)``.

    Parameters
    ----------
    n : int
        Examples at the organisation.
    batch_size : int
        Expected batch; sample rate ``1 / ceil(n / batch_size)``.
    steps : int
        Total steps over all rounds.
    epsilon : float
        Target epsilon (finite).
    delta : float
        Target delta.

    Returns
    -------
    float
        ``z`` from opacus' RDP accountant (cached: organisations of equal size
        share one search).

    Raises
    ------
    ValueError
        If opacus finds no noise meeting the budget.
    """
    sample_rate = 1.0 / steps_per_epoch(n, batch_size)
    try:
        return float(get_noise_multiplier(
            target_epsilon=epsilon, target_delta=delta, sample_rate=sample_rate,
            steps=steps, accountant="rdp", epsilon_tolerance=0.01 * epsilon, alphas=RDP_ALPHAS,
        ))
    except ValueError as exc:
        raise ValueError(
            f"cannot calibrate DP-SGD noise for epsilon={epsilon}, delta={delta}, "
            f"{steps} steps at sample rate {sample_rate:.4g}: {exc}"
        ) from exc


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


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
            engine = PrivacyEngine(accountant="rdp")
            done = state.metric_records.get(_STATE_KEY, MetricRecord({"steps": 0}))
            if int(done["steps"]):
                engine.accountant.history = [
                    (shard.noise_multiplier, 1.0 / len(loader), int(done["steps"]))
                ]
            model, optimizer, loader = engine.make_private(
                module=model, optimizer=optimizer, data_loader=loader,
                noise_multiplier=shard.noise_multiplier, max_grad_norm=settings.max_grad_norm,
                poisson_sampling=True,
                noise_generator=torch.Generator().manual_seed(
                    _seed(settings.seed, partition, server_round, 2)),
            )
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
        state[_STATE_KEY] = MetricRecord({"steps": sum(s for _, _, s in engine.accountant.history)})
        metrics["epsilon"] = float(engine.accountant.get_epsilon(delta=settings.delta, alphas=RDP_ALPHAS))
        model = model._module
    return {"proj.weight": model.proj.weight.detach().clone()}, metrics


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


def _check_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_args(
    epsilon: float, delta: float, rounds: int, local_epochs: int, batch_size: int,
    learning_rate: float, max_grad_norm: float, temperature: float,
) -> None:
    if math.isnan(epsilon) or epsilon <= 0:
        raise ValueError(f"epsilon must be > 0 (math.inf turns privacy off), got {epsilon!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must satisfy 0 < delta < 1, got {delta!r}")
    _check_int("rounds", rounds, 1)
    _check_int("local_epochs", local_epochs, 1)
    _check_int("batch_size", batch_size, 1)
    for name, value in (("learning_rate", learning_rate), ("max_grad_norm", max_grad_norm),
                        ("temperature", temperature)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be finite and > 0, got {value!r}")


def fedavg_dp_arm(
    org_events: Sequence[Sequence[Event]],
    catalog: Catalog,
    test: Sequence[TestItem],
    epsilon: float,
    delta: float,
    rounds: int,
    embedder: Embedder | None = None,
    seed: int = 0,
    local_epochs: int = 1,
    batch_size: int = 64,
    learning_rate: float = 1e-3,
    max_grad_norm: float = 1.0,
    temperature: float = 0.05,
    extra_tests: Mapping[str, Sequence[TestItem]] | None = None,
    backend_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Federated DP-SGD baseline: a cosine head over frozen embeddings, trained with Flower FedAvg.

    One Flower simulation (``flwr.simulation.run_simulation``, one SuperNode
    per organisation) runs a ``ServerApp`` whose main calls
    ``FedAvg.start`` for ``rounds`` rounds; every organisation trains every
    round. Each ``ClientApp`` finds its data by its ``partition-id`` in a
    registry built here, once, from the embeddings (nothing is embedded per
    round), trains the head locally (DP-SGD with opacus when ``epsilon`` is
    finite) and returns the weights as an ``ArrayRecord`` with a
    ``MetricRecord`` holding ``num-examples``, ``loss`` and its cumulative
    ``epsilon``. The ``ServerApp`` evaluates the global head on the test sets
    before the first round and after each round.

    Parameters
    ----------
    org_events : sequence of sequence of Event
        Each organisation's private events (labels as in :func:`event_label`).
    catalog : Catalog
        Tools; the head scores all of them, labelled or not.
    test : sequence of TestItem
        Main evaluation queries.
    epsilon : float
        Per-organisation epsilon over all rounds; ``math.inf`` trains
        without clipping or noise.
    delta : float
        Per-organisation delta, ``0 < delta < 1``.
    rounds : int
        Federation rounds, ``>= 1``.
    embedder : Embedder or None
        Frozen sentence embedder (``name``, ``dim``, ``encode``); ``None``
        means ``get_embedder("minilm")`` (cached on disk).
    seed : int
        Seed of sampling and noise.
    local_epochs : int
        Local passes over the data per round, ``>= 1``.
    batch_size : int
        Expected batch size, ``>= 1``.
    learning_rate : float
        Adam step size, ``> 0``.
    max_grad_norm : float
        Per-example clipping bound of DP-SGD, ``> 0``.
    temperature : float
        Cosine-logit temperature, ``> 0``.
    extra_tests : mapping of str to sequence of TestItem or None
        More test sets evaluated with the same models (e.g. held-out tools).
    backend_config : mapping or None
        Flower simulation backend config; default one CPU per ClientApp.

    Returns
    -------
    dict
        ``acc``, ``r5``, ``n`` of the final global head on ``test``;
        ``init_acc``, ``init_r5`` of the untrained head (identity map:
        description retrieval); ``epsilon_spent`` (largest over organisations,
        from opacus' RDP accountant; ``inf`` without privacy), ``delta``,
        ``rounds``, ``noise_multipliers`` (per organisation), ``wall_s``; and
        ``extra``: the same metrics per name of ``extra_tests``.

    Raises
    ------
    ValueError
        For out-of-range arguments, no organisations, an organisation without
        labelled events, an embedder without width, or a budget opacus cannot
        meet.
    RuntimeError
        If an organisation's training failed in a round.
    """
    _check_args(epsilon, delta, rounds, local_epochs, batch_size, learning_rate,
                max_grad_norm, temperature)
    if not org_events:
        raise ValueError("org_events holds no organisations")
    t0 = time.perf_counter()
    embedder = embedder if embedder is not None else get_embedder("minilm")
    if embedder.dim < 1:
        raise ValueError(f"embedder {embedder.name!r} has no width (a TfidfEmbedder must be fit first)")
    index = {tool_id: i for i, tool_id in enumerate(catalog.ids)}
    settings = TrainSettings(batch_size, local_epochs, learning_rate, max_grad_norm,
                             temperature, delta, seed)
    registry: dict[int, OrgShard] = {}
    for pid, events in enumerate(org_events):
        queries, labels = labelled_pairs(events, catalog)
        if not queries:
            raise ValueError(f"organisation {pid} has no labelled events")
        steps = rounds * local_epochs * steps_per_epoch(len(queries), batch_size)
        z = 0.0
        if math.isfinite(epsilon):
            z = calibrate_noise(len(queries), batch_size, steps, epsilon, delta)
        registry[pid] = OrgShard(
            np.asarray(embedder.encode(queries), dtype=np.float32),
            np.asarray([index[t] for t in labels], dtype=np.int64),
            z,
        )
        log.info("org %d: %d examples, %d DP-SGD steps planned, noise multiplier %.4f",
                 pid, len(queries), steps, z)
    tool_np = np.asarray(embedder.encode([tool_text(d.tool_id, d.description) for d in catalog.tools]),
                         dtype=np.float32)
    tool_vectors = torch.from_numpy(tool_np)
    splits = {"test": test, **(extra_tests or {})}
    split_x = {name: np.asarray(embedder.encode([i.query for i in items]), dtype=np.float32)
               if items else np.zeros((0, embedder.dim), np.float32)
               for name, items in splits.items()}
    log.info("embedded %d orgs, %d tools and %d test queries in %.1f s", len(registry),
             len(catalog), sum(len(v) for v in splits.values()), time.perf_counter() - t0)

    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        server_round = int(msg.content["config"]["server-round"])
        shard = registry[pid]
        weights, metrics = train_local(
            msg.content["arrays"].to_torch_state_dict()["proj.weight"], shard, tool_vectors,
            settings, context.state, server_round, pid,
        )
        reply = RecordDict({
            "arrays": ArrayRecord(weights),
            "metrics": MetricRecord({"num-examples": len(shard.y), **metrics}),
        })
        return Message(content=reply, reply_to=msg)

    evaluations: dict[int, dict[str, dict[str, float]]] = {}

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        weight = arrays.to_numpy_ndarrays()[0]
        evaluations[server_round] = {
            name: ranking_metrics(head_scores(weight, split_x[name], tool_np), catalog.ids, items)
            for name, items in splits.items()
        }
        return MetricRecord({f"{name}-{key}": float(value)
                             for name, m in evaluations[server_round].items()
                             for key, value in m.items()})

    outcome: dict[str, Any] = {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(
            fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=len(registry),
            min_available_nodes=len(registry), train_metrics_aggr_fn=aggregate_train_metrics,
        )
        init = CosineHead(tool_vectors, temperature).state_dict()
        outcome["result"] = strategy.start(
            grid=grid, initial_arrays=ArrayRecord(init), num_rounds=rounds, evaluate_fn=evaluate,
        )

    config = dict(backend_config) if backend_config is not None else {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    }
    run_simulation(server_app=server, client_app=client, num_supernodes=len(registry),
                   backend_config=config)

    result = outcome.get("result")
    train_metrics = result.train_metrics_clientapp if result is not None else {}
    for rnd in range(1, rounds + 1):
        got = int(train_metrics[rnd]["orgs"]) if rnd in train_metrics else 0
        if got != len(registry):
            raise RuntimeError(f"round {rnd}: {got} of {len(registry)} organisations trained")
    spent = float(train_metrics[rounds]["epsilon"])

    def summary(name: str) -> dict[str, float]:
        final, init = evaluations[rounds][name], evaluations[0][name]
        return {**final, "init_acc": init["acc"], "init_r5": init["r5"]}

    out = {
        **summary("test"),
        "epsilon_spent": spent,
        "delta": delta,
        "rounds": rounds,
        "noise_multipliers": [registry[p].noise_multiplier for p in sorted(registry)],
        "wall_s": time.perf_counter() - t0,
        "extra": {name: summary(name) for name in extra_tests or {}},
    }
    log.info("fedavg_dp: acc %.3f (init %.3f), epsilon spent %.3f over %d rounds",
             out["acc"], out["init_acc"], spent, rounds)
    return out
