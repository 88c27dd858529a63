"""The frozen-LLM reranker on MetaTool: LLM vs ``fields`` vs retrieval, typed vs flat, across models.

In process, no Flower. The federated compendium is the one
``simulations/tune_router.py`` builds (one release per org, merged typed).
On ``dev_seed`` each model's channel scores choose that model's LLM weight
(:data:`~synapse_flwr.core.rerank_llm.LLM_WEIGHT` is the blend for models never
measured); on ``report_seed`` every model
reranks the same sampled queries with the federated compendium rendered typed
and flat, and with no compendium (``docs_only``), beside retrieval order and
the ``fields`` reranker. Each LLM arm is routed once: its candidates'
retrieval, documentation and raw LLM scores are kept per query in the
config's ``rows`` folder (reread by later runs, by other report seeds' configs
and by ``simulations/llm_fusion.py``) and fused at any weight
(:func:`~synapse_flwr.core.rerank_llm.fuse_llm`): the report keeps top-1 at every
grid weight and reads it at the dev choice, so the dev stage and the report
can run side by side (``--stage``). A shuffled-order check reroutes some
queries with their candidates permuted and counts changed picks at every
weight. The reported LLM reranker is the model with the best dev top-1.

Sample sizes: ``dev_n_per_split`` queries per split on ``dev_seed``,
``n_per_split`` on ``report_seed``; a model named in ``n_per_model`` (a slower
one) reranks a random subset of that many of the same sampled queries.
``--models`` measures only the models named and keeps the others' dev
grids and arms from the output folder, reread at every save, so runs for
different models (or arms) can go side by side.

Usage: ``python simulations/llm_bench.py configs/llm.toml [--stage dev|report|tables] [--models M ...] [--arms A ...]``
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
from synapse_flwr.simulations.experiment import data_hashes, routing_code
from synapse_flwr.simulations.tune_router import dataset, global_compendium

from synapse_flwr.core.builder import PROTOTYPE_WEIGHT
from synapse_flwr.core.embed import get_embedder
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.metrics import evaluate_routes
from synapse_flwr.core.rerank_llm import fuse_llm
from synapse_flwr.core.router import Router
from synapse_flwr.eval.order_check import order_changes
from synapse_flwr.eval.results import (
    experiment_parser,
    load_experiment,
    update_summary,
    write_results,
)

log = logging.getLogger("llm_bench")
Rows = list[tuple[list[str], np.ndarray, np.ndarray, np.ndarray]]


def sample(items: list, n: int, seed: int) -> list:
    """A fixed random sample of a test split (all of it when smaller)."""
    rng = np.random.default_rng(seed)
    return [items[i] for i in sorted(rng.choice(len(items), min(n, len(items)), replace=False))]


def llm_rows(router: Router, queries: list[str]) -> tuple[Rows, float, int]:
    """Route once; per query the candidates in retrieval order with retrieval, documentation and raw LLM scores."""
    t0 = time.perf_counter()
    results = router.route_many(queries)
    qps = len(queries) / (time.perf_counter() - t0)
    rows: Rows = []
    for r in results:
        cands = sorted(r.candidates, key=lambda c: -c.retrieval)
        rows.append(([c.tool_id for c in cands], np.array([c.retrieval for c in cands]),
                     np.array([c.signals.get("description", c.retrieval) for c in cands]),
                     np.array([c.signals.get("llm", 0.0) for c in cands])))
    return rows, qps, sum(r.fallback for r in results)


def rows_path(folder: Path, model: str, arm: str, seed: int) -> Path:
    """The file keeping one LLM arm's rows on one seed (``arm`` as in :data:`ARMS`)."""
    return folder / f"{model.replace('/', '_')}_{arm.replace('/', '_')}_{seed}.json"


# the settings a compendium's rows depend on besides model, arm and seed (named in the file)
ROW_SETTINGS = ("dataset", "orgs", "alpha", "epsilon", "delta", "embedder", "k")


