"""The scenario weight of a compendium without query prototypes (``router.SCENARIO_WEIGHTS``).

A federation that releases no prototypes (run config ``prototype_space =
"none"``, or a lexical embedder whose space cannot be shared) routes on its
released ``when`` scenarios: the scenario similarity beyond the description,
gated per query like the prototypes (added only when the documentation's
choice for the query has a released scenario). Each federation (K orgs, one
release each, merged typed) is routed with retrieval order by each embedder
of the run at every scenario weight (0: docs_only's scores), beside docs_only.

Usage: ``python simulations/scenario_weight.py configs/scenario_weight.toml``
"""

from __future__ import annotations

import logging
import math
from statistics import mean

from synapse_flwr.simulations.tune_router import accuracy, draw_global

from synapse_flwr.core.embed import get_embedder
from synapse_flwr.core.router import PROTOTYPE_WEIGHTS, Router
from synapse_flwr.data.federation import load_federated
from synapse_flwr.eval.results import run_lab

log = logging.getLogger("scenario_weight")


def one_run(run: dict, cfg: dict, _emb) -> list[dict]:
    """Every draw x embedder x weight of one (dataset, orgs, epsilon) federation, beside docs_only."""
    ds = load_federated(run["dataset"], run["orgs"], cfg["seed"])
    eps = math.inf if run["epsilon"] == "inf" else float(run["epsilon"])
    rows = []
    for draw in run["draws"]:
        merged = draw_global(ds, eps, draw, cfg, None)  # no embedder: no prototypes
        for emb_name in cfg["embedders"]:
            # a lexical embedder is fitted per router, so each router gets its own
            docs = accuracy(Router(None, ds.catalog, embedder=get_embedder(emb_name), reranker="none"), ds)
            router = Router(merged, ds.catalog, embedder=get_embedder(emb_name), reranker="none")
            for weight in cfg["weights"]:
                router.weights = (PROTOTYPE_WEIGHTS[0], PROTOTYPE_WEIGHTS[1], weight)
                row = {"dataset": run["dataset"], "orgs": run["orgs"], "epsilon": run["epsilon"], "draw": draw,
                       "embedder": emb_name, "weight": weight, **accuracy(router, ds),
                       "docs_seen": docs["seen"], "docs_heldout": docs["heldout"]}
                log.info("%s", row)
                rows.append(row)
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Markdown: top-1 per federation, embedder and scenario weight (mean over draws), beside docs_only."""
    lines = [f"# Scenario weight without prototypes (seed {cfg['seed']}, retrieval order, gated per query)", "",
             "| dataset | orgs | epsilon | embedder | draws | weight | seen | held-out | docs seen | docs held-out |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key in dict.fromkeys((r["dataset"], r["orgs"], r["epsilon"], r["embedder"]) for r in rows):
        for w in cfg["weights"]:
            rs = [r for r in rows if (r["dataset"], r["orgs"], r["epsilon"], r["embedder"]) == key
                  and r["weight"] == w]
            lines.append(f"| {' | '.join(map(str, key))} | {len(rs)} | {w} | {mean(r['seen'] for r in rs):.4f} | "
                         f"{mean(r['heldout'] for r in rs):.4f} | {rs[0]['docs_seen']:.4f} | "
                         f"{rs[0]['docs_heldout']:.4f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run every federation of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "scenario_weight.py", one_run, tables)


if __name__ == "__main__":
    main()
