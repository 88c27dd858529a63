"""The count prior under label shift: seen-tool top-1 per prior weight, on the test mix a dataset has and on a balanced one.

Inside the per-query gate the router adds ``prior * log(1 + n)`` for each
tool's released count ``n``: a class prior learnt from the federation's
training mix. It helps where test traffic follows that mix and costs where it
does not. Each federation (K orgs, one release each, merged typed) is routed
with the ``none`` reranker at every prior weight on its seen test queries as
they come, on a class-balanced subsample (``per_tool`` queries of every seen
tool; tools with fewer are left out) and on its held-out queries, beside
docs_only on the same queries. The training mix's skew (largest over smallest
labelled count among seen tools) is reported with each dataset.

Usage: ``python simulations/label_shift.py configs/label_shift.toml``
"""

from __future__ import annotations

import logging
import math
import random
from collections import Counter, defaultdict
from dataclasses import replace

from synapse_flwr.simulations.tune_router import accuracy

from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.experience import event_label
from synapse_flwr.core.fusion import Fusion
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.router import Router
from synapse_flwr.data.federation import FederatedDataset, load_federated
from synapse_flwr.eval.results import run_lab

log = logging.getLogger("label_shift")


def balanced(ds: FederatedDataset, per_tool: int, seed: int) -> FederatedDataset:
    """The dataset with its seen test queries cut to ``per_tool`` per gold tool (fewer: left out)."""
    by_tool = defaultdict(list)
    for item in ds.seen_test:
        by_tool[item.gold[0]].append(item)
    rng = random.Random(seed)
    items = [x for tool in sorted(by_tool) if len(by_tool[tool]) >= per_tool
             for x in rng.sample(by_tool[tool], per_tool)]
    return replace(ds, seen_test=items)


def skew(ds: FederatedDataset) -> float:
    """Largest over smallest labelled training count among the tools that have any."""
    counts = Counter(y for events in ds.orgs.values() for e in events if (y := event_label(e, ds.catalog)))
    return max(counts.values()) / min(counts.values())


def one_run(run: dict, cfg: dict, emb) -> list[dict]:
    """Every draw x prior of one (dataset, orgs, epsilon) federation, with the docs_only lines."""
    ds = load_federated(run["dataset"], run["orgs"], cfg["seed"])
    mixes = {"as given": ds, "balanced": balanced(ds, cfg["per_tool"], cfg["seed"])}
    eps = math.inf if run["epsilon"] == "inf" else float(run["epsilon"])
    docs = Router(None, ds.catalog, embedder=emb, reranker="none")
    lines = {mix: accuracy(docs, d) for mix, d in mixes.items()}
    train_skew = round(skew(ds), 2)
    rows = []
    for draw in run["draws"]:
        arts = [build_compendium(ev, ds.catalog, org, round_=draw, epsilon=eps, delta=cfg["delta"], rounds=1,
                                 seed=cfg["seed"], embedder=emb) for org, ev in sorted(ds.orgs.items())]
        router = Router(merge_typed(arts), ds.catalog, embedder=emb, reranker="none")
        for prior in cfg["priors"]:
            router.set_fusion(Fusion(prior=prior))
            for mix, d in mixes.items():
                acc = accuracy(router, d)
                row = {"dataset": run["dataset"], "orgs": run["orgs"], "epsilon": run["epsilon"], "draw": draw,
                       "prior": prior, "mix": mix, "n_seen": len(d.seen_test), "skew": train_skew,
                       **acc, "docs_seen": lines[mix]["seen"], "docs_heldout": lines[mix]["heldout"]}
                log.info("%s", row)
                rows.append(row)
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Markdown: seen top-1 per (dataset, epsilon, mix) and prior, mean over draws, beside docs_only."""
    priors = cfg["priors"]
    no_harm = "yes" if all(r["heldout"] >= r["docs_heldout"] - 0.005 for r in rows) else "NO"
    head = "| dataset | train skew | orgs | epsilon | draws | test mix | n | docs_only | "
    lines = [f"# The count prior under label shift (seed {cfg['seed']}; balanced: {cfg['per_tool']} seen queries a tool)",
             "", f"Seen-tool top-1, mean over noise draws; held-out equals docs_only in every row ({no_harm}).", "",
             head + " | ".join(f"prior {p}" for p in priors) + " |", "|" + "---|" * (8 + len(priors))]
    keys = dict.fromkeys((r["dataset"], r["orgs"], r["epsilon"], r["mix"]) for r in rows)
    for key in keys:
        sel = [r for r in rows if (r["dataset"], r["orgs"], r["epsilon"], r["mix"]) == key]
        cells = []
        for p in priors:
            vals = [r["seen"] for r in sel if r["prior"] == p]
            mean = sum(vals) / len(vals)
            cells.append(f"{mean:.4f}" + (" **below docs**" if mean < sel[0]["docs_seen"] else ""))
        draws = len({r["draw"] for r in sel})
        lines.append(f"| {key[0]} | {sel[0]['skew']} | {key[1]} | {key[2]} | {draws} | {key[3]} | {sel[0]['n_seen']} "
                     f"| {sel[0]['docs_seen']:.4f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run every federation of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "label_shift.py", one_run, tables, lambda cfg: (run["dataset"] for run in cfg["runs"]))


if __name__ == "__main__":
    main()
