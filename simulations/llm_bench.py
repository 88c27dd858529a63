"""The frozen-LLM reranker on MetaTool: LLM vs ``fields`` vs retrieval, typed vs flat, across models.

In process, no Flower. The federated compendium is the one
``simulations/tune_router.py`` builds (one release per org, merged typed).
On ``dev_seed`` the first model's channel scores choose the LLM weight
(:data:`~synapse_flwr.core.router.LLM_WEIGHT`); on ``report_seed`` every model
reranks the same sampled queries with the federated compendium rendered typed
and flat, and with no compendium (``docs_only``), beside retrieval order and
the ``fields`` reranker. Each LLM arm is routed once: its raw LLM scores are
kept per candidate and fused with retrieval at any weight
(:func:`~synapse_flwr.core.router.fuse_llm`). A shuffled-order check reroutes
some queries with their candidates permuted and counts changed picks.

Sample sizes: ``dev_n_per_split`` queries per split on ``dev_seed``,
``n_per_split`` on ``report_seed``; a model named in ``n_per_model`` (a slower
one) reranks a random subset of that many of the same sampled queries.

Usage: ``python simulations/llm_bench.py configs/llm.toml``
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
from synapse_flwr.simulations.tune_router import dataset, global_compendium

from synapse_flwr.core.builder import PROTOTYPE_WEIGHT
from synapse_flwr.core.embed import get_embedder
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.router import Router, evaluate_routes, fuse_llm
from synapse_flwr.data.pins import verified_hashes
from synapse_flwr.eval.results import (
    experiment_parser,
    load_experiment,
    update_summary,
    write_results,
)

log = logging.getLogger("llm_bench")
Rows = list[tuple[list[str], np.ndarray, np.ndarray]]


def sample(items: list, n: int, seed: int) -> list:
    """A fixed random sample of a test split (all of it when smaller)."""
    rng = np.random.default_rng(seed)
    return [items[i] for i in sorted(rng.choice(len(items), min(n, len(items)), replace=False))]


def llm_rows(router: Router, queries: list[str]) -> tuple[Rows, float, int]:
    """Route once; per query the candidates in retrieval order with retrieval and raw LLM scores."""
    t0 = time.perf_counter()
    results = router.route_many(queries)
    qps = len(queries) / (time.perf_counter() - t0)
    rows: Rows = []
    for r in results:
        cands = sorted(r.candidates, key=lambda c: -c.retrieval)
        rows.append(([c.tool_id for c in cands], np.array([c.retrieval for c in cands]),
                     np.array([c.signals.get("llm", 0.0) for c in cands])))
    return rows, qps, sum(r.fallback for r in results)


def top1(rows: Rows, golds: list, weight: float) -> float:
    """Top-1 of the fused scores at one LLM weight (ties: retrieval order)."""
    hits = [ids[int(np.argmax(fuse_llm(ret, llm, weight)))] in gold for (ids, ret, llm), gold in zip(rows, golds)]
    return float(np.mean(hits)) if hits else 0.0


def order_changes(router: Router, queries: list[str], seed: int) -> dict:
    """Picks that change when each query's candidates are shown reversed, or shuffled."""
    rng = np.random.default_rng(seed)
    parts = router.evidence(queries)
    fused = sum(parts.values())
    cands = [list(np.argsort(-row, kind="stable")[: router.k]) for row in fused]
    reads = [router.experience_read(parts["prototype"][row], c) for row, c in enumerate(cands)]
    orders = {"reversed": [c[::-1] for c in cands], "shuffled": [list(rng.permutation(c)) for c in cands]}
    base = router.llm_scores(queries, cands, reads)
    out = {}
    for name, perm in orders.items():
        other = router.llm_scores(queries, perm, reads)
        changed = {"": 0, "llm_alone_": 0}
        for row, (c, p) in enumerate(zip(cands, perm)):
            if base[row] is None or other[row] is None:
                continue
            back = dict(zip(p, other[row]))
            aligned = np.array([back[t] for t in c])
            # the fused pick, and the LLM's own (at weight 0 the fused pick is retrieval's and cannot move)
            for key, weight in (("", router.llm_weight), ("llm_alone_", 1000.0)):
                pick = [c[int(np.argmax(fuse_llm(fused[row][c], s, weight)))] for s in (base[row], aligned)]
                changed[key] += int(pick[0] != pick[1])
        out |= {f"{key}{name}_changed": n for key, n in changed.items()}
    out["n"] = len(queries)
    return out


def retrieval_baselines(comp, ds, splits: dict, cfg: dict, emb) -> dict:
    """Retrieval order and the ``fields`` reranker on the sampled queries."""
    out = {}
    for reranker in ("none", "fields"):
        router = Router(comp, ds.catalog, embedder=emb, reranker=reranker, k=cfg["k"])
        for split, items in splits.items():
            res = router.route_many([i.query for i in items])
            out[f"{reranker}/{split}"] = evaluate_routes(res, [i.gold for i in items], cfg["k"])["acc"]
    return out


