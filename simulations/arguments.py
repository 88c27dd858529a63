"""Tool arguments read in the documentation vector (``documentation.arguments_text``).

A tool's parameters' JSON Schema is public catalog text: argument names and
descriptions say what a request for the tool must mention ("order id",
"zip code"). Each federation is routed with the ``fields`` reranker three ways:
with the arguments appended to the documentation text (shipped), with every
argument even those most tools take (without
``documentation.distinctive_parameters``), and without them (the rendering
before); docs_only is scored each way beside it. Three datasets:

- ``demo``: the embedded demo, whose catalog documents its arguments;
- ``taubench``: tau-bench retail's 16 function schemas, docs_only per step
  (every gold call of the train and test tasks; nothing is fitted, so no
  split);
- ``metatool`` with ``boilerplate = true``: a stress case, MetaTool's
  catalog (which has no parameters) with the same four generic arguments
  given to every tool, which carry no routing information at all (the
  shipped rule drops them; ``all`` reads them).

A run may drop the catalog's example requests (``examples = false``), as a
benchmark folder without ``examples.json`` has none.

Usage: ``python simulations/arguments.py configs/arguments.toml``
"""

from __future__ import annotations

import logging
import math
from contextlib import ExitStack
from dataclasses import replace
from statistics import mean
from unittest.mock import patch

from synapse_flwr.simulations.tune_router import accuracy, draw_global

from synapse_flwr.core import documentation
from synapse_flwr.core import router as router_module
from synapse_flwr.core.catalog import Catalog
from synapse_flwr.core.router import Router
from synapse_flwr.data.federation import FederatedDataset, load_dataset, load_federated
from synapse_flwr.eval.results import run_lab
from synapse_flwr.eval.taubench import rankings, step_metrics, step_scores

log = logging.getLogger("arguments")
#: Generic arguments for the stress case: the same four on every tool.
BOILERPLATE = {"type": "object", "properties": {
    "query": {"type": "string", "description": "The search query or request text."},
    "limit": {"type": "integer", "description": "Maximum number of results to return."},
    "page": {"type": "integer", "description": "Page number of the results, starting at 1."},
    "language": {"type": "string", "description": "Language code of the response, e.g. en."}}}
#: shipped; without the common-argument rule (``documentation.distinctive_parameters``); the rendering before.
RENDERINGS = ("arguments", "all", "none")


def rendering(label: str) -> ExitStack:
    """Patches that make routers built inside the block read the arguments as ``label`` says."""
    stack = ExitStack()
    if label == "none":
        stack.enter_context(patch.object(router_module, "catalog_arguments", lambda catalog: {}))
    if label == "all":
        stack.enter_context(patch.object(documentation, "distinctive_parameters", dict))
    return stack


def _catalog(catalog: Catalog, run: dict) -> Catalog:
    """The run's catalog: without example requests and with boilerplate arguments where the run asks."""
    ex = run.get("examples", True)
    boiler = run.get("boilerplate", False)
    return Catalog(tuple(replace(d, examples=d.examples if ex else (), parameters=BOILERPLATE if boiler
                                 else d.parameters) for d in catalog.tools))


def _taubench_rows(run: dict, emb) -> list[dict]:
    """docs_only per step on every gold call of tau-bench's train and test tasks, with and without arguments."""
    from synapse_flwr.data.taubench import load_taubench, taubench_step_items

    catalog = _catalog(load_dataset("taubench").catalog, run)
    items = taubench_step_items(load_taubench(split="train")[1] + load_taubench(split="test")[1])
    rows = []
    for label in RENDERINGS:
        with rendering(label):
            router = Router(None, catalog, embedder=emb)
            m = step_metrics(rankings(step_scores(router, items, docs_only=True), router.tool_ids), items)
        rows.append({"dataset": "taubench", "examples": run.get("examples", True), "arguments": label,
                     "steps": m["n"], "docs_step_top1": m["acc"], "docs_step_recall5": m["r5"],
                     **{f"docs_{k}": v["acc"] for k, v in m["by_kind"].items()}})
        log.info("%s", rows[-1])
    return rows


def one_run(run: dict, cfg: dict, emb) -> list[dict]:
    """Every draw x rendering of one federation with docs_only, or tau-bench's docs_only per step."""
    if run["dataset"] == "taubench":
        return _taubench_rows(run, emb)
    ds = load_federated(run["dataset"], run["orgs"], cfg["seed"])
    ds = FederatedDataset(ds.name, _catalog(ds.catalog, run), ds.orgs, ds.seen_test, ds.heldout_test, ds.info)
    eps = math.inf if run["epsilon"] == "inf" else float(run["epsilon"])
    globals_ = [draw_global(ds, eps, draw, cfg, emb) for draw in run["draws"]]
    rows = []
    for label in RENDERINGS:
        with rendering(label):
            docs = accuracy(Router(None, ds.catalog, embedder=emb), ds)
            for draw, merged in zip(run["draws"], globals_, strict=True):
                row = {"dataset": run["dataset"], "examples": run.get("examples", True),
                       "boilerplate": run.get("boilerplate", False), "orgs": run["orgs"], "epsilon": run["epsilon"],
                       "draw": draw, "arguments": label, **accuracy(Router(merged, ds.catalog, embedder=emb), ds),
                       "docs_seen": docs["seen"], "docs_heldout": docs["heldout"]}
                log.info("%s", row)
                rows.append(row)
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Markdown: top-1 per federation and rendering (mean over draws) beside docs_only, and tau-bench per step."""
    lines = [f"# Tool arguments in the documentation vector (seed {cfg['seed']}, fields reranker)", "",
             ("| dataset | examples | boilerplate | orgs | epsilon | draws | arguments | seen | held-out "
              "| docs seen | docs held-out |"), "|---|---|---|---|---|---|---|---|---|---|---|"]
    fed = [r for r in rows if r["dataset"] != "taubench"]
    for key in dict.fromkeys((r["dataset"], r["examples"], r["boilerplate"], r["orgs"], r["epsilon"]) for r in fed):
        for label in RENDERINGS:
            rs = [r for r in fed if (r["dataset"], r["examples"], r["boilerplate"], r["orgs"], r["epsilon"]) == key
                  and r["arguments"] == label]
            lines.append(f"| {' | '.join(map(str, key))} | {len(rs)} | {label} | {mean(r['seen'] for r in rs):.4f} "
                         f"| {mean(r['heldout'] for r in rs):.4f} | {rs[0]['docs_seen']:.4f} "
                         f"| {rs[0]['docs_heldout']:.4f} |")
    tau = [r for r in rows if r["dataset"] == "taubench"]
    if tau:
        lines += ["", "tau-bench retail, docs_only per step (every gold call of the train and test tasks):", "",
                  "| examples | arguments | steps | top-1 | recall@5 | first | read | write |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['examples']} | {r['arguments']} | {r['steps']} | {r['docs_step_top1']:.4f} "
                  f"| {r['docs_step_recall5']:.4f} | {r['docs_first']:.4f} | {r['docs_read']:.4f} "
                  f"| {r['docs_write']:.4f} |" for r in tau]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run every federation of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "arguments.py", one_run, tables,
            lambda cfg: ["taubench-retail" if r["dataset"] == "taubench" else r["dataset"] for r in cfg["runs"]])


if __name__ == "__main__":
    main()
