"""Choose the fedavg_dp baseline's training settings on the seed-7 dev split.

In process, no Flower: each grid point is one FedAvg + DP-SGD run of
:mod:`synapse_flwr.flower.fedavg_dp` through
:func:`~synapse_flwr.flower.fedavg_dp.run_in_process` (the ServerApp's
schedule: every organisation trains every round, heads averaged by example
count), at the committed budget (``epsilon``, ``delta`` per organisation over
all rounds). Points are ranked by the mean of seen and held-out top-1 on the
dev seed; the best is what ``configs/metatool.toml`` and the epsilon sweep
train with. The reported seeds are never used here.

Usage: ``python simulations/tune_fedavg.py configs/tune_fedavg.toml``
"""

from __future__ import annotations

import itertools
import logging
import math
import sys
import tomllib
from pathlib import Path

from synapse_flwr.simulations.experiment import data_hashes

from synapse_flwr.core.embed import Embedder, get_embedder
from synapse_flwr.core.files import write_atomic
from synapse_flwr.data.federation import FederatedDataset, load_federated
from synapse_flwr.eval.baselines import fedavg_job, fedavg_results
from synapse_flwr.eval.results import experiment_parser, load_experiment, write_results
from synapse_flwr.flower.fedavg_dp import TrainSettings, run_in_process

log = logging.getLogger("tune_fedavg")
GRID_KEYS = ("learning_rate", "local_epochs", "max_grad_norm", "batch_size", "temperature")


def fedavg_point(ds: FederatedDataset, settings: dict, epsilon: float, delta: float, rounds: int,
                 embedder: Embedder, seed: int) -> dict:
    """Seen and held-out top-1 of one fedavg_dp run, and the epsilon it spent."""
    train = TrainSettings(settings["batch_size"], settings["local_epochs"], settings["learning_rate"],
                          settings["max_grad_norm"], settings["temperature"], delta, seed)
    job = fedavg_job([ds.orgs[o] for o in sorted(ds.orgs)], ds.catalog,
                     {"test": ds.seen_test, "heldout": ds.heldout_test}, embedder, train, epsilon, rounds)
    outcome = run_in_process(job)
    res = fedavg_results(outcome, job, ["heldout"], 0.0)
    return {"seen": round(res["acc"], 4), "heldout": round(res["extra"]["heldout"]["acc"], 4),
            "epsilon_spent": round(res["epsilon_spent"], 4) if math.isfinite(res["epsilon_spent"]) else "inf"}


def tables(rows: list[dict], best: dict, cfg: dict) -> str:
    """The grid and the chosen point as markdown."""
    cols = [*GRID_KEYS, "seen", "heldout", "epsilon_spent"]
    lines = [f"# fedavg_dp tuning (seed-{cfg['dev_seed']} dev split, epsilon {cfg['epsilon']:g}, "
             f"{cfg['rounds']} rounds, K={cfg['orgs']})", "",
             "Ranked by the mean of seen and held-out top-1. In process (the ServerApp's FedAvg schedule "
             "without a Flower run per point).", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    lines += ["", "Chosen: " + ", ".join(f"{k}={best[k]}" for k in GRID_KEYS), ""]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    """Run the grid on the dev seed; write results.json, manifest.json and tables.md."""
    args = experiment_parser(__doc__).parse_args(argv)
    cfg = load_experiment(args.config)
    grid = tomllib.loads(args.config.read_text())["grid"]
    ds = load_federated("metatool", cfg["orgs"], cfg["dev_seed"], cfg["alpha"], 0.0)
    emb = get_embedder(cfg["embedder"])  # cached on disk: grid points share every vector
    rows = []
    for values in itertools.product(*(grid[k] for k in GRID_KEYS)):
        point = dict(zip(GRID_KEYS, values))
        row = point | fedavg_point(ds, point, cfg["epsilon"], cfg["delta"], cfg["rounds"], emb, cfg["dev_seed"])
        log.info("%s", row)
        rows.append(row)
    best = max(rows, key=lambda r: r["seen"] + r["heldout"])
    out = Path(cfg["output"])
    write_results(out, {"grid": rows, "chosen": {k: best[k] for k in GRID_KEYS}, "chosen_row": best}, cfg,
                  data_hashes("metatool"), f"python simulations/tune_fedavg.py {args.config}")
    write_atomic(out / "tables.md", tables(rows, best, cfg))
    log.info("chosen %s", best)


if __name__ == "__main__":
    main(sys.argv[1:])
