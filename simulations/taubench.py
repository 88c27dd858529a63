"""tau-bench retail per step: a 5-fold cross-validated protocol by task, and the train-only protocol.

``cv`` (the reported protocol): the 115 test tasks are split into ``folds``
folds by task (a permutation per seed); each fold is scored with experience
from the other folds' gold call sequences plus the 500 train tasks' calls,
every task one private record (:mod:`synapse_flwr.core.sequences`) assigned
at random to one of ``orgs`` organisations. ``train_only`` (the committed
protocol before issue 12, kept for comparison): experience from the train
tasks only, every test task scored.

Everything runs in process: each organisation's artifact is built with
:func:`~synapse_flwr.core.builder.build_compendium` (one release), artifacts
are merged with :func:`~synapse_flwr.core.merge.merge_typed`, the code the
Flower apps run, without the transport (one Flower run per fold and seed
would not fit the shared 2-core machines). ``fedavg_dp`` (a Ray simulation
per fold) is not run here.

Arms, all scored by :func:`~synapse_flwr.eval.taubench.step_scores` on the
same steps: ``docs_only`` (router on the instruction, no compendium),
``local_only`` (each org's own artifact, mean over orgs), ``federated``
(merged, no noise), ``federated_private`` (merged, ``epsilon`` per record),
``centralized`` (one build of all experience), ``classifier`` (TF-IDF + SVM
on instruction and previous tool, centralised), ``oracle`` (the federated
scores ranked among the task's own gold tools only: an upper bound, uses the
labels) and ``bigram_start`` (exact start and bigram counts of the same
experience, the most frequent next tool).

Usage: ``synapse experiment configs/taubench.toml`` (``dataset = "taubench"``
dispatches here); ``python simulations/taubench.py configs/taubench.toml --tune``
chooses the constants on the dev seed and writes ``tuning.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import statistics
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from synapse_flwr.simulations.experiment_report import COMPARE_DIGITS, VALUE_DIGITS

from synapse_flwr.core.builder import BuildConfig, build_compendium, derive_seed
from synapse_flwr.core.catalog import Catalog
from synapse_flwr.core.embed import Embedder, get_embedder
from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.router import Router
from synapse_flwr.core.schema import Compendium
from synapse_flwr.core.sequences import SequenceBounds, SequenceRecord, record_events
from synapse_flwr.data.federation import packaged_examples
from synapse_flwr.data.taubench import (
    StepItem,
    Task,
    load_taubench,
    task_records,
    taubench_step_items,
)
from synapse_flwr.eval.baselines import tfidf_svm_scores
from synapse_flwr.eval.results import write_results
from synapse_flwr.eval.taubench import (
    STEP_KINDS,
    StepWeights,
    bigram_rankings,
    rankings,
    step_metrics,
    step_scores,
)

log = logging.getLogger("taubench")

TAU_ARMS = ("docs_only", "local_only", "federated", "federated_private", "centralized", "classifier", "oracle",
            "bigram_start")
PROTOCOLS = ("cv", "train_only")


@dataclass(frozen=True)
class TauConfig:
    """The ``[taubench]`` table: the protocol and the constants chosen on ``dev_seed``.

    Parameters
    ----------
    folds : int
        Cross-validation folds over the test tasks.
    dev_seed : int
        The only seed constants are chosen on.
    max_tools, max_counters, sequence_weight, floor_sds : int, int, float, float
        Contribution bound of one task record and the release floor
        (:class:`~synapse_flwr.core.sequences.SequenceBounds`).
    prototype_weight : float
        ``c`` of the prototypes in the same release.
    train_sequences : bool
        Whether the train tasks' gold lists count as call sequences (they list
        the write calls only) or only as calls.
    lift_first, lift_later, route, smoothing, backoff, docs, prior_floor_sds : float
        :class:`~synapse_flwr.eval.taubench.StepWeights` (``prior_floor_sds`` is its ``floor_sds``).
    grid : dict
        Values searched by ``--tune`` (key -> list), on ``dev_seed`` only.
    """

    folds: int = 5
    dev_seed: int = 7
    max_tools: int = 6
    max_counters: int = 8
    sequence_weight: float = 16.0
    floor_sds: float = 1.0
    prototype_weight: float = 1.0
    train_sequences: bool = False
    lift_first: float = 30.0
    lift_later: float = 0.0
    route: float = 3.0
    smoothing: float = 0.1
    backoff: float = 1.0
    docs: float = 0.0
    prior_floor_sds: float = 0.0
    grid: dict = field(default_factory=dict)

    @classmethod
    def from_toml(cls, path: Path) -> TauConfig:
        """Read the ``[taubench]`` table (missing: the defaults); unknown keys are an error naming them."""
        table = tomllib.loads(path.read_text(encoding="utf-8")).get("taubench", {})
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(table) - known):
            raise SynapseError(f"{path}: unknown keys in [taubench]: {', '.join(unknown)} "
                               f"(known: {', '.join(sorted(known))})")
        cfg = cls(**table)
        if cfg.folds < 2:
            raise SynapseError(f"{path}: [taubench] folds must be at least 2, got {cfg.folds}")
        return cfg

    @property
    def weights(self) -> StepWeights:
        return StepWeights(self.lift_first, self.lift_later, self.route, self.smoothing, self.backoff, self.docs,
                           self.prior_floor_sds)

    @property
    def build(self) -> BuildConfig:
        bounds = SequenceBounds(self.max_tools, self.max_counters, self.sequence_weight, self.floor_sds)
        return BuildConfig(prototype_weight=self.prototype_weight, sequences=bounds)


@dataclass
class Fold:
    """One split: experience records (with their org and whether their sequence counts) and test steps."""

    records: list[SequenceRecord]
    orgs: list[int]
    sequenced: list[bool]
    test: list[StepItem]


def fold_ids(n: int, folds: int, seed: int) -> list[int]:
    """The fold of each of ``n`` tasks: a seeded permutation dealt round robin."""
    out = [0] * n
    for i, j in enumerate(np.random.default_rng(derive_seed(seed, "folds")).permutation(n)):
        out[j] = i % folds
    return out


def make_folds(train: list[Task], test: list[Task], protocol: str, folds: int, orgs: int, seed: int,
               train_sequences: bool) -> list[Fold]:
    """The splits of a protocol for one seed (records assigned to orgs uniformly at random)."""
    if protocol == "train_only":
        splits = [(list(train), [False] * len(train), list(test))]
    else:
        ids = fold_ids(len(test), folds, seed)
        splits = [([t for t, g in zip(test, ids) if g != f] + list(train),
                   [True] * sum(g != f for g in ids) + [train_sequences] * len(train),
                   [t for t, g in zip(test, ids) if g == f]) for f in range(folds)]
    out = []
    for f, (exp, seq, held) in enumerate(splits):
        if protocol == "train_only":
            seq = [train_sequences] * len(exp)
        rng = np.random.default_rng(derive_seed(seed, protocol, f, "orgs"))
        out.append(Fold(task_records(exp), rng.integers(0, orgs, len(exp)).tolist(), seq,
                        taubench_step_items(held)))
    return out


class Runner:
    """Builds and scores every arm of one fold.

    Parameters
    ----------
    catalog : Catalog
        The 16 retail tools.
    embedder : Embedder
        Embedder of every router and of the prototypes.
    orgs : int
        Organisations.
    epsilon, delta : float
        Budget of ``federated_private`` per record.
    k : int
        Recall cut-off.
    """

    def __init__(self, catalog: Catalog, embedder: Embedder, orgs: int, epsilon: float, delta: float,
                 k: int) -> None:
        self.catalog, self.embedder, self.orgs = catalog, embedder, orgs
        self.epsilon, self.delta, self.k = epsilon, delta, k

    def artifacts(self, fold: Fold, epsilon: float, config: BuildConfig, seed: int) -> list[Compendium]:
        """Every organisation's one-release artifact of the fold's records."""
        bounds = config.sequences
        out = []
        for org in range(self.orgs):
            mine = [(r, s) for r, o, s in zip(fold.records, fold.orgs, fold.sequenced) if o == org]
            events = [e for r, _ in mine for e in record_events(r, bounds)]
            out.append(build_compendium(events, self.catalog, f"org{org}", epsilon=epsilon, delta=self.delta,
                                        rounds=1, seed=seed, config=config, embedder=self.embedder,
                                        sequences=[r for r, s in mine if s]))
        return out

    def router(self, compendium: Compendium | None) -> Router:
        return Router(compendium, self.catalog, embedder=self.embedder, k=self.k)

    def ranked(self, compendium: Compendium | None, items: list[StepItem], weights: StepWeights) -> list[list[str]]:
        router = self.router(compendium)
        return rankings(step_scores(router, items, weights, docs_only=compendium is None), router.tool_ids)


def classifier_rankings(fold: Fold, items: list[StepItem]) -> list[list[str]]:
    """TF-IDF + SVM on the instruction and the previous tool, trained on the experience's steps."""
    steps = [(r.query, prev, tool) for r in fold.records for prev, tool in zip((None, *r.tools), r.tools)]

    def text(query: str, prev: str | None) -> str:
        return f"{query}\nprevious tool: {prev or 'none'}"

    scores, classes = tfidf_svm_scores([text(q, p) for q, p, _ in steps], [t for _, _, t in steps],
                                       [text(i.query, i.prev_tool) for i in items])
    return rankings(scores, classes)


