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
    retrieval. The Flower apps are :mod:`synapse_flwr.flower.fedavg_dp`; the
    arm prepares their job (labels, embeddings, noise calibration) and
    launches it.

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
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.svm import LinearSVC

from synapse_flwr.core import metrics
from synapse_flwr.core.catalog import Catalog
from synapse_flwr.core.documentation import catalog_arguments, documentation_text
from synapse_flwr.core.embed import Embedder, get_embedder
from synapse_flwr.core.errors import log_once
from synapse_flwr.core.experience import Event, TestItem, event_label
from synapse_flwr.core.phrases import spaced
from synapse_flwr.core.privacy import noise_multiplier_for
from synapse_flwr.flower.fedavg_dp import (
    EvalSplit,
    FedAvgJob,
    FedAvgOutcome,
    OrgShard,
    TrainSettings,
    run_job,
)

log = logging.getLogger(__name__)

#: Recall cut-off, as in :func:`synapse_flwr.core.metrics.evaluate_routes`.
TOP_K = 5


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
        # an experiment reads the same training set more than once: said once a process
        log_once(log, f"{len(events) - len(labels)} of {len(events)} events carry no usable label")
    return queries, labels


def ranking_metrics(
    scores: np.ndarray, columns: Sequence[str], test: Sequence[TestItem], k: int = TOP_K
) -> dict[str, float]:
    """Top-1 accuracy and recall@k of score rows (:func:`synapse_flwr.core.metrics.ranking_metrics`).

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
    return metrics.ranking_metrics(metrics.top_ids(scores, columns, k), [item.gold for item in test], k)


def tfidf_svm_arm(
    train: Sequence[Event], catalog: Catalog, tests: Mapping[str, Sequence[TestItem]], C: float = 1.0,
    k: int = TOP_K,
) -> dict[str, dict[str, float]]:
    """Centralised TF-IDF + linear SVM query classifier (the MetaTool paper's baseline).

    The classes are the tools that have at least one labelled training event;
    ranking (top-1 and top-k) runs over those classes only, so a tool without
    a training label can never be predicted and its queries score 0 by
    construction: on held-out-tool test sets the arm's accuracy and recall
    are 0. One fit scores every test set (a fit over 2,400 tools takes
    minutes).

    Parameters
    ----------
    train : sequence of Event
        Training events, pooled; labels as in :func:`event_label`.
    catalog : Catalog
        Tools; labels resolve through it.
    tests : mapping of str to sequence of TestItem
        Test sets by name (``seen``, ``heldout``): queries with their gold ids.
    C : float
        SVM regularisation (inverse strength), ``> 0``.
    k : int
        Recall cut-off (the experiment's ``k``: its tables say recall@k).

    Returns
    -------
    dict
        Per test set: ``acc``, ``r5`` (recall@k, from the top ``k`` of ``decision_function``) and ``n``.

    Raises
    ------
    ValueError
        If ``C`` is not positive or fewer than two tools have a training label.
    """
    queries, labels = labelled_pairs(train, catalog)
    log.info("tfidf_svm: %d training queries, %d of %d tools have labels",
             len(queries), len(set(labels)), len(catalog))
    items = [item for test in tests.values() for item in test]
    scores, classes = tfidf_svm_scores(queries, labels, [item.query for item in items], C)
    out, start = {}, 0
    for name, test in tests.items():
        out[name] = ranking_metrics(scores[start:start + len(test)], classes, test, k)
        start += len(test)
    return out


#: Bytes the classifier's dense weights (classes x TF-IDF features, float64) may take. A synthetic folder with
#: 2,400 labelled tools and 19,200 training queries has 113,223 features (2.2 GB of weights): the fit peaked at
#: 4.8 GB (an experiment's driver at 5.8 GB), capped at 2.5 GB with the same top-1 (0.9975 vs 0.997 on 2,000
#: test queries). MetaTool's 199 tools stay far below the cap.
SVM_WEIGHT_BYTES = 10**9


def tfidf_svm_scores(
    queries: Sequence[str], labels: Sequence[str], test: Sequence[str], C: float = 1.0
) -> tuple[np.ndarray, list[str]]:
    """Fit TF-IDF (1-2 grams) + a linear SVM on labelled queries; score test queries.

    Parameters
    ----------
    queries, labels : sequence of str
        Training queries and their tool ids.
    test : sequence of str
        Queries to score.
    C : float
        SVM regularisation (inverse strength), ``> 0``.

    Returns
    -------
    (numpy.ndarray, list of str)
        ``(len(test), len(classes))`` decision values and the classes (the
        labelled tools, sorted).

    Raises
    ------
    ValueError
        If ``C`` is not positive or fewer than two tools have a label.
    """
    if not C > 0:
        raise ValueError(f"C must be > 0, got {C!r}")
    classes = sorted(set(labels))
    if len(classes) < 2:
        raise ValueError(f"need labelled training events of at least 2 tools, got {len(classes)}")
    if not test:
        return np.zeros((0, len(classes))), classes
    # spaced: Chinese or Japanese text gives words (character bigrams), not one token per query
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, preprocessor=spaced)
    x = vectorizer.fit_transform(queries)
    # the SVM's weights are dense, classes x features: keep them within SVM_WEIGHT_BYTES
    if x.shape[1] > (cap := max(SVM_WEIGHT_BYTES // (8 * len(classes)), 1)):
        log.info("tfidf_svm: %d classes x %d features would take %.1f GB of weights; the %d most frequent "
                 "features are kept", len(classes), x.shape[1], 8 * len(classes) * x.shape[1] / 1e9, cap)
        vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, preprocessor=spaced, max_features=cap)
        x = vectorizer.fit_transform(queries)
    # the dual solver visits samples in a random order: seeded, a rerun gives the same scores
    svm = LinearSVC(C=C, random_state=0).fit(x, labels)
    scores = svm.decision_function(vectorizer.transform(list(test)))
    if scores.ndim == 1:  # binary: one margin, positive for classes_[1]
        scores = np.stack([-scores, scores], axis=1)
    return scores, list(svm.classes_)


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
        ``z`` from :func:`synapse_flwr.core.privacy.noise_multiplier_for`
        (cached: organisations of equal size share one search).

    Raises
    ------
    ValueError
        If opacus finds no noise meeting the budget.
    """
    sample_rate = 1.0 / steps_per_epoch(n, batch_size)
    try:
        return noise_multiplier_for(epsilon, delta, sample_rate, steps)
    except ValueError as exc:
        raise ValueError(
            f"cannot calibrate DP-SGD noise for epsilon={epsilon}, delta={delta}, "
            f"{steps} steps at sample rate {sample_rate:.4g}: {exc}"
        ) from exc


def calibration_problem(sizes: Sequence[int], epsilon: float, delta: float, rounds: int, local_epochs: int,
                        batch_size: int) -> str | None:
    """Why DP-SGD noise cannot be calibrated for organisations of these labelled sizes, or None (never raises).

    The budget a run can meet depends on each organisation's size (its sample
    rate and steps), so it is checked once the data loads, before any training.

    Parameters
    ----------
    sizes : sequence of int
        Labelled examples per organisation.
    epsilon, delta : float
        The budget per organisation (``math.inf``: no noise, always met).
    rounds, local_epochs, batch_size : int
        The planned training (steps = rounds x epochs x ceil(n / batch)).
    """
    if not math.isfinite(epsilon):
        return None
    for n in sorted(set(sizes)):
        steps = rounds * local_epochs * steps_per_epoch(n, batch_size)
        try:
            calibrate_noise(n, batch_size, steps, epsilon, delta)
        except ValueError as exc:
            return f"an organisation of {n} labelled examples: {exc}"
    return None


def _check_int(name: str, value: Any, minimum: int) -> None:
    """Raise ValueError unless ``value`` is an integer (not a bool) ``>= minimum``."""
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_args(
    epsilon: float, delta: float, rounds: int, local_epochs: int, batch_size: int,
    learning_rate: float, max_grad_norm: float, temperature: float,
) -> None:
    """Raise ValueError for an out-of-range argument of :func:`fedavg_dp_arm`."""
    if math.isnan(epsilon) or epsilon <= 0:
        raise ValueError("epsilon must be > 0 (inf turns privacy off: 'inf' on a command line, math.inf in Python), "
                         f"got {epsilon!r}")
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
    k: int = TOP_K,
) -> dict[str, Any]:
    """Federated DP-SGD baseline: a cosine head over frozen embeddings, trained with Flower FedAvg.

    Embeds everything once (nothing is embedded per round), calibrates each
    organisation's DP-SGD noise and runs one Flower simulation of the apps
    in :mod:`synapse_flwr.flower.fedavg_dp` (one SuperNode per
    organisation, ``rounds`` FedAvg rounds, every organisation training
    every round, the global head evaluated before the first round and after
    each).

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
    k : int
        Recall cut-off of ``r5`` (the experiment's ``k``).

    Returns
    -------
    dict
        ``acc``, ``r5`` (recall@k), ``n`` of the final global head on ``test``;
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
    _check_int("k", k, 1)
    if not org_events:
        raise ValueError("org_events holds no organisations")
    t0 = time.perf_counter()
    embedder = embedder if embedder is not None else get_embedder("minilm")
    if embedder.dim < 1:
        raise ValueError(f"embedder {embedder.name!r} has no width (a TfidfEmbedder must be fit first)")
    settings = TrainSettings(batch_size, local_epochs, learning_rate, max_grad_norm,
                             temperature, delta, seed)
    job = fedavg_job(org_events, catalog, {"test": test, **(extra_tests or {})}, embedder, settings,
                     epsilon, rounds, k)
    log.info("embedded %d orgs, %d tools and %d test queries in %.1f s", len(job.shards),
             len(catalog), sum(len(s.golds) for s in job.splits.values()), time.perf_counter() - t0)
    out = fedavg_results(run_job(job, backend_config), job, list(extra_tests or {}), t0)
    log.info("fedavg_dp: acc %.3f (init %.3f), epsilon spent %.3f over %d rounds",
             out["acc"], out["init_acc"], out["epsilon_spent"], rounds)
    return out


def org_shard(
    partition: int, events: Sequence[Event], catalog: Catalog, embedder: Embedder,
    settings: TrainSettings, epsilon: float, rounds: int,
) -> OrgShard:
    """One organisation's labelled, embedded events and its calibrated DP-SGD noise.

    Parameters
    ----------
    partition : int
        The organisation's partition id (in messages).
    events : sequence of Event
        The organisation's events (labels as in :func:`event_label`).
    catalog : Catalog
        Tools; a label is the index of its tool in ``catalog.ids``.
    embedder : Embedder
        Frozen sentence embedder.
    settings : TrainSettings
        Batch size and local epochs (the planned steps), delta.
    epsilon : float
        Its epsilon over all rounds (``math.inf``: no noise).
    rounds : int
        Federation rounds.

    Returns
    -------
    OrgShard
        float32 embeddings, int64 labels and ``z`` (0 without privacy).

    Raises
    ------
    ValueError
        If no event carries a label, or the budget cannot be met.
    """
    queries, labels = labelled_pairs(events, catalog)
    if not queries:
        raise ValueError(f"organisation {partition} has no labelled events")
    steps = rounds * settings.local_epochs * steps_per_epoch(len(queries), settings.batch_size)
    z = 0.0
    if math.isfinite(epsilon):
        z = calibrate_noise(len(queries), settings.batch_size, steps, epsilon, settings.delta)
    index = {tool_id: i for i, tool_id in enumerate(catalog.ids)}
    log.info("org %d: %d examples, %d DP-SGD steps planned, noise multiplier %.4f",
             partition, len(queries), steps, z)
    return OrgShard(np.asarray(embedder.encode(queries), dtype=np.float32),
                    np.asarray([index[t] for t in labels], dtype=np.int64), z)


def fedavg_job(
    org_events: Sequence[Sequence[Event]], catalog: Catalog, splits: Mapping[str, Sequence[TestItem]],
    embedder: Embedder, settings: TrainSettings, epsilon: float, rounds: int, k: int = TOP_K,
) -> FedAvgJob:
    """The FedAvg + DP-SGD job of :func:`fedavg_dp_arm`: shards, tool and test embeddings.

    Parameters
    ----------
    org_events : sequence of sequence of Event
        Each organisation's events.
    catalog : Catalog
        Tools, embedded as :func:`synapse_flwr.core.documentation.documentation_text` renders them.
    splits : mapping of str to sequence of TestItem
        Test sets by name.
    embedder : Embedder
        Frozen sentence embedder (fitted).
    settings : TrainSettings
        Training hyper-parameters.
    epsilon : float
        Per-organisation epsilon over all rounds.
    rounds : int
        Federation rounds.
    k : int
        Recall cut-off of the evaluations.

    Returns
    -------
    FedAvgJob
        Ready for :func:`synapse_flwr.flower.fedavg_dp.run_job`.

    Raises
    ------
    ValueError
        If an organisation has no labelled events or its budget cannot be met.
    """
    shards = tuple(org_shard(pid, events, catalog, embedder, settings, epsilon, rounds)
                   for pid, events in enumerate(org_events))
    arguments = catalog_arguments(catalog)
    tools = np.asarray(embedder.encode([documentation_text(d.name, d.description, arguments[d.tool_id])
                                        for d in catalog.tools]), dtype=np.float32)
    eval_splits = {
        name: EvalSplit(np.asarray(embedder.encode([i.query for i in items]), dtype=np.float32)
                        if items else np.zeros((0, embedder.dim), np.float32),
                        tuple(tuple(i.gold) for i in items))
        for name, items in splits.items()
    }
    return FedAvgJob(shards, tools, tuple(catalog.ids), eval_splits, settings, rounds, k)


def fedavg_results(
    outcome: FedAvgOutcome, job: FedAvgJob, extra: Sequence[str], started: float
) -> dict[str, Any]:
    """The arm's results from what the job's ServerApp recorded.

    Parameters
    ----------
    outcome : FedAvgOutcome
        Per-round train metrics and evaluations.
    job : FedAvgJob
        The job (rounds, organisations, noise multipliers).
    extra : sequence of str
        Names of the extra test sets.
    started : float
        ``time.perf_counter()`` when the arm started (for ``wall_s``).

    Returns
    -------
    dict
        As :func:`fedavg_dp_arm` returns.

    Raises
    ------
    RuntimeError
        If an organisation's training failed in a round.
    """
    rounds, orgs = job.rounds, len(job.shards)
    for rnd in range(1, rounds + 1):
        got = int(outcome.train[rnd]["orgs"]) if rnd in outcome.train else 0
        if got != orgs:
            raise RuntimeError(f"round {rnd}: {got} of {orgs} organisations trained")

    def summary(name: str) -> dict[str, float]:
        """Final metrics of a split, with those of the untrained head."""
        final, init = outcome.evaluations[rounds][name], outcome.evaluations[0][name]
        return {**final, "init_acc": init["acc"], "init_r5": init["r5"]}

    return {
        **summary("test"),
        "epsilon_spent": float(outcome.train[rounds]["epsilon"]),
        "delta": job.settings.delta,
        "rounds": rounds,
        "noise_multipliers": [shard.noise_multiplier for shard in job.shards],
        "wall_s": time.perf_counter() - started,
        "extra": {name: summary(name) for name in extra},
    }
