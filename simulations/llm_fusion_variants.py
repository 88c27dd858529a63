"""Two more LLM fusion rules, scored offline on the bench's kept rows (``tuning/unshipped.md`` 14).

On the rows ``simulations/llm_bench.py`` keeps (``docs/results/llm/rows``,
federated compendium rendered typed), per seed, mean of seen and held-out
top-1 over local/gemma3 and local/smollm2:

``plain``
    the shipped rule, :func:`~synapse_flwr.core.rerank_llm.fuse_llm` at weight ``w``;
``hard`` / ``soft``
    the LLM's standardised score added only when the best candidate's
    standing leads the second's by less than ``tau``, or with a weight
    ``w exp(-lead / tau)``;
``ensemble``
    the mean of both models' standardised scores, fused at ``w``.

Choose on seed 7 (the dev split) only. No LLM runs: the rows must exist.

Usage: ``python simulations/llm_fusion_variants.py [--rows docs/results/llm/rows] [--seeds 7]``
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np
from synapse_flwr.simulations.llm_bench import rows_path

from synapse_flwr.core.rerank_llm import fuse_llm, standardise

log = logging.getLogger("llm_fusion_variants")
MODELS = ("local/gemma3", "local/smollm2")
SPLITS = ("seen", "heldout")
GRID = ([("plain", w, 0.0) for w in (0.0, 0.25, 0.5, 1.0)]
        + [(mode, w, t) for mode in ("hard", "soft") for w in (0.5, 1.0, 2.0, 4.0) for t in (0.25, 0.5, 1.0)])


def pick(row: dict, llm: np.ndarray, mode: str, w: float, tau: float) -> str:
    """The tool one rule picks for one kept row (``llm``: the raw LLM scores it fuses)."""
    ret, docs = np.array(row["retrieval"]), np.array(row["docs"])
    standing = fuse_llm(ret, docs, np.zeros_like(ret), 0.0)
    lead = float(np.subtract(*np.sort(standing)[::-1][:2])) if len(standing) > 1 else np.inf
    weight = {"plain": w, "hard": w if lead < tau else 0.0, "soft": w * np.exp(-lead / tau) if tau else 0.0}[mode]
    return row["ids"][int(np.argmax(standing + weight * standardise(llm)))]


def top1(rows: list[dict], scores: list[np.ndarray], mode: str, w: float, tau: float) -> float:
    return float(np.mean([pick(r, s, mode, w, tau) in r["gold"] for r, s in zip(rows, scores)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=Path, default=Path("docs/results/llm/rows"), help="the bench's rows folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=[7], help="seeds whose rows to score (7: dev)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for seed in args.seeds:
        kept = {m: json.loads(rows_path(args.rows, m, "federated/typed", seed).read_text()) for m in MODELS}
        rows = {s: kept[MODELS[0]][s]["rows"] for s in SPLITS}
        for s in SPLITS:  # both models scored the same queries and candidates
            assert all(a["ids"] == b["ids"] for a, b in zip(rows[s], kept[MODELS[1]][s]["rows"]))
        raw = {(m, s): [np.array(r["llm"], float) for r in kept[m][s]["rows"]] for m in MODELS for s in SPLITS}
        for mode, w, tau in GRID:
            vals = [top1(rows[s], raw[m, s], mode, w, tau) for m in MODELS for s in SPLITS]
            log.info("seed %d %-5s w=%-4g tau=%-4g mean %.4f  gemma3 %.3f / %.3f  smollm2 %.3f / %.3f",
                     seed, mode, w, tau, np.mean(vals), *vals)
        for w in (0.25, 0.5, 0.75, 1.0):  # the mean of both models' standardised scores, halved as a weight
            both = {s: [(standardise(a) + standardise(b)) / 2 for a, b in zip(raw[MODELS[0], s], raw[MODELS[1], s])]
                    for s in SPLITS}
            vals = [float(np.mean([r["ids"][int(np.argmax(fuse_llm(np.array(r["retrieval"]), np.array(r["docs"]),
                                                                    np.zeros(len(z)), 0.0) + w * z))] in r["gold"]
                                   for r, z in zip(rows[s], both[s])])) for s in SPLITS]
            log.info("seed %d ensemble w=%-4g mean %.4f  %.3f / %.3f", seed, w, np.mean(vals), *vals)


if __name__ == "__main__":
    main()
