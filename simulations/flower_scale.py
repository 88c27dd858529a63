"""Time and size federations under Flower's simulation engine at several numbers of orgs.

Usage: ``python simulations/flower_scale.py configs/flower_scale.toml``
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from synapse_flwr.data.pins import verified_hashes
from synapse_flwr.eval.results import experiment_parser, load_experiment, write_results
from synapse_flwr.flower.launch import default_app_dir, read_metrics, run_simulation

log = logging.getLogger("flower_scale")


def main() -> None:
    parser = experiment_parser(__doc__)
    args = parser.parse_args()
    cfg = load_experiment(args.config)
    results = {}
    for run in cfg["runs"]:
        key = f"{run['dataset']}_k{run['nodes']}"
        with tempfile.TemporaryDirectory(prefix="synapse-scale-") as tmp:
            out = Path(tmp) / "out"
            overrides = {**cfg["run_config"], "dataset": run["dataset"], "num-rounds": run["rounds"],
                         "min-nodes": run["nodes"], "output-dir": str(out)}
            res = run_simulation(default_app_dir(), run["nodes"], overrides, Path(tmp) / "flwr", timeout=1800)
            rounds = read_metrics(out)
        results[key] = {
            "nodes": run["nodes"], "rounds": run["rounds"], "status": res.status,
            "wall_s": round(res.wall_s, 1), "peak_rss_mb": round(res.peak_rss_bytes / 2**20),
            "per_round": [{k: r.get(k) for k in ("round", "bytes_per_client", "bytes_out", "conflicts",
                                                   "epsilon", "seen_acc", "heldout_acc", "wall_s")}
                          | {"accepted": len(r["accepted"]), "rejected": len(r["rejected"])}
                          for r in rounds],
        }
        log.info("%s: %s", key, results[key])
    data = verified_hashes(run["dataset"] for run in cfg["runs"])
    write_results(Path(cfg["output"]), results, cfg, data, f"python simulations/flower_scale.py {args.config}")


if __name__ == "__main__":
    main()
