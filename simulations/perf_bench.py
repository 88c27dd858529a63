"""Performance at scale: artifact bytes, validate+merge time and memory, routing latency.

Usage: ``python simulations/perf_bench.py configs/perf.toml --parts bytes,merge`` and
``python simulations/perf_bench.py configs/perf_route.toml --parts route`` (two folders).

Artifacts are MetaTool org artifacts (the dataset split over ``orgs``
organisations) spread over larger catalogs by
:mod:`synapse_flwr.simulations.catalog_gen`; K organisations beyond the
base ones are varied copies. Every merge cell runs in its own forked process
(its peak RSS is its own) next to a naive baseline in the same process:
validate, then concatenate the tool lists.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import multiprocessing as mp
import statistics
import time
from pathlib import Path

import numpy as np
from synapse_flwr.simulations.catalog_gen import (
    real_catalog,
    replicate_artifact,
    scaled_catalog,
    vary_org,
)

from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.embed import get_embedder
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.merge import flatten, merge_typed
from synapse_flwr.core.router import Router
from synapse_flwr.core.schema import Compendium
from synapse_flwr.core.wire import canonical_json, decode, encode
from synapse_flwr.data.federation import load_federated, metatool_dataset
from synapse_flwr.data.pins import verified_hashes
from synapse_flwr.eval.results import (
    experiment_parser,
    load_experiment,
    update_summary,
    write_results,
)

log = logging.getLogger("perf_bench")
PARTS = ("bytes", "merge", "route")
SUMMARY_KEYS = ("paper_style_flat_bytes_3180", "merge_s_k100_t3180", "retrieval_p50_ms_t3180",
                "fields_route_p50_ms_t3180", "wire_bytes_3180_round1")


def base_artifacts(cfg: dict, epsilon: float) -> list[Compendium]:
    """The real org artifacts (MetaTool over ``orgs`` organisations, round 1)."""
    ds = load_federated(cfg["dataset"], cfg["orgs"], cfg["seed"], cfg["alpha"])
    emb = get_embedder(cfg["embedder"])
    return [build_compendium(ev, ds.catalog, org, round_=1, epsilon=epsilon, delta=cfg["delta"],
                             seed=cfg["seed"], embedder=emb) for org, ev in sorted(ds.orgs.items())]


def at_size(art: Compendium, tools: int, real) -> Compendium:
    """``art`` itself at its own size, else spread over a scaled catalog."""
    return art if tools == len(art.tools) else replicate_artifact(art, scaled_catalog(tools, 0, real))


def measure_bytes(cfg: dict, bases: dict[str, list[Compendium]], real) -> dict:
    out = {}
    for privacy, arts in bases.items():
        for tools in cfg["byte_tools"]:
            art = at_size(arts[0], tools, real)
            row = {"tools": tools, "privacy": privacy, "raw": len(encode(art, compress=False)), "gzip": len(encode(art))}
            if privacy == "off" and tools == 3180:
                flat = flatten(art)
                row |= {"paper_flat_raw": len(canonical_json(flat)), "paper_flat_gzip": len(encode(flat))}
            out[f"{privacy}/{tools}"] = row
            log.info("bytes %s", row)
    return out


def _peak_reset() -> None:
    # Linux: writing 5 to clear_refs resets this process's peak RSS (VmHWM)
    Path("/proc/self/clear_refs").write_text("5")


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _merge_cell(objs: list[dict], k: int, seed: int, queue) -> None:
    wires = [json.dumps(vary_org(objs[i % len(objs)], f"org{i:04d}", seed + i) if i >= len(objs) else objs[i],
                        sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() for i in range(k)]
    gc.collect()
    _peak_reset()
    base = _rss("VmRSS")
    # CPU seconds of this process (one core): on a shared machine wall time mostly measures the neighbours
    w0, t0 = time.perf_counter(), time.process_time()
    arts = [decode(w) for w in wires]
    t1 = time.process_time()
    g = merge_typed(arts)
    t2 = time.process_time()
    naive = [e for a in arts for e in a.tools]  # the baseline: concatenate what was validated
    t3 = time.process_time()
    queue.put({"validate_s": t1 - t0, "merge_s": t2 - t1, "concat_s": t3 - t2, "wall_s": time.perf_counter() - w0,
               "input_bytes": sum(map(len, wires)),
               "input_scenarios": sum(len(e.when) + len(e.when_not) for e in naive), "tools_out": len(g.tools),
               "conflicts": len(g.conflicts), "conflicts_dropped": sum(d.count for d in g.conflicts_dropped),
               "global_bytes": len(encode(g, compress=False)), "peak_rss_bytes": _rss("VmHWM") - base})


def merge_grid(cfg: dict, arts: list[Compendium], real) -> dict:
    """Validate + merge for every K x tools cell projected to fit ``merge_budget_s``; the rest extrapolated."""
    cells, fitted = {}, []
    ctx = mp.get_context("fork")
    for tools in cfg["merge_tools"]:
        objs = [at_size(a, tools, real).model_dump(mode="json") for a in arts]
        for k in cfg["merge_orgs"]:
            key = f"k{k}/t{tools}"
            projected = _project([(x, t) for x, t, _ in fitted], k * tools)
            memory = _project([(x, m) for x, _, m in fitted], k * tools)
            if projected is not None and (projected > cfg["merge_budget_s"] or memory > cfg["merge_max_rss_bytes"]):
                cells[key] = {"k": k, "tools": tools, "skipped": True, "projected_s": projected,
                              "projected_rss_bytes": memory}
                log.info("merge %s skipped: projected %.0f s, %.1f GB", key, projected, memory / 1e9)
                continue
            queue = ctx.Queue()
            proc = ctx.Process(target=_merge_cell, args=(objs, k, cfg["seed"], queue))
            proc.start()
            row = queue.get()
            proc.join()
            row |= {"k": k, "tools": tools, "skipped": False, "total_s": row["validate_s"] + row["merge_s"],
                    "naive_s": row["validate_s"] + row["concat_s"]}
            row["ratio_to_naive"] = row["total_s"] / row["naive_s"]
            cells[key] = row
            fitted.append((k * tools, row["total_s"], row["peak_rss_bytes"]))
            log.info("merge %s: %s", key, row)
    for tools in cfg["extrapolate_tools"]:  # too costly here even to generate: fitted only
        cells |= {f"k{k}/t{tools}": {"k": k, "tools": tools, "skipped": True} for k in cfg["merge_orgs"]}
    return {"cells": cells, "exponents": _exponents(cells)}


def _fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    if len({x for x, _ in points}) < 2:
        return None
    slope, intercept = np.polyfit(np.log([x for x, _ in points]), np.log([max(y, 1e-6) for _, y in points]), 1)
    return float(slope), float(intercept)


def _project(points: list[tuple[float, float]], x: float) -> float | None:
    fit = _fit(points)
    if fit is None:
        return points[-1][1] * x / points[-1][0] if points else None
    return math.exp(fit[1]) * x ** fit[0]


def _exponents(cells: dict) -> dict:
    done = [c for c in cells.values() if not c["skipped"]]
    out = {}
    for metric in ("total_s", "validate_s", "merge_s", "peak_rss_bytes"):
        fit = _fit([(c["k"] * c["tools"], c[metric]) for c in done])
        out[metric] = fit and round(fit[0], 3)
    for c in cells.values():
        if c["skipped"]:
            for metric in ("total_s", "peak_rss_bytes"):
                fit = _fit([(d["k"] * d["tools"], d[metric]) for d in done])
                c[f"projected_{metric.split('_')[0]}" + ("_s" if metric == "total_s" else "_rss_bytes")] = (
                    fit and math.exp(fit[1]) * (c["k"] * c["tools"]) ** fit[0])
    return out


class _Lookup:
    """The real embedder, with the benchmark queries' vectors computed up front (embedding excluded)."""

    def __init__(self, embedder, queries: list[str]) -> None:
        self.base, self.name, self.dim = embedder, embedder.name, embedder.dim
        self.table = dict(zip(queries, embedder.encode(queries)))

    def encode(self, texts):
        if all(t in self.table for t in texts):
            return np.stack([self.table[t] for t in texts])
        return self.base.encode(texts)


