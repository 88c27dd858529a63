"""What released phrases buy under privacy, against the budget they take from the prototypes.

A record's phrases are 8 of its 12 counters, so releasing them raises the
noise of every field of the one Gaussian release (sensitivity ``sqrt(77)``
instead of ``sqrt(69)`` with prototypes). The builder's default private
build with prototypes leaves them out (``BuildConfig.phrases`` None);
``phrases = True`` forces them. Each federation (K orgs, one release each,
merged typed) is built both ways at the same noise draws (the prototypes'
noise is the same draw scaled by sigma) and routed with the ``fields``
reranker on its seen and held-out test queries, beside docs_only; the
scenarios each way released are counted.

Usage: ``python simulations/phrases.py configs/phrases.toml``
"""

from __future__ import annotations

import logging
from statistics import mean

from synapse_flwr.simulations.tune_router import accuracy

from synapse_flwr.core.builder import BuildConfig, build_compendium
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.router import Router
from synapse_flwr.data.federation import load_federated
from synapse_flwr.eval.results import paired, run_lab

log = logging.getLogger("phrases")
ARMS = {"default (no phrases)": BuildConfig(), "phrases": BuildConfig(phrases=True)}


def one_run(run: dict, cfg: dict, emb) -> list[dict]:
    """Every draw x arm of one (dataset, orgs, epsilon) federation, with the docs_only line."""
    ds = load_federated(run["dataset"], run["orgs"], cfg["seed"])
    docs = accuracy(Router(None, ds.catalog, embedder=emb), ds)
    rows = []
    for arm, config in ARMS.items():
        for draw in run["draws"]:
            arts = [build_compendium(ev, ds.catalog, org, round_=draw, epsilon=run["epsilon"], delta=cfg["delta"],
                                     rounds=1, seed=cfg["seed"], embedder=emb, config=config)
                    for org, ev in sorted(ds.orgs.items())]
            merged = merge_typed(arts)
            row = {"dataset": run["dataset"], "orgs": run["orgs"], "epsilon": run["epsilon"], "arm": arm,
                   "draw": draw, "sigma": arts[0].privacy.sigma,
                   "scenarios": sum(len(t.when) + len(t.when_not) for t in merged.tools),
                   **accuracy(Router(merged, ds.catalog, embedder=emb), ds),
                   "docs_seen": docs["seen"], "docs_heldout": docs["heldout"]}
            log.info("%s", row)
            rows.append(row)
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Markdown: sigma, released scenarios and top-1 (mean over draws) per federation and arm, and the paired gain."""
    head = ("| dataset | orgs | epsilon | build | sigma | scenarios in the global | seen | held-out | docs seen "
            "| docs held-out |")
    lines = [f"# Phrases under privacy: what they buy and what they cost (seed {cfg['seed']}, fields reranker)", "",
             head, "|---|---|---|---|---|---|---|---|---|---|"]
    gains = []
    for key in sorted({(r["dataset"], r["orgs"], r["epsilon"]) for r in rows}, key=str):
        group = {a: [r for r in rows if (r["dataset"], r["orgs"], r["epsilon"]) == key and r["arm"] == a]
                 for a in ARMS}
        for a, rs in group.items():
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {a} | {rs[0]['sigma']:.2f} | "
                         f"{mean(r['scenarios'] for r in rs):.1f} | {mean(r['seen'] for r in rs):.4f} | "
                         f"{mean(r['heldout'] for r in rs):.4f} | {rs[0]['docs_seen']:.4f} | "
                         f"{rs[0]['docs_heldout']:.4f} |")
        off, on = group.values()
        gains.append(f"- {key[0]} K={key[1]} epsilon {key[2]}: without - with phrases, seen top-1 per draw "
                     f"{paired(off, on)}; held-out {paired(off, on, 'heldout')}")
    return "\n".join([*lines, "", "Paired by draw (same noise seeds):", "", *gains]) + "\n"


def main() -> None:
    """Run every federation of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "phrases.py", one_run, tables)


if __name__ == "__main__":
    main()
