"""Tool names read as words in the documentation vector (``documentation.name_words``).

Each federation (K orgs, one release each, merged typed) is routed with the
``fields`` reranker twice: with names split into words at camelCase,
acronym and digit boundaries as well as at ``_`` and ``-`` (shipped), and with
the former rendering, which split at ``_`` and ``-`` only (an uncased embedder
then reads ``AusPetrolPrices`` as one unknown word). docs_only is scored both
ways beside it. A run may drop the catalog's example requests
(``examples = false``), as a benchmark folder without ``examples.json`` has
none, so the documentation vector is the name and description alone.

Usage: ``python simulations/name_words.py configs/name_words.toml``
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import replace
from statistics import mean
from unittest.mock import patch

from synapse_flwr.simulations.tune_router import accuracy, draw_global

from synapse_flwr.core import documentation
from synapse_flwr.core.catalog import Catalog
from synapse_flwr.core.documentation import name_words
from synapse_flwr.core.router import Router
from synapse_flwr.data.federation import load_federated
from synapse_flwr.eval.results import run_lab

log = logging.getLogger("name_words")


def separators_only(name: str) -> str:
    """The rendering before ``name_words``: ``_`` and ``-`` become spaces, nothing else."""
    return re.sub(r"[_\-]", " ", name).strip()


RENDERINGS = {"words": name_words, "separators": separators_only}


def one_run(run: dict, cfg: dict, emb) -> list[dict]:
    """Every draw x rendering of one (dataset, orgs, epsilon, examples) federation, with docs_only."""
    ds = load_federated(run["dataset"], run["orgs"], cfg["seed"])
    if not run.get("examples", True):
        ds = replace(ds, catalog=Catalog(tuple(replace(d, examples=()) for d in ds.catalog.tools)))
    eps = math.inf if run["epsilon"] == "inf" else float(run["epsilon"])
    globals_ = [draw_global(ds, eps, draw, cfg, emb) for draw in run["draws"]]
    camel = sum(bool(re.search(r"[a-z0-9][A-Z]", d.name)) for d in ds.catalog.tools)
    rows = []
    for label, render in RENDERINGS.items():
        with patch.object(documentation, "name_words", render):
            docs = accuracy(Router(None, ds.catalog, embedder=emb), ds)
            for draw, merged in zip(run["draws"], globals_, strict=True):
                row = {"dataset": run["dataset"], "orgs": run["orgs"], "epsilon": run["epsilon"],
                       "examples": run.get("examples", True), "draw": draw, "names": label,
                       "camel_case_names": camel, "tools": len(ds.catalog.tools),
                       **accuracy(Router(merged, ds.catalog, embedder=emb), ds),
                       "docs_seen": docs["seen"], "docs_heldout": docs["heldout"]}
                log.info("%s", row)
                rows.append(row)
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Markdown: top-1 per federation and rendering (mean over draws), beside docs_only."""
    lines = [f"# Tool names as words in the documentation vector (seed {cfg['seed']}, fields reranker)", "",
             "| dataset | examples | orgs | epsilon | draws | names | seen | held-out | docs seen | docs held-out |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key in dict.fromkeys((r["dataset"], r["examples"], r["orgs"], r["epsilon"]) for r in rows):
        for label in RENDERINGS:
            rs = [r for r in rows if (r["dataset"], r["examples"], r["orgs"], r["epsilon"]) == key
                  and r["names"] == label]
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {len(rs)} | {label} | "
                         f"{mean(r['seen'] for r in rs):.4f} | {mean(r['heldout'] for r in rs):.4f} | "
                         f"{rs[0]['docs_seen']:.4f} | {rs[0]['docs_heldout']:.4f} |")
    sets = sorted({(r["dataset"], r["camel_case_names"], r["tools"]) for r in rows})
    notes = [f"- {d}: {c} of {n} tool names have a lower-to-upper case boundary" for d, c, n in sets]
    return "\n".join([*lines, "", *notes]) + "\n"


def main() -> None:
    """Run every federation of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "name_words.py", one_run, tables)


if __name__ == "__main__":
    main()