def choose_weight(cfg: dict, emb) -> dict:
    """The LLM weight that maximises mean dev top-1 (first model, federated, typed)."""
    ds = dataset(cfg["dev_seed"], cfg)
    comp, _ = global_compendium(ds, cfg["epsilon"], PROTOTYPE_WEIGHT, cfg, emb, cfg["dev_seed"])
    router = Router(comp, ds.catalog, embedder=emb, reranker="llm", k=cfg["k"], model=cfg["models"][0])
    grid: dict[str, dict[str, float]] = {str(w): {} for w in cfg["weights"]}
    for split, items in (("seen", ds.seen_test), ("heldout", ds.heldout_test)):
        picked = sample(items, cfg["dev_n_per_split"], cfg["dev_seed"])
        rows, _, _ = llm_rows(router, [i.query for i in picked])
        for w in cfg["weights"]:
            grid[str(w)][split] = top1(rows, [i.gold for i in picked], w)
    best = max(cfg["weights"], key=lambda w: (sum(grid[str(w)].values()), -w))
    log.info("dev grid %s -> weight %s", grid, best)
    return {"grid": grid, "chosen": best}


def model_arms(model: str, comp, cfg: dict) -> list[tuple[str, object, str]]:
    """A model's arms: (name, compendium, render); the flat render only for ``flat_models``."""
    arms = [("federated/typed", comp, "typed"), ("docs_only/typed", None, "typed")]
    return arms + ([("federated/flat", comp, "flat")] if model in cfg["flat_models"] else [])


def report(cfg: dict, emb, weight: float, save) -> dict:
    """Every model x (federated typed, docs_only; federated flat for ``flat_models``) on the report seed.

    ``save(rep)`` is called after every arm, so a run stopped early keeps what it measured.
    """
    seed = cfg["report_seed"]
    ds = dataset(seed, cfg)
    comp, _ = global_compendium(ds, cfg["epsilon"], PROTOTYPE_WEIGHT, cfg, emb, seed)
    splits = {s: sample(items, cfg["n_per_split"], seed) for s, items in
              (("seen", ds.seen_test), ("heldout", ds.heldout_test))}
    rep: dict = {"baselines": retrieval_baselines(comp, ds, splits, cfg, emb),
                 "docs_retrieval": retrieval_baselines(None, ds, splits, cfg, emb), "arms": {}}
    routers = {}
    for model in cfg["models"]:
        n = cfg["n_per_model"].get(model, cfg["n_per_split"])
        for arm, compendium, render in model_arms(model, comp, cfg):
            router = routers[(model, arm)] = Router(compendium, ds.catalog, embedder=emb, reranker="llm",
                                                    k=cfg["k"], model=model, render=render, llm_weight=weight)
            for split, every in splits.items():
                items = sample(every, n, seed)
                rows, qps, fallbacks = llm_rows(router, [i.query for i in items])
                golds = [i.gold for i in items]
                m = {"fused": top1(rows, golds, weight), "llm_alone": top1(rows, golds, 1000.0),
                     "retrieval": top1(rows, golds, 0.0), "queries_per_s": qps, "fallbacks": fallbacks,
                     "n": len(items)}
                rep["arms"][f"{model}/{arm}/{split}"] = m
                log.info("%s %s %s: %s", model, arm, split, m)
                save(rep)
    queries = [i.query for i in splits["seen"]]
    if cfg["order_check"]:
        for (model, arm), router in routers.items():
            rep["arms"][f"{model}/{arm}/order_check"] = order_changes(router, queries[: cfg["order_check"]], seed)
            save(rep)
    if cfg["list_sample"]:
        router = Router(comp, ds.catalog, embedder=emb, reranker="llm", k=cfg["k"], model=cfg["models"][0],
                        llm_mode="list", llm_weight=weight)
        items = splits["seen"][: cfg["list_sample"]]
        rows, qps, _ = llm_rows(router, [i.query for i in items])
        golds = [i.gold for i in items]
        rep["list_balanced"] = {"fused": top1(rows, golds, weight), "llm_alone": top1(rows, golds, 1000.0),
                                "retrieval": top1(rows, golds, 0.0), "queries_per_s": qps,
                                **order_changes(router, [i.query for i in items], seed)}
        save(rep)
    return rep


def recheck_orders(cfg: dict, emb, rep: dict, weight: float, save) -> dict:
    """Rerun only the order checks of a finished report (``--order-check-only``), at its weight."""
    seed = cfg["report_seed"]
    ds = dataset(seed, cfg)
    comp, _ = global_compendium(ds, cfg["epsilon"], PROTOTYPE_WEIGHT, cfg, emb, seed)
    queries = [i.query for i in sample(ds.seen_test, cfg["n_per_split"], seed)][: cfg["order_check"]]
    for model in cfg["models"]:
        for arm, compendium, render in model_arms(model, comp, cfg):
            router = Router(compendium, ds.catalog, embedder=emb, reranker="llm", k=cfg["k"], model=model,
                            render=render, llm_weight=weight)
            rep["arms"][f"{model}/{arm}/order_check"] = order_changes(router, queries, seed)
            log.info("%s %s order check: %s", model, arm, rep["arms"][f"{model}/{arm}/order_check"])
            save(rep)
    if "list_balanced" in rep:
        router = Router(comp, ds.catalog, embedder=emb, reranker="llm", k=cfg["k"], model=cfg["models"][0],
                        llm_mode="list", llm_weight=weight)
        rep["list_balanced"] |= order_changes(router, queries[: cfg["list_sample"]], seed)
        save(rep)
    return rep


