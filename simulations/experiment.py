"""The paper's experiments, reproduced and extended: arms x seeds x contradiction rates.

One TOML config (``configs/metatool.toml``, ``configs/taubench.toml``) names
the dataset, seeds, organisations, privacy budget, arms, contradiction rates,
merge policies and renders. :func:`run_experiment` runs every unit of work
(Flower simulations of the federation, compendium builds, evaluations,
baselines), caching each one as JSON under ``cache`` so that an interrupted
run resumes where it stopped, and writes ``results.json``, ``tables.md``,
``manifest.json`` and PNG figures into ``output``.

Federated arms go through the project's own Flower ``ServerApp`` and
``ClientApp`` under the simulation engine (:func:`synapse_flwr.flower.launch.run_simulation`),
exactly as users run them; every other arm reads the same partition and the
same injected contradictions (:func:`synapse_flwr.data.federation.load_federated`).

The config is read and checked in :mod:`~synapse_flwr.simulations.experiment_config`;
targets, tables, summary and figures are drawn from the results in
:mod:`~synapse_flwr.simulations.experiment_report`.

Usage: ``synapse experiment configs/metatool.toml`` (``--fresh`` ignores the cache).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import math
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from synapse_flwr.simulations.experiment_config import (
    ARMS,
    LLM_ARMS,
    SPLITS,
    ExperimentConfig,
)
from synapse_flwr.simulations.experiment_report import (
    figures,
    no_harm,
    summary_lines,
    tables,
    targets,
)

from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.catalog import Catalog
from synapse_flwr.core.documentation import (
    COMMON_ARGUMENT_SHARE,
    catalog_arguments,
    distinctive_parameters,
    documentation_text,
    schema_properties,
)
from synapse_flwr.core.embed import LEXICAL
from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.experience import TestItem
from synapse_flwr.core.files import write_atomic, write_problem
from synapse_flwr.core.merge import TYPED, merge_typed
from synapse_flwr.core.metrics import evaluate_routes
from synapse_flwr.core.release import ReleaseState
from synapse_flwr.core.router import Router
from synapse_flwr.core.schema import Compendium
from synapse_flwr.core.votes import chosen_setting
from synapse_flwr.core.wire import content_hash, load_artifact
from synapse_flwr.data.check import file_hashes, require_valid
from synapse_flwr.data.federation import (
    KNOWN_DATASETS,
    FederatedDataset,
    experienced_tools,
    load_federated,
)
from synapse_flwr.eval.order_check import order_changes
from synapse_flwr.eval.results import write_results
from synapse_flwr.flower.config import SPACES, RunConfig

log = logging.getLogger(__name__)

# Sampled queries per split whose LLM picks are rechecked in reversed and
# shuffled candidate order (each costs two more LLM passes over its candidates)
ORDER_CHECK = 20
#: The arm whose LLM picks the order check reads: the first of these the config runs.
ORDER_CHECK_ARMS = ("federated", "centralized", "docs_only")
# What the Router (and the fusion votes cast through it) reads: every synapse_flwr module
# core.router and core.votes import, but error texts, file writes and the progress bar.
# A Flower run that votes is cached under their hash (its votes are scored by a Router).
ROUTER_MODULES = ("core.router", "core.votes", "core.catalog", "core.documentation", "core.embed", "core.experience",
                  "core.explain", "core.fusion", "core.llm", "core.phrase_profile", "core.phrases", "core.privacy",
                  "core.prototypes", "core.render", "core.rerank_llm", "core.sanitize", "core.scenarios",
                  "core.schema", "core.shift")
# Evaluations and baselines are cached under a hash of the code that scores the arms and of the code
# that splits the test sets, so a router or split change re-scores every arm (and reruns the Flower
# runs that vote) while the other Flower runs stay cached; a change to the builder or the merge needs ``--fresh``.
ROUTING_MODULES = (*ROUTER_MODULES, "core.metrics", "core.sequences", "eval.baselines",
                   "eval.order_check", "flower.fedavg_dp", "data.check", "data.federation", "data.inject",
                   "data.metatool", "data.pins", "data.protocol", "data.taubench")


def llm_subsample(items: list, n: int) -> list:
    """Every ``len(items) // n``-th item, ``n`` at most (all of them for ``n`` = 0): the LLM sample."""
    return items[:: max(1, len(items) // n)][:n] if n else items


def routing_code(modules: Sequence[str] = ROUTING_MODULES) -> str:
    """Hash of the sources of ``modules`` (names under ``synapse_flwr``), the modules that score the arms by default."""
    sources = (Path(importlib.import_module(f"synapse_flwr.{n}").__file__).read_bytes() for n in modules)
    return hashlib.sha256(b"".join(sources)).hexdigest()[:12]


class UnitCache:
    """One JSON file per unit of work, tagged with the config fingerprint.

    Parameters
    ----------
    root : Path
        Cache folder.
    fingerprint : str
        :meth:`ExperimentConfig.fingerprint`; entries written under another
        fingerprint are recomputed.
    """

    def __init__(self, root: Path, fingerprint: str) -> None:
        self.root, self.fingerprint = root, fingerprint
        self.hits = self.misses = 0
        self._written: set[str] = set()  # reading back a unit this run wrote is not a cache hit
        self._read: set[str] = set()  # nor is reading one unit twice

    def path(self, key: str) -> Path:
        return self.root / "units" / (key.replace("/", "__") + ".json")

    def get(self, key: str, compute: Callable[[], Any]) -> Any:
        """The cached value of ``key``, or ``compute()``'s, stored atomically."""
        path = self.path(key)
        if path.exists():
            entry = json.loads(path.read_text())
            if entry.get("fingerprint") == self.fingerprint:
                self.hits += key not in self._written and key not in self._read
                self._read.add(key)
                return entry["value"]
        self.misses += 1
        self._written.add(key)
        value = compute()
        write_atomic(path, json.dumps({"fingerprint": self.fingerprint, "key": key, "value": value},
                                      sort_keys=True) + "\n")
        return value


def _eps_tag(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def flower_key(policy: str, epsilon: float, rate: float, replay: bool, seed: int, code: str | None = None) -> str:
    """Cache key (and output folder under the cache) of one Flower run.

    Parameters
    ----------
    policy, epsilon, rate, replay, seed
        The run (:meth:`Experiment.federate`).
    code : str or None
        The Router's code hash (:data:`ROUTER_MODULES`) when the run votes: its
        fusion votes are cast through a Router, so a router change reruns it.
        None for a run without votes, which stays cached.
    """
    key = f"flower/{policy}/eps{_eps_tag(epsilon)}/rate{rate:g}/{'replay-' if replay else ''}seed{seed}"
    return key if code is None else f"{key}/code{code}"


def verify_key(epsilon: float, rate: float, seed: int, code: str) -> str:
    """Cache key of the check that the rebuilt org artifacts are those Flower merged (their votes route)."""
    return f"verify/eps{_eps_tag(epsilon)}/rate{rate:g}/seed{seed}/code{code}"


def classifier_key(seed: int, code: str) -> str:
    """Cache key of the classifier arm (:func:`~synapse_flwr.eval.baselines.tfidf_svm_arm`)."""
    return f"classifier/seed{seed}/code{code}"


def fedavg_key(epsilon: float, seed: int, code: str) -> str:
    """Cache key of the fedavg_dp arm (:func:`~synapse_flwr.eval.baselines.fedavg_dp_arm`)."""
    return f"fedavg_dp/eps{_eps_tag(epsilon)}/seed{seed}/code{code}"


def summarise(runs: Sequence[dict]) -> dict:
    """Mean and SD over seeds of ``acc`` and ``r5`` (SD 0 for one seed), and of ``docs_gated`` where each seed has it.

    ``docs_gated``: :meth:`~synapse_flwr.core.router.Router.docs_gated_share`;
    ``experience_off_seeds``: the seeds whose test set turned experience off
    (:meth:`~synapse_flwr.core.router.Router.shifted`), where any did.
    """
    acc, r5 = [r["acc"] for r in runs], [r["r5"] for r in runs]
    out = {"acc_mean": statistics.mean(acc), "acc_sd": statistics.stdev(acc) if len(acc) > 1 else 0.0,
           "r5_mean": statistics.mean(r5), "n": [r["n"] for r in runs], "seeds": len(runs)}
    if all("docs_gated" in r for r in runs):
        out["docs_gated_mean"] = statistics.mean(r["docs_gated"] for r in runs)
    if any(r.get("experience_off") for r in runs):
        out["experience_off_seeds"] = sum(bool(r.get("experience_off")) for r in runs)
    return out


class Experiment:
    """Runs one :class:`ExperimentConfig`; see the module docstring.

    Parameters
    ----------
    cfg : ExperimentConfig
        What to run.
    fresh : bool
        Ignore (and delete) the cache.
    progress : callable or None
        Called with a unit's key once it is done, once per unit (a unit
        read again within the run is not counted twice).
    """

    def __init__(self, cfg: ExperimentConfig, fresh: bool = False,
                 progress: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.cache_dir = Path(cfg.cache).resolve()
        if fresh and self.cache_dir.exists():
            shutil.rmtree(self.cache_dir)
        self.cache = UnitCache(self.cache_dir, cache_fingerprint(cfg))
        self.progress = progress or (lambda label: None)
        self._done: set[str] = set()
        self.code = routing_code()
        self.router_code = routing_code(ROUTER_MODULES)
        self._embedder = None
        self._built: dict[tuple, Any] = {}

    # ------------------------------------------------------------ plumbing
    @property
    def embedder(self):
        """The experiment's embedder; a lexical one (``tfidf``) is a new, unfitted one at each use.

        A Router fits a lexical embedder on its own index: one instance shared
        by every Router kept the first one's vocabulary for all the others, so
        an arm's scores depended on which units a resumed run computed first.
        """
        from synapse_flwr.core.embed import get_embedder

        if self.cfg.embedder == LEXICAL:
            return get_embedder(LEXICAL)
        if self._embedder is None:
            self._embedder = get_embedder(self.cfg.embedder)
        return self._embedder

    def fitted_embedder(self, catalog) -> Any:
        """The embedder for features read without a Router (fedavg_dp, the paraphrase count): a lexical one
        fitted on the catalog's documentation, public text, so that it does not depend on the order units ran."""
        embedder = self.embedder
        if self.cfg.embedder == LEXICAL:
            arguments = catalog_arguments(catalog)
            embedder.fit([documentation_text(d.name, d.description, arguments[d.tool_id]) for d in catalog.tools])
        return embedder

    @property
    def space_name(self) -> str:
        """The federation's embedding space: the experiment's embedder where it can carry prototypes."""
        return self.cfg.embedder if self.cfg.embedder in SPACES else "none"

    @property
    def space(self):
        """The embedder the org artifacts' prototypes are in (None: no prototypes)."""
        return None if self.space_name == "none" else self.embedder

    def dataset(self, seed: int, rate: float = 0.0) -> FederatedDataset:
        return load_federated(self.cfg.dataset, self.cfg.orgs, seed, self.cfg.alpha, rate)

    def splits(self, ds: FederatedDataset) -> dict[str, list]:
        """Evaluation sets: the ``seen`` and ``heldout`` queries."""
        return {k: v for k, v in (("seen", ds.seen_test), ("heldout", ds.heldout_test)) if v}

    def observe(self, router: Router, ds: FederatedDataset) -> None:
        """Put the whole test set, both splits, in ``router``'s query-shift window (:meth:`Router.observe`).

        Every split is then routed on one decision, as a deployment's mixed traffic would be.
        """
        router.observe([i.query for items in self.splits(ds).values() for i in items])

    def unit(self, key: str, compute: Callable[[], Any]) -> Any:
        value = self.cache.get(key, compute)
        if key not in self._done:  # the Flower runs are read again by every arm that uses them
            self._done.add(key)
            self.progress(key)
        return value

    # ------------------------------------------------------------ federation
    def run_seed(self, seed: int, epsilon: float, rate: float) -> int:
        """The seed whose Flower run stands for ``seed``'s: the first seed's where a run cannot depend on it.

        With the dataset's own organisations (no re-partition), no noise and
        no injected contradictions nothing a run draws depends on its seed
        (sigma 0 draws nothing; the demo's runs of seeds 42, 123 and 456 are
        byte for byte the same), so one Flower run serves every seed instead
        of repeating itself; each seed's rebuilt org artifacts are still
        checked against the run's inputs (:meth:`verify_inputs`).
        """
        return self.cfg.seeds[0] if math.isinf(epsilon) and rate == 0 and self.orgs_as_given else seed

    @cached_property
    def orgs_as_given(self) -> bool:
        """Whether the federations keep the dataset's own organisations (the same for every seed)."""
        return bool(self.dataset(self.cfg.seeds[0]).info.get("orgs_as_given"))

    def federate(self, seed: int, policy: str, epsilon: float, rate: float, replay: bool = False) -> dict:
        """One Flower simulation; returns its global's path and per-round records."""
        seed = self.run_seed(seed, epsilon, rate)
        votes = self.run_config(seed, policy, epsilon, rate, replay, self.cache_dir).votes
        key = flower_key(policy, epsilon, rate, replay, seed, self.router_code if votes else None)
        out_dir = self.cache_dir / key

        def compute() -> dict:
            from synapse_flwr.flower.launch import (
                default_app_dir,
                read_metrics,
                run_simulation,
            )

            if out_dir.exists():
                shutil.rmtree(out_dir)  # a half-finished run of an older config
            rc = self.run_config(seed, policy, epsilon, rate, replay, out_dir).to_mapping()
            sim = run_simulation(default_app_dir(), self.cfg.orgs, rc, timeout=self.cfg.timeout)
            rounds = read_metrics(out_dir)
            if not any(r.get("accepted") for r in rounds):
                raise SynapseError(f"Flower run {key} merged no organisation's artifact (see {sim.log_path} "
                                   f"and {out_dir / 'metrics.json'}); nothing was cached")
            return {"output_dir": str(out_dir), "wall_s": sim.wall_s, "peak_rss_bytes": sim.peak_rss_bytes,
                    "rounds": [{**{k: r[k] for k in ("round", "bytes_out", "conflicts", "epsilon", "accepted")},
                                # what a client sends in the round: its train reply and its vote-phase reply
                                "bytes_per_client": r["bytes_per_client"] + (r.get("vote_bytes_per_client") or 0)}
                               for r in rounds]}

        return self.unit(key, compute)

    def _memo(self, key: tuple, compute: Callable[[], Any]) -> Any:
        # builds and artifact loads that several arms of one seed share
        if key not in self._built:
            self._built[key] = compute()
        return self._built[key]

    def global_of(self, run: dict, round_: int | None = None):
        path = Path(run["output_dir"]) / f"global_round_{round_ or self.cfg.rounds}.json"
        return self._memo(("global", path), lambda: load_artifact(path))

    def run_config(self, seed: int, policy: str, epsilon: float, rate: float, replay: bool,
                   out_dir: Path) -> RunConfig:
        """The run config of one Flower simulation of this experiment."""
        # a built-in name or a folder's absolute path (ExperimentConfig), whatever the clients' working folder
        return RunConfig.from_mapping({
            "dataset": self.cfg.dataset, "num-rounds": self.cfg.rounds, "policy": policy, "min-nodes": self.cfg.orgs,
            # seeded noise: the experimenter holds every organisation's data, and the org artifacts
            # are rebuilt in process from the same seed (org_artifacts)
            "epsilon": epsilon, "delta": self.cfg.delta, "alpha": self.cfg.alpha, "seed": seed, "noise": "seeded",
            "inject": rate,
            "output-dir": str(out_dir), "evaluate": False, "replay": replay, "embedder": self.space_name})

    def org_artifacts(self, seed: int, rate: float, epsilon: float, run: dict) -> dict[str, Compendium]:
        """Each org's final-round artifact, rebuilt through its ClientApp's own release and vote paths.

        Each round starts from the global ``run`` merged the round before, as
        the ClientApp did; when the run votes, the round's artifacts are
        merged here as the server merged them, and each org's records vote
        against that merge (the round's vote phase).
        """
        from synapse_flwr.flower.client_app import OrgData, org_release, org_vote

        ds = self.dataset(seed, rate)
        cfg = self.run_config(seed, TYPED, epsilon, rate, False, self.cache_dir)

        def rebuild() -> dict[str, Compendium]:
            orgs = {org: OrgData(org, ds.catalog, events) for org, events in ds.orgs.items()}
            states = {org: ReleaseState(fingerprint="") for org in orgs}
            arts: dict[str, Compendium] = {}
            for round_ in range(1, cfg.num_rounds + 1):
                incoming = self.global_of(run, round_ - 1) if round_ > 1 else None
                for org, data in orgs.items():
                    arts[org], states[org], _ = org_release(data, cfg, states[org], round_, [], self.space, incoming)
                if cfg.votes:
                    merged = merge_typed(list(arts.values()))
                    for org, data in orgs.items():
                        arts[org], states[org], _ = org_vote(data, cfg, states[org], round_, self.space, merged)
            return arts

        return self._memo(("orgs", seed, rate, epsilon), rebuild)

    def centralized(self, seed: int, rate: float = 0.0) -> Compendium:
        """All experience of the federation (same partition, same injected set) pooled in one place.

        When the federation votes, the pooled records vote too (exactly, leaving themselves out), so
        its router chooses its fusion as the federated ones do.
        """
        from synapse_flwr.core.release import cast_votes

        ds = self.dataset(seed, rate)
        voting = self.run_config(seed, TYPED, math.inf, rate, False, self.cache_dir).votes and self.space is not None

        def pooled() -> Compendium:
            comp = build_compendium(ds.all_events, ds.catalog, "central", round_=self.cfg.rounds, seed=seed,
                                    embedder=self.space, epsilon=math.inf)
            if not voting:
                return comp
            cast = cast_votes(ds.all_events, ds.catalog, comp, self.space, 0.0, np.random.default_rng(seed))
            return comp.model_copy(update={"votes": cast})

        return self._memo(("central", seed, rate), pooled)

    def verify_inputs(self, seed: int, rate: float, epsilon: float, run: dict) -> dict:
        """Check that the Flower clients merged exactly the artifacts this process rebuilds.

        The global records the sha256 of every org artifact in it; rebuilding
        them from :meth:`dataset` (same partition, same injected set, same
        noise seeds) must give the same hashes.
        """
        key = verify_key(epsilon, rate, seed, self.code)

        def compute() -> dict:
            merged = set(self.global_of(run).inputs)
            rebuilt = {content_hash(a) for a in self.org_artifacts(seed, rate, epsilon, run).values()}
            injection = self.dataset(seed, rate).info.get("injection")
            return {"verified": rebuilt == merged, "orgs": len(rebuilt),
                    "merged_only": sorted(merged - rebuilt), "rebuilt_only": sorted(rebuilt - merged),
                    "injection_sha256": injection.sha256 if injection else None,
                    "injection_counts": injection.counts if injection else {}}

        return self.unit(key, compute)

    # ------------------------------------------------------------ evaluation
    def evaluate(self, compendium, seed: int, render: str = "typed", oracle: bool = False,
                 label: str = "", reranker: str | None = None, sample: int = 0) -> dict:
        """Metrics per split of one compendium (cached by its content hash)."""
        tag = content_hash(compendium)[:16] if compendium is not None else "docs"
        reranker = reranker or self.cfg.reranker
        key = (f"eval/{label or tag}/{tag}/{render}/{reranker}/oracle{int(oracle)}/n{sample}/seed{seed}"
               f"/code{self.code}")

        def compute() -> dict:
            ds = self.dataset(seed)
            router = Router(compendium, ds.catalog, embedder=self.embedder, reranker=reranker,
                            k=self.cfg.k, render=render, model=self.cfg.llm_model)
            self.observe(router, ds)
            return {split: self._score(router, llm_subsample(items, sample), oracle)
                    for split, items in self.splits(ds).items()}

        return self.unit(key, compute)

    def _score(self, router: Router, items: list, oracle: bool) -> dict:
        golds = [i.gold for i in items]
        queries = [i.query for i in items]
        results = router.route_many(queries, force=golds if oracle else None, observe=False)
        metrics = evaluate_routes(results, golds, self.cfg.k)
        if router.prototypes is not None and not oracle:  # how much of the split reads no prototype
            metrics["docs_gated"] = router.docs_gated_share(queries)
        if router.shift is not None:  # the test set's query shift, and whether it turned experience off
            metrics["shift"] = router.shift.state()[1]
            metrics["experience_off"] = router.shifted()
        if router.reranker == "llm":  # a failed LLM call routes in retrieval order: say how often
            metrics["fallbacks"] = sum(r.fallback for r in results)
        return metrics

    def _golds(self, ds: FederatedDataset) -> dict[str, list]:
        return {split: [i if isinstance(i, TestItem) else TestItem(query=i.query, gold=(i.gold,))
                        for i in items] for split, items in self.splits(ds).items()}

    # ------------------------------------------------------------ arms
    def arms_for_seed(self, seed: int) -> dict[str, dict]:
        """Every clean-setting arm for one seed: ``arm -> split -> metrics``."""
        cfg, ds, out = self.cfg, self.dataset(seed), {}
        arms = set(cfg.arms)
        need_fed = arms & {"federated", "oracle", "local_only"}
        fed = self.federate(seed, TYPED, math.inf, 0.0) if need_fed else None
        if "docs_only" in arms:
            out["docs_only"] = self.evaluate(None, seed)
        if "centralized" in arms:
            out["centralized"] = self.evaluate(self.centralized(seed), seed)
        if "federated" in arms:
            out["federated"] = self.evaluate(self.global_of(fed), seed)
        if "oracle" in arms:
            out["oracle"] = self.evaluate(self.global_of(fed), seed, oracle=True)
        if "local_only" in arms:
            check = self.verify_inputs(seed, 0.0, math.inf, fed)
            if not check["verified"]:
                raise SynapseError(f"seed {seed}: the rebuilt org artifacts differ from those Flower merged")
            per_org = [self.evaluate(art, seed, label=f"local-{org}")
                       for org, art in sorted(self.org_artifacts(seed, 0.0, math.inf, fed).items())]
            out["local_only"] = {split: {"acc": statistics.mean(m[split]["acc"] for m in per_org),
                                         "r5": statistics.mean(m[split]["r5"] for m in per_org),
                                         "n": per_org[0][split]["n"],
                                         "per_org_acc": [m[split]["acc"] for m in per_org]}
                                 for split in per_org[0]}
        if "federated_private" in arms:
            private = self.federate(seed, TYPED, cfg.epsilon, 0.0)
            out["federated_private"] = self.evaluate(self.global_of(private), seed)
        if "classifier" in arms:
            out["classifier"] = self.unit(classifier_key(seed, self.code), lambda: self._classifier(ds))
        if "fedavg_dp" in arms:
            out["fedavg_dp"] = self.unit(fedavg_key(cfg.epsilon, seed, self.code), lambda: self._fedavg(ds, seed))
        return out

    def _classifier(self, ds: FederatedDataset) -> dict:
        from synapse_flwr.eval.baselines import tfidf_svm_arm

        return tfidf_svm_arm(ds.all_events, ds.catalog, self._golds(ds), k=self.cfg.k)

    def _fedavg(self, ds: FederatedDataset, seed: int) -> dict:
        from synapse_flwr.eval.baselines import fedavg_dp_arm

        cfg = self.cfg
        golds = self._golds(ds)
        first, *rest = golds
        # the Flower simulation runs in a fresh interpreter of its own (fedavg_dp.run_job)
        res = fedavg_dp_arm([ds.orgs[o] for o in sorted(ds.orgs)], ds.catalog, golds[first], cfg.epsilon,
                            cfg.delta, cfg.rounds, embedder=self.fitted_embedder(ds.catalog), seed=seed,
                            extra_tests={s: golds[s] for s in rest}, k=cfg.k, **cfg.fedavg)
        out = {first: {k: res[k] for k in ("acc", "r5", "n")}}
        out.update({s: {k: res["extra"][s][k] for k in ("acc", "r5", "n")} for s in rest})
        out["epsilon_spent"] = res["epsilon_spent"]
        return out

    def sweep_for_seed(self, seed: int) -> dict:
        """2x2 (merge x render) and the contradiction sweep for one seed (none without the federated arm)."""
        cfg, out = self.cfg, {"2x2": {}, "rates": {}, "injection": {}}
        for rate in cfg.rates if cfg.sweeps else []:
            runs = {m: self.federate(seed, m, cfg.sweep_epsilon, rate) for m in cfg.merges}
            check = self.verify_inputs(seed, rate, cfg.sweep_epsilon, runs[TYPED])
            if not check["verified"]:
                raise SynapseError(
                    f"seed {seed} rate {rate}: Flower merged other org artifacts than this process rebuilds "
                    f"({len(check.get('merged_only', []))} merged but not rebuilt, "
                    f"{len(check.get('rebuilt_only', []))} rebuilt but not merged, of {check['orgs']} orgs): the "
                    "cached Flower runs were made from other data or code; start fresh with "
                    "`synapse experiment CONFIG --fresh`")
            out["injection"][f"{rate:g}"] = check
            row = {}
            for merge, run in runs.items():
                globl = self.global_of(run)
                renders = cfg.renders if rate == 0 else ["typed" if merge == TYPED else "flat"]
                for render in renders:
                    metrics = self.evaluate(globl, seed, render=render)
                    if rate == 0:
                        out["2x2"][f"{merge}/{render}"] = metrics
                    row[f"{merge}/{render}"] = metrics
            if set(cfg.rates) != {0.0}:  # the sweep's reference line; rate 0 alone is no sweep (the 2x2's row)
                row["centralized"] = self.evaluate(self.centralized(seed, rate), seed)
            out["rates"][f"{rate:g}"] = row
        return out

    def rounds_for_seed(self, seed: int) -> dict:
        """Accuracy of each round's global, for the clean typed federations."""
        out = {}
        runs = [("federated", math.inf, False), ("federated_private", self.cfg.epsilon, False)]
        if self.cfg.replay:
            runs.append(("federated_replay", math.inf, True))
        for arm, eps, replay in runs:
            if arm.removesuffix("_replay") not in self.cfg.arms:
                continue
            run = self.federate(seed, TYPED, eps, 0.0, replay)
            out[arm] = {"rounds": [self.evaluate(self.global_of(run, r), seed) for r in
                                   range(1, self.cfg.rounds + 1)], "records": run["rounds"]}
        return out

    def llm_sample(self, seed: int) -> dict:
        """The LLM reranker on a fixed sample of every split, beside retrieval order on the same queries.

        ``arms``: per router arm and split the LLM's metrics (``fallbacks``:
        failed calls, routed in retrieval order) and ``retrieval_acc``,
        retrieval order's top-1 on the same queries (the line an LLM has to
        beat). ``order_check``: per split, the picks of the first arm of
        :data:`ORDER_CHECK_ARMS` the config runs that change when the candidates are
        shown reversed or shuffled (:func:`~synapse_flwr.eval.order_check.order_changes`,
        on the first :data:`ORDER_CHECK` sampled queries, at the router's weight).
        Only the arms of ``arms`` are reranked (a sample of docs_only alone
        started a Flower run for the federated arm it left out).
        """
        n, arms = self.cfg.llm_sample, {}
        make = {"federated": lambda: self.global_of(self.federate(seed, TYPED, math.inf, 0.0)),
                "centralized": lambda: self.centralized(seed), "docs_only": lambda: None}
        globals_ = {arm: make[arm]() for arm in LLM_ARMS if arm in self.cfg.arms}
        # (no flat render here: a whole compendium entry as one string makes
        # prompts of thousands of tokens, minutes per query for the local model)
        for arm, comp in globals_.items():
            llm = self.evaluate(comp, seed, reranker="llm", sample=n, label=f"llm-{arm}")
            order = self.evaluate(comp, seed, reranker="none", sample=n, label=f"llm-{arm}")
            arms[arm] = {split: {**m, "retrieval_acc": order[split]["acc"]} for split, m in llm.items()}
        order_arm = next(arm for arm in ORDER_CHECK_ARMS if arm in globals_)
        checked = globals_[order_arm]
        key = f"llm-order/{content_hash(checked)[:16] if checked else 'docs'}/n{n}/seed{seed}/code{self.code}"
        return {"arms": arms, "order_check": self.unit(key, lambda: self._order_check(checked, seed)),
                "order_arm": order_arm}

    def _order_check(self, compendium: Compendium | None, seed: int) -> dict:
        ds = self.dataset(seed)
        router = Router(compendium, ds.catalog, embedder=self.embedder, reranker="llm", k=self.cfg.k,
                        model=self.cfg.llm_model)
        self.observe(router, ds)  # as evaluate decides
        out = {}
        for split, items in self.splits(ds).items():
            queries = [i.query for i in llm_subsample(items, self.cfg.llm_sample)[:ORDER_CHECK]]
            check = order_changes(router, queries, seed, [router.llm_weight])
            out[split] = {"n": check["n"], "checked": min(check["checked"].values()),
                          **{f"checked_{order}": n for order, n in check["checked"].items()},
                          **check["by_weight"][str(router.llm_weight)]}
        return out

    # ------------------------------------------------------------ driver
    def total_units(self) -> int:
        """A rough count of units, for the progress bar."""
        cfg = self.cfg
        sweep = len(cfg.rates) * (len(cfg.merges) * 2 + 3) if cfg.sweeps else 0
        per_seed = len(cfg.arms) + cfg.orgs + sweep + 2 * cfg.rounds + 4
        llm_arms = len(set(LLM_ARMS) & set(cfg.arms)) if cfg.llm_sample else 0
        return per_seed * len(cfg.seeds) + (3 * llm_arms + 1 if llm_arms else 0)

    def federations(self) -> list[tuple[int, str, float, float, bool]]:
        """Every Flower run the config needs: ``(seed, policy, epsilon, rate, replay)``."""
        cfg, runs = self.cfg, []
        for seed in cfg.seeds:
            if set(cfg.arms) & {"federated", "oracle", "local_only"}:
                runs.append((seed, TYPED, math.inf, 0.0, False))
            if "federated_private" in cfg.arms:
                runs.append((seed, TYPED, cfg.epsilon, 0.0, False))
            if cfg.replay and "federated" in cfg.arms:
                runs.append((seed, TYPED, math.inf, 0.0, True))
            if cfg.sweeps:
                runs += [(seed, m, cfg.sweep_epsilon, r, False) for r in cfg.rates for m in cfg.merges]
        return list(dict.fromkeys((self.run_seed(seed, eps, rate), policy, eps, rate, replay)
                                  for seed, policy, eps, rate, replay in runs))

    def run(self) -> dict:
        """Run everything; returns the results dict (see :func:`aggregate`)."""
        for run in self.federations():  # the slow part first, all cached
            self.federate(*run)
        per_seed = {}
        for seed in self.cfg.seeds:
            log.info("seed %d", seed)
            self._built.clear()  # shared within a seed only: keeps memory flat
            per_seed[seed] = {"arms": self.arms_for_seed(seed), **self.sweep_for_seed(seed),
                              "per_round": self.rounds_for_seed(seed), "info": self.seed_info(seed)}
        llm = self.llm_sample(self.cfg.seeds[0]) if self.cfg.llm_sample else {}
        return aggregate(self.cfg, per_seed, llm)

    def votes_chose(self, seed: int) -> dict[str, list[float] | None]:
        """The fusion setting ``[prototype weight, prior]`` the votes of each federated arm's global chose.

        ``[0, 0]`` is documentation only: the votes did not show experience
        beating it (by the noise margin). None: the global carries no votes.
        """
        runs = {"federated": math.inf, "federated_private": self.cfg.epsilon}
        out = {}
        for arm, epsilon in runs.items():
            if arm in self.cfg.arms:
                setting = chosen_setting(self.global_of(self.federate(seed, TYPED, epsilon, 0.0)).votes)
                out[arm] = None if setting is None else [setting.prototype, setting.prior]
        return out

    def globals_for_seed(self, seed: int) -> dict[str, str]:
        """Per clean federated arm, the path of its last round's global (what ``synapse route --compendium`` reads)."""
        runs = {"federated": math.inf, "federated_private": self.cfg.epsilon}
        return {arm: shown_path(Path(self.federate(seed, TYPED, epsilon, 0.0)["output_dir"])
                                / f"global_round_{self.cfg.rounds}.json")
                for arm, epsilon in runs.items() if arm in self.cfg.arms}

    def seed_info(self, seed: int) -> dict:
        ds = self.dataset(seed)
        splits = self.splits(ds)
        return {"votes_chose": self.votes_chose(seed), "train_events": len(ds.all_events),
                "org_events": {o: len(e) for o, e in sorted(ds.orgs.items())},
                "test_sizes": {split: len(items) for split, items in splits.items()},
                "leak_filter": ds.info.get("leak_filter"), "orgs_as_given": bool(ds.info.get("orgs_as_given")),
                # records of a folder's files that no reader reads (a query without a letter or digit)
                "skipped_records": ds.info.get("skipped_records", {}),
                "globals": self.globals_for_seed(seed),
                "heldout_tools": heldout_tool_count(ds.heldout_test),
                # a catalog may hold tools that are neither taught nor tested: all of them route on documentation
                "tools_with_experience": len(experienced_tools(ds.catalog, ds.all_events)),
                "catalog_tools": len(ds.catalog),
                "paraphrase_neighbours": self.unit(f"paraphrases/seed{seed}",
                                                   lambda: self._paraphrases(ds, splits))}

    def _paraphrases(self, ds: FederatedDataset, splits: dict) -> dict:
        """Diagnostic, nothing is dropped: training queries whose embedding is within
        cosine ``t`` of some test query (paraphrases the shingle filter keeps)."""
        embedder = self.fitted_embedder(ds.catalog)
        train = embedder.encode([e.query for e in ds.all_events])
        test = embedder.encode([i.query for items in splits.values() for i in items])
        best = np.zeros(len(train))
        for start in range(0, len(train), 2048):
            best[start:start + 2048] = (train[start:start + 2048] @ test.T).max(axis=1)
        return {f"cosine>={t}": int((best >= t).sum()) for t in (0.9, 0.95, 0.99)}


def shown_path(path: Path, cwd: Path | None = None) -> str:
    """A path as results name it: relative to the working folder when under it (committed results should not
    carry the machine's paths), else as given."""
    cwd = (cwd or Path.cwd()).absolute()
    return str(path.relative_to(cwd)) if path.is_relative_to(cwd) and path != cwd else str(path)


def shown_dataset(dataset: str, cwd: Path | None = None) -> str:
    """The dataset as the results name it: a folder under the working folder relative to it (:func:`shown_path`).

    The config holds a folder's absolute path (:func:`~synapse_flwr.simulations.experiment_config.resolve_dataset`).
    """
    if dataset in KNOWN_DATASETS:
        return dataset
    shown = shown_path(Path(dataset), cwd)
    return f"./{shown}" if shown in KNOWN_DATASETS else shown  # a folder ./demo is not the built-in demo


def heldout_tool_count(heldout: Sequence[TestItem]) -> int:
    """Distinct gold tools of the held-out test queries: the tools scored as without experience.

    Counted from the test set itself, so a folder (whose loader names no held-out
    tools) reports them as MetaTool's split does.
    """
    return len({tool for item in heldout for tool in item.gold})


def _split_summary(per_seed: dict, path: Callable[[dict], dict | None]) -> dict:
    """Mean/SD over seeds of every split under ``path(seed_result)``, over the seeds whose test set holds it.

    A split one seed's draw leaves empty (no held-out query) is still summarised over the others (taking
    the first seed's splits dropped it, or failed when a later seed lacked one).
    """
    found = [m for m in (path(r) for r in per_seed.values()) if m]
    splits = [s for s in SPLITS if any(isinstance(m.get(s), dict) for m in found)]
    return {split: summarise([m[split] for m in found if isinstance(m.get(split), dict)]) for split in splits}


def aggregate(cfg: ExperimentConfig, per_seed: dict, llm: dict) -> dict:
    """Results: per-arm summaries, 2x2, contradiction sweep, per-round curves, targets."""
    first = next(iter(per_seed.values()))
    arms = {arm: _split_summary(per_seed, lambda r, a=arm: r["arms"].get(a)) for arm in first["arms"]}
    cells = {cell: _split_summary(per_seed, lambda r, c=cell: r["2x2"].get(c)) for cell in first["2x2"]}
    rates = {rate: {cell: _split_summary(per_seed, lambda r, q=rate, c=cell: r["rates"][q][c])
                    for cell in row} for rate, row in first["rates"].items()}
    per_round = {}
    for arm, run in first["per_round"].items():
        per_round[arm] = [_split_summary(per_seed, lambda r, a=arm, i=i: r["per_round"][a]["rounds"][i])
                          for i in range(cfg.rounds)]
    records = [(arm, rec) for r in per_seed.values() for arm, run in r["per_round"].items() for rec in run["records"]]
    clean = [rec for arm, rec in records if arm != "federated_private"]
    private = [rec for arm, rec in records if arm == "federated_private"]
    results = {
        "name": cfg.name, "dataset": shown_dataset(cfg.dataset), "seeds": cfg.seeds, "orgs": cfg.orgs,
        "alpha": cfg.alpha, "rounds": cfg.rounds, "embedder": cfg.embedder, "reranker": cfg.reranker, "k": cfg.k,
        "arms": arms, "ablation_2x2": cells, "contradiction": rates, "per_round": per_round,
        # the federations without privacy, apart from the private one (its artifacts differ: no phrases, votes)
        "bytes_per_client_round": statistics.mean(r["bytes_per_client"] for r in clean) if clean else None,
        "bytes_per_client_round_max": max((r["bytes_per_client"] for r in clean + private), default=None),
        # what an organisation actually ships with privacy on (released text is thresholded)
        "bytes_per_client_round_private": statistics.mean(r["bytes_per_client"] for r in private)
        if private else None,
        "epsilon": max((r["epsilon"] for r in private if r["epsilon"] is not None), default=None),
        "epsilon_target": cfg.epsilon, "delta": cfg.delta,
        "fedavg_dp_epsilon": max((r["arms"]["fedavg_dp"]["epsilon_spent"] for r in per_seed.values()
                                  if "fedavg_dp" in r["arms"]), default=None),
        "injection": {str(s): r["injection"] for s, r in per_seed.items()},
        "leak_filter": {str(s): r["info"]["leak_filter"] for s, r in per_seed.items()},
        "skipped_records": first["info"].get("skipped_records", {}),
        "orgs_as_given": first["info"]["orgs_as_given"],
        "seed_info": {str(s): r["info"] for s, r in per_seed.items()},
        "per_seed": {str(s): {"arms": r["arms"], "2x2": r["2x2"], "rates": r["rates"]}
                     for s, r in per_seed.items()},
        "llm_sample": llm,
    }
    results["no_harm"] = {arm: {split: round(gap, 4) for split, gap in block.items()}  # rounded to read
                          for arm, block in no_harm(results).items()}
    results["targets"] = targets(results)
    return results


def data_hashes(dataset: str) -> dict[str, str]:
    """sha256 of the data files the experiment read."""
    from synapse_flwr.data.pins import verified_hashes

    if dataset in ("metatool", "taubench"):
        from synapse_flwr.data.federation import EXAMPLES_DIR

        examples = EXAMPLES_DIR / f"{dataset}.json"  # shipped example requests: part of the documentation
        shipped = {f"examples/{examples.name}": hashlib.sha256(examples.read_bytes()).hexdigest()
                   } if examples.is_file() else {}
        return {**verified_hashes(["metatool" if dataset == "metatool" else "taubench-retail"]), **shipped}
    if dataset == "demo":
        from synapse_flwr.data.federation import demo_dir

        root = demo_dir()
    else:
        root = Path(dataset)
    return file_hashes(root)


def _arm_problems(cfg: ExperimentConfig, ds: FederatedDataset) -> dict[str, str]:
    """Arm -> why the loaded data cannot train it (checked before any Flower run, on the first seed's federation)."""
    from synapse_flwr.eval.baselines import calibration_problem, labelled_pairs

    problems = {}
    if "classifier" in cfg.arms and len(tools := set(labelled_pairs(ds.all_events, ds.catalog)[1])) < 2:
        problems["classifier"] = ("it needs labelled training events (a successful call or a gold tool) of at "
                                  f"least 2 tools, got {len(tools)}")
    if "fedavg_dp" in cfg.arms and (empty := [o for o, ev in sorted(ds.orgs.items())
                                              if not labelled_pairs(ev, ds.catalog)[0]]):
        problems["fedavg_dp"] = (f"it needs labelled events in every organisation; {', '.join(empty)} "
                                 f"{'has' if len(empty) == 1 else 'have'} none left after loading (failed calls "
                                 "without gold, or queries the leak and garbage filter dropped)")
    elif "fedavg_dp" in cfg.arms and (why := calibration_problem(
            [len(labelled_pairs(ev, ds.catalog)[0]) for ev in ds.orgs.values()], cfg.epsilon, cfg.delta, cfg.rounds,
            *(cfg.fedavg_option(key) for key in ("local_epochs", "batch_size")))):
        # the budget first meets the orgs' sizes after every Flower run of the experiment
        problems["fedavg_dp"] = f"its DP-SGD noise cannot meet epsilon {cfg.epsilon}: {why}"
    return problems


def runnable_arms(cfg: ExperimentConfig, ds: FederatedDataset) -> tuple[ExperimentConfig, dict[str, str]]:
    """The config with the arms the data can train, and why each arm left out was left out.

    A baseline that cannot train on a user's folder (one organisation's log
    holds only failed calls) should not stop the default run of every other
    arm, so a default arm is left out; an arm the config names still stops
    the run, before any Flower run. The default is told by the list itself:
    a config that names every arm in :data:`ARMS`' order runs as one without
    ``arms``.
    """
    problems = _arm_problems(cfg, ds)
    if not problems:
        return cfg, {}
    if cfg.arms != list(ARMS):
        raise SynapseError(f"{cfg.dataset}: " + "; ".join(f"arm {arm!r}: {why}; drop it from arms"
                                                          for arm, why in problems.items()))
    for arm, why in problems.items():
        log.warning("arm %r left out of this run: %s (arms = [...] in the config chooses the arms)", arm, why)
    return replace(cfg, arms=[a for a in cfg.arms if a not in problems]), problems


def cache_fingerprint(cfg: ExperimentConfig) -> str:
    """The config's fingerprint and the sha256 of every data file: changed data recomputes every unit."""
    data = json.dumps(data_hashes(cfg.dataset), sort_keys=True)
    return hashlib.sha256((cfg.fingerprint() + data).encode()).hexdigest()[:16]


def _log_documentation(catalog: Catalog, dataset: str) -> None:
    """Say what the documentation holds beyond names and descriptions: example requests, arguments."""
    if not any(d.examples for d in catalog.tools):
        log.info("the catalog carries no example requests; `synapse examples %s` writes them from the catalog "
                 "alone (docs/formats.md; on MetaTool's dev split docs_only gains 3.6 seen and 4.7 held-out "
                 "points)", dataset)
    log.info("%s", arguments_line(catalog))


def arguments_line(catalog: Catalog) -> str:
    """What the documentation reads of the tools' parameters' schemas: given, read, and the arguments it drops.

    An argument more than half of the catalog's tools take is not read
    (:func:`~synapse_flwr.core.documentation.distinctive_parameters`): a catalog
    whose every tool takes ``query`` and ``locale`` gives a schema for each
    tool and has none read, which the line says with the names dropped
    rather than as a bare ``0 of N``.

    Parameters
    ----------
    catalog : Catalog
        The tools.

    Returns
    -------
    str
        One line for the run's log.
    """
    schemas = {d.tool_id: d.parameters for d in catalog.tools}
    given = sum(bool(schema_properties(s)) for s in schemas.values())
    if not given:
        return (f"no tool of the {len(schemas)} gives a parameters' schema with arguments (parameters, inputSchema, "
                "input_schema): the documentation reads names and descriptions (docs/formats.md)")
    kept = distinctive_parameters(schemas)
    dropped = sorted({a for t, s in schemas.items() for a in schema_properties(s).keys() - schema_properties(kept[t])})
    read = sum(map(bool, catalog_arguments(catalog).values()))
    line = (f"the documentation reads the arguments of {read} of the {given} tools whose parameters' schema lists "
            f"some (of {len(schemas)} tools; docs/formats.md)")
    if dropped:
        shown = ", ".join(repr(a) for a in dropped[:8]) + (f" and {len(dropped) - 8} more" if len(dropped) > 8 else "")
        line += (f"; not read, as more than {COMMON_ARGUMENT_SHARE:.0%} of the catalog's tools take them (they say nothing of which tool a "
                 f"request wants): {shown}")
    return line


def fresh_problem(cache: Path, kept: dict[str, Path]) -> str | None:
    """Why ``--fresh`` must not delete ``cache``, or None: it is, or holds, a path that must be kept.

    A config's ``cache = "."`` or ``cache = "runs"`` beside ``runs/folders/<data>`` would otherwise delete the
    working folder or the dataset before any check.
    """
    root = cache.resolve()
    for what, path in kept.items():
        if path.exists() and path.resolve().is_relative_to(root):
            return (f"--fresh would delete the cache folder {cache}, which holds {what} ({path}); give the "
                    "experiment a cache folder of its own (cache = ... in the config)")
    return None


def run_experiment(config: Path, fresh: bool = False, output: Path | None = None,
                   progress: Callable[[str], None] | None = None,
                   on_start: Callable[[int], None] | None = None) -> Path:
    """Run a config end to end and write the results folder; returns its path.

    Parameters
    ----------
    config : Path
        Experiment TOML, or a dataset folder (:meth:`ExperimentConfig.from_toml`).
    fresh : bool
        Delete the cache and recompute every unit.
    output : Path or None
        Results folder; None: the config's ``output``.
    progress : callable or None
        Called with each unit's label once it is done.
    on_start : callable or None
        Called once, with a rough count of the units ahead, when every
        check of the config and its data has passed (so that a progress bar
        never stands above a refusal).
    """
    cfg = ExperimentConfig.from_toml(config)
    out_dir = Path(output or cfg.output)
    # before any unit: the results and every unit's cache must have a place (a cache under a file failed at the
    # first unit, a Flower run)
    for what, folder in (("results folder", out_dir), ("cache folder", Path(cfg.cache))):
        if problem := write_problem(folder, folder=True):
            raise SynapseError(f"{what} {folder} {problem}")
    if fresh and (held := fresh_problem(Path(cfg.cache), {"the dataset": Path(cfg.dataset), "the results": out_dir,
                                                          "the config": config, "the working folder": Path.cwd()})):
        raise SynapseError(held)
    if cfg.dataset == "taubench":  # its own per-step protocols (cross-validated and train-only)
        from synapse_flwr.simulations.taubench import run_taubench

        if on_start:
            on_start(Experiment(cfg).total_units())
        return run_taubench(config, cfg, output, progress)
    if cfg.dataset not in KNOWN_DATASETS and Path(cfg.dataset).is_dir():  # a built-in name is never a folder
        require_valid(Path(cfg.dataset))  # every file, line and tool id, before any Flower run
    exp = Experiment(cfg, fresh, progress)
    first = exp.dataset(cfg.seeds[0])
    if not exp.splits(first):  # before any Flower run: nothing could be scored
        raise SynapseError(f"{cfg.dataset}: no test queries to score the arms on; add a test.jsonl "
                           "(docs/formats.md: a query and its gold tool per line)")
    if rates := [r for r in cfg.rates if r > 0]:  # what injection needs, before any Flower run
        exp.dataset(cfg.seeds[0], min(rates))
    events = len(first.all_events)
    if not first.info.get("orgs_as_given") and cfg.orgs > events:  # before any Flower run: a node per empty org
        raise SynapseError(f"orgs: {cfg.orgs} organisations re-partition {events} events of {cfg.dataset}, "
                           f"leaving at least {cfg.orgs - events} of them empty; use orgs = {events} or fewer")
    runnable, left_out = runnable_arms(cfg, first)
    if left_out:  # the cache, if fresh, is emptied already
        cfg, exp = runnable, Experiment(runnable, progress=progress)
    _log_documentation(first.catalog, cfg.dataset)
    if on_start:
        on_start(exp.total_units())
    t0 = time.perf_counter()
    results = exp.run()
    results["wall_s"] = round(time.perf_counter() - t0, 1)
    results["cache"] = {"hits": exp.cache.hits, "computed": exp.cache.misses}
    results["arms_left_out"] = left_out
    out_dir.mkdir(parents=True, exist_ok=True)
    write_results(out_dir, results, asdict(cfg), data_hashes(cfg.dataset), f"synapse experiment {config}")
    write_atomic(out_dir / "tables.md", tables(results))
    figures(results, out_dir)
    for line in summary_lines(results):
        log.info("%s", line)
    log.info("results in %s (%.0fs, %d units computed, %d from an earlier run's cache)", out_dir.resolve(), results["wall_s"],
             exp.cache.misses, exp.cache.hits)
    return out_dir
