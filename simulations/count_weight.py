"""Counts released at a weight of their own, so a count-weighted merge can trust them (a lab: not shipped).

A private record adds ``c * u`` (``c`` = 8) to one tool's prototype sum and
1 to its count in the same Gaussian release, so the count carries the full
``sigma`` (9.27 records per organisation at epsilon 4) and the sum
``sigma / c`` per coordinate. ``tuning/merge_weights/`` found a merge that
weights each organisation's prototype by its released count held back by
that noise. Here the count gets its own weight ``c_n``: the record's
squared sensitivity becomes ``m + c^2 + c_n^2`` (today ``c_n`` = 1 and
``m + c^2 + 1`` = 69 at MetaTool's build), every field's noise grows by
``sqrt((68 + c_n^2) / 69)``, and the count's noise falls to ``sigma' / c_n``. Emulated from each organisation's exact sums and
counts (a build without noise) with that noise drawn here; the rest of the
global (documentation, statistics) is the product's epsilon-4 global of the
same draw. The router reads prototypes through the shipped gate (length,
count and documentation tests; this lab was first measured, 2026-12-03,
with the length test alone), ``fields`` reranker, no votes: seen / held-out top-1 of the
plain sum and of the count-weighted merge
(:func:`~synapse_flwr.simulations.merge_weights.weighted_merge`, rule
``count``), beside docs_only and the product, and per global the held-out
tools (no records anywhere) whose noise the gate reads with the length test
alone and with the count test at 1 SD as well.

Usage: ``python simulations/count_weight.py configs/count_weight.toml``
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict

import numpy as np
from synapse_flwr.simulations.merge_weights import with_merged
from synapse_flwr.simulations.tune_router import accuracy

from synapse_flwr.core.builder import BuildConfig, build_compendium, derive_seed
from synapse_flwr.core.embed import Embedder
from synapse_flwr.core.fusion import Fusion
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.prototypes import (
    decode_prototype,
    encode_prototype,
    prototype_sensitivity,
    readable,
)
from synapse_flwr.core.router import Router
from synapse_flwr.core.schema import Compendium, Prototype
from synapse_flwr.data.federation import FederatedDataset, load_federated
from synapse_flwr.eval.results import group_rows, mean_of, run_lab

log = logging.getLogger("count_weight")
#: The shipped gate, which routes every arm here.
GATE = Fusion()


def today_sensitivity2() -> float:
    """Squared sensitivity of one record in today's private build with prototypes (count weight 1)."""
    config = BuildConfig()
    params = config.resolved(True, True).privacy_params(4.0, 1e-5, 1, config.prototype_weight)
    return prototype_sensitivity(params.max_contributions, config.prototype_weight, params.prototypes_per_record) ** 2


def noised(exact: Prototype | None, dim: int, sum_sd: float, count_sd: float, rng: np.random.Generator) -> Prototype:
    """One organisation's released prototype: its exact sum and count plus noise of these SDs.

    ``exact`` None: a tool the organisation has no record of (its release is noise alone).
    """
    x = decode_prototype(exact) if exact is not None else np.zeros(dim)
    count = exact.count if exact is not None else 0.0
    return encode_prototype(x + rng.normal(0.0, sum_sd, size=x.shape), count + rng.normal(0.0, count_sd),
                            sum_sd, count_sd)


def routed(glob: Compendium, ds: FederatedDataset, emb: Embedder) -> dict:
    """Top-1 through the shipped gate, and the held-out tools the length test reads alone and with 1 count SD."""
    held = [e.tool_id in {g for t in ds.heldout_test for g in t.gold} for e in glob.tools]
    protos = [e.prototype for e in glob.tools]
    return {**accuracy(Router(glob, ds.catalog, embedder=emb, fusion=GATE), ds),
            "heldout_read": [sum(r and h for r, h in zip(readable(protos, GATE.gate_alpha, s), held))
                             for s in (0.0, 1.0)]}