def _quantiles(lat: list[float]) -> dict:
    return {"p50_ms": 1000 * statistics.median(lat), "p99_ms": 1000 * float(np.quantile(lat, 0.99))}


def routing(cfg: dict, real) -> dict:
    """Single-query latency and batch throughput (CPU time), retrieval only and retrieval + ``fields``, one thread.

    faiss searches with OpenMP threads by default; for one query at a time on
    a shared machine the threads cost more than they save (36 ms instead of
    a few per search at 3,180 tools here), so the benchmark pins faiss to one
    thread, as a latency-bound deployment would.
    """
    import faiss

    faiss.omp_set_num_threads(cfg["faiss_threads"])
    ds = metatool_dataset(cfg["seed"])
    emb = get_embedder(cfg["route_embedder"])
    central = build_compendium(ds.all_events, ds.catalog, "central", embedder=emb, epsilon=math.inf, seed=0)
    queries = [i.query for i in ds.seen_test + ds.heldout_test][: cfg["batch_queries"]]
    single = queries[: cfg["route_queries"]]
    lookup = _Lookup(emb, queries)
    raw = get_embedder(cfg["route_embedder"], cache=False)
    embed_lat = []
    for q in single:
        t0 = time.process_time()
        raw.encode([q])
        embed_lat.append(time.process_time() - t0)
    out = {"query_embedding": _quantiles(embed_lat) | {"embedder": cfg["route_embedder"]}}
    for tools in cfg["route_tools"]:
        catalog = ds.catalog if tools == len(ds.catalog) else scaled_catalog(tools, 0, real)
        comp = at_size(central, tools, real)
        t0 = time.perf_counter()
        router = Router(comp, catalog, embedder=lookup, reranker="none", k=cfg["k"])
        built = time.perf_counter() - t0
        for reranker in ("none", "fields"):
            router.reranker = reranker
            router.route_many(single[:8])  # warm-up
            lat, wall = [], []
            for q in single:
                w0, t0 = time.perf_counter(), time.process_time()
                router.route(q)
                lat.append(time.process_time() - t0)
                wall.append(time.perf_counter() - w0)
            t0 = time.process_time()
            router.route_many(queries)
            batch = time.process_time() - t0
            row = _quantiles(lat) | {"tools": tools, "reranker": reranker, "build_s": built,
                                     "wall_p50_ms": 1000 * statistics.median(wall),
                                     "queries_per_s": len(single) / sum(lat), "batch_queries_per_s": len(queries) / batch}
            out[f"{'retrieval' if reranker == 'none' else 'fields'}/{tools}"] = row
            log.info("route %s", row)
    return out


