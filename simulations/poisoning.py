"""One poisoning organisation of K: the accuracy each merge policy loses, clean versus poisoned.

In process, no Flower (as ``simulations/tune_router.py``): every org's
artifact is one release of :func:`~synapse_flwr.core.builder.build_compendium`
(with query prototypes); the poisoner's is built from its own events with
*every* event credited to a wrong tool as a success
(:func:`~synapse_flwr.data.inject.corrupt_org` at rate 1, ``wrong_tool``
only: every scenario and prototype attached to the wrong tool), then every
count, support and prototype (sum, count and their noise SDs) scaled by
``inflate`` (:func:`~synapse_flwr.core.influence.scale_compendium`: it
claims ``inflate`` times its data, and still passes the schema's checks,
which this script makes; keeping the declared noise SDs instead makes its
prototypes fail the schema's norm bound under privacy). Since 2026-12-06 a
server also refuses noise claimed beyond ``max-windows`` release windows
(:mod:`synapse_flwr.core.noise_claims`: 4 times one window's at the
defaults), so at epsilon 4 this poisoner (5 times) is refused at a real
server's edge; the table measures what each merge policy does with one
that gets through. Each policy merges the clean and the poisoned
federation; the ``seen`` and ``heldout`` test sets are routed with the
``fields`` reranker (``flat-majority`` with the flat render it is measured
with elsewhere). The loss is clean minus poisoned top-1, in points.

The robust policy's constants (:class:`~synapse_flwr.core.merge.MergeConfig`)
were chosen on ``dev_seed`` (7); ``report_seed`` (42) is reported. The
loss at the default epsilon on the report seed (the larger of seen and
held-out) goes into
``docs/results/security/summary.json`` (other keys there are kept).

Usage: ``python simulations/poisoning.py configs/poisoning.toml``
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.embed import Embedder, get_embedder
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.influence import scale_compendium
from synapse_flwr.core.merge import FLAT_MAJORITY, POLICIES, ROBUST, TYPED, merge
from synapse_flwr.core.metrics import evaluate_routes
from synapse_flwr.core.router import Router
from synapse_flwr.core.schema import Compendium
from synapse_flwr.core.wire import decode, encode
from synapse_flwr.data.federation import FederatedDataset, load_federated
from synapse_flwr.data.inject import corrupt_org
from synapse_flwr.data.pins import verified_hashes
from synapse_flwr.eval.results import experiment_parser, load_experiment, write_results

log = logging.getLogger("poisoning")
SPLITS = ("seen", "heldout")
TARGET_PTS = 2.0  # the bound on the robust policy's loss


def artifacts(ds: FederatedDataset, cfg: dict, epsilon: float, emb: Embedder, seed: int) -> tuple[list, list]:
    """The clean federation's org artifacts, and the same with the poisoner's replaced."""
    def build(org: str, events: list) -> Compendium:
        return build_compendium(events, ds.catalog, org, epsilon=epsilon, delta=cfg["delta"], rounds=1,
                                seed=seed, embedder=emb)

    clean = {org: build(org, events) for org, events in sorted(ds.orgs.items())}
    tools = [d.tool_id for d in ds.catalog.tools]
    bad, _ = corrupt_org(ds.orgs[cfg["poisoner"]], cfg["poisoner"], 1.0, seed, tools, kinds=("wrong_tool",))
    poisoned = scale_compendium(build(cfg["poisoner"], bad), cfg["inflate"])
    decode(encode(poisoned))  # raises ArtifactError if the edge would reject it
    return list(clean.values()), [poisoned if o == cfg["poisoner"] else a for o, a in clean.items()]


def accuracy(comp, ds: FederatedDataset, emb: Embedder, cfg: dict, render: str = "typed") -> dict[str, float]:
    """Top-1 accuracy on the seen and held-out test sets."""
    router = Router(comp, ds.catalog, embedder=emb, reranker="fields", k=cfg["k"], render=render)
    tests = {"seen": ds.seen_test, "heldout": ds.heldout_test}
    return {s: round(evaluate_routes(router.route_many([t.query for t in tests[s]]), [t.gold for t in tests[s]])
                     ["acc"], 4) for s in SPLITS}


def policy_row(policy: str, clean: list, poisoned: list, ds: FederatedDataset, emb: Embedder, cfg: dict) -> dict:
    """Clean and poisoned accuracy of one policy, the loss in points, and the conflicts logged."""
    render = "flat" if policy == FLAT_MAJORITY else "typed"
    row: dict = {}
    for name, arts in (("clean", clean), ("poisoned", poisoned)):
        g = merge(arts, policy)
        conflicts = getattr(g, "conflicts", [])
        row[name] = {**accuracy(g, ds, emb, cfg, render), "conflicts": len(conflicts),
                     "conflicts_naming_poisoner": sum(any(cfg["poisoner"] in c.orgs for c in k.claims)
                                                      for k in conflicts)}
    row["loss_pts"] = {s: round(100 * (row["clean"][s] - row["poisoned"][s]), 2) for s in SPLITS}
    log.info("%s: %s", policy, row)
    return row


def run_seed(seed: int, cfg: dict, emb: Embedder) -> dict:
    """Docs-only, then every policy clean and poisoned, at every epsilon."""
    ds = load_federated(cfg["dataset"], cfg["orgs"], seed, cfg["alpha"])
    out: dict = {"docs_only": accuracy(None, ds, emb, cfg), "events": {o: len(e) for o, e in ds.orgs.items()},
                 "test_sizes": {"seen": len(ds.seen_test), "heldout": len(ds.heldout_test)}, "by_epsilon": {}}
    for eps in cfg["epsilons"]:
        eps = math.inf if eps == "inf" else float(eps)
        clean, poisoned = artifacts(ds, cfg, eps, emb, seed)
        rows = {p: policy_row(p, clean, poisoned, ds, emb, cfg) for p in cfg["policies"]}
        if ROBUST in rows and TYPED in rows:
            rows[ROBUST]["clean_cost_vs_typed_pts"] = {
                s: round(100 * (rows[TYPED]["clean"][s] - rows[ROBUST]["clean"][s]), 2) for s in SPLITS}
        out["by_epsilon"]["inf" if math.isinf(eps) else f"{eps:g}"] = rows
    return out


def targets(results: dict, cfg: dict) -> list[dict]:
    """The robust policy's loss on every split, seed and epsilon, against the 2-point bound."""
    return [{"seed": int(seed), "epsilon": eps, "split": s, "robust_loss_pts": rows[ROBUST]["loss_pts"][s],
             "goal": f"< {TARGET_PTS:g}", "met": rows[ROBUST]["loss_pts"][s] < TARGET_PTS}
            for seed, r in results["seeds"].items() for eps, rows in r["by_epsilon"].items()
            if ROBUST in rows for s in SPLITS]


