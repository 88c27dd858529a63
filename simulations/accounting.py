"""Exact Gaussian accounting against opacus' RDP bound: the noise each asks for, and what it buys in routing.

The same releases (one per record, the builder's default contribution bound)
are calibrated twice: with the exact GDP curve the builder uses
(:func:`~synapse_flwr.core.privacy.gaussian_noise_multiplier`) and with
opacus' RDP accountant (:func:`~synapse_flwr.core.privacy.noise_multiplier_for`,
sample rate 1, what the builder used before). Each federation (K orgs, one
release each, merged typed) is built under both at the same noise draws and
routed with the ``fields`` reranker on its seen and held-out test queries,
beside docs_only. Same draws, so the difference is paired.

Usage: ``python simulations/accounting.py configs/accounting.toml``
"""

from __future__ import annotations

import logging
from statistics import mean
from unittest.mock import patch

from synapse_flwr.simulations.tune_router import accuracy

from synapse_flwr.core import privacy
from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.router import Router
from synapse_flwr.data.federation import load_federated
from synapse_flwr.eval.results import paired, run_lab

log = logging.getLogger("accounting")
ACCOUNTANTS = ("exact", "rdp")


def rdp_multiplier(epsilon: float, delta: float, releases: int) -> float:
    """opacus' RDP calibration of ``releases`` full-data Gaussian releases (the builder's former one)."""
    return privacy.noise_multiplier_for(epsilon, delta, 1.0, releases)


def one_run(run: dict, cfg: dict, emb) -> list[dict]:
    """Every draw x accountant of one (dataset, orgs, epsilon) federation, with the docs_only line."""
    ds = load_federated(run["dataset"], run["orgs"], cfg["seed"])
    docs = accuracy(Router(None, ds.catalog, embedder=emb), ds)
    rows = []
    for accountant in ACCOUNTANTS:
        multiplier = privacy.gaussian_noise_multiplier if accountant == "exact" else rdp_multiplier
        privacy.calibrate.cache_clear()
        with patch.object(privacy, "gaussian_noise_multiplier", multiplier):
            for draw in run["draws"]:
                arts = [build_compendium(ev, ds.catalog, org, round_=draw, epsilon=run["epsilon"],
                                         delta=cfg["delta"], rounds=1, seed=cfg["seed"], embedder=emb)
                        for org, ev in sorted(ds.orgs.items())]
                acc = accuracy(Router(merge_typed(arts), ds.catalog, embedder=emb), ds)
                row = {"dataset": run["dataset"], "orgs": run["orgs"], "epsilon": run["epsilon"],
                       "accountant": accountant, "draw": draw, "z": arts[0].privacy.noise_multiplier,
                       "sigma": arts[0].privacy.sigma, **acc, "docs_seen": docs["seen"],
                       "docs_heldout": docs["heldout"]}
                log.info("%s", row)
                rows.append(row)
    privacy.calibrate.cache_clear()
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Markdown: z, sigma and top-1 (mean over draws) per federation and accountant, and the paired gain."""
    lines = [f"# Exact accounting vs opacus' RDP bound (seed {cfg['seed']}, fields reranker)", "",
             "| dataset | orgs | epsilon | accountant | z | sigma | seen | held-out | docs seen | docs held-out |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["dataset"], r["orgs"], r["epsilon"]) for r in rows}, key=str)
    gains = []
    for key in keys:
        group = {a: [r for r in rows if (r["dataset"], r["orgs"], r["epsilon"]) == key and r["accountant"] == a]
                 for a in ACCOUNTANTS}
        for a, rs in group.items():
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {a} | {rs[0]['z']:.3f} | {rs[0]['sigma']:.2f} | "
                         f"{mean(r['seen'] for r in rs):.4f} | {mean(r['heldout'] for r in rs):.4f} | "
                         f"{rs[0]['docs_seen']:.4f} | {rs[0]['docs_heldout']:.4f} |")
        gains.append(f"- {key[0]} K={key[1]} epsilon {key[2]}: exact - rdp seen top-1 per draw "
                     f"{paired(group['exact'], group['rdp'])}; noise "
                     f"{group['rdp'][0]['z'] / group['exact'][0]['z'] - 1:+.1%} under RDP")
    return "\n".join([*lines, "", "Paired by draw (same noise seeds):", "", *gains]) + "\n"


def main() -> None:
    """Run every federation of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "accounting.py", one_run, tables)


if __name__ == "__main__":
    main()