def cached_rows(router: Router, splits: dict[str, list], path: Path, cfg: dict) -> dict[str, dict]:
    """Per split: ``rows`` (each query with its gold and its candidates' scores), ``queries_per_s`` and ``fallbacks``.

    The LLM is the costly part, so each split is routed once and kept in
    ``path`` with the config's :data:`ROW_SETTINGS`; a later run (a new
    fusion rule, a report beside the dev grid) rereads a split whose queries
    and settings are the same. Each split names the routing code that
    scored it (:func:`~synapse_flwr.simulations.experiment.routing_code`); a
    split scored by other code is reread with a warning, not routed again
    (most router changes leave the LLM's scores alone, and routing is the
    costly part): remove the file after a change to the LLM path. Rows
    written before splits named their code, and ``queries_per_s`` and
    ``fallbacks`` before those were recorded, lack those keys.
    """
    settings, code = {key: cfg[key] for key in ROW_SETTINGS}, routing_code()
    kept = json.loads(path.read_text()) if path.exists() else {}
    if kept and kept.get("settings") != settings:
        log.warning("%s was written with settings %s, not %s: routing again", path, kept.get("settings"), settings)
        kept = {}
    kept["settings"] = settings
    for split, items in splits.items():
        queries = [i.query for i in items]
        old = kept.get(split, {})
        if [r["query"] for r in old.get("rows", [])] == queries:
            if old.get("code", code) != code:
                log.warning("%s %s was scored by routing code %s, this is %s: reread as it is (remove the file "
                            "to route again after a change to the LLM path)", path.stem, split, old["code"], code)
            continue
        rows, qps, fallbacks = llm_rows(router, queries)
        kept[split] = {"code": code, "queries_per_s": qps, "fallbacks": fallbacks, "rows": [
            {"query": q, "gold": list(i.gold), "ids": ids, "retrieval": ret.tolist(), "docs": docs.tolist(),
             "llm": llm.tolist()} for q, i, (ids, ret, docs, llm) in zip(queries, items, rows)]}
        log.info("%s %s: %d queries at %.2f/s, %d fallbacks", path.stem, split, len(queries), qps, fallbacks)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(kept))
    return {split: kept[split] for split in splits}


def as_rows(kept: list[dict]) -> tuple[Rows, list]:
    """Kept rows as :data:`Rows` and their golds."""
    return ([(r["ids"], np.array(r["retrieval"]), np.array(r["docs"]), np.array(r["llm"])) for r in kept],
            [r["gold"] for r in kept])


def by_weight(rows: Rows, golds: list, weights: list[float]) -> dict[str, float]:
    """Top-1 at every weight of the grid (``str(weight)`` keys)."""
    return {str(w): top1(rows, golds, w) for w in weights}


def top1(rows: Rows, golds: list, weight: float) -> float:
    """Top-1 of the fused scores at one LLM weight (ties: retrieval order)."""
    hits = [ids[int(np.argmax(fuse_llm(ret, docs, llm, weight)))] in gold
            for (ids, ret, docs, llm), gold in zip(rows, golds)]
    return float(np.mean(hits)) if hits else 0.0


def retrieval_baselines(comp, ds, splits: dict, cfg: dict, emb) -> dict:
    """Retrieval order and the ``fields`` reranker on the sampled queries."""
    out = {}
    for reranker in ("none", "fields"):
        router = Router(comp, ds.catalog, embedder=emb, reranker=reranker, k=cfg["k"])
        for split, items in splits.items():
            res = router.route_many([i.query for i in items])
            out[f"{reranker}/{split}"] = evaluate_routes(res, [i.gold for i in items], cfg["k"])["acc"]
    return out


def dev_grid(cfg: dict, emb, model: str, rows_dir: Path) -> dict:
    """One model's dev top-1 by LLM weight (federated, typed) and the weight that maximises its mean."""
    seed = cfg["dev_seed"]
    ds = dataset(seed, cfg)
    comp, _ = global_compendium(ds, cfg["epsilon"], PROTOTYPE_WEIGHT, cfg, emb, seed)
    router = Router(comp, ds.catalog, embedder=emb, reranker="llm", k=cfg["k"], model=model)
    picked = {split: sample(items, cfg["dev_n_per_split"], seed)
              for split, items in (("seen", ds.seen_test), ("heldout", ds.heldout_test))}
    kept = cached_rows(router, picked, rows_path(rows_dir, model, "federated/typed", seed), cfg)
    grid: dict[str, dict[str, float]] = {str(w): {} for w in cfg["weights"]}
    for split, got in kept.items():
        for w, acc in by_weight(*as_rows(got["rows"]), cfg["weights"]).items():
            grid[w][split] = acc
    best = max(cfg["weights"], key=lambda w: (sum(grid[str(w)].values()), -w))
    log.info("%s dev grid %s -> weight %s", model, grid, best)
    return {"grid": grid, "chosen": best, "n": cfg["dev_n_per_split"]}