def table(results: dict, cfg: dict) -> str:
    """``table.md``: per seed and epsilon, every policy's clean, poisoned and loss."""
    lines = ["# One poisoning org of " + str(cfg["orgs"]), "",
             f"MetaTool, K={cfg['orgs']} orgs (Dirichlet alpha {cfg['alpha']}), `{cfg['poisoner']}` credits "
             f"every event to a wrong tool and inflates every count, support and prototype {cfg['inflate']:g}x. "
             "Top-1 accuracy, `fields` reranker; loss = clean - poisoned, in points. Robust constants chosen "
             f"on seed {cfg['dev_seed']}; seed {cfg['report_seed']} is the report.", ""]
    for seed, r in results["seeds"].items():
        role = "dev (constants chosen here)" if int(seed) == cfg["dev_seed"] else "report"
        docs = r["docs_only"]
        lines += [f"## Seed {seed} ({role})", "", f"docs_only: seen {docs['seen']}, held-out {docs['heldout']}.", "",
                  "| epsilon | policy | seen clean | seen poisoned | seen loss (pts) | held-out clean | "
                  "held-out poisoned | held-out loss (pts) | conflicts clean / poisoned |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for eps, rows in r["by_epsilon"].items():
            for p, row in rows.items():
                c, q, loss = row["clean"], row["poisoned"], row["loss_pts"]
                lines.append(f"| {eps} | {p} | {c['seen']:.4f} | {q['seen']:.4f} | {loss['seen']:+.2f} | "
                             f"{c['heldout']:.4f} | {q['heldout']:.4f} | {loss['heldout']:+.2f} | "
                             f"{c['conflicts']} / {q['conflicts']} |")
            if "clean_cost_vs_typed_pts" in rows.get(ROBUST, {}):
                cost = rows[ROBUST]["clean_cost_vs_typed_pts"]
                lines.append(f"| {eps} | robust clean cost vs typed (pts) | {cost['seen']:+.2f} | | | "
                             f"{cost['heldout']:+.2f} | | | |")
        lines.append("")
    lines += ["## Target: robust loss < 2 points", "", "| seed | epsilon | split | loss (pts) | met |",
              "|---|---|---|---|---|"]
    lines += [f"| {t['seed']} | {t['epsilon']} | {t['split']} | {t['robust_loss_pts']:+.2f} | "
              f"{'yes' if t['met'] else 'NO'} |" for t in results["targets"]]
    return "\n".join(lines) + "\n"


def update_summary(path: Path, results: dict, cfg: dict) -> None:
    """Read-modify-write the security summary: the report seed's loss at the default epsilon.

    The loss is the larger of the seen and held-out losses (at epsilon 4 the
    router's per-query gate keeps held-out queries as docs_only routes them,
    so the damage lands on seen tools).
    """
    rows = results["seeds"][str(cfg["report_seed"])]["by_epsilon"][f"{float(cfg['summary_epsilon']):g}"]
    summary = json.loads(path.read_text()) if path.exists() else {}
    summary["poisoning_loss_pts_robust"] = max(rows[ROBUST]["loss_pts"].values())
    summary["poisoning_loss_pts_typed"] = max(rows[TYPED]["loss_pts"].values())
    write_atomic(path, json.dumps(summary, indent=2, sort_keys=True) + "\n")


def main() -> None:
    """Run every seed; write results.json, manifest.json, table.md and the summary keys."""
    args = experiment_parser(__doc__).parse_args()
    cfg = load_experiment(args.config)
    cfg.setdefault("policies", list(POLICIES))
    emb = get_embedder(cfg["embedder"])
    results: dict = {"seeds": {str(s): run_seed(s, cfg, emb) for s in (cfg["dev_seed"], cfg["report_seed"])}}
    results["targets"] = targets(results, cfg)
    out = Path(cfg["output"])
    write_results(out, results, cfg, verified_hashes([cfg["dataset"]]),
                  f"python simulations/poisoning.py {args.config}")
    write_atomic(out / "table.md", table(results, cfg))
    update_summary(Path(cfg["summary"]), results, cfg)
    log.info("wrote %s", out)


if __name__ == "__main__":
    main()