def bigram_counts(fold: Fold) -> tuple[Counter, Counter]:
    """Exact start and bigram counts of the fold's sequenced records (every transition)."""
    seqs = [r.tools for r, s in zip(fold.records, fold.sequenced) if s and r.tools]
    return Counter(t[0] for t in seqs), Counter(p for t in seqs for p in itertools.pairwise(t))


def fold_rankings(runner: Runner, fold: Fold, tau: TauConfig, seed: int, arms: Sequence[str],
                  f: int) -> dict[str, Any]:
    """Rankings of every arm on one fold (``local_only``: one list per org)."""
    items, w, config = fold.test, tau.weights, tau.build
    out: dict[str, Any] = {}
    noise_seed = derive_seed(seed, f)
    clean = runner.artifacts(fold, math.inf, config, noise_seed)
    fed = merge_typed(clean)
    if "docs_only" in arms:
        out["docs_only"] = runner.ranked(None, items, w)
    if "local_only" in arms:
        out["local_only"] = [runner.ranked(a, items, w) for a in clean]
    if "federated" in arms or "oracle" in arms:
        router = runner.router(fed)
        scores = step_scores(router, items, w)
        out["federated"] = rankings(scores, router.tool_ids)
        task_golds: dict[int, set[str]] = {}
        for i in items:
            task_golds.setdefault(i.task_id, set()).add(i.gold)
        out["oracle"] = rankings(scores, router.tool_ids, [task_golds[i.task_id] for i in items])
    if "federated_private" in arms:
        private = merge_typed(runner.artifacts(fold, runner.epsilon, config, noise_seed))
        out["federated_private"] = runner.ranked(private, items, w)
        out["_privacy"] = private.privacy.model_dump()
    if "centralized" in arms:
        central = build_compendium([e for r in fold.records for e in record_events(r, config.sequences)],
                                   runner.catalog, "central", seed=noise_seed, config=config,
                                   embedder=runner.embedder,
                                   sequences=[r for r, s in zip(fold.records, fold.sequenced) if s], epsilon=math.inf)
        out["centralized"] = runner.ranked(central, items, w)
    if "classifier" in arms:
        out["classifier"] = classifier_rankings(fold, items)
    if "bigram_start" in arms:
        out["bigram_start"] = bigram_rankings(*bigram_counts(fold), runner.catalog.ids, items)
    return {k: v for k, v in out.items() if k in arms or k == "_privacy"}


