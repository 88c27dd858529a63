"""Flower ServerApp: R rounds of validate -> merge -> (vote -> merge) -> broadcast, with outputs and resume.

When the run votes (``RunConfig.votes``), each round's merge is followed by
its vote phase (:class:`~synapse_flwr.strategies.base.CompendiumStrategy`):
the records released in the round vote against the global they went into,
and the round's global is merged again with their votes. Every round the merged global compendium is written to
``<output-dir>/global_round_<r>.json``, evaluated on the dataset's held-out
queries when it has any (routing accuracy and recall@5, seen and held-out
tools), and the round's record (nodes accepted and rejected with reasons,
bytes in and out, conflicts, epsilon, accuracy, wall time) is appended to ``<output-dir>/metrics.json``, both atomically. A run that
crashed resumes from the last completed round: the global of that round is
broadcast again, each organisation's latest accepted artifact
(``orgs_round_<r>.json``) is merged again if it misses a round, and only the
remaining rounds run.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TypeVar

from flwr.app import Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from synapse_flwr.core.catalog import Catalog, load_catalog
from synapse_flwr.core.embed import get_embedder
from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.merge import GLOBAL_ORG
from synapse_flwr.core.metrics import evaluate_routes
from synapse_flwr.core.prototypes import space_of
from synapse_flwr.core.router import Router
from synapse_flwr.core.schema import Compendium, Issuer
from synapse_flwr.core.signing import SERVER
from synapse_flwr.core.wire import (
    Artifact,
    ArtifactError,
    canonical_json,
    decode,
    encode,
    load_artifact,
    routing_hash,
)
from synapse_flwr.data.federation import load_dataset
from synapse_flwr.flower.calibration import noise_bound
from synapse_flwr.flower.config import RunConfig, recorded_run, resume_conflict
from synapse_flwr.flower.keys import registry_for, signer_for
from synapse_flwr.strategies import make_strategy
from synapse_flwr.strategies.base import CompendiumStrategy, RoundReport
from synapse_flwr.strategies.records import from_record, to_record

log = logging.getLogger(__name__)

app = ServerApp()


class RunRecorder:
    """Writes per-round outputs atomically and finds the resume point.

    Parameters
    ----------
    out_dir : Path
        Output folder (created if needed).
    run_config : dict
        Recorded in ``metrics.json`` for reproducibility.

    Raises
    ------
    RecordedRunError
        If ``metrics.json`` exists but is unreadable (:func:`~synapse_flwr.flower.config.recorded_run`).
    """

    def __init__(self, out_dir: Path, run_config: dict) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)  # an unusable output folder fails the run before round 1
        self.out_dir = out_dir
        self.metrics_path = out_dir / "metrics.json"
        self.rounds: list[dict] = []
        self.run_config = run_config
        self.recorded_config: dict = {}  # the run config of the rounds on disk
        # an unreadable metrics.json is a RecordedRunError naming the file, not a bare JSONDecodeError
        if recorded := recorded_run(self.metrics_path):
            self.rounds, self.recorded_config = recorded

    def resume_point(self) -> tuple[int, bytes | None, dict[str, Compendium]]:
        """The last round whose global is on disk and valid: that round, the global's bytes, and
        each organisation's latest accepted artifact then (what the next merge starts from)."""
        for record in reversed(self.rounds):
            path = self.out_dir / f"global_round_{record['round']}.json"
            try:
                return record["round"], encode(load_artifact(path)), self.org_state(record["round"])
            except ArtifactError as exc:
                log.warning("cannot resume from %s: %s", path, exc)
        return 0, None, {}

    def org_state(self, round_: int) -> dict[str, Compendium]:
        """The per-org artifacts checkpointed after ``round_``.

        Raises
        ------
        ArtifactError
            If the checkpoint is missing or an artifact in it is invalid.
        """
        path = self.out_dir / f"orgs_round_{round_}.json"
        try:
            orgs = json.loads(path.read_bytes())["orgs"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ArtifactError([f"(file): cannot read the per-org checkpoint {path}: {exc}"]) from None
        return {org: decode(json.dumps(art).encode()) for org, art in orgs.items()}

    def record(self, round_: int, global_: Artifact, report: dict, eval_metrics: dict,
               orgs: dict[str, Compendium]) -> None:
        """Write the round's per-org checkpoint and global, then its metrics (so metrics never point
        at a missing file)."""
        state = {"round": round_, "orgs": {org: art.model_dump(mode="json") for org, art in sorted(orgs.items())}}
        write_atomic(self.out_dir / f"orgs_round_{round_}.json", json.dumps(state, sort_keys=True))
        write_atomic(self.out_dir / f"global_round_{round_}.json", canonical_json(global_))
        self.rounds = [r for r in self.rounds if r["round"] < round_]
        self.rounds.append({**report, **eval_metrics, "round": round_})
        doc = {"run_config": self.run_config, "rounds": self.rounds}
        write_atomic(self.metrics_path, json.dumps(doc, indent=2, sort_keys=True) + "\n")


def empty_global() -> bytes:
    """The round-0 global: no tools yet."""
    return encode(Compendium(kind="global", issuer=Issuer(org=GLOBAL_ORG, round=0), policy="none"))


T = TypeVar("T")


def loaded(source: str, load: Callable[[], T]) -> T:
    """``load()``; when it fails, the reason logged before any round and a RuntimeError naming ``source``.

    Parameters
    ----------
    source : str
        What is loaded, as the log names it (``dataset demo``).
    load : callable
        Loads it, raising :class:`~synapse_flwr.core.errors.SynapseError` on bad input.

    Raises
    ------
    RuntimeError
        ``<source> is invalid (see the ServerApp log above)``: the run's log says why, not a traceback.
    """
    try:
        return load()
    except SynapseError as exc:
        log.error("the ServerApp cannot load %s:\n%s", source, exc)
        raise RuntimeError(f"{source} is invalid (see the ServerApp log above)") from None


def federation_catalog(cfg: RunConfig) -> Catalog:
    """The federation's tools, which every artifact's must be from: the run config's ``catalog``, else its dataset's.

    Parameters
    ----------
    cfg : RunConfig
        The run config (``catalog``, ``dataset``, ``seed``).

    Returns
    -------
    Catalog
        The loaded catalog.

    Raises
    ------
    RuntimeError
        When it does not load (:func:`loaded`).
    """
    if cfg.catalog:
        return loaded(f"the catalog {cfg.catalog}", lambda: load_catalog(cfg.catalog))
    return loaded(f"dataset {cfg.dataset}", lambda: load_dataset(cfg.dataset, cfg.seed)).catalog


def make_evaluator(cfg: RunConfig, catalog: Catalog) -> Callable[[Artifact], dict] | None:
    """Server-side evaluation of a global compendium on the dataset's test sets.

    Returns None when ``evaluate`` is off, the dataset has no test set, or
    the run's ``catalog`` is not the dataset's (the federation's tools would
    be scored on another catalog's queries: a ``deploy-local`` of one's own
    nodes scored on the demo's). Metrics: top-1 accuracy and recall@5 of the
    ``fields`` router, on seen-tool and held-out-tool queries.

    Parameters
    ----------
    cfg : RunConfig
        The run config (``evaluate``, ``dataset``, ``seed``, ``embedder``).
    catalog : Catalog
        The federation's tools (:func:`federation_catalog`).
    """
    if not cfg.evaluate:
        return None
    ds = loaded(f"dataset {cfg.dataset}", lambda: load_dataset(cfg.dataset, cfg.seed))
    if set(catalog.ids) != set(ds.catalog.ids):
        log.warning("no evaluation: the run's catalog %s is not dataset %s's, whose test queries would score "
                    "another catalog's tools; set dataset to a folder holding this catalog and a test.jsonl",
                    cfg.catalog, cfg.dataset)
        return None
    splits = {k: v for k, v in (("seen", ds.seen_test), ("heldout", ds.heldout_test)) if v}
    if not splits:
        return None
    # the federation's space, so that the router reads the prototypes
    embedder = get_embedder("static" if cfg.embedder == "none" else cfg.embedder)

    def score(router: Router) -> dict[str, dict]:
        # one query-shift decision over the whole test set; shifted, the routes are the documentation line's
        if router.observe([i.query for items in splits.values() for i in items]):
            return docs
        return {split: evaluate_routes(router.route_many([i.query for i in items], observe=False),
                                       [i.gold for i in items])
                for split, items in splits.items()}

    # the documentation-only line every round is read against (a router without prototypes observes nothing)
    docs = score(Router(None, ds.catalog, embedder=embedder, reranker="fields"))

    # the last global scored: a round in which nothing new was released yields a global that routes alike, and
    # scoring it again cost a 3,000-tool folder (9,000 test queries) about 12 s a round
    scored: dict[str, dict] = {}

    def evaluate(compendium: Artifact) -> dict:
        key = routing_hash(compendium)
        if key in scored:
            return dict(scored[key])
        router = Router(compendium, ds.catalog, embedder=embedder, reranker="fields")
        out = {}
        for split, m in score(router).items():
            out[f"{split}_acc"], out[f"{split}_r5"], out[f"{split}_n"] = m["acc"], m["r5"], m["n"]
            out[f"docs_{split}_acc"] = docs[split]["acc"]
        tools = getattr(compendium, "tools", [])
        out["prototype_share"] = sum(t.prototype is not None for t in tools) / max(len(ds.catalog), 1)
        # privately every tool carries a prototype; these are the ones above the noise the router reads
        used = int((router.prototypes[1] > 0).sum()) if router.prototypes is not None else 0
        out["prototype_used_share"] = used / max(len(ds.catalog), 1)
        # what the router made of the federation's fusion votes (the defaults before any)
        out["fusion_prototype"], out["fusion_prior"] = router.fusion.prototype, router.fusion.prior
        # the test queries far from the experience: routed as docs_only (docs/experiments.md, "Query shift")
        out["experience_off"] = float(router.shifted())  # a MetricRecord holds numbers only
        scored.clear()
        scored[key] = out
        return dict(out)

    return evaluate


SUMMARY_COLUMNS = (
    ("round", "round", "{}"), ("accepted", "accepted", "{}"), ("rejected", "rejected", "{}"),
    ("global", "global", "{}"), ("epsilon", "epsilon", "{:.3f}"), ("bytes/client", "bytes_per_client", "{:,}"),
    ("vote bytes", "vote_bytes_per_client", "{:,}"),
    ("prototypes", "prototype_share", "{:.0%}"), ("above noise", "prototype_used_share", "{:.0%}"),
    ("fusion w", "fusion_prototype", "{:g}"), ("prior", "fusion_prior", "{:g}"), ("exp. off", "experience_off", "{:g}"),
    ("seen", "seen_acc", "{:.3f}"),
    ("held-out", "heldout_acc", "{:.3f}"), ("docs seen", "docs_seen_acc", "{:.3f}"),
    ("docs held-out", "docs_heldout_acc", "{:.3f}"),
)


def summary_table(rounds: list[dict]) -> str:
    """The run's final table: one row per round (a dash where a value was not measured)."""

    def cell(record: dict, key: str, fmt: str) -> str:
        value = record.get(key)
        if isinstance(value, list):
            value = len(value)
        return "-" if value is None else fmt.format(value)

    rows = [[name for name, _, _ in SUMMARY_COLUMNS]]
    rows += [[cell(r, key, fmt) for _, key, fmt in SUMMARY_COLUMNS] for r in rounds]
    widths = [max(len(row[i]) for row in rows) for i in range(len(SUMMARY_COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows)


def make_evaluate_fn(
    strategy: CompendiumStrategy,
    recorder: RunRecorder,
    offset: int,
    evaluator: Callable[[Artifact], dict] | None,
):
    """Per-round hook (called by ``Strategy.start`` after each round): evaluate, record outputs."""
    t0 = time.perf_counter()

    def evaluate_fn(server_round: int, arrays) -> MetricRecord | None:
        if server_round == 0:
            return None
        rnd = offset + server_round
        report = strategy.reports.get(rnd)
        summary = asdict(report or RoundReport(round=rnd))
        summary["bytes_per_client"] = summary["bytes_in"] // max(summary["artifacts_in"], 1)
        voters = len(summary["votes_accepted"])  # no vote phase (nothing new released): a dash in the table
        summary["vote_bytes_per_client"] = summary["votes_bytes_in"] // voters if voters else None
        summary["wall_s"] = round(time.perf_counter() - t0, 3)
        global_ = decode(from_record(strategy.global_record(arrays)))  # after the round's vote phase
        # a round that merged nothing ends with the previous global: said as such, with that global's epsilon
        # (its dash read as "privacy off")
        summary["global"] = "new" if summary["merged"] else "kept"
        if not summary["merged"]:
            summary["epsilon"] = global_.privacy.epsilon
        scores = evaluator(global_) if evaluator else {}
        recorder.record(rnd, global_, summary, scores, {org: art for org, (_, art) in strategy.latest.items()})
        return MetricRecord({"accepted": len(summary["accepted"]), "rejected": len(summary["rejected"]),
                             **{k: float(v) for k, v in scores.items()}})

    return evaluate_fn


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the federation described by the run config (see ``[tool.flwr.app.config]``)."""
    cfg = RunConfig.from_mapping(context.run_config)
    num_rounds = cfg.num_rounds
    out_dir = Path(cfg.output_dir).resolve()
    recorder = RunRecorder(out_dir, cfg.to_mapping())
    reason = resume_conflict(out_dir, recorder.recorded_config, recorder.run_config) if recorder.rounds else None
    if reason:  # `flwr run` straight into a used folder (synapse's launchers check before starting)
        log.error("%s", reason)
        raise RuntimeError(f"{out_dir} holds another run's rounds (see the ServerApp log above)")
    done, resume_bytes, orgs = recorder.resume_point()
    if done >= num_rounds:
        log.warning("all %d rounds already completed in %s; nothing to do", num_rounds, out_dir)
        return
    if done:
        log.warning("resuming after round %d from %s", done, out_dir)
    catalog = federation_catalog(cfg)
    strategy = make_strategy(
        cfg.policy,
        min_nodes=cfg.min_nodes,
        round_offset=done,
        registry=registry_for(cfg),  # signing: verify replies, sign the global
        signer=signer_for(cfg, SERVER),
        run_id=context.run_id,  # signatures name the run: an earlier federation's round r is no round r here
        vote_phase=cfg.votes,
        # the run's space: an artifact in another is refused at intake, not left to fail the merge
        embedding=None if cfg.embedder == "none" else space_of(get_embedder(cfg.embedder)),
        catalog=catalog.ids,  # made-up tools are refused, and larger replies are never parsed
        noise_bound=noise_bound(cfg),  # one organisation's claimed noise would drown every merged prototype
    )
    strategy.restore(orgs)  # an org that misses the next round keeps contributing what it sent before
    strategy.start(
        grid=grid,
        initial_arrays=to_record(resume_bytes or empty_global()),
        num_rounds=num_rounds - done,
        timeout=cfg.round_timeout,
        evaluate_fn=make_evaluate_fn(strategy, recorder, done, make_evaluator(cfg, catalog)),
    )
    log.warning("federation finished: outputs in %s\n%s", out_dir, summary_table(recorder.rounds))
