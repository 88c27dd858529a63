"""No harm on dataset folders of other shapes: MetaTool rewritten several ways.

Another user's benchmark will not look like the splits the router was tuned
on. This writes MetaTool as generic dataset folders of other shapes (more or
fewer tools held out, fewer and more skewed organisations, a tenth or a
fiftieth of the experience, documentation cut to its first sentence or to the
tool's name alone), reads each back through
:func:`~synapse_flwr.data.federation.load_folder` (the generic path of
``synapse experiment``), and routes its test queries with the shipped router
(``fields`` reranker, no tuning here) from: the documentation alone, the
merged global of every organisation's one release without noise, and the
same at the private epsilon over several noise draws. A row passes the
no-harm rule when held-out top-1 >= docs_only - 0.005 and seen top-1 >=
docs_only. In process, no Flower (the Flower path's merge and router are the
same functions).

Usage: ``python simulations/folder_stress.py configs/folder_stress.toml``
"""

from __future__ import annotations

import json
import logging
import math
import random
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
from synapse_flwr.simulations.tune_router import (
    NO_HARM,
    accuracy,
    dataset,
    harmless,
    write_folder,
)

from synapse_flwr.core.builder import (
    BuildConfig,
    build_compendium,
    derive_seed,
    vote_noise,
)
from synapse_flwr.core.catalog import Catalog
from synapse_flwr.core.embed import Embedder
from synapse_flwr.core.fusion import voted_fusion
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.release import cast_votes
from synapse_flwr.core.router import Router
from synapse_flwr.core.votes import VOTE_SHARE, sum_votes
from synapse_flwr.data.federation import FederatedDataset, load_folder
from synapse_flwr.eval.results import run_lab

log = logging.getLogger("folder_stress")
#: What each ``docs`` shape keeps of a tool's documentation.
CUTS = {"full": lambda t: t.description, "sentence": lambda t: t.description.split(". ")[0].rstrip(".") + ".",
        "name": lambda t: t.name}


def reshape(ds: FederatedDataset, keep: float, docs: str, seed: int) -> FederatedDataset:
    """Keep a share of every org's events; cut the documentation to ``full``, ``sentence`` or ``name``."""
    rng = random.Random(seed)
    orgs = {o: [e for e in evs if rng.random() < keep] for o, evs in ds.orgs.items()}
    # write_folder writes names and descriptions only: the catalog's example requests never reach the folder
    catalog = Catalog(tuple(replace(t, description=CUTS[docs](t)) for t in ds.catalog.tools))
    return FederatedDataset(ds.name, catalog, orgs, ds.seen_test, ds.heldout_test, ds.info)


def run_variant(v: dict, cfg: dict, emb: Embedder) -> dict:
    """Write one folder shape, read it back, and route its tests with every arm."""
    log.info("shape: %s", v)
    base = dataset(cfg["seed"], {"orgs": v.get("orgs", 5), "alpha": v.get("alpha", 0.5)}, v.get("heldout_frac", 0.5))
    shaped = reshape(base, v.get("keep", 1.0), v.get("docs", "full"), cfg["seed"])
    with tempfile.TemporaryDirectory() as tmp:
        ds = load_folder(write_folder(shaped, Path(tmp) / v["name"]))
    docs = accuracy(Router(None, ds.catalog, embedder=emb, reranker="fields", k=cfg["k"]), ds)
    row = {"variant": v["name"], "tools": len(ds.catalog), "events": sum(map(len, ds.orgs.values())),
           "seen_n": len(ds.seen_test), "heldout_n": len(ds.heldout_test), "docs_only": docs}
    for eps, draws in ((math.inf, 1), (cfg["epsilon"], cfg["draws"])):
        label = "federated" if math.isinf(eps) else f"federated_eps{eps:g}"
        for d in range(draws):
            row[label if draws == 1 else f"{label}_draw{d}"] = federated(ds, eps, d, cfg, emb, docs)
    log.info("%s", json.dumps(row))
    return row


