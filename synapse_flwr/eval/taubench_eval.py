"""tau-bench retail per-step tool-call evaluation, with composition knowledge as a prior.

Every gold call of a test task is one step: the query is the instruction plus
the gold calls made so far (:func:`~synapse_flwr.data.datasets.taubench_step_items`),
``prev_tool`` the previous gold call (None at the first step), and the task is
to name the next tool.

Two predictions are scored per step:

``router``
    the router's ranking as it is;
``transition``
    the router's candidate scores plus a transition prior ``P(next | prev)``
    estimated from the compendium's ``next_tools`` counts (see
    :func:`transition_prior` and :func:`rerank_with_transitions`).

:func:`run_taubench` compares three arms over seeds: ``plain`` (documentation
only), ``federated`` (the train tasks' events split non-IID over K
organisations, one compendium each, merged with
:func:`~synapse_flwr.core.merge.merge_typed`) and ``centralized`` (all train events
in one compendium). PII in the long instructions is masked by the builder.

Usage: ``python -m synapse_flwr.eval.taubench_eval [--seeds 42 123 456] [--output DIR]``
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.catalog import Catalog
from synapse_flwr.core.embed import Embedder, get_embedder
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.router import Router, RouteResult
from synapse_flwr.core.schema import Compendium, ToolEntry
from synapse_flwr.data.datasets import (
    StepItem,
    Task,
    load_taubench,
    partition_noniid,
    taubench_events,
    taubench_step_items,
    verified_hashes,
)
from synapse_flwr.eval.results import write_results

log = logging.getLogger(__name__)

# Weight of the log-lift of the transition prior, added to the router's
# candidate scores (sums of cosines, whose top candidates are typically a few
# tenths apart). At 0.1 a strong transition (lift ~5, log ~1.6) moves a tool by
# ~0.16 and a transition never seen after ``prev`` costs ~0.15: enough to
# settle a near tie, not to overturn a clear retrieval win. Fixed a priori,
# not tuned on the test split.
TRANSITION_WEIGHT = 0.1
# Laplace pseudo-count per tool when estimating P(next | prev) from counts.
TRANSITION_SMOOTHING = 1.0
ARMS = ("plain", "federated", "centralized")
VARIANTS = ("router", "transition")

Knowledge = Compendium | Mapping[str, ToolEntry]
EmbedderSpec = str | Callable[[], Embedder]


def _entries(knowledge: Knowledge) -> Mapping[str, ToolEntry]:
    """Tool id -> entry of a compendium, or the mapping itself."""
    if isinstance(knowledge, Compendium):
        return {e.tool_id: e for e in knowledge.tools}
    return knowledge


def transition_prior(
    knowledge: Knowledge, prev_tool: str | None, smoothing: float = TRANSITION_SMOOTHING
) -> dict[str, float]:
    """Smoothed ``P(next | prev)`` over the tools of a compendium.

    ``P(b | a) = (c(a, b) + s) / (C(a) + s * T)`` with ``c(a, b)`` the
    (possibly noised) count of ``b`` in ``a``'s ``next_tools``, ``C(a)`` their
    sum, ``s`` the smoothing and ``T`` the number of tools. Without a previous
    tool, or when it has no ``next_tools``, the prior is uniform.

    Parameters
    ----------
    knowledge : Compendium or mapping of str to ToolEntry
        The compendium (or the router's ``entries``) whose counts are used.
    prev_tool : str or None
        The tool called just before.
    smoothing : float
        Pseudo-count added to every tool (> 0).

    Returns
    -------
    dict of str to float
        Probability of every tool of the compendium; sums to one.
    """
    if smoothing <= 0:
        raise ValueError(f"smoothing must be positive, not {smoothing}")
    entries = _entries(knowledge)
    entry = entries.get(prev_tool) if prev_tool else None
    counts = {c.tool: max(c.count, 0.0) for c in entry.next_tools} if entry else {}
    total = math.fsum(counts.get(t, 0.0) for t in entries) + smoothing * len(entries)
    return {t: (counts.get(t, 0.0) + smoothing) / total for t in entries}


def rerank_with_transitions(
    result: RouteResult,
    knowledge: Knowledge,
    prev_tool: str | None,
    weight: float = TRANSITION_WEIGHT,
    smoothing: float = TRANSITION_SMOOTHING,
) -> list[str]:
    """Rank tools by router score plus ``weight`` times the transition log-lift.

    A tool's combined score is ``score + weight * log(T * P(tool | prev))``,
    ``T`` the number of tools (so a uniform prior shifts nothing). Candidates
    keep their router score; tools the router did not retrieve enter at the
    lowest candidate score, so a strong transition can still bring them into
    the ranking. Ties keep the router's order.

    Parameters
    ----------
    result : RouteResult
        The router's answer (candidates best first).
    knowledge : Compendium or mapping of str to ToolEntry
        Source of the ``next_tools`` counts.
    prev_tool : str or None
        The tool called just before; None leaves the router's order.
    weight : float
        Weight of the log-lift (>= 0); 0 leaves the router's order.
    smoothing : float
        Laplace pseudo-count of :func:`transition_prior`.

    Returns
    -------
    list of str
        Tool ids, best first: the candidates and every tool of the compendium.
    """
    if weight < 0:
        raise ValueError(f"weight must be non-negative, not {weight}")
    prior = transition_prior(knowledge, prev_tool, smoothing)
    floor = min((c.score for c in result.candidates), default=0.0)
    scores = {c.tool_id: c.score for c in result.candidates}
    for tool in prior:
        scores.setdefault(tool, floor)
    if weight == 0 or not prior:
        return list(scores)
    n_tools = len(prior)
    combined = {
        t: s + (weight * math.log(n_tools * prior[t]) if t in prior else 0.0)
        for t, s in scores.items()
    }
    order = {t: i for i, t in enumerate(scores)}
    return sorted(combined, key=lambda t: (-combined[t], order[t]))


def _metrics(rankings: Sequence[Sequence[str]], golds: Sequence[str], k: int) -> dict[str, float]:
    n = len(golds)
    if not n:
        return {"acc": 0.0, "r5": 0.0, "n": 0}
    acc = sum(bool(r) and r[0] == g for r, g in zip(rankings, golds, strict=True))
    recall = sum(g in r[:k] for r, g in zip(rankings, golds, strict=True))
    return {"acc": acc / n, "r5": recall / n, "n": n}


def step_accuracy(
    router: Router,
    items: Sequence[StepItem],
    transition_weight: float = TRANSITION_WEIGHT,
    k: int = 5,
    oracle: bool = False,
) -> dict[str, dict[str, float]]:
    """Next-tool accuracy of a router over task steps, alone and with the transition prior.

    Parameters
    ----------
    router : Router
        The router; its compendium (``router.entries``) also supplies the
        ``next_tools`` counts of the prior.
    items : sequence of StepItem
        Steps to predict (the query already carries the calls so far).
    transition_weight : float
        Weight of the prior, see :func:`rerank_with_transitions`.
    k : int
        Cut-off of the recall (``r5`` is recall@k).
    oracle : bool
        Force each step's gold tool into the candidates (oracle retrieval).

    Returns
    -------
    dict
        ``{"router": {"acc", "r5", "n"}, "transition": {"acc", "r5", "n"}}``.
    """
    force = [(i.gold,) for i in items] if oracle else None
    results = router.route_many([i.query for i in items], force=force)
    golds = [i.gold for i in items]
    alone = [[c.tool_id for c in r.candidates] for r in results]
    with_prior = [
        rerank_with_transitions(r, router.entries, i.prev_tool, transition_weight)
        for r, i in zip(results, items, strict=True)
    ]
    return {"router": _metrics(alone, golds, k), "transition": _metrics(with_prior, golds, k)}


def _embedder_factory(embedder: EmbedderSpec) -> Callable[[], Embedder]:
    """A callable giving each router its embedder.

    A neural embedder (by name) is built once and shared, so its cache and
    weights are loaded once; TF-IDF must be fitted per router, so a fresh one
    is made every time, as is anything a callable builds.
    """
    if callable(embedder):
        return embedder
    if embedder == "tfidf":
        return lambda: get_embedder("tfidf")
    shared = get_embedder(embedder)
    return lambda: shared


def arm_compendia(
    catalog: Catalog,
    train: Sequence[Task],
    seed: int,
    k_orgs: int = 5,
    alpha: float = 0.5,
    epsilon: float = math.inf,
) -> dict[str, Compendium | None]:
    """The knowledge of each arm for one seed.

    Parameters
    ----------
    catalog : Catalog
        The tools.
    train : sequence of Task
        Tasks whose gold calls are the experience.
    seed : int
        Seed of the non-IID partition and of the privacy noise.
    k_orgs : int
        Organisations of the federated arm.
    alpha : float
        Dirichlet concentration of the partition (small: more skewed).
    epsilon : float
        Privacy budget of every build; ``inf`` turns privacy off.

    Returns
    -------
    dict
        ``plain`` -> None, ``federated`` and ``centralized`` -> Compendium.
    """
    events = taubench_events(train)
    parts = partition_noniid(events, k_orgs, alpha, seed)
    orgs = [
        build_compendium(part, catalog, f"org{i}", round_=1, epsilon=epsilon, seed=seed)
        for i, part in enumerate(parts)
    ]
    log.info("seed %d: %d events over %d orgs: %s", seed, len(events), k_orgs, [len(p) for p in parts])
    return {
        "plain": None,
        "federated": merge_typed(orgs),
        "centralized": build_compendium(events, catalog, "central", epsilon=epsilon, seed=seed),
    }


def _summary(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    def sd(xs: list[float]) -> float:
        return statistics.stdev(xs) if len(xs) > 1 else 0.0

    acc, r5 = [r["acc"] for r in runs], [r["r5"] for r in runs]
    return {
        "acc_mean": statistics.mean(acc),
        "acc_sd": sd(acc),
        "r5_mean": statistics.mean(r5),
        "r5_sd": sd(r5),
        "n": runs[0]["n"],
        "seeds": len(runs),
    }


def evaluate_arms(
    catalog: Catalog,
    train: Sequence[Task],
    test: Sequence[Task],
    seeds: Sequence[int] = (42, 123, 456),
    k_orgs: int = 5,
    alpha: float = 0.5,
    epsilon: float = math.inf,
    embedder: EmbedderSpec = "minilm",
    transition_weight: float = TRANSITION_WEIGHT,
    reranker: str = "fields",
) -> dict:
    """Step accuracy of every arm and seed on the test tasks, and their mean and sd.

    Parameters
    ----------
    catalog : Catalog
        The tools.
    train, test : sequence of Task
        Experience tasks and evaluated tasks.
    seeds : sequence of int
        One partition (and noise draw) per seed.
    k_orgs, alpha, epsilon : see :func:`arm_compendia`.
    embedder : str or callable
        Embedder name, or a callable returning a fresh embedder per router
        (e.g. ``TfidfEmbedder``).
    transition_weight : float
        Weight of the transition prior.
    reranker : str
        The router's reranker.

    Returns
    -------
    dict
        ``per_seed[arm][variant]`` lists of ``{"acc", "r5", "n", "seed"}``,
        ``summary[arm][variant]`` mean and sd over seeds, ``seconds[arm]`` wall
        time, and ``steps`` (first steps and later ones). The docs-only arm
        is deterministic, so it is run once and its sd is 0.
    """
    if not seeds:
        raise ValueError("at least one seed is needed")
    items = taubench_step_items(test)
    make_embedder = _embedder_factory(embedder)
    per_seed: dict[str, dict[str, list[dict]]] = {a: {v: [] for v in VARIANTS} for a in ARMS}
    seconds = dict.fromkeys(ARMS, 0.0)
    for seed in seeds:
        compendia = arm_compendia(catalog, train, seed, k_orgs, alpha, epsilon)
        for arm, compendium in compendia.items():
            if arm == "plain" and per_seed[arm]["router"]:
                continue
            t0 = time.perf_counter()
            router = Router(compendium, catalog, embedder=make_embedder(), reranker=reranker)
            scores = step_accuracy(router, items, transition_weight)
            seconds[arm] += time.perf_counter() - t0
            for variant, m in scores.items():
                per_seed[arm][variant].append({**m, "seed": seed})
            log.info("seed %d %s: %s", seed, arm, scores)
    summary = {a: {v: _summary(per_seed[a][v]) for v in VARIANTS} for a in ARMS}
    first = sum(i.prev_tool is None for i in items)
    return {
        "per_seed": per_seed,
        "summary": summary,
        "seconds": seconds,
        "steps": {"total": len(items), "first": first, "later": len(items) - first},
    }


def run_taubench(
    seeds: Sequence[int] = (42, 123, 456),
    k_orgs: int = 5,
    alpha: float = 0.5,
    epsilon: float = math.inf,
    embedder: EmbedderSpec = "minilm",
    transition_weight: float = TRANSITION_WEIGHT,
    directory: str | Path | None = None,
) -> dict:
    """The three arms on tau-bench retail: train tasks as experience, test tasks' steps scored.

    Parameters
    ----------
    seeds, k_orgs, alpha, epsilon, embedder, transition_weight
        See :func:`evaluate_arms`.
    directory : str, Path or None
        Data folder; None uses :func:`~synapse_flwr.data.datasets.data_dir`.

    Returns
    -------
    dict
        :func:`evaluate_arms`' result plus the ``config`` it ran with.
    """
    catalog, train = load_taubench(directory, split="train")
    _, test = load_taubench(directory, split="test")
    out = evaluate_arms(
        catalog, train, test, seeds, k_orgs, alpha, epsilon, embedder, transition_weight
    )
    out["config"] = {
        "seeds": list(seeds),
        "k_orgs": k_orgs,
        "alpha": alpha,
        "epsilon": epsilon,
        "embedder": embedder if isinstance(embedder, str) else repr(embedder),
        "transition_weight": transition_weight,
        "transition_smoothing": TRANSITION_SMOOTHING,
        "train_tasks": len(train),
        "test_tasks": len(test),
    }
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: run :func:`run_taubench`, log the summary, optionally write results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 123, 456])
    parser.add_argument("--k-orgs", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--epsilon", type=float, default=math.inf)
    parser.add_argument("--embedder", default="minilm", choices=("minilm", "static", "tfidf"))
    parser.add_argument("--transition-weight", type=float, default=TRANSITION_WEIGHT)
    parser.add_argument("--output", type=Path, help="folder for results.json and manifest.json")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    t0 = time.perf_counter()
    results = run_taubench(
        args.seeds, args.k_orgs, args.alpha, args.epsilon, args.embedder, args.transition_weight
    )
    results["wall_seconds"] = time.perf_counter() - t0
    for arm, variants in results["summary"].items():
        for variant, s in variants.items():
            log.info(
                "%-11s %-10s acc %.3f±%.3f  r5 %.3f±%.3f  (n=%d, %d seeds)",
                arm, variant, s["acc_mean"], s["acc_sd"], s["r5_mean"], s["r5_sd"], s["n"], s["seeds"],
            )
    log.info("wall time %.1f s", results["wall_seconds"])
    if args.output:
        command = " ".join(["python -m synapse_flwr.eval.taubench_eval", *argv])
        write_results(
            args.output, results, results["config"], verified_hashes(["taubench-retail"]), command
        )


if __name__ == "__main__":
    main()