def seed_metrics(runner: Runner, train: list[Task], test: list[Task], protocol: str, tau: TauConfig,
                 seed: int, arms: Sequence[str], k: int) -> dict[str, Any]:
    """Every arm's metrics for one seed, pooled over the folds' steps."""
    folds = make_folds(train, test, protocol, tau.folds, runner.orgs, seed, tau.train_sequences)
    pooled: dict[str, list] = {}
    items: list[StepItem] = []
    privacy = None
    for f, fold in enumerate(folds):
        ranked = fold_rankings(runner, fold, tau, seed, arms, f)
        privacy = ranked.pop("_privacy", privacy)
        items += fold.test
        for arm, r in ranked.items():
            if arm == "local_only":
                per_org = pooled.setdefault(arm, [[] for _ in r])
                for acc, org_r in zip(per_org, r):
                    acc += org_r
            else:
                pooled.setdefault(arm, []).extend(r)
    out = {}
    for arm, r in pooled.items():
        if arm == "local_only":
            per_org = [step_metrics(x, items, k) for x in r]
            out[arm] = mean_metrics(per_org)
            out[arm]["per_org_acc"] = [m["acc"] for m in per_org]
        else:
            out[arm] = step_metrics(r, items, k)
    return {"arms": out, "privacy": privacy, "steps": len(items)}


