"""The LLM reranker's fusion rule and per-model weight (``rerank_llm.fuse_llm``, ``rerank_llm.LLM_WEIGHTS``).

Per model, seed and arm (the federated compendium and docs_only, both
rendered typed), the sampled test queries are routed once by the LLM
reranker and each query's candidates kept with their retrieval,
documentation and raw LLM scores (kept in ``rows``, the bench's
``docs/results/llm/rows``: the costly part, reused when present). Every
rule and weight is then scored offline on those rows:

``retrieval``
    the LLM fused with the candidates' retrieval scores alone (the rule
    before 2026-12-03: ``fuse_llm`` with the documentation scores set to
    retrieval's);
``standing``
    the shipped :func:`~synapse_flwr.core.rerank_llm.fuse_llm`: a candidate
    without experience for the query stands at the better of its retrieval
    and documentation scores, one with experience at retrieval's.

Each model's weight is the one that maximises the mean of seen and
held-out top-1 of the federated arm on ``dev_seed`` under ``standing``;
other seeds are reported, never used to choose. The samples are
:func:`~synapse_flwr.simulations.llm_bench.sample`'s, as in
``simulations/llm_bench.py``.

Usage: ``python simulations/llm_fusion.py configs/llm_fusion.toml``
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from synapse_flwr.simulations.experiment import data_hashes
from synapse_flwr.simulations.llm_bench import cached_rows, rows_path, sample
from synapse_flwr.simulations.llm_bench import top1 as bench_top1
from synapse_flwr.simulations.tune_router import dataset, global_compendium

from synapse_flwr.core.builder import PROTOTYPE_WEIGHT
from synapse_flwr.core.embed import get_embedder
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.router import Router
from synapse_flwr.eval.results import experiment_parser, load_experiment, write_results

log = logging.getLogger("llm_fusion")
RULES = ("retrieval", "standing")
SPLITS = ("seen", "heldout")


def rows_for(cfg: dict, emb, model: str, seed: int, arm: str, built: tuple) -> dict[str, list[dict]]:
    """Per split, each sampled query's candidates with retrieval, documentation and raw LLM scores.

    ``built`` is the seed's dataset and federated global (:func:`build`).
    Kept with the bench's rows (``cfg["rows"]``): the same compendium and samples.
    """
    ds, comp = built
    router = Router(comp if arm == "federated" else None, ds.catalog, embedder=emb, reranker="llm", k=cfg["k"],
                    model=model)
    tests = (ds.seen_test, ds.heldout_test)
    picked = {split: sample(items, cfg["n_per_split"], seed) for split, items in zip(SPLITS, tests)}
    kept = cached_rows(router, picked, rows_path(Path(cfg["rows"]), model, f"{arm}/typed", seed), cfg)
    return {split: got["rows"] for split, got in kept.items()}


def build(cfg: dict, emb, seed: int) -> tuple:
    """One seed's dataset and the federated global its rows were routed with (the bench's)."""
    ds = dataset(seed, cfg)
    return ds, global_compendium(ds, cfg["epsilon"], PROTOTYPE_WEIGHT, cfg, emb, seed)[0]


def top1(rows: list[dict], rule: str, weight: float) -> float:
    """Top-1 of the fused picks under one rule and LLM weight (``retrieval``: documentation scores set to retrieval's)."""
    bench_rows = [(r["ids"], np.array(r["retrieval"]), np.array(r["retrieval" if rule == "retrieval" else "docs"]),
                   np.array(r["llm"])) for r in rows]
    return bench_top1(bench_rows, [r["gold"] for r in rows], weight)


def chosen_weights(table: list[dict], cfg: dict) -> dict[str, float]:
    """Per model, the weight with the best dev mean top-1 (federated, ``standing``; ties: the smaller)."""
    out = {}
    for model in cfg["models"]:
        dev = [r for r in table if r["model"] == model and r["seed"] == cfg["dev_seed"]
               and r["arm"] == "federated" and r["rule"] == "standing"]
        out[model] = max(dev, key=lambda r: (r["seen"] + r["heldout"], -r["weight"]))["weight"]
    return out


def tables(table: list[dict], chosen: dict[str, float], cfg: dict) -> str:
    """Markdown: seen / held-out top-1 per model, seed, arm and rule at every weight."""
    weights = cfg["weights"]
    lines = [f"# LLM fusion rule and weight (MetaTool, {cfg['n_per_split']} queries per split)", "",
             (f"Weights chosen on seed {cfg['dev_seed']} (federated, `standing`): {chosen}. Cells: seen / held-out "
              "top-1; weight 0 with `retrieval` is retrieval order."), "",
             "| model | seed | arm | rule | " + " | ".join(f"w {w}" for w in weights) + " |",
             "|---|---|---|---|" + "---|" * len(weights)]
    for key in dict.fromkeys((r["model"], r["seed"], r["arm"], r["rule"]) for r in table):
        cells = {r["weight"]: r for r in table if (r["model"], r["seed"], r["arm"], r["rule"]) == key}
        lines.append(f"| {' | '.join(map(str, key))} | "
                     + " | ".join(f"{cells[w]['seen']:.3f} / {cells[w]['heldout']:.3f}" for w in weights) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Dump (or reread) every arm's rows, score every rule and weight, write results, manifest and tables."""
    args = experiment_parser(__doc__).parse_args()
    cfg = load_experiment(args.config)
    import torch

    torch.set_num_threads(cfg["torch_threads"])
    emb = get_embedder(cfg["embedder"])
    out = Path(cfg["output"])
    table = []
    built = {seed: build(cfg, emb, seed) for seed in cfg["seeds"]}
    for model in cfg["models"]:
        for seed in cfg["seeds"]:
            for arm in cfg["arms"]:
                rows = rows_for(cfg, emb, model, seed, arm, built[seed])
                for rule in RULES if arm == "federated" else ("retrieval",):  # docs_only: the rules agree
                    for w in cfg["weights"]:
                        table.append({"model": model, "seed": seed, "arm": arm, "rule": rule, "weight": w,
                                      **{s: top1(rows[s], rule, w) for s in SPLITS}, "n": len(rows["seen"])})
    chosen = chosen_weights(table, cfg)
    write_results(out, {"table": table, "chosen": chosen}, cfg, data_hashes("metatool"),
                  f"python simulations/llm_fusion.py {args.config}")
    write_atomic(out / "tables.md", tables(table, chosen, cfg))
    log.info("chosen weights: %s", chosen)


if __name__ == "__main__":
    main()
