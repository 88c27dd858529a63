"""Count- and energy-weighted prototype merges against the plain sum, on the seed-7 dev split (a lab: not shipped).

The typed merge sums the organisations' prototypes of a tool, so its noise
grows as ``sqrt(K)`` while its signal sits in the few organisations that use
the tool (Dirichlet 0.5). A matched filter weights each organisation's
prototype by its released count ``n_k`` (clipped at 0; ``count_sd``: only
counts above one count SD, others weight 0), rescaled so the merged sum
stays in units of queries. ``energy`` weights it by its own noise-corrected
length ``A_k`` instead (post-processing of the sum alone: its 384
coordinates estimate ``n_k |mu|`` far better than one count with the full
``sigma``); ``energy_k1`` / ``energy_k4`` shrink that weight toward 1 by the
noise's length (``A_k / (A_k + kappa sd_k sqrt(dim))``), so without noise
they are the plain sum. The noise SD of the weighted sum is
``sqrt(sum w_k^2 sd_k^2)``, so the router's gate and shrinkage stay
calibrated (the counts' noise is drawn apart from the sums', and weighting
released values is post-processing). One release per organisation, the
shipped router (``fields``, default fusion, no votes), seen / held-out
top-1 beside docs_only and the plain sum of the same noise draw.

Usage: ``python simulations/merge_weights.py configs/merge_weights.toml``
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict

import numpy as np
from synapse_flwr.simulations.tune_router import accuracy

from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.embed import Embedder
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.prototypes import (
    decode_prototype,
    encode_prototype,
    merge_prototypes,
    signal_energy,
)
from synapse_flwr.core.router import Router
from synapse_flwr.core.schema import Compendium, Prototype
from synapse_flwr.data.federation import load_federated
from synapse_flwr.eval.results import group_rows, mean_of, run_lab

log = logging.getLogger("merge_weights")
RULES = ("count", "count_sd", "energy", "energy_k1", "energy_k4")


def weighted_merge(protos: list[Prototype], rule: str) -> Prototype:
    """The weighted sum of one tool's prototypes: weights from the released counts, or (``energy``) from
    each sum's own noise-corrected length ``A_k`` (:func:`signal_energy`), the matched filter's ``n_k |mu|``
    read off all ``dim`` coordinates at once instead of off one count."""
    n = np.array([max(p.count, 0.0) for p in protos])
    if rule.startswith("energy"):
        amp = np.array([math.sqrt(max(signal_energy(p)[0], 0.0)) for p in protos])
        if rule != "energy":  # shrunk toward 1 by the noise's length: the plain sum without noise
            kappa = float(rule.removeprefix("energy_k"))
            reach = np.array([kappa * p.sum_sd * math.sqrt(decode_prototype(p).size) for p in protos])
            amp = np.where(amp + reach > 0, amp / np.maximum(amp + reach, 1e-12), 1.0)
        w = amp * amp.sum() / (amp * amp).sum() if (amp * amp).sum() > 0 else np.ones_like(n)
    else:
        w = n if rule == "count" else np.where(n > np.array([p.count_sd for p in protos]), n, 0.0)
        if (w * n).sum() <= 0:
            w = np.ones_like(n)  # no count above noise: the plain sum
        else:
            w = w * n.sum() / (w * n).sum()  # sum_k w_k n_k = sum_k n_k: still in units of queries
    total = np.sum([wk * decode_prototype(p) for wk, p in zip(w, protos)], axis=0)
    return encode_prototype(total, float(n.sum()), math.sqrt(float(np.sum(w**2 * np.array([p.sum_sd for p in protos])**2))),
                            math.sqrt(math.fsum(p.count_sd**2 for p in protos)))


def per_tool(arts: list[Compendium]) -> dict[str, list[Prototype]]:
    """Each tool's prototypes across the artifacts."""
    per: dict[str, list[Prototype]] = defaultdict(list)
    for a in arts:
        for e in a.tools:
            if e.prototype is not None:
                per[e.tool_id].append(e.prototype)
    return per


def with_merged(glob: Compendium, per: dict[str, list[Prototype]], rule: str) -> Compendium:
    """``glob`` with every tool's prototype merged from ``per``: ``plain`` summed, else :func:`weighted_merge`."""
    tools = [e.model_copy(update={"prototype": merge_prototypes(per[e.tool_id]) if rule == "plain"
                                  else weighted_merge(per[e.tool_id], rule)}) if per.get(e.tool_id) else e
             for e in glob.tools]
    return glob.model_copy(update={"tools": tools})


def one_run(run: dict, cfg: dict, emb: Embedder) -> list[dict]:
    """Every noise draw of one federation: plain sum and each weighting rule, beside docs_only."""
    ds = load_federated(run["dataset"], run["orgs"], cfg["seed"])
    docs = accuracy(Router(None, ds.catalog, embedder=emb), ds)
    rows = []
    for draw in run["draws"]:
        arts = [build_compendium(evs, ds.catalog, org, round_=draw, epsilon=run["epsilon"], delta=cfg["delta"],
                                 rounds=1, seed=cfg["seed"], embedder=emb) for org, evs in sorted(ds.orgs.items())]
        glob, per = merge_typed(arts), per_tool(arts)
        row = {"dataset": run["dataset"], "orgs": run["orgs"], "epsilon": run["epsilon"], "draw": draw,
               "docs_only": docs, "plain": accuracy(Router(glob, ds.catalog, embedder=emb), ds)}
        for rule in RULES:
            row[rule] = accuracy(Router(with_merged(glob, per, rule), ds.catalog, embedder=emb), ds)
        log.info("%s", row)
        rows.append(row)
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Mean seen / held-out top-1 over draws per federation and merge."""
    lines = [f"# Count-weighted prototype merge, seed-{cfg['seed']} dev split", "",
             "Mean over noise draws; the last column lists each draw's seen top-1. docs_only beside.", "",
             "| dataset | orgs | epsilon | draws | merge | seen | held-out | seen - plain | per draw (seen) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (dataset, orgs, eps), sel in group_rows(rows, "dataset", "orgs", "epsilon").items():
        plain = mean_of(sel, "seen", "plain")
        for merge in ("docs_only", "plain", *RULES):
            seen, held = mean_of(sel, "seen", merge), mean_of(sel, "heldout", merge)
            per = ", ".join(f"{r[merge]['seen']:.4f}" for r in sel)
            lines.append(f"| {dataset} | {orgs} | {eps} | {len(sel)} | {merge} | {seen:.4f} | {held:.4f} "
                         f"| {seen - plain:+.4f} | {per} |")
    return "\n".join([*lines, ""])


def main() -> None:
    """Run every federation of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "merge_weights.py", one_run, tables)


if __name__ == "__main__":
    main()