def mean_metrics(runs: Sequence[dict]) -> dict[str, Any]:
    """Mean (and SD over runs) of acc, r5, task_acc and per-kind acc."""
    def sd(xs: list[float]) -> float:
        return statistics.stdev(xs) if len(xs) > 1 else 0.0

    acc = [r["acc"] for r in runs]
    return {"acc": statistics.mean(acc), "acc_sd": sd(acc), "r5": statistics.mean(r["r5"] for r in runs),
            "task_acc": statistics.mean(r["task_acc"] for r in runs), "n": runs[0]["n"],
            "tasks": runs[0]["tasks"],
            "by_kind": {k: {"acc": statistics.mean(r["by_kind"][k]["acc"] for r in runs),
                            "n": runs[0]["by_kind"][k]["n"]} for k in STEP_KINDS}}


def run_protocol(runner: Runner, train: list[Task], test: list[Task], protocol: str, tau: TauConfig,
                 seeds: Sequence[int], arms: Sequence[str], k: int,
                 progress: Callable[[str], None]) -> dict[str, Any]:
    """One protocol over the seeds: per-seed metrics and their means."""
    per_seed = {}
    for seed in seeds:
        t0 = time.perf_counter()
        per_seed[str(seed)] = seed_metrics(runner, train, test, protocol, tau, seed, arms, k)
        log.info("%s seed %d: %s (%.0fs)", protocol, seed,
                 {a: round(m["acc"], 3) for a, m in per_seed[str(seed)]["arms"].items()}, time.perf_counter() - t0)
        progress(f"{protocol}/seed{seed}")
    first = next(iter(per_seed.values()))
    arms_out = {arm: mean_metrics([r["arms"][arm] for r in per_seed.values()]) for arm in first["arms"]}
    return {"arms": arms_out, "steps": first["steps"], "privacy": first["privacy"],
            "per_seed": {s: r["arms"] for s, r in per_seed.items()}}


# ---------------------------------------------------------------- targets and reports
def worst_gap(block: dict[str, Any], arm: str) -> float:
    """The arm's smallest margin over ``docs_only``: overall and on every step kind."""
    mine, docs = block["arms"][arm], block["arms"]["docs_only"]
    return min([mine["acc"] - docs["acc"],
                *(mine["by_kind"][k]["acc"] - docs["by_kind"][k]["acc"] for k in STEP_KINDS)])


