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
from unittest.mock import patch

from synapse_flwr.simulations.tune_router import accuracy

from synapse_flwr.core import router as router_module
from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.router import Router
from synapse_flwr.data.federation import FederatedDataset, load_federated
from synapse_flwr.eval.results import run_lab

log = logging.getLogger("when_not")


def flips(fields: Router, none: Router, ds: FederatedDataset) -> tuple[int, int]:
    """Seen routes the fields reranker fixed and broke against retrieval order."""
    queries = [t.query for t in ds.seen_test]
    fixed = broke = 0
    for item, a, b in zip(ds.seen_test, fields.route_many(queries), none.route_many(queries)):
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
        glob = merge_typed([build_compendium(ev, ds.catalog, org, round_=draw, epsilon=eps, delta=cfg["delta"],
                                             rounds=1, seed=cfg["seed"], embedder=emb)
                            for org, ev in sorted(ds.orgs.items())])
        none = Router(glob, ds.catalog, embedder=emb, reranker="none")
        order = accuracy(none, ds)
        fields = Router(glob, ds.catalog, embedder=emb)
        for margin in cfg["margins"]:
            with patch.object(router_module, "WHEN_NOT_MARGIN", margin):
                acc = accuracy(fields, ds)
                fixed, broke = flips(fields, none, ds)
            row = {"dataset": run["dataset"], "orgs": run["orgs"], "epsilon": run["epsilon"], "draw": draw,
                   "when_not": sum(len(e.when_not) for e in glob.tools), "margin": margin, **acc,
                   "fixed": fixed, "broke": broke, "order_seen": order["seen"], "order_heldout": order["heldout"],
                   "docs_seen": docs["seen"], "docs_heldout": docs["heldout"]}
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