ARMS = ("federated/typed", "docs_only/typed", "federated/flat")


def model_arms(model: str, comp, cfg: dict) -> list[tuple[str, object, str]]:
    """A model's arms: (name, compendium, render); the flat render only for ``flat_models``."""
    arms = [("federated/typed", comp, "typed"), ("docs_only/typed", None, "typed")]
    return arms + ([("federated/flat", comp, "flat")] if model in cfg["flat_models"] else [])


def report(cfg: dict, emb, models: list[str], arms: list[str] | None, rep: dict, save, rows_dir: Path) -> dict:
    """``models`` x (federated typed, docs_only; federated flat for ``flat_models``) on the report seed.

    ``arms`` (None: all) limits the arms measured; arms not measured now are
    kept from ``rep``. ``save(rep)`` is called after every arm, and each
    arm's rows are kept in ``rows_dir`` (:func:`cached_rows`), so a run
    stopped early keeps what it measured.
    """
    seed, weights = cfg["report_seed"], cfg["weights"]
    ds = dataset(seed, cfg)
    comp, _ = global_compendium(ds, cfg["epsilon"], PROTOTYPE_WEIGHT, cfg, emb, seed)
    splits = {s: sample(items, cfg["n_per_split"], seed) for s, items in
              (("seen", ds.seen_test), ("heldout", ds.heldout_test))}
    rep.setdefault("arms", {})
    rep |= {"baselines": retrieval_baselines(comp, ds, splits, cfg, emb),
            "docs_retrieval": retrieval_baselines(None, ds, splits, cfg, emb)}
    routers = {}
    for model in models:
        n = cfg["n_per_model"].get(model, cfg["n_per_split"])
        for arm, compendium, render in model_arms(model, comp, cfg):
            if arms is not None and arm not in arms:
                continue
            router = routers[(model, arm)] = Router(compendium, ds.catalog, embedder=emb, reranker="llm",
                                                    k=cfg["k"], model=model, render=render)
            picked = {split: sample(every, n, seed) for split, every in splits.items()}
            for split, got in cached_rows(router, picked, rows_path(rows_dir, model, arm, seed), cfg).items():
                m = {"by_weight": by_weight(*as_rows(got["rows"]), weights), "queries_per_s": got["queries_per_s"],
                     "fallbacks": got["fallbacks"], "n": len(got["rows"])}
                rep["arms"][f"{model}/{arm}/{split}"] = m
                log.info("%s %s %s: %s", model, arm, split, m)
            save(rep)
    queries = [i.query for i in splits["seen"]]
    if cfg["order_check"]:
        for (model, arm), router in routers.items():
            rep["arms"][f"{model}/{arm}/order_check"] = order_changes(router, queries[: cfg["order_check"]],
                                                                      seed, weights)
            save(rep)
    if cfg["list_sample"] and cfg["models"][0] in models:
        router = Router(comp, ds.catalog, embedder=emb, reranker="llm", k=cfg["k"], model=cfg["models"][0],
                        llm_mode="list")
        items = splits["seen"][: cfg["list_sample"]]
        rows, qps, _ = llm_rows(router, [i.query for i in items])
        rep["list_balanced"] = {"by_weight": by_weight(rows, [i.gold for i in items], weights),
                                "queries_per_s": qps, "n": len(items),
                                "order_check": order_changes(router, [i.query for i in items], seed, weights)}
        save(rep)
    return rep


def recheck_orders(cfg: dict, emb, models: list[str], rep: dict, save) -> dict:
    """Rerun only the order checks of a finished report (``--order-check-only``) for ``models``."""
    seed, weights = cfg["report_seed"], cfg["weights"]
    ds = dataset(seed, cfg)
    comp, _ = global_compendium(ds, cfg["epsilon"], PROTOTYPE_WEIGHT, cfg, emb, seed)
    queries = [i.query for i in sample(ds.seen_test, cfg["n_per_split"], seed)][: cfg["order_check"]]
    for model in models:
        for arm, compendium, render in model_arms(model, comp, cfg):
            router = Router(compendium, ds.catalog, embedder=emb, reranker="llm", k=cfg["k"], model=model,
                            render=render)
            rep["arms"][f"{model}/{arm}/order_check"] = order_changes(router, queries, seed, weights)
            log.info("%s %s order check: %s", model, arm, rep["arms"][f"{model}/{arm}/order_check"])
            save(rep)
    if "list_balanced" in rep and cfg["models"][0] in models:
        router = Router(comp, ds.catalog, embedder=emb, reranker="llm", k=cfg["k"], model=cfg["models"][0],
                        llm_mode="list")
        rep["list_balanced"]["order_check"] = order_changes(router, queries[: cfg["list_sample"]], seed, weights)
        save(rep)
    return rep