def targets(cv: dict[str, Any], train_only: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Issue 12's targets on the cross-validated protocol, each with its value and whether it is met.

    Then the no-harm rule on the arms and protocol the issue does not name
    (the private arm; the train-only protocol, whose experience holds the
    write tools only, so that most steps go to tools without experience):
    each arm's worst margin over ``docs_only``, overall and per step kind.
    """
    arms = cv["arms"]
    out = []

    def add(name: str, value: float, goal: str, met: bool) -> None:
        out.append({"target": name, "value": round(value, VALUE_DIGITS), "goal": goal, "met": bool(met)})

    fed, private, bigram = (arms[a]["acc"] for a in ("federated", "federated_private", "bigram_start"))
    add("federated per-step top-1", fed, ">= 0.60", fed >= 0.60)
    add("federated_private per-step top-1 (epsilon 4)", private, ">= 0.55", private >= 0.55)
    add("federated - bigram_start", fed - bigram, "> 0", fed > bigram)
    add("federated_private - bigram_start", private - bigram, "> 0", private > bigram)
    for kind in STEP_KINDS:
        gap = arms["federated"]["by_kind"][kind]["acc"] - arms["docs_only"]["by_kind"][kind]["acc"]
        add(f"no harm: federated - docs_only ({kind} steps)", gap, ">= 0", round(gap, COMPARE_DIGITS) >= 0)
    worst = [("federated_private", "cross-validated", cv)]
    if train_only is not None:
        worst += [(arm, "train-only", train_only) for arm in ("federated", "federated_private")]
    for arm, protocol, block in worst:
        gap = worst_gap(block, arm)
        add(f"no harm, {protocol}: {arm} - docs_only (worst of overall and each step kind)", gap, ">= 0",
            round(gap, COMPARE_DIGITS) >= 0)
    return out


def summary(cv: dict[str, Any]) -> dict[str, float]:
    """``summary.json``: the issue's headline numbers (cross-validated, mean over seeds)."""
    arms = cv["arms"]
    return {"steps": cv["steps"], "federated_step_cv": round(arms["federated"]["acc"], 4),
            "federated_private_step_cv_eps4": round(arms["federated_private"]["acc"], 4),
            "docs_only_step_cv": round(arms["docs_only"]["acc"], 4),
            "bigram_start_step_cv": round(arms["bigram_start"]["acc"], 4)}


def _table(block: dict[str, Any]) -> list[str]:
    lines = ["| arm | top-1 (mean ± SD over seeds) | recall@5 | first | read | write | tasks whole |",
             "|---|---|---|---|---|---|---|"]
    for arm in TAU_ARMS:
        if arm in block["arms"]:
            m = block["arms"][arm]
            kinds = " | ".join(f"{m['by_kind'][k]['acc']:.3f}" for k in STEP_KINDS)
            lines.append(f"| {arm} | {m['acc']:.3f} ± {m['acc_sd']:.3f} | {m['r5']:.3f} | {kinds} | "
                         f"{m['task_acc']:.3f} |")
    first = next(iter(block["arms"].values()))
    counts = ", ".join(f"{first['by_kind'][k]['n']} {k}" for k in STEP_KINDS)
    lines += ["", f"Steps: {block['steps']} ({counts}); tasks with at least one call: {first['tasks']}."]
    return lines


def tables(results: dict[str, Any]) -> str:
    """``tables.md``: both protocols, per step kind, and the targets."""
    p = results["privacy"] or {}
    lines = [f"# {results['name']}", "",
             f"Seeds {results['seeds']}, K={results['orgs']} organisations (records assigned uniformly at random), "
             f"embedder `{results['embedder']}`. Every arm is built and scored in process (org builds and the "
             "typed merge, no Flower transport); `fedavg_dp` is not run on this benchmark. Constants chosen on "
             f"seed {results['tau']['dev_seed']} only (`tuning.json`). Columns first / read / write: top-1 per step "
             "kind; tasks whole: share of test tasks whose every step is predicted right.", "",
             f"## Cross-validated protocol ({results['tau']['folds']}-fold by task over the test tasks; "
             "experience: the other folds' call sequences plus the train tasks' calls)", "",
             *_table(results["cv"]), "",
             "## Train-only protocol (the protocol committed before issue 12: experience from the train tasks, "
             "whose gold lists hold six write tools only; every test task scored)", "",
             *_table(results["train_only"]), "",
             f"Privacy (`federated_private`): epsilon {results['epsilon']} per record (one task), delta "
             f"{results['delta']}, one release per organisation; clip (L2 sensitivity of one record) "
             f"{p.get('clip', 0):.2f}, sigma {p.get('sigma', 0):.2f}; bounds: {results['bounds']}.", "",
             "## Targets (cross-validated protocol; the last no-harm rows: the private arm, and the train-only "
             "protocol)", "", "| target | measured | goal | met |", "|---|---|---|---|"]
    lines += [f"| {t['target']} | {t['value']:+.3f} | {t['goal']} | {'yes' if t['met'] else 'NO'} |"
              for t in results["targets"]]
    return "\n".join(lines) + "\n"


def run_taubench(config: Path, exp: Any, output: Path | None = None,
                 progress: Callable[[str], None] | None = None) -> Path:
    """Both protocols for every seed; writes results, manifest, tables and summary into the output folder.

    Parameters
    ----------
    config : Path
        The TOML (its ``[taubench]`` table is read here).
    exp : ExperimentConfig
        Its ``[experiment]`` table (seeds, orgs, epsilon, delta, embedder, k, arms, output).
    output : Path or None
        Folder instead of ``exp.output``.
    progress : callable or None
        Called with a label after each protocol and seed.
    """
    from synapse_flwr.simulations.experiment import data_hashes

    tau = TauConfig.from_toml(config)
    arms = [a for a in exp.arms if a != "fedavg_dp"] + ["bigram_start"]
    if bad := sorted(set(arms) - set(TAU_ARMS)):
        raise SynapseError(f"{config}: arms {bad} are not run on tau-bench; choose from {', '.join(TAU_ARMS)}")
    for needed in ("docs_only", "federated", "federated_private"):
        if needed not in arms:
            raise SynapseError(f"{config}: tau-bench needs the arm {needed!r} (its targets read it)")
    catalog, train = load_taubench(split="train")
    catalog = packaged_examples("taubench", catalog)  # the example requests shipped with the package
    test = load_taubench(split="test")[1]
    runner = Runner(catalog, get_embedder(exp.embedder), exp.orgs, exp.epsilon, exp.delta, exp.k)
    t0 = time.perf_counter()
    results: dict[str, Any] = {"name": exp.name, "seeds": exp.seeds, "orgs": exp.orgs, "embedder": exp.embedder,
                               "epsilon": exp.epsilon, "delta": exp.delta, "k": exp.k, "tau": asdict(tau),
                               "bounds": asdict(tau.build.sequences)}
    for protocol in PROTOCOLS:
        results[protocol] = run_protocol(runner, train, test, protocol, tau, exp.seeds, arms, exp.k,
                                         progress or (lambda label: None))
    results["privacy"] = results["cv"]["privacy"]
    results["targets"] = targets(results["cv"], results["train_only"])
    results["wall_s"] = round(time.perf_counter() - t0, 1)
    out_dir = Path(output or exp.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_results(out_dir, results, {"experiment": asdict(exp), "taubench": asdict(tau)},
                  data_hashes("taubench"), f"synapse experiment {config}")
    write_atomic(out_dir / "tables.md", tables(results))
    write_atomic(out_dir / "summary.json", json.dumps(summary(results["cv"]), indent=2, sort_keys=True) + "\n")
    log.info("results in %s (%.0fs)", out_dir.resolve(), results["wall_s"])
    return out_dir


# ---------------------------------------------------------------- tuning on the dev seed
def tune(config: Path) -> Path:
    """Grid-search the ``[taubench] grid`` on ``dev_seed`` (cv protocol); writes ``tuning.json``.

    Step weights and ``train_sequences`` maximise ``federated`` (no noise)
    subject to no harm against ``docs_only`` on every step kind; then the
    budget split, release floor and prior's noise floor (``sequence_weight``,
    ``prototype_weight``, ``floor_sds``, ``prior_floor_sds``: they only matter
    with noise) maximise ``federated_private`` at those weights. Builds are
    shared by every weight point.
    """
    from synapse_flwr.simulations.experiment_config import ExperimentConfig

    exp = ExperimentConfig.from_toml(config)
    base = TauConfig.from_toml(config)
    catalog, train = load_taubench(split="train")
    catalog = packaged_examples("taubench", catalog)  # the example requests shipped with the package
    test = load_taubench(split="test")[1]
    runner = Runner(catalog, get_embedder(exp.embedder), exp.orgs, exp.epsilon, exp.delta, exp.k)
    seed = base.dev_seed

    def global_routers(tau: TauConfig, epsilon: float) -> list[tuple[Router, list[StepItem]]]:
        folds = make_folds(train, test, "cv", tau.folds, exp.orgs, seed, tau.train_sequences)
        return [(runner.router(merge_typed(runner.artifacts(fold, epsilon, tau.build, derive_seed(seed, f)))),
                 fold.test) for f, fold in enumerate(folds)]

    def pooled(routers: list[tuple[Router, list[StepItem]]], weights: StepWeights, docs_only: bool = False) -> dict:
        ranked, items = [], []
        for router, steps in routers:
            ranked += rankings(step_scores(router, steps, weights, docs_only), router.tool_ids)
            items += steps
        m = step_metrics(ranked, items, exp.k)
        return {"acc": m["acc"], "by_kind": {k: m["by_kind"][k]["acc"] for k in STEP_KINDS}}

    folds = make_folds(train, test, "cv", base.folds, exp.orgs, seed, base.train_sequences)
    docs = pooled([(runner.router(None), fold.test) for fold in folds], base.weights, docs_only=True)
    weight_keys = [k for k in ("lift_first", "lift_later", "route", "docs") if k in base.grid]
    trials = []
    for train_sequences in base.grid.get("train_sequences", [base.train_sequences]):
        routers = global_routers(replace(base, train_sequences=train_sequences), math.inf)
        for values in itertools.product(*(base.grid[k] for k in weight_keys)):
            point = {"train_sequences": train_sequences, **dict(zip(weight_keys, values))}
            m = pooled(routers, replace(base, **point).weights)
            trials.append({"point": point, "federated": m, "no_harm": all(
                m["by_kind"][k] >= docs["by_kind"][k] for k in STEP_KINDS)})
    best = max([t for t in trials if t["no_harm"]] or trials, key=lambda t: t["federated"]["acc"])
    chosen = replace(base, **best["point"])
    log.info("step constants on seed %d: %s -> %s", seed, best["point"], best["federated"])
    budget_keys = [k for k in ("sequence_weight", "prototype_weight", "floor_sds", "prior_floor_sds") if k in base.grid]
    budget = []
    for values in itertools.product(*(base.grid[k] for k in budget_keys)):
        point = dict(zip(budget_keys, values))
        tau = replace(chosen, **point)
        budget.append({"point": point, "federated_private": pooled(global_routers(tau, exp.epsilon), tau.weights)})
        log.info("%s", budget[-1])
    if budget:
        chosen = replace(chosen, **max(budget, key=lambda t: t["federated_private"]["acc"])["point"])
    out = Path(exp.output) / "tuning.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    picked = {k: v for k, v in asdict(chosen).items() if k != "grid"}
    write_atomic(out, json.dumps({"dev_seed": seed, "docs_only": docs, "step_trials": trials,
                                  "budget_trials": budget, "chosen": picked}, indent=2, sort_keys=True) + "\n")
    log.info("chosen on seed %d: %s", seed, picked)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python simulations/taubench.py CONFIG [--tune]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, help="configs/taubench.toml")
    parser.add_argument("--tune", action="store_true", help="choose the constants on the dev seed")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.tune:
        tune(args.config)
    else:
        from synapse_flwr.simulations.experiment_config import ExperimentConfig

        run_taubench(args.config, ExperimentConfig.from_toml(args.config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