def summary(rep: dict, cfg: dict) -> dict:
    """The issue's summary keys (the first model is the reported LLM reranker); None where not measured.

    ``n_per_split`` is the fewest queries of a split the first model reranked;
    ``n_per_model`` gives that count for every model measured.
    """
    first, arms, base = cfg["models"][0], rep["arms"], rep["baselines"]

    def fused(model: str, arm: str, split: str) -> float | None:
        m = arms.get(f"{model}/{arm}/{split}")
        return None if m is None else m["fused"]

    def diff(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a - b

    n_per_model = {m: min(a["n"] for k, a in arms.items() if k.startswith(f"{m}/") and "order_check" not in k)
                   for m in cfg["models"] if any(k.startswith(f"{m}/") for k in arms)}
    out: dict = {"n_per_split": n_per_model.get(first, 0), "n_per_model": n_per_model,
                 "models": cfg["models"], "llm_model": first}
    for split in ("seen", "heldout"):
        out[f"llm_top1_{split}"] = fused(first, "federated/typed", split)
        out[f"fields_top1_{split}"] = base[f"fields/{split}"]
        out[f"retrieval_top1_{split}"] = base[f"none/{split}"]
        out[f"typed_minus_flat_llm_{split}"] = diff(fused(first, "federated/typed", split),
                                                    fused(first, "federated/flat", split))
    gains = {m: [diff(fused(m, "federated/typed", s), fused(m, "docs_only/typed", s)) for s in ("seen", "heldout")]
             for m in cfg["models"]}
    out["transfer_gain_over_docs"] = {m: float(np.mean(g)) for m, g in gains.items() if None not in g}
    return out


def tables(results: dict) -> str:
    """Markdown: summary, dev grid, every arm."""
    s, rep = results["summary"], results["report"]
    lines = ["# Frozen-LLM reranker on MetaTool", "",
             (f"n = {s['n_per_split']} queries per split (seed {results['config']['report_seed']}; per model: "
              f"{s['n_per_model']}); LLM weight {results['dev']['chosen']} chosen on seed "
              f"{results['config']['dev_seed']} ({results['config']['dev_n_per_split']} queries per split)."), "",
             "| | seen | held-out |", "|---|---|---|"]
    for key in ("llm_top1", "fields_top1", "retrieval_top1", "typed_minus_flat_llm"):
        cells = [s[f"{key}_{split}"] for split in ("seen", "heldout")]
        lines.append(f"| {key} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")
    gains = ", ".join(f"{m} {g:+.3f}" for m, g in s["transfer_gain_over_docs"].items())
    lines += ["", f"Transfer gain (federated typed minus docs_only, mean of splits): {gains}", "",
              "| arm | fused | LLM alone | retrieval | queries/s | fallbacks | n |", "|---|---|---|---|---|---|---|"]
    for key, m in sorted(rep["arms"].items()):
        if "order_check" in key:
            continue
        lines.append(f"| {key} | {m['fused']:.3f} | {m['llm_alone']:.3f} | {m['retrieval']:.3f} "
                     f"| {m['queries_per_s']:.3f} | {m['fallbacks']} | {m['n']} |")
    lines += ["", "Order check (picks changed when the candidates are reversed / shuffled):", ""]
    lines += [f"- {k}: {m}" for k, m in sorted(rep["arms"].items()) if "order_check" in k]
    if "list_balanced" in rep:
        lines += [f"- list prompt, cyclic orders: {rep['list_balanced']}"]
    lines += ["", "Dev grid (seed-7 top-1 by LLM weight): " + str(results["dev"]["grid"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run dev selection and the report; write results.json, summary.json and tables.md after every arm."""
    parser = experiment_parser(__doc__)
    parser.add_argument("--order-check-only", action="store_true",
                        help="rerun only the order checks of the results already in the output folder")
    args = parser.parse_args()
    cfg = load_experiment(args.config)
    import torch

    torch.set_num_threads(cfg["torch_threads"])
    emb = get_embedder(cfg["embedder"])
    out = Path(cfg["output"])
    previous = json.loads((out / "results.json").read_text()) if args.order_check_only else None
    dev = previous["dev"] if previous else choose_weight(cfg, emb)

    def save(rep: dict) -> None:
        results = {"config": cfg, "dev": dev, "report": rep, "summary": summary(rep, cfg)}
        write_results(out, results, cfg, verified_hashes(["metatool"]),
                      f"python simulations/llm_bench.py {args.config}")
        update_summary(out / "summary.json", results["summary"])
        write_atomic(out / "tables.md", tables(results))

    if previous:
        recheck_orders(cfg, emb, previous["report"], dev["chosen"], save)
    else:
        report(cfg, emb, dev["chosen"], save)


if __name__ == "__main__":
    main()
