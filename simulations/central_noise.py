"""What noise added once to the organisations' sum would buy (a lab: secure aggregation is not built).

Each organisation noises its own release, so a tool's merged prototype
carries ``K`` organisations' noise for the same records (``docs/results/
tuning/gate_lab.md``, "the noise floor, counted"). Under secure aggregation
(the server sees only the sum) each organisation could add ``sigma /
sqrt(K)`` and the sum would carry ``sigma`` once, the noise of one central
release at the same epsilon. Emulated here by building every organisation
at the epsilon whose calibrated sigma is ``sigma(epsilon) / sqrt(K)`` (the
merged global then has exactly the noise distributed DP would give it);
the shipped product noises locally. One release per organisation, the
shipped router (``fields``, default fusion, no votes): seen / held-out top-1
beside docs_only, the product's local noise and no noise.

Usage: ``python simulations/central_noise.py configs/central_noise.toml``
"""

from __future__ import annotations

import logging
import math

from synapse_flwr.simulations.tune_router import accuracy, draw_global

from synapse_flwr.core.builder import BuildConfig
from synapse_flwr.core.embed import Embedder
from synapse_flwr.core.privacy import calibrate
from synapse_flwr.core.router import Router
from synapse_flwr.data.federation import FederatedDataset, load_federated
from synapse_flwr.eval.results import group_rows, mean_of, run_lab

log = logging.getLogger("central_noise")


def sigma_at(epsilon: float, delta: float) -> float:
    """The sigma a one-release private build with prototypes calibrates at ``epsilon``."""
    config = BuildConfig()
    params = config.resolved(True, True).privacy_params(epsilon, delta, 1, config.prototype_weight)
    return calibrate(params).sigma


def epsilon_for_sigma(target: float, delta: float) -> float:
    """The epsilon whose calibrated sigma is ``target`` (bisection on log epsilon; sigma falls as epsilon grows)."""
    lo, hi = math.log(1e-3), math.log(1e4)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sigma_at(math.exp(mid), delta) > target else (lo, mid)
    return math.exp(hi)


def global_top1(ds: FederatedDataset, epsilon: float, draw: int, cfg: dict, emb: Embedder) -> dict:
    """Seen / held-out top-1 of the merged global of every organisation's one release at ``epsilon``."""
    return accuracy(Router(draw_global(ds, epsilon, draw, cfg, emb), ds.catalog, embedder=emb), ds)


def one_run(run: dict, cfg: dict, emb: Embedder) -> list[dict]:
    """Every noise draw of one federation: local noise (the product) and noise once on the sum."""
    ds = load_federated(run["dataset"], run["orgs"], cfg["seed"])
    eps = run["epsilon"]
    local_eps = epsilon_for_sigma(sigma_at(eps, cfg["delta"]) / math.sqrt(len(ds.orgs)), cfg["delta"])
    base = {"dataset": run["dataset"], "orgs": len(ds.orgs), "epsilon": eps, "sigma": round(sigma_at(eps, cfg["delta"]), 4),
            "per_org_epsilon": round(local_eps, 4), "docs_only": accuracy(Router(None, ds.catalog, embedder=emb), ds),
            "no_noise": global_top1(ds, math.inf, 0, cfg, emb)}
    rows = []
    for draw in run["draws"]:
        row = {**base, "draw": draw, "local": global_top1(ds, eps, draw, cfg, emb),
               "central": global_top1(ds, local_eps, draw, cfg, emb)}
        log.info("%s", row)
        rows.append(row)
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Mean seen / held-out top-1 over draws per federation and noise placement."""
    lines = [(f"# Noise once on the sum (secure aggregation, emulated) vs each organisation's own, seed-{cfg['seed']}"
             " dev split"), "", ("Mean over noise draws. `central`: every organisation built at `per-org epsilon`, whose "
             "sigma is sigma(epsilon) / sqrt(K), so the merged global carries sigma once."), "",
             "| dataset | orgs | epsilon | per-org epsilon | draws | noise | seen | held-out |", "|---|---|---|---|---|---|---|---|"]
    for (dataset, orgs, eps), sel in group_rows(rows, "dataset", "orgs", "epsilon").items():
        for noise in ("docs_only", "local", "central", "no_noise"):
            seen, held = mean_of(sel, "seen", noise), mean_of(sel, "heldout", noise)
            lines.append(f"| {dataset} | {orgs} | {eps} | {sel[0]['per_org_epsilon']} | {len(sel)} | {noise} "
                         f"| {seen:.4f} | {held:.4f} |")
    return "\n".join([*lines, ""])


def main() -> None:
    """Run every federation of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "central_noise.py", one_run, tables)


if __name__ == "__main__":
    main()
