"""The weight of a tool's example requests in its documentation vector (``router.EXAMPLE_WEIGHT``).

Each federation (K orgs, one release each, merged typed) is routed with the
``fields`` reranker at every example weight (0: the documentation alone), on
its seen and held-out test queries, beside docs_only at the same weight: the
examples are documentation, so docs_only reads them too. The examples are
the ones shipped with the dataset (``synapse examples``); the manifest
records the sha256 of that table.

Usage: ``python simulations/example_weight.py configs/example_weight.toml``
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from statistics import mean
from unittest.mock import patch

from synapse_flwr.simulations.tune_router import accuracy, draw_global

from synapse_flwr.core import router as router_module
from synapse_flwr.core.router import Router
from synapse_flwr.data.federation import load_federated
from synapse_flwr.eval.results import run_lab

log = logging.getLogger("example_weight")


def examples_hash(ds) -> str:
    """sha256 of the dataset's example table as the catalog carries it."""
    table = {d.tool_id: list(d.examples) for d in ds.catalog.tools}
    return hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()


def one_run(run: dict, cfg: dict, emb) -> list[dict]:
    """Every draw x weight of one (dataset, orgs, epsilon) federation, with docs_only at each weight."""
    ds = load_federated(run["dataset"], run["orgs"], cfg["seed"])
    eps = math.inf if run["epsilon"] == "inf" else float(run["epsilon"])
    globals_ = [draw_global(ds, eps, draw, cfg, emb) for draw in run["draws"]]
    rows = []
    for weight in cfg["weights"]:
        with patch.object(router_module, "EXAMPLE_WEIGHT", weight):
            docs = accuracy(Router(None, ds.catalog, embedder=emb), ds)
            for draw, merged in zip(run["draws"], globals_):
                row = {"dataset": run["dataset"], "orgs": run["orgs"], "epsilon": run["epsilon"], "draw": draw,
                       "weight": weight, "examples_sha256": examples_hash(ds),
                       "tools_with_examples": sum(bool(d.examples) for d in ds.catalog.tools),
                       **accuracy(Router(merged, ds.catalog, embedder=emb), ds),
                       "docs_seen": docs["seen"], "docs_heldout": docs["heldout"]}
                log.info("%s", row)
                rows.append(row)
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Markdown: top-1 per federation and example weight (mean over draws), beside docs_only."""
    lines = [f"# Example requests in the documentation vector (seed {cfg['seed']}, fields reranker)", "",
             "| dataset | orgs | epsilon | draws | example weight | seen | held-out | docs seen | docs held-out |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key in dict.fromkeys((r["dataset"], r["orgs"], r["epsilon"]) for r in rows):
        for w in cfg["weights"]:
            rs = [r for r in rows if (r["dataset"], r["orgs"], r["epsilon"]) == key and r["weight"] == w]
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {len(rs)} | {w} | {mean(r['seen'] for r in rs):.4f} | "
                         f"{mean(r['heldout'] for r in rs):.4f} | {rs[0]['docs_seen']:.4f} | "
                         f"{rs[0]['docs_heldout']:.4f} |")
    sets = {(r["dataset"], r["tools_with_examples"], r["examples_sha256"][:12]) for r in rows}
    notes = [f"- {d}: {n} tools with examples, table sha256 {h}..." for d, n, h in sorted(sets)]
    return "\n".join([*lines, "", "Example tables (shipped with the package, `synapse examples`):", "", *notes]) + "\n"


def main() -> None:
    """Run every federation of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "example_weight.py", one_run, tables)


if __name__ == "__main__":
    main()
