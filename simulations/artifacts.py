"""Measure artifact sizes and build/merge times on a real dataset split over K orgs.

Usage: ``python simulations/artifacts.py configs/artifacts.toml``
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.merge import POLICIES, merge
from synapse_flwr.core.wire import encode
from synapse_flwr.data.pins import verified_hashes
from synapse_flwr.data.federation import load_federated
from synapse_flwr.eval.results import experiment_parser, load_experiment, write_results

log = logging.getLogger("artifacts")


def measure(cfg: dict) -> dict:
    """Build every org's artifact per epsilon, then merge with every policy; time and size all."""
    ds = load_federated(cfg["dataset"], cfg["orgs"], cfg["seed"], cfg["alpha"])
    out: dict = {"orgs": cfg["orgs"], "events": {o: len(e) for o, e in ds.orgs.items()},
                 "tools": len(ds.catalog), "by_epsilon": {}}
    for eps in cfg["epsilons"]:
        arts, builds = [], []
        for org, events in sorted(ds.orgs.items()):
            t0 = time.perf_counter()
            arts.append(build_compendium(events, ds.catalog, org, round_=1, epsilon=eps,
                                         delta=cfg["delta"], rounds=cfg["rounds"], seed=cfg["seed"]))
            builds.append(time.perf_counter() - t0)
        raw = [len(encode(a, compress=False)) for a in arts]
        packed = [len(encode(a)) for a in arts]
        merges = {}
        for policy in POLICIES:
            t0 = time.perf_counter()
            g = merge(arts, policy)
            merges[policy] = {"seconds": round(time.perf_counter() - t0, 3),
                              "bytes_raw": len(encode(g, compress=False)), "bytes_gzip": len(encode(g)),
                              "conflicts": len(getattr(g, "conflicts", []))}
        key = "inf" if eps == float("inf") else str(eps)
        out["by_epsilon"][key] = {
            "bytes_raw_per_org": raw, "bytes_gzip_per_org": packed,
            "bytes_raw_mean": statistics.mean(raw), "bytes_gzip_mean": statistics.mean(packed),
            "build_seconds_per_org": [round(b, 3) for b in builds],
            "scenarios_per_org": [sum(len(t.when) + len(t.when_not) for t in a.tools) for a in arts],
            "epsilon_spent_round1": arts[0].privacy.epsilon, "merge": merges,
        }
        log.info("epsilon %s: %.0f bytes raw, %.0f gzip per org; merges %s", key,
                 statistics.mean(raw), statistics.mean(packed), merges)
    return out


def main() -> None:
    parser = experiment_parser(__doc__)
    args = parser.parse_args()
    cfg = load_experiment(args.config)
    results = measure(cfg)
    data = verified_hashes([cfg["dataset"]])
    write_results(Path(cfg["output"]), results, cfg, data, f"python simulations/artifacts.py {args.config}")


if __name__ == "__main__":
    main()
