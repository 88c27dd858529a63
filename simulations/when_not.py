"""The ``when_not`` redirect's margin: seen top-1 of the fields reranker per margin, beside retrieval order.

A ``when_not`` scenario of tool A (``prefer`` B) counts for a query only when
it matches the query better than anything in A's favour by more than
:data:`~synapse_flwr.core.router.WHEN_NOT_MARGIN`; any excess then hands A's
score to B. Each federation (K orgs, one release each, merged typed) is
routed with the ``fields`` reranker at every margin and with the ``none``
reranker (retrieval order, which reads no when_not), on its seen and
held-out test queries; the routes the fields reranker fixed and broke
against retrieval order are counted.

Usage: ``python simulations/when_not.py configs/when_not.toml``
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from unittest.mock import patch

from synapse_flwr.simulations.tune_router import accuracy, draw_global

from synapse_flwr.core import router as router_module
from synapse_flwr.core.experience import TestItem
from synapse_flwr.core.metrics import evaluate_routes
from synapse_flwr.core.router import Router, RouteResult
from synapse_flwr.data.federation import FederatedDataset, load_federated
from synapse_flwr.eval.results import run_lab

log = logging.getLogger("when_not")


def routes(router: Router, ds: FederatedDataset) -> dict[str, list[RouteResult]]:
    """The router's results on the seen and held-out test queries."""
    return {split: router.route_many([t.query for t in items])
            for split, items in (("seen", ds.seen_test), ("heldout", ds.heldout_test))}


def top1(results: dict[str, list[RouteResult]], ds: FederatedDataset) -> dict[str, float]:
    """Top-1 per split of :func:`routes`' results (as :func:`tune_router.accuracy` rounds it)."""
    golds = {"seen": [t.gold for t in ds.seen_test], "heldout": [t.gold for t in ds.heldout_test]}
    return {split: round(evaluate_routes(res, golds[split])["acc"], 4) for split, res in results.items()}


def flips(items: Sequence[TestItem], fields: Sequence[RouteResult], order: Sequence[RouteResult]) -> tuple[int, int]:
    """Routes the fields reranker fixed and broke against retrieval order, on the same queries."""
    fixed = broke = 0
    for item, a, b in zip(items, fields, order):
        fixed += a.tool in item.gold and b.tool not in item.gold
        broke += b.tool in item.gold and a.tool not in item.gold
    return fixed, broke


def one_run(run: dict, cfg: dict, emb) -> list[dict]:
    """Every draw x margin of one (dataset, orgs, epsilon) federation, with retrieval order and docs_only."""
    ds = load_federated(run["dataset"], run["orgs"], cfg["seed"])
    eps = math.inf if run["epsilon"] == "inf" else float(run["epsilon"])
    docs = accuracy(Router(None, ds.catalog, embedder=emb), ds)
    rows = []
    for draw in run["draws"]:
        glob = draw_global(ds, eps, draw, cfg, emb)
        order_routes = routes(Router(glob, ds.catalog, embedder=emb, reranker="none"), ds)  # reads no when_not
        order = top1(order_routes, ds)
        fields = Router(glob, ds.catalog, embedder=emb)
        for margin in cfg["margins"]:
            with patch.object(router_module, "WHEN_NOT_MARGIN", margin):
                fields_routes = routes(fields, ds)
            fixed, broke = flips(ds.seen_test, fields_routes["seen"], order_routes["seen"])
            row = {"dataset": run["dataset"], "orgs": run["orgs"], "epsilon": run["epsilon"], "draw": draw,
                   "when_not": sum(len(e.when_not) for e in glob.tools), "margin": margin,
                   **top1(fields_routes, ds), "fixed": fixed, "broke": broke, "order_seen": order["seen"],
                   "order_heldout": order["heldout"], "docs_seen": docs["seen"], "docs_heldout": docs["heldout"]}
            log.info("%s", row)
            rows.append(row)
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Markdown: one line per federation, draw and margin."""
    lines = [f"# when_not margin (seed {cfg['seed']}, fields reranker vs retrieval order)", "",
             ("| dataset | orgs | epsilon | draw | when_not entries | margin | seen | held-out | fixed | broke | "
              "retrieval order seen | docs seen |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['dataset']} | {r['orgs']} | {r['epsilon']} | {r['draw']} | {r['when_not']} | {r['margin']} | "
              f"{r['seen']:.4f} | {r['heldout']:.4f} | {r['fixed']} | {r['broke']} | {r['order_seen']:.4f} | "
              f"{r['docs_seen']:.4f} |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    run_lab(__doc__, "when_not.py", one_run, tables, lambda cfg: {r["dataset"] for r in cfg["runs"]})


if __name__ == "__main__":
    main()