def at_weight(m: dict | None, weight: float | None) -> float | None:
    """An arm's top-1 at one grid weight; None where the arm or the weight was not measured."""
    return None if m is None or weight is None else m["by_weight"].get(str(weight))


def best_model(dev: dict, models: list[str]) -> str:
    """The model whose dev top-1 (sum of the splits, at its chosen weight) is highest; ties: listed first."""
    scored = [m for m in models if m in dev]
    if not scored:
        return models[0]
    return max(scored, key=lambda m: (sum(dev[m]["grid"][str(dev[m]["chosen"])].values()), -models.index(m)))


def summary(rep: dict, dev: dict, cfg: dict) -> dict:
    """The issue's summary keys for the reported LLM reranker (best on dev); None where not measured.

    ``n_per_split`` is the fewest queries of a split that model reranked;
    ``n_per_model`` gives that count for every model measured, and
    ``llm_weight`` each model's dev weight.
    """
    first, arms, base = best_model(dev, cfg["models"]), rep["arms"], rep["baselines"]

    def fused(model: str, arm: str, split: str) -> float | None:
        return at_weight(arms.get(f"{model}/{arm}/{split}"), dev.get(model, {}).get("chosen"))

    def diff(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a - b

    n_per_model = {m: min(a["n"] for k, a in arms.items() if k.startswith(f"{m}/") and "order_check" not in k)
                   for m in cfg["models"] if any(k.startswith(f"{m}/") for k in arms)}
    out: dict = {"n_per_split": n_per_model.get(first, 0), "n_per_model": n_per_model,
                 "models": cfg["models"], "llm_model": first,
                 "llm_weight": {m: d["chosen"] for m, d in dev.items()}}
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


def merge_report(saved: dict, own: dict) -> dict:
    """A partial run's report laid over the saved one: its own keys and arms win, every other is kept."""
    return saved | own | {"arms": saved.get("arms", {}) | own.get("arms", {})}


def model_of(key: str, models: list[str]) -> str:
    """The model an arm key (``model/arm/render/split``) belongs to; model strings may hold slashes."""
    return max((m for m in models if key.startswith(f"{m}/")), key=len, default="")


def tables(results: dict) -> str:
    """Markdown: summary, every arm at its model's dev weight, the dev grids."""
    s, rep, dev, cfg = results["summary"], results["report"], results["dev"], results["config"]
    lines = ["# Frozen-LLM reranker on MetaTool", "",
             (f"n = {s['n_per_split']} queries per split (seed {cfg['report_seed']}; per model: "
              f"{s['n_per_model']}); LLM weight per model {s['llm_weight']} chosen on seed "
              f"{cfg['dev_seed']} ({cfg['dev_n_per_split']} queries per split); reported reranker: "
              f"{s['llm_model']} (best dev top-1)."), "",
             "| | seen | held-out |", "|---|---|---|"]
    for key in ("llm_top1", "fields_top1", "retrieval_top1", "typed_minus_flat_llm"):
        cells = [s[f"{key}_{split}"] for split in ("seen", "heldout")]
        lines.append(f"| {key} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")
    gains = ", ".join(f"{m} {g:+.3f}" for m, g in s["transfer_gain_over_docs"].items())

    def cell(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    lines += ["", f"Transfer gain (federated typed minus docs_only, mean of splits): {gains}", "",
              "| arm | fused (dev weight) | LLM alone | weight 0 (no LLM) | queries/s | fallbacks | n |",
              "|---|---|---|---|---|---|---|"]
    for key, m in sorted(rep["arms"].items()):
        if "order_check" in key:
            continue
        w = dev.get(model_of(key, cfg["models"]), {}).get("chosen")
        fallbacks = "-" if m["fallbacks"] is None else m["fallbacks"]
        lines.append(f"| {key} | {cell(at_weight(m, w))} | {cell(at_weight(m, 1000.0))} | "
                     f"{cell(at_weight(m, 0.0))} | {cell(m['queries_per_s'])} | {fallbacks} | {m['n']} |")
    if any(m["queries_per_s"] is None for key, m in rep["arms"].items() if "order_check" not in key):
        lines += ["", "queries/s `-`: the arm's rows were reread from a run that did not record its speed."]
    if any("order_check" in key for key in rep["arms"]) or "list_balanced" in rep:
        lines += ["", ("Order check (picks changed when the candidates are reversed / shuffled, at the model's dev "
                       "weight and for the LLM alone):"), ""]
    for key, m in sorted(rep["arms"].items()):
        if "order_check" in key:
            w = dev.get(model_of(key, cfg["models"]), {}).get("chosen")
            lines.append(f"- {key} (n {m['n']}): fused {m['by_weight'].get(str(w))}, "
                         f"LLM alone {m['by_weight']['1000.0']}")
    if "list_balanced" in rep:
        lb = rep["list_balanced"]
        lines += [(f"- list prompt, cyclic orders ({cfg['models'][0]}, n {lb['n']}): top-1 by weight "
                   f"{lb['by_weight']}, order check {lb['order_check']['by_weight']}")]
    lines += ["", "Dev grids (seed-7 top-1 by LLM weight, per model):", ""]
    lines += [f"- {m}: {d['grid']} -> {d['chosen']}" for m, d in dev.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run dev selection and the report; write results.json, summary.json and tables.md after every arm."""
    parser = experiment_parser(__doc__)
    parser.add_argument("--stage", choices=("all", "dev", "report", "tables"), default="all",
                        help="dev: only the per-model weight grids (dev.json); report: only the report seed, read "
                             "at the dev grids in the output folder when it saves (so both stages can run side by "
                             "side); tables: rewrite results, summary and tables from the output folder; all: dev, "
                             "then report")
    parser.add_argument("--models", nargs="+", metavar="MODEL",
                        help="measure only these models (of the config's `models`); the others' dev grids and "
                             "arms are kept from the output folder")
    parser.add_argument("--arms", nargs="+", metavar="ARM", choices=ARMS,
                        help="report only these arms of each model; the others are kept from the output folder")
    parser.add_argument("--order-check-only", action="store_true",
                        help="rerun only the order checks of the results already in the output folder")
    args = parser.parse_args()
    cfg = load_experiment(args.config)
    models = args.models or cfg["models"]
    if unknown := sorted(set(models) - set(cfg["models"])):
        parser.error(f"--models {unknown} not in the config's models {cfg['models']}")
    if not {0.0, 1000.0} <= set(map(float, cfg["weights"])):
        parser.error(f"weights must include 0.0 (no LLM) and 1000.0 (the LLM alone), got {cfg['weights']}")
    import torch

    torch.set_num_threads(cfg["torch_threads"])
    emb = get_embedder(cfg["embedder"])
    out = Path(cfg["output"])
    dev_path = out / "dev.json"
    results_path = out / "results.json"

    def saved_report() -> dict:
        return json.loads(results_path.read_text())["report"] if results_path.exists() else {}

    partial = bool(args.models) or bool(args.arms)
    # a run that measures starts empty: a partial one rereads the rest of the folder at every save
    rep = saved_report() if args.order_check_only or args.stage == "tables" else {}

    def read_dev() -> dict:
        return json.loads(dev_path.read_text()) if dev_path.exists() else {}

    def save(rep: dict) -> None:
        dev = read_dev()  # a dev stage running beside this one may have written since
        if partial:  # so may a run for other models or arms: keep what it saved
            rep = merge_report(saved_report(), rep)
        results = {"config": cfg, "dev": dev, "report": rep, "summary": summary(rep, dev, cfg)}
        write_results(out, results, cfg, data_hashes("metatool"),  # the pinned data and the shipped example requests
                      f"python simulations/llm_bench.py {args.config}")
        update_summary(out / "summary.json", results["summary"])
        write_atomic(out / "tables.md", tables(results))

    if args.order_check_only:
        recheck_orders(cfg, emb, models, rep, save)
    elif args.stage == "tables":
        save(rep)
    if args.order_check_only or args.stage == "tables":
        return
    if args.stage in ("all", "dev"):
        for model in models:
            grid = dev_grid(cfg, emb, model, Path(cfg["rows"]))
            write_atomic(dev_path, json.dumps(read_dev() | {model: grid}, indent=2, sort_keys=True) + "\n")
    if args.stage in ("all", "report"):
        report(cfg, emb, models, args.arms, rep, save, Path(cfg["rows"]))

if __name__ == "__main__":
    main()
