"""How many of the documentation's best tools every candidate set keeps: recall@k on the seed-7 dev split.

Experience reorders retrieval. On a query whose documented tool has no
experience but whose per-query gate is open, experienced tools can fill every
slot after the first, so a reranker that reads the candidates (the LLM) never
sees the documented tool. :data:`~synapse_flwr.core.router.DOCS_CANDIDATES`
keeps the documentation's top ``m`` in every set
(:func:`~synapse_flwr.core.router.candidate_set`); retrieval's top-1 never
changes. Per ``m``: recall@k of the candidate sets on seen and held-out tools
at each epsilon (K orgs, one release each, merged typed), beside docs_only's.

Usage: ``python simulations/candidates.py configs/candidates.toml``
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
from synapse_flwr.simulations.tune_router import dataset, global_compendium

from synapse_flwr.core.builder import PROTOTYPE_WEIGHT
from synapse_flwr.core.embed import get_embedder
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.router import Router, candidate_set
from synapse_flwr.data.pins import verified_hashes
from synapse_flwr.eval.results import experiment_parser, load_experiment, write_results

log = logging.getLogger("candidates")


def recall(router: Router, items: list, keep: int) -> float:
    """Share of ``items`` whose gold is among the candidates that keep the docs' top ``keep``."""
    parts = router.evidence([i.query for i in items])
    fused = sum(parts.values())
    hits = [any(router.tool_ids[t] in item.gold
                for t in candidate_set(fused[row], parts["description"][row], router.k, keep))
            for row, item in enumerate(items)]
    return float(np.mean(hits))


def rows(cfg: dict, emb) -> list[dict]:
    """recall@k per (epsilon, keep, split), and docs_only's line."""
    ds = dataset(cfg["seed"], cfg)
    splits = {"seen": ds.seen_test, "heldout": ds.heldout_test}
    docs = Router(None, ds.catalog, embedder=emb, reranker="none", k=cfg["k"])
    out = [{"epsilon": "docs_only", "keep": 0, **{s: recall(docs, items, 0) for s, items in splits.items()}}]
    for epsilon in cfg["epsilons"]:
        eps = math.inf if epsilon == "inf" else float(epsilon)
        comp, _ = global_compendium(ds, eps, PROTOTYPE_WEIGHT, cfg, emb, cfg["seed"])
        router = Router(comp, ds.catalog, embedder=emb, reranker="none", k=cfg["k"])
        for keep in cfg["keep"]:
            out.append({"epsilon": epsilon, "keep": keep, **{s: recall(router, items, keep) for s, items in splits.items()}})
            log.info("%s", out[-1])
    return out


def tables(results: list[dict], cfg: dict) -> str:
    """Markdown: one line per (epsilon, keep)."""
    lines = [f"# Candidate sets on {cfg['dataset']} seed {cfg['seed']} (K={cfg['orgs']}, k={cfg['k']}): recall@k", "",
             "| epsilon | docs' top kept | seen recall@k | held-out recall@k |", "|---|---|---|---|"]
    lines += [f"| {r['epsilon']} | {r['keep']} | {r['seen']:.4f} | {r['heldout']:.4f} |" for r in results]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Measure every (epsilon, keep) and write results.json and tables.md."""
    args = experiment_parser(__doc__).parse_args()
    cfg = load_experiment(args.config)
    results = rows(cfg, get_embedder(cfg["embedder"]))
    out = Path(cfg["output"])
    write_results(out, {"config": cfg, "rows": results}, cfg, verified_hashes([cfg["dataset"]]),
                  f"python simulations/candidates.py {args.config}")
    write_atomic(out / "tables.md", tables(results, cfg))


if __name__ == "__main__":
    main()
