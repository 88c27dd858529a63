"""The LLM reranker's headline figures over every report seed, side by side (issue 11's "3 seeds").

Reads the summary that :mod:`synapse_flwr.simulations.llm_bench` wrote
into each report seed's ``results.json`` (``configs/llm.toml``,
``configs/llm_seed123.toml``, ``configs/llm_seed456.toml``) and writes
``seeds.json`` and ``seeds.md`` beside the first: per seed and on the mean,
the best LLM reranker's top-1 beside retrieval order and the ``fields``
reranker on the same queries, typed minus flat render, and each model's
gain over docs_only. Nothing is routed again.

Usage: ``python simulations/llm_seeds.py docs/results/llm docs/results/llm_seed123 docs/results/llm_seed456``
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from pathlib import Path

from synapse_flwr.simulations.experiment_config import SPLITS

from synapse_flwr.core.files import write_atomic

log = logging.getLogger("llm_seeds")

#: summary key prefixes compared per split
ROWS = ("llm_top1", "retrieval_top1", "fields_top1", "typed_minus_flat_llm")


def seed_row(summary: dict) -> dict:
    """One report seed's figures from its summary: per split, and the transfer gain per model."""
    row = {f"{key}_{split}": summary.get(f"{key}_{split}") for key in ROWS for split in SPLITS}
    for split in SPLITS:
        row[f"llm_minus_retrieval_{split}"] = summary[f"llm_top1_{split}"] - summary[f"retrieval_top1_{split}"]
    row["transfer_gain_over_docs"] = summary["transfer_gain_over_docs"]
    row["llm_model"], row["n_per_split"] = summary["llm_model"], summary["n_per_split"]
    return row


def mean_row(rows: dict[str, dict]) -> dict:
    """The mean over seeds of every figure that each seed reports (a seed without a figure leaves it out)."""
    keys = [k for k, v in next(iter(rows.values())).items() if isinstance(v, float)]
    out = {k: statistics.fmean(r[k] for r in rows.values())
           for k in keys if all(r.get(k) is not None for r in rows.values())}
    models = set.intersection(*(set(r["transfer_gain_over_docs"]) for r in rows.values()))
    out["transfer_gain_over_docs"] = {m: statistics.fmean(r["transfer_gain_over_docs"][m] for r in rows.values())
                                      for m in sorted(models)}
    return out


def tables(rows: dict[str, dict], mean: dict) -> str:
    """``seeds.md``: one line per seed and the mean, each figure as seen / held-out."""
    def pair(row: dict, key: str, signed: bool = False) -> str:
        cells = [row.get(f"{key}_{s}") for s in SPLITS]
        return " / ".join("-" if c is None else (f"{c:+.3f}" if signed else f"{c:.3f}") for c in cells)

    models = sorted({m for r in rows.values() for m in r["transfer_gain_over_docs"]})
    sizes = sorted({r["n_per_split"] for r in rows.values()})
    lines = ["# The frozen-LLM reranker over the report seeds (MetaTool)", "",
             (f"Each seed's figures are its folder's summary (`summary.json`, {'/'.join(map(str, sizes))} queries per split; "
              "the best LLM reranker is the one with the best seed-7 dev top-1, at its seed-7 weight). Cells: seen / "
              "held-out top-1."), "",
             "| seed | best LLM | retrieval order | `fields` | LLM - retrieval | typed - flat (LLM) | "
             + " | ".join(f"{m} over docs_only" for m in models) + " |",
             "|---" * (6 + len(models)) + "|"]
    for seed, row in [*rows.items(), ("mean", mean)]:
        gains = " | ".join(f"{row['transfer_gain_over_docs'][m]:+.3f}" if m in row["transfer_gain_over_docs"]
                           else "-" for m in models)
        cells = [pair(row, "llm_top1"), pair(row, "retrieval_top1"), pair(row, "fields_top1"),
                 pair(row, "llm_minus_retrieval", True), pair(row, "typed_minus_flat_llm", True), gains]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Read the folders named on the command line and write ``seeds.json`` and ``seeds.md`` into the first."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="llm_bench output folders, one per report seed")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    rows = {}
    for folder in args.folders:
        results = json.loads((folder / "results.json").read_text())
        rows[str(results["config"]["report_seed"])] = seed_row(results["summary"])
    mean = mean_row(rows)
    out = args.folders[0]
    doc = {"seeds": rows, "mean": mean, "folders": [str(f) for f in args.folders]}
    write_atomic(out / "seeds.json", json.dumps(doc, indent=2, sort_keys=True) + "\n")
    write_atomic(out / "seeds.md", tables(rows, mean))
    log.info("wrote %s and %s", out / "seeds.json", out / "seeds.md")


if __name__ == "__main__":
    main()
