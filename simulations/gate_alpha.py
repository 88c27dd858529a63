"""The prototype gate's false-pass level on the seed-7 dev split: seen and held-out top-1 per alpha.

A noise-only prototype that passes the gate opens it for the queries its
(held-out) tool documents best and adds a count prior to it; the level
:attr:`~synapse_flwr.core.fusion.Fusion.gate_alpha` bounds the chance that
any tool of the catalog does. Each federation (K orgs, one release each,
merged typed) is built under several noise draws and routed with the
``fields`` reranker at every alpha, beside docs_only.

Usage: ``python simulations/gate_alpha.py configs/gate_alpha.toml``
"""

from __future__ import annotations

import logging
import math

from synapse_flwr.simulations.tune_router import accuracy

from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.fusion import Fusion
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.router import Router
from synapse_flwr.data.federation import load_federated
from synapse_flwr.eval.results import run_lab

log = logging.getLogger("gate_alpha")


def one_run(run: dict, cfg: dict, emb) -> list[dict]:
    """Every draw x alpha of one (orgs, epsilon) federation, with the docs_only line."""
    seed = run.get("seed", cfg["seed"])  # a run on another seed is a check, not a choice
    ds = load_federated(cfg["dataset"], run["orgs"], seed)
    eps = math.inf if run["epsilon"] == "inf" else float(run["epsilon"])
    docs = Router(None, ds.catalog, embedder=emb, reranker="fields")
    line = {f"docs_{split}": acc for split, acc in accuracy(docs, ds).items()}
    rows = []
    for draw in run["draws"]:
        arts = [build_compendium(ev, ds.catalog, org, round_=draw, epsilon=eps, delta=cfg["delta"], rounds=1,
                                 seed=seed, embedder=emb) for org, ev in sorted(ds.orgs.items())]
        router = Router(merge_typed(arts), ds.catalog, embedder=emb, reranker="fields")
        for alpha in cfg["alphas"]:
            router.set_fusion(Fusion(gate_alpha=alpha))
            row = {"seed": seed, "orgs": run["orgs"], "epsilon": run["epsilon"], "draw": draw, "alpha": alpha,
                   **accuracy(router, ds),
                   "used": int((router.prototypes[1] > 0).sum()) if router.prototypes else 0, **line}
            log.info("%s", row)
            rows.append(row)
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Markdown: one line per (orgs, epsilon, draw, alpha); held-out below docs_only - 0.005 marked."""
    lines = [f"# Prototype gate level on {cfg['dataset']} (alpha chosen on seed {cfg['seed']}; other seeds are checks)",
             "", "| seed | orgs | epsilon | draw | alpha | prototypes used | seen | held-out | docs seen | docs held-out |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        harm = " **harm**" if r["heldout"] < r["docs_heldout"] - 0.005 else ""
        lines.append(f"| {r['seed']} | {r['orgs']} | {r['epsilon']} | {r['draw']} | {r['alpha']} | {r['used']} | {r['seen']:.4f} "
                     f"| {r['heldout']:.4f}{harm} | {r['docs_seen']:.4f} | {r['docs_heldout']:.4f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run every federation of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "gate_alpha.py", one_run, tables, lambda cfg: [cfg["dataset"]])


if __name__ == "__main__":
    main()
