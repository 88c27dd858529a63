"""Router quality (top-1, recall@5) per embedder x reranker x compendium, and speed.

Usage: ``python simulations/router_bench.py configs/router.toml``
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from pathlib import Path

import numpy as np
from synapse_flwr.simulations.catalog_gen import real_catalog, scaled_catalog

from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.catalog import Catalog
from synapse_flwr.core.embed import Embedder, get_embedder
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.metrics import evaluate_routes
from synapse_flwr.core.router import Router
from synapse_flwr.data.federation import metatool_dataset
from synapse_flwr.data.pins import verified_hashes
from synapse_flwr.eval.results import experiment_parser, load_experiment, write_results

log = logging.getLogger("router_bench")


def prototype_space(emb_name: str) -> Embedder | None:
    """The embedder the compendia release query prototypes in, or None for a lexical one.

    A lexical space is fitted per index and its dimension is its vocabulary
    (beyond the wire's ``MAX_DIM`` at a few hundred tools), so its compendia
    carry no prototypes and its router reads the other fields.
    """
    emb = get_embedder(emb_name)
    return None if hasattr(emb, "fit") else emb


def compendia_for(ds, cfg: dict, seed: int, emb_name: str) -> dict:
    """docs_only, and one organisation holding all training experience, without and with privacy.

    The compendia carry query prototypes in ``emb_name``'s space (none for a
    lexical one, :func:`prototype_space`), so each embedder is measured with
    the prototypes a federation on it would release.
    """
    emb = prototype_space(emb_name)
    return {
        "docs_only": None,
        "central": build_compendium(ds.all_events, ds.catalog, "central", embedder=emb, epsilon=math.inf, seed=0),
        "central_private": build_compendium(ds.all_events, ds.catalog, "central", epsilon=cfg["private_epsilon"],
                                            delta=cfg["delta"], seed=seed, embedder=emb),
    }


def quality(ds, cfg: dict, seed: int) -> dict:
    out = {}
    splits = {"seen": ds.seen_test, "heldout": ds.heldout_test}
    for emb_name in cfg["embedders"]:
        for comp_name, comp in compendia_for(ds, cfg, seed, emb_name).items():
            router = Router(comp, ds.catalog, embedder=get_embedder(emb_name), reranker="none", k=cfg["k"])
            for reranker in cfg["rerankers"]:
                router.reranker = reranker
                for split, items in splits.items():
                    res = router.route_many([i.query for i in items])
                    m = evaluate_routes(res, [i.gold for i in items], cfg["k"])
                    out[f"{comp_name}/{emb_name}/{reranker}/{split}/{seed}"] = m
                    log.info("seed %d %s %s %s %s: %s", seed, comp_name, emb_name, reranker, split, m)
    return out


def llm_quality(ds, compendia: dict, cfg: dict) -> dict:
    out = {}
    rng = np.random.default_rng(0)
    for comp_name, comp in compendia.items():
        router = Router(comp, ds.catalog, embedder=get_embedder("minilm"), reranker="llm",
                        k=cfg["k"], model=cfg["llm_model"])
        for split, items in {"seen": ds.seen_test, "heldout": ds.heldout_test}.items():
            sample = [items[i] for i in sorted(rng.choice(len(items), cfg["llm_sample"], replace=False))]
            t0 = time.perf_counter()
            res = router.route_many([i.query for i in sample])
            secs = time.perf_counter() - t0
            m = evaluate_routes(res, [i.gold for i in sample], cfg["k"])
            m.update(queries_per_s=len(sample) / secs, fallbacks=sum(r.fallback for r in res))
            out[f"{comp_name}/minilm/llm/{split}/42"] = m
            log.info("llm %s %s: %s", comp_name, split, m)
    return out


def speed(catalog: Catalog, centrals: dict, queries: list[str], cfg: dict) -> dict:
    out = {}
    for emb_name, compendium in centrals.items():
        # uncached: latency must include embedding the query
        router = Router(compendium, catalog, embedder=get_embedder(emb_name, cache=False), reranker="fields",
                        k=cfg["k"])
        router.route_many(queries[:8])  # warm-up: model load, caches
        lat = []
        for q in queries[: cfg["latency_queries"]]:
            t0 = time.perf_counter()
            router.route(q)
            lat.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        router.route_many(queries)
        batch = time.perf_counter() - t0
        out[emb_name] = {
            "tools": len(catalog),
            "p50_ms": 1000 * statistics.median(lat),
            "p99_ms": 1000 * float(np.quantile(lat, 0.99)),
            "batch_queries_per_s": len(queries) / batch,
        }
        log.info("speed %d tools %s: %s", len(catalog), emb_name, out[emb_name])
    return out


PARTS = ("quality", "speed", "llm")


def main() -> None:
    parser = experiment_parser(__doc__)
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="comma-separated subset of quality,speed,llm to (re)run; the others are "
                             "kept from an existing results.json")
    args = parser.parse_args()
    cfg = load_experiment(args.config)
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        parser.error(f"unknown parts {sorted(parts - set(PARTS))}; choose from {', '.join(PARTS)}")
    previous = Path(cfg["output"]) / "results.json"
    results: dict = json.loads(previous.read_text()) if previous.exists() else {}
    if "quality" in parts:
        results["quality"], results["split_sizes"] = {}, {}
    for seed in cfg["seeds"] if "quality" in parts else cfg["seeds"][:1]:
        ds = metatool_dataset(seed)
        if "quality" in parts:
            results["split_sizes"][str(seed)] = {
                "train": len(ds.all_events), "seen": len(ds.seen_test), "heldout": len(ds.heldout_test),
                "leak_filter": ds.info["leak_filter"]}
            results["quality"].update(quality(ds, cfg, seed))
        if seed != cfg["seeds"][0]:
            continue
        if "speed" in parts:
            queries = [i.query for i in ds.seen_test + ds.heldout_test][:2000]
            # one central compendium per embedder, its prototypes in that embedder's space
            centrals = {e: build_compendium(ds.all_events, ds.catalog, "central", embedder=prototype_space(e),
                                            epsilon=math.inf, seed=0)
                        for e in cfg["embedders"]}
            results["speed"] = {
                "real": speed(ds.catalog, centrals, queries, cfg),
                "scaled": speed(scaled_catalog(cfg["scaled_tools"], seed, real_catalog()), centrals, queries, cfg),
            }
        if "llm" in parts:
            minilm = compendia_for(ds, cfg, seed, "minilm")
            results["llm"] = llm_quality(ds, {k: minilm[k] for k in ("docs_only", "central")}, cfg)
    summary = {}
    for key in {k.rsplit("/", 1)[0] for k in results.get("quality", {})}:
        runs = [v for k, v in results["quality"].items() if k.rsplit("/", 1)[0] == key]
        summary[key] = {
            "acc_mean": statistics.mean(r["acc"] for r in runs),
            "acc_sd": statistics.stdev(r["acc"] for r in runs) if len(runs) > 1 else 0.0,
            "r5_mean": statistics.mean(r["r5"] for r in runs),
            "n": [r["n"] for r in runs], "seeds": len(runs),
        }
    results["summary"] = dict(sorted(summary.items()))
    data = verified_hashes(["metatool"])
    write_results(Path(cfg["output"]), results, cfg, data, f"python simulations/router_bench.py {args.config}")
    write_atomic(Path(cfg["output"]) / "tables.md", tables(results))


def tables(results: dict) -> str:
    """Markdown tables of a results dict (quality mean +- SD over seeds, LLM sample, speed)."""
    lines = ["# Router on MetaTool", "", "Top-1 accuracy (mean +- SD over seeds) / recall@5.", "",
             "| compendium | embedder | reranker | seen | held-out |", "|---|---|---|---|---|"]
    for key in sorted({k.rsplit("/", 1)[0] for k in results.get("summary", {})}):
        comp, emb, rr = key.split("/")
        cells = []
        for split in ("seen", "heldout"):
            m = results["summary"].get(f"{key}/{split}")
            cells.append(f"{m['acc_mean']:.3f} +- {m['acc_sd']:.3f} / {m['r5_mean']:.3f}" if m else "-")
        lines.append(f"| {comp} | {emb} | {rr} | {cells[0]} | {cells[1]} |")
    if results.get("llm"):
        lines += ["", "Local LLM reranker (sample, seed 42, MiniLM retrieval).", "",
                  "| arm | acc | r5 | n | queries/s | fallbacks |", "|---|---|---|---|---|---|"]
        for key, m in sorted(results["llm"].items()):
            lines.append(f"| {key} | {m['acc']:.3f} | {m['r5']:.3f} | {m['n']} | {m['queries_per_s']:.2f} "
                         f"| {m['fallbacks']} |")
    if results.get("speed"):
        lines += ["", "Speed (`fields` reranker, uncached embeddings).", "",
                  "| catalog | embedder | tools | p50 ms | p99 ms | batch queries/s |", "|---|---|---|---|---|---|"]
        for cat, by_emb in results["speed"].items():
            for emb, m in by_emb.items():
                lines.append(f"| {cat} | {emb} | {m['tools']} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} "
                             f"| {m['batch_queries_per_s']:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