def summary_values(results: dict) -> dict:
    """This benchmark's keys of ``summary.json`` (numbers, SI units)."""
    b, m, r = results.get("bytes", {}), results.get("merge", {}).get("cells", {}), results.get("route", {})
    values = {
        "paper_style_flat_bytes_3180": b.get("off/3180", {}).get("paper_flat_raw"),
        "wire_bytes_3180_round1": b.get("on/3180", {}).get("gzip"),
        "merge_s_k100_t3180": m.get("k100/t3180", {}).get("total_s"),
        "retrieval_p50_ms_t3180": r.get("retrieval/3180", {}).get("p50_ms"),
        "fields_route_p50_ms_t3180": r.get("fields/3180", {}).get("p50_ms"),
    }
    return {k: v for k, v in values.items() if v is not None}


def tables(results: dict) -> str:
    """Markdown tables of a results dict."""
    lines = ["# Performance at scale"]
    if results.get("bytes"):
        lines += ["", "Artifact bytes per organisation (one MetaTool org, spread over the catalog).",
                  "", "| tools | privacy | raw | gzip |", "|---|---|---|---|"]
    # numeric order: a partial rerun reloads the saved JSON, whose keys are sorted as strings
    for row in sorted(results.get("bytes", {}).values(), key=lambda r: (r["privacy"] != "on", r["tools"])):
        lines.append(f"| {row['tools']} | {row['privacy']} | {row['raw']:,} | {row['gzip']:,} |")
        if "paper_flat_raw" in row:
            lines.append(f"| {row['tools']} | paper-style flat JSON | {row['paper_flat_raw']:,} | {row['paper_flat_gzip']:,} |")
    merge = results.get("merge", {})
    if merge:
        lines += ["", "Validate + merge (typed), privacy on, CPU seconds of one process; naive = validate + concatenate, same process.", "",
                  "| K | tools | validate s | merge s | total s | naive s | ratio | peak RSS MB | conflicts (dropped) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c in sorted(merge["cells"].values(), key=lambda c: (c["tools"], c["k"])):
            if c["skipped"]:
                lines.append(f"| {c['k']} | {c['tools']} | skipped | | ~{c['projected_total_s']:.0f} (fit) | | | "
                             f"~{c['projected_peak_rss_bytes'] / 1e6:.0f} (fit) | |")
            else:
                lines.append(f"| {c['k']} | {c['tools']} | {c['validate_s']:.2f} | {c['merge_s']:.2f} | "
                             f"{c['total_s']:.2f} | {c['naive_s']:.2f} | {c['ratio_to_naive']:.2f} | "
                             f"{c['peak_rss_bytes'] / 1e6:.0f} | {c['conflicts']} ({c['conflicts_dropped']}) |")
        lines += ["", "Growth exponents in K x tools: " + ", ".join(f"{k} {v}" for k, v in merge["exponents"].items())]
    route = results.get("route", {})
    if route:
        emb = route["query_embedding"]
        lines += ["", (f"Routing, CPU time on one thread ({emb['embedder']} embedder, query embedding excluded: it costs "
                       f"p50 {emb['p50_ms']:.2f} ms, p99 {emb['p99_ms']:.2f} ms per query)."), "",
                  "| tools | path | p50 ms | p99 ms | queries/s | batch queries/s |", "|---|---|---|---|---|---|"]
        for key, row in route.items():
            if key != "query_embedding":
                lines.append(f"| {row['tools']} | {key.split('/')[0]} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
                             f"{row['queries_per_s']:.0f} | {row['batch_queries_per_s']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, out: Path) -> None:
    """Merge time against K x tools, measured and naive (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = sorted((c for c in results["merge"]["cells"].values() if not c["skipped"]), key=lambda c: c["k"] * c["tools"])
    fig, ax = plt.subplots(figsize=(6, 4))
    x = [c["k"] * c["tools"] for c in done]
    ax.loglog(x, [c["total_s"] for c in done], "o-", label="validate + typed merge")
    ax.loglog(x, [c["naive_s"] for c in done], "s--", label="validate + concatenate (naive)")
    ax.set_xlabel("K x tools (input tool entries)")
    ax.set_ylabel("seconds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "merge_curve.png", dpi=120)


def main() -> None:
    parser = experiment_parser(__doc__)
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of bytes,merge,route; "
                        "the others are kept from an existing results.json")
    args = parser.parse_args()
    cfg = load_experiment(args.config)
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        parser.error(f"unknown parts {sorted(parts - set(PARTS))}; choose from {', '.join(PARTS)}")
    out = Path(cfg["output"])
    previous = out / "results.json"
    results: dict = json.loads(previous.read_text()) if previous.exists() else {}
    real = real_catalog()
    if parts & {"bytes", "merge"}:
        bases = {"on": base_artifacts(cfg, cfg["epsilon"]), "off": base_artifacts(cfg, math.inf)}
        if "bytes" in parts:
            results["bytes"] = measure_bytes(cfg, bases, real)
        if "merge" in parts:
            results["merge"] = merge_grid(cfg, bases["on"], real)
    if "route" in parts:
        results["route"] = routing(cfg, real)
    write_results(out, results, cfg, verified_hashes([cfg["dataset"]]),
                  f"python simulations/perf_bench.py {args.config} --parts {args.parts}")
    write_atomic(out / "tables.md", tables(results))
    if results.get("merge"):
        plot(results, out)
    update_summary(Path(cfg["summary"]), summary_values(results))


if __name__ == "__main__":
    main()