def federated(ds: FederatedDataset, eps: float, draw: int, cfg: dict, emb: Embedder, docs: dict) -> dict:
    """One noise draw of the merged global, routed as the product routes it: after the fusion votes, and without."""
    config = BuildConfig(vote_share=VOTE_SHARE)  # the ClientApp's build config when the run votes
    comp = merge_typed([build_compendium(evs, ds.catalog, org, round_=draw, epsilon=eps, delta=cfg["delta"], rounds=1,
                                         seed=cfg["seed"], embedder=emb, config=config)
                        for org, evs in sorted(ds.orgs.items())])
    router = Router(comp, ds.catalog, embedder=emb, k=cfg["k"])
    out = {f"{k}_no_votes": v for k, v in accuracy(router, ds).items()}
    sd, _ = vote_noise(eps, cfg["delta"], 1, 1, config, emb)
    votes = sum_votes([cast_votes(evs, ds.catalog, comp, emb, sd,
                                  np.random.default_rng(derive_seed(cfg["seed"], draw, org, "votes")))
                       for org, evs in sorted(ds.orgs.items())])
    # the fusion the product's router reads off a global that carries these votes
    router.set_fusion(voted_fusion(comp.model_copy(update={"votes": votes}), emb.name))
    out |= accuracy(router, ds)
    out["setting"] = [router.fusion.prototype, router.fusion.prior]
    out["ok"] = harmless(out, docs)
    out["ok_no_votes"] = harmless({"seen": out["seen_no_votes"], "heldout": out["heldout_no_votes"]}, docs)
    return out


def tables(rows: list[dict], cfg: dict) -> str:
    """One line per folder shape and arm: the product's route (after the votes) and the router without votes."""
    intro = (f"MetaTool split seed {cfg['seed']}, written as generic folders and read back with `load_folder`; "
             "the shipped router (`fields`), no tuning. `ok`: held-out >= docs_only - "
             f"{NO_HARM} and seen >= docs_only. `votes chose`: (prototype weight, prior) the federation's fusion "
             "votes chose ((0, 0) is documentation only).")
    lines = ["# No harm on dataset folders of other shapes", "", intro, "",
             ("| shape | tools | events | seen n | held-out n | arm | seen | held-out | ok | votes chose "
              "| no votes: seen | held-out | ok |"), "|" + "---|" * 13]
    for r in rows:
        d = r["docs_only"]
        lines.append(f"| {r['variant']} | {r['tools']} | {r['events']} | {r['seen_n']} | {r['heldout_n']} "
                     f"| docs_only | {d['seen']} | {d['heldout']} | | | | | |")
        for arm in [k for k in r if k.startswith("federated")]:
            a = r[arm]
            lines.append(f"| | | | | | {arm} | {a['seen']} | {a['heldout']} | {a['ok']} "
                         f"| ({a['setting'][0]:g}, {a['setting'][1]:g}) | {a['seen_no_votes']} "
                         f"| {a['heldout_no_votes']} | {a['ok_no_votes']} |")
    arms = [(r["variant"], k, a) for r in rows for k, a in r.items() if k.startswith("federated")]
    for key, what in (("ok", "the product (after the votes)"), ("ok_no_votes", "the router without votes")):
        failed = [f"{v} / {k}" for v, k, a in arms if not a[key]]
        lines.append(f"- No-harm rule failed for {what} on {len(failed)} of {len(arms)} rows"
                     + (": " + ", ".join(failed) if failed else "."))
    return "\n".join([*lines, ""])


def one_run(run: dict, cfg: dict, emb: Embedder) -> list[dict]:
    """One folder shape of the config (its row)."""
    return [run_variant(run, cfg, emb)]


def main() -> None:
    """Run every shape of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "folder_stress.py", one_run, tables, datasets=lambda cfg: ["metatool"])


if __name__ == "__main__":
    main()