def one_draw(ds: FederatedDataset, exact: dict, run: dict, cfg: dict, emb: Embedder, draw: int) -> dict:
    """Product, and plain / count-weighted merges at every count weight, for one noise draw."""
    arts = [build_compendium(evs, ds.catalog, org, round_=draw, epsilon=run["epsilon"], delta=cfg["delta"], rounds=1,
                             seed=cfg["seed"], embedder=emb) for org, evs in sorted(ds.orgs.items())]
    product = merge_typed(arts)
    some = next(e.prototype for e in arts[0].tools if e.prototype is not None)
    sigma, c = some.count_sd, some.count_sd / some.sum_sd
    row = {"draw": draw, "sigma": round(sigma, 4), "c": round(c, 4), "product": routed(product, ds, emb)}
    today = today_sensitivity2()
    for c_n in cfg["count_weights"]:
        grown = sigma * math.sqrt((today - 1.0 + c_n**2) / today)  # every field's noise at count weight c_n
        per: dict[str, list[Prototype]] = defaultdict(list)
        for org, protos in sorted(exact.items()):
            rng = np.random.default_rng(derive_seed(cfg["seed"], draw, org, c_n, "count_weight"))
            for tool in ds.catalog.ids:  # privately every tool is released, records or not
                per[tool].append(noised(protos.get(tool), some.dim, grown / c, grown / c_n, rng))
        for merge in ("plain", "count"):
            row[f"{merge}@{c_n:g}"] = routed(with_merged(product, per, merge), ds, emb)
    return row


def one_run(run: dict, cfg: dict, emb: Embedder) -> list[dict]:
    """Every noise draw of one federation."""
    ds = load_federated(run["dataset"], run["orgs"], cfg["seed"])
    exact = {org: {e.tool_id: e.prototype for e in build_compendium(
        evs, ds.catalog, org, seed=cfg["seed"], embedder=emb, config=BuildConfig(phrases=False), epsilon=math.inf).tools
        if e.prototype is not None} for org, evs in sorted(ds.orgs.items())}
    docs = accuracy(Router(None, ds.catalog, embedder=emb), ds)
    rows = []
    for draw in run["draws"]:
        row = {"dataset": run["dataset"], "orgs": len(ds.orgs), "epsilon": run["epsilon"], "docs_only": docs,
               **one_draw(ds, exact, run, cfg, emb, draw)}
        log.info("%s", row)
        rows.append(row)
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Mean seen / held-out top-1 over draws per federation, count weight and merge."""
    lines = [f"# Counts at a weight of their own, seed-{cfg['seed']} dev split", "",
             ("Mean over noise draws, routed through the shipped gate (length, count and documentation tests). "
              "`plain@c_n` / `count@c_n`: prototypes released with count weight c_n (1 is today's), summed or "
              "count-weighted; `product`: the shipped global of the same draw. Held-out tools read: per draw, "
              "tools without experience whose noise the gate reads with the length test alone / with the count "
              "test at 1 SD as well."), "",
             "| dataset | orgs | epsilon | draws | arm | seen | held-out | seen - product | held-out tools read |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (dataset, orgs, eps), sel in group_rows(rows, "dataset", "orgs", "epsilon").items():
        product = mean_of(sel, "seen", "product")
        for arm in [k for k in sel[0] if isinstance(sel[0][k], dict)]:
            seen, held = mean_of(sel, "seen", arm), mean_of(sel, "heldout", arm)
            read = ", ".join("/".join(map(str, r[arm]["heldout_read"])) for r in sel if "heldout_read" in r[arm])
            lines.append(f"| {dataset} | {orgs} | {eps} | {len(sel)} | {arm} | {seen:.4f} | {held:.4f} "
                         f"| {seen - product:+.4f} | {read} |")
    return "\n".join([*lines, ""])


def main() -> None:
    """Run every federation of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "count_weight.py", one_run, tables)


if __name__ == "__main__":
    main()
