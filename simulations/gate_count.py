"""The prototype gate's count test (``Fusion.gate_count_sds``) on the seed-7 dev split.

The gate reads a merged prototype only when noise alone would rarely make
its sum as long (``Fusion.gate_alpha``). Its released count carries noise
drawn apart from the sum's, so also asking the count to clear ``s`` of its
noise SDs multiplies the chance that noise alone passes by ``P(N(0, 1) >
s)``; the cost is any tool with real experience whose count falls below
that. Per federation and noise draw (one release per organisation, merged
typed, epsilon 4): the prototypes read and seen / held-out top-1 at ``s``
= 0 (a positive count: the length test all but alone), 1 and 2, shipped router (``fields``,
default fusion otherwise, no votes), beside docs_only.

Usage: ``python simulations/gate_count.py configs/gate_count.toml``
"""

from __future__ import annotations

import logging
from dataclasses import replace

from synapse_flwr.simulations.tune_router import accuracy, draw_global

from synapse_flwr.core.embed import Embedder
from synapse_flwr.core.prototypes import readable
from synapse_flwr.core.router import Fusion, Router
from synapse_flwr.data.federation import load_federated
from synapse_flwr.eval.results import group_rows, mean_of, run_lab

log = logging.getLogger("gate_count")


def one_run(run: dict, cfg: dict, emb: Embedder) -> list[dict]:
    """Every noise draw of one federation at every count threshold."""
    ds = load_federated(run["dataset"], run["orgs"], cfg["seed"])
    docs = accuracy(Router(None, ds.catalog, embedder=emb), ds)
    rows = []
    for draw in run["draws"]:
        glob = draw_global(ds, run["epsilon"], draw, cfg, emb)
        router = Router(glob, ds.catalog, embedder=emb)
        protos = [e.prototype for e in glob.tools]
        held = {g for t in ds.heldout_test for g in t.gold}
        noise_only = [e.prototype for e in glob.tools if e.tool_id in held and e.prototype is not None]
        for sds in cfg["count_sds"]:
            router.set_fusion(replace(Fusion(), gate_count_sds=sds))
            row = {"dataset": run["dataset"], "orgs": len(ds.orgs), "epsilon": run["epsilon"], "draw": draw,
                   "count_sds": sds, "read": sum(readable(protos, Fusion().gate_alpha, sds)), "docs_only": docs,
                   # tools no record teaches: how often noise alone clears the count test (the clipped sum of
                   # each organisation's count is biased upward, so this is not P(N(0, 1) > sds))
                   "noise_count_pass": [sum(p.count > sds * p.count_sd for p in noise_only), len(noise_only)],
                   **accuracy(router, ds)}
            log.info("%s", row)
            rows.append(row)
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Mean over draws per federation and count threshold."""
    lines = [f"# The gate's count test, seed-{cfg['seed']} dev split", "",
             ("Mean over noise draws; `read`: prototypes the router reads (per draw); count SDs 0: a positive count. "
              "`noise passes count test`: of the prototypes of tools no record teaches (noise alone), those whose "
              "count clears the test, over all draws."),
             "", ("| dataset | orgs | epsilon | draws | count SDs | read | seen | held-out | docs seen | docs held-out "
                  "| noise passes count test |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (dataset, orgs, eps, sds), sel in group_rows(rows, "dataset", "orgs", "epsilon", "count_sds").items():
        passed, total = (sum(r["noise_count_pass"][i] for r in sel) for i in (0, 1))
        lines.append(f"| {dataset} | {orgs} | {eps} | {len(sel)} | {sds} | {', '.join(str(r['read']) for r in sel)} "
                     f"| {mean_of(sel, 'seen'):.4f} | {mean_of(sel, 'heldout'):.4f} "
                     f"| {sel[0]['docs_only']['seen']:.4f} | {sel[0]['docs_only']['heldout']:.4f} "
                     f"| {passed} of {total} ({passed / max(total, 1):.2f}) |")
    return "\n".join([*lines, ""])


def main() -> None:
    """Run every federation of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "gate_count.py", one_run, tables)


if __name__ == "__main__":
    main()
