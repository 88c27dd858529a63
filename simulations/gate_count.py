"""The prototype gate's second tests (``Fusion.gate_count_sds``, ``Fusion.gate_doc_sds``) on the seed-7 dev split.

The gate reads a merged prototype only when noise alone would rarely make
its sum as long (``Fusion.gate_alpha``). Two quantities carry noise drawn
apart from that length, so asking either to clear ``s`` of its noise SDs
divides how often noise alone passes the gate; the cost is any tool with
real experience that falls below. The released count: each organisation
clips its count at 0, so a merged count of noise alone sits above 0 and the
count test divides less than ``P(N(0, 1) > s)``. The sum's projection on
the tool's public documentation vector: its noise is exactly
``N(0, sum_sd^2)`` after the merge. Per federation and noise draw (one
release per organisation, merged typed, epsilon 4): per (count SDs,
documentation SDs) pair of the config, the prototypes read, the held-out
(noise-only) prototypes read, and seen / held-out top-1 of the shipped
router (``fields``, default fusion otherwise, no votes), beside docs_only;
and how often the noise-only prototypes clear each test on its own.

Usage: ``python simulations/gate_count.py configs/gate_count.toml``
"""

from __future__ import annotations

import logging
from dataclasses import replace

from synapse_flwr.simulations.tune_router import accuracy, draw_global

from synapse_flwr.core.embed import Embedder
from synapse_flwr.core.fusion import Fusion
from synapse_flwr.core.prototypes import along_documentation
from synapse_flwr.core.router import Router
from synapse_flwr.data.federation import load_federated
from synapse_flwr.eval.results import group_rows, mean_of, run_lab

log = logging.getLogger("gate_count")


def gate_of(pair: list) -> Fusion:
    """The default fusion with a config's ``[count SDs, documentation SDs or "off"]``."""
    count_sds, doc_sds = pair
    return replace(Fusion(), gate_count_sds=float(count_sds), gate_doc_sds=None if doc_sds == "off" else float(doc_sds))


def one_run(run: dict, cfg: dict, emb: Embedder) -> list[dict]:
    """Every noise draw of one federation at every gate of the config."""
    ds = load_federated(run["dataset"], run["orgs"], cfg["seed"])
    docs = accuracy(Router(None, ds.catalog, embedder=emb), ds)
    held = {g for t in ds.heldout_test for g in t.gold}
    rows = []
    for draw in run["draws"]:
        glob = draw_global(ds, run["epsilon"], draw, cfg, emb)
        router = Router(glob, ds.catalog, embedder=emb)
        protos = [router.entries[t].prototype for t in router.tool_ids]
        noise_only = [i for i, t in enumerate(router.tool_ids) if t in held and protos[i] is not None]
        doc_vectors = router.vectors[router.doc_rows]
        for pair in cfg["gates"]:
            gate = gate_of(pair)
            router.set_fusion(gate)
            read = [bool(g > 0) for g in router.prototypes[1]]  # the gain the router gives each prototype
            row = {"dataset": run["dataset"], "orgs": len(ds.orgs), "epsilon": run["epsilon"], "draw": draw,
                   "count_sds": gate.gate_count_sds, "doc_sds": pair[1], "read": sum(read),
                   "heldout_read": sum(read[i] for i in noise_only), "docs_only": docs,
                   # tools no record teaches: how often noise alone clears each test on its own (the clipped
                   # sum of each organisation's count is biased upward, so the first is not P(N(0, 1) > sds))
                   "noise_count_pass": [sum(protos[i].count > gate.gate_count_sds * protos[i].count_sd
                                            for i in noise_only), len(noise_only)],
                   "noise_doc_pass": [sum(along_documentation([protos[i] for i in noise_only],
                                                              doc_vectors[noise_only], gate.gate_doc_sds)),
                                      len(noise_only)],
                   **accuracy(router, ds)}
            log.info("%s", row)
            rows.append(row)
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Mean over draws per federation and gate."""
    lines = [f"# The gate's count and documentation tests, seed-{cfg['seed']} dev split", "",
             ("Mean over noise draws; `read`: prototypes the router reads (per draw); `held-out read`: of those, "
              "prototypes of tools no record teaches (noise alone), per draw; count SDs 0: a positive count; "
              "doc SDs off: no documentation test. `noise passes`: of the noise-only prototypes, those clearing "
              "that test on its own, over all draws."),
             "", ("| dataset | orgs | epsilon | draws | count SDs | doc SDs | read | held-out read | seen | held-out "
                  "| docs seen | docs held-out | noise passes count test | noise passes doc test |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (dataset, orgs, eps, sds, doc), sel in group_rows(rows, "dataset", "orgs", "epsilon", "count_sds",
                                                          "doc_sds").items():
        passes = []
        for key in ("noise_count_pass", "noise_doc_pass"):
            passed, total = (sum(r[key][i] for r in sel) for i in (0, 1))
            passes.append(f"{passed} of {total} ({passed / max(total, 1):.2f})")
        lines.append(f"| {dataset} | {orgs} | {eps} | {len(sel)} | {sds} | {doc} "
                     f"| {', '.join(str(r['read']) for r in sel)} | {', '.join(str(r['heldout_read']) for r in sel)} "
                     f"| {mean_of(sel, 'seen'):.4f} | {mean_of(sel, 'heldout'):.4f} "
                     f"| {sel[0]['docs_only']['seen']:.4f} | {sel[0]['docs_only']['heldout']:.4f} "
                     f"| {' | '.join(passes)} |")
    return "\n".join([*lines, ""])


def main() -> None:
    """Run every federation of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "gate_count.py", one_run, tables)


if __name__ == "__main__":
    main()
