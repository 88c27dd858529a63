"""Time and size federations under Flower's simulation engine at several numbers of orgs.

Each run is one ``flwr run`` (Ray simulation engine, managed SuperLink) with K
virtual organisations; the results are written after every run, so a run that
fails or times out leaves the smaller ones, and the curve's growth exponent
(least squares of log wall time on log K) is reported with the table.

Usage: ``python simulations/flower_scale.py configs/flower_scale.toml``
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np

from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.files import write_atomic
from synapse_flwr.data.pins import verified_hashes
from synapse_flwr.eval.results import (
    experiment_parser,
    load_experiment,
    update_summary,
    write_results,
)
from synapse_flwr.flower.launch import default_app_dir, read_metrics, run_simulation
from synapse_flwr.flower.processes import interrupt_on_sigterm

log = logging.getLogger("flower_scale")
ROUND_KEYS = ("round", "bytes_per_client", "vote_bytes_per_client", "bytes_out", "deltas_in", "conflicts", "epsilon",
              "seen_acc", "heldout_acc", "docs_seen_acc", "docs_heldout_acc", "wall_s")


def one_run(run: dict, run_config: dict, timeout: float) -> dict:
    """One ``flwr run`` of ``run['nodes']`` orgs: status, wall time, peak memory and the per-round records."""
    with tempfile.TemporaryDirectory(prefix="synapse-scale-") as tmp:
        out = Path(tmp) / "out"
        overrides = {**run_config, "dataset": run["dataset"], "num-rounds": run["rounds"],
                     "min-nodes": run["nodes"], "output-dir": str(out)}
        try:
            res = run_simulation(default_app_dir(), run["nodes"], overrides, Path(tmp) / "flwr", timeout=timeout)
        except SynapseError as exc:  # a run that fails or times out is reported, the others are kept
            log.error("K=%d failed: %s", run["nodes"], str(exc)[:2000])
            return {"nodes": run["nodes"], "rounds": run["rounds"], "status": f"failed: {str(exc)[:300]}"}
        rounds = read_metrics(out)
    return {
        "nodes": run["nodes"], "rounds": run["rounds"], "status": res.status, "wall_s": round(res.wall_s, 1),
        "peak_rss_bytes": res.peak_rss_bytes,
        "per_round": [{k: r.get(k) for k in ROUND_KEYS} | {"accepted": len(r["accepted"]),
                                                          "rejected": len(r["rejected"])} for r in rounds],
    }


def growth_exponent(ks: list[int], values: list[float]) -> float | None:
    """Slope of log(value) on log(K) (least squares); None with fewer than two points."""
    if len(ks) < 2:
        return None
    return float(np.polyfit(np.log(ks), np.log(values), 1)[0])


def _row(r: dict) -> str:
    per = r.get("per_round", [])
    # what a client sends in the round: its train reply, plus its vote reply in a round with a vote phase
    sent = [f"{p['bytes_per_client'] + (p.get('vote_bytes_per_client') or 0):,}" for p in per] + ["-"] * (3 - len(per))
    rss = f"{r['peak_rss_bytes'] / 2**30:.2f}" if r.get("peak_rss_bytes") else "-"
    last = per[-1] if per else {}
    acc = [f"{last[k]:.3f}" if last.get(k) is not None else "-" for k in ("seen_acc", "heldout_acc")]
    cells = [r["nodes"], r["status"][:40], r.get("wall_s", "-"), rss, *sent[:3],
             sum(p["deltas_in"] or 0 for p in per[1:]), *acc]
    return "| " + " | ".join(map(str, cells)) + " |"


def table(results: dict) -> str:
    """The Markdown table of the runs, with the growth exponents of wall time and peak memory."""
    lines = [("| K | status | wall s | peak RSS GiB | bytes/client r1 | bytes/client r2 | bytes/client r3 | "
             "deltas r2..3 | seen acc | held-out acc |"), "|" + "---|" * 10]
    runs = sorted(results.values(), key=lambda r: r["nodes"])
    lines += [_row(r) for r in runs]
    done = [r for r in runs if r["status"] == "finished:completed"]
    ks = [r["nodes"] for r in done]
    wall = growth_exponent(ks, [r["wall_s"] for r in done])
    if wall is not None:
        rss = growth_exponent(ks, [r["peak_rss_bytes"] for r in done])
        lines += ["", (f"Growth exponents over K = {ks} (least squares on log-log): "
                      f"wall time K^{wall:.2f}, peak RSS K^{rss:.2f}.")]
    return "\n".join(lines) + "\n"


def summary_keys(results: dict) -> dict:
    """The ``sim_k<K>_*`` keys of ``docs/results/perf/summary.json`` for the completed runs of K = 100 and 200."""
    keys = {}
    for r in results.values():
        if r["status"] == "finished:completed" and r["nodes"] in (100, 200):
            keys[f"sim_k{r['nodes']}_wall_s"] = r["wall_s"]
            if r["nodes"] == 100:
                keys["sim_k100_peak_rss_bytes"] = r["peak_rss_bytes"]
    return keys


def main() -> None:
    """Run every federation size of the config; a SIGTERM stops it as Ctrl-C does (Flower processes torn down)."""
    interrupt_on_sigterm()
    parser = experiment_parser(__doc__)
    args = parser.parse_args()
    cfg = load_experiment(args.config)
    out_dir, command = Path(cfg["output"]), f"python simulations/flower_scale.py {args.config}"
    data = verified_hashes(run["dataset"] for run in cfg["runs"])
    results: dict = {}
    for run in cfg["runs"]:
        key = f"{run['dataset']}_k{run['nodes']}"
        results[key] = one_run(run, cfg["run_config"], float(cfg.get("timeout_s", 1800)))
        log.info("%s: %s", key, {k: v for k, v in results[key].items() if k != "per_round"})
        write_results(out_dir, results, cfg, data, command)
        write_atomic(out_dir / "results.md", table(results))
        if cfg.get("summary"):
            update_summary(Path(cfg["summary"]), summary_keys(results))


if __name__ == "__main__":
    main()
