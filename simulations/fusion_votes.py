"""Fusion votes on the seed-7 dev split: the share of the budget they take, the setting they choose, what it routes.

Each federation (K orgs of one dataset, split seed ``seed``) releases its
experience once (round 1, merged typed), then every record casts its
leave-one-out fusion vote against that global (round 2;
:mod:`synapse_flwr.core.votes`) and the router follows the summed votes. Per
vote share (0: no votes, the MetaTool defaults) and noise draw the lab
reports, per choice rule and margin, the chosen setting and the seen /
held-out top-1 (``none`` reranker), beside docs_only on the same queries.
Rules: ``gate`` (:func:`~synapse_flwr.core.votes.chosen_setting`: the best
setting once it beats documentation only by ``margin`` noise SDs of their
difference) and ``within`` (the first setting, least experience first, within
``margin`` SDs of the best). A share costs the release
noise (``1 / sqrt(1 - share)`` more); a small one leaves the votes noisy.

Usage: ``python simulations/fusion_votes.py configs/fusion_votes.toml``
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import replace

import numpy as np
from synapse_flwr.simulations.tune_router import accuracy

from synapse_flwr.core.builder import (
    BuildConfig,
    build_compendium,
    derive_seed,
    vote_noise,
)
from synapse_flwr.core.fusion import Fusion
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.release import cast_votes
from synapse_flwr.core.router import Router
from synapse_flwr.core.schema import FusionSetting, FusionVotes
from synapse_flwr.core.votes import chosen_setting, sum_votes
from synapse_flwr.data.federation import load_federated
from synapse_flwr.eval.results import group_rows, run_lab

log = logging.getLogger("fusion_votes")


def within_noise(votes: FusionVotes, sds: float) -> FusionSetting:
    """The rival rule: the first setting whose votes are within ``sds`` SDs of their difference of the best."""
    floor = max(votes.correct) - sds * math.sqrt(2) * votes.sd
    return next(s for s, c in zip(votes.settings, votes.correct) if c >= floor)


#: ``gate``: the best setting once it beats documentation only by the margin (the router's rule).
RULES = {"gate": chosen_setting, "within": within_noise}


def one_run(run: dict, cfg: dict, emb) -> list[dict]:
    """Every share x draw of one (dataset, orgs, epsilon) federation, with the docs_only lines."""
    ds = load_federated(run["dataset"], run["orgs"], cfg["seed"])
    eps = math.inf if run["epsilon"] == "inf" else float(run["epsilon"])
    docs = accuracy(Router(None, ds.catalog, embedder=emb, reranker="none"), ds)
    rows = []
    for share in run["shares"] if math.isfinite(eps) else [0.0, cfg["exact_share"]]:
        config = BuildConfig(vote_share=share)
        for draw in run["draws"]:
            arts = {org: build_compendium(ev, ds.catalog, org, round_=1, epsilon=eps, delta=cfg["delta"],
                                          rounds=1, seed=draw, embedder=emb, config=config)
                    for org, ev in sorted(ds.orgs.items())}
            glob = merge_typed(list(arts.values()))
            votes = None
            if share:
                sd, _ = vote_noise(eps, cfg["delta"], 1, 1, config, emb)
                votes = sum_votes([cast_votes(ev, ds.catalog, glob, emb, sd,
                                              np.random.default_rng(derive_seed(draw, org, 2, "votes")))
                                   for org, ev in sorted(ds.orgs.items())])
            router = Router(glob, ds.catalog, embedder=emb, reranker="none")
            for rule, sds in itertools.product(RULES, cfg["vote_sds"]) if share else [(None, None)]:
                setting = RULES[rule](votes, sds) if share else None
                router.set_fusion(replace(Fusion(), prototype=setting.prototype, prior=setting.prior)
                                  if setting else Fusion())
                row = {"dataset": run["dataset"], "orgs": run["orgs"], "epsilon": run["epsilon"], "share": share,
                       "rule": rule, "vote_sds": sds, "draw": draw, "prototype": router.fusion.prototype,
                       "prior": router.fusion.prior, "vote_sd": votes.sd if votes else None,
                       "voters": votes.records if votes else None, "correct": votes.correct if votes else None,
                       **accuracy(router, ds), "docs_seen": docs["seen"], "docs_heldout": docs["heldout"]}
                log.info("%s", row)
                rows.append(row)
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Markdown: per federation and share, mean top-1 over draws beside docs_only, and the settings chosen."""
    groups = group_rows(rows, "dataset", "orgs", "epsilon", "share", "rule", "vote_sds")
    intro = ("Top-1 (retrieval order), mean over noise draws; share 0 is the MetaTool defaults without votes "
             "(prototype 8, prior 0.5). Chosen: (prototype weight, prior) per draw.")
    head = ("| dataset | orgs | epsilon | share | rule | margin (SDs) | draws | seen | held-out | docs seen "
            "| docs held-out | seen - docs | chosen | vote SD |")
    lines = [f"# Fusion votes on the seed-{cfg['seed']} dev split", "", intro, "", head, "|" + "---|" * 14]
    for (dataset, orgs, eps, share, rule, sds), sel in groups.items():
        seen = sum(r["seen"] for r in sel) / len(sel)
        held = sum(r["heldout"] for r in sel) / len(sel)
        chosen = ", ".join(f"({r['prototype']:g}, {r['prior']:g})" for r in sel) if share else "defaults"
        sd = f"{sel[0]['vote_sd']:.1f}" if sel[0]["vote_sd"] is not None else "-"
        margin = "-" if sds is None else f"{sds:g}"
        lines.append(f"| {dataset} | {orgs} | {eps} | {share:g} | {rule or '-'} | {margin} | {len(sel)} | {seen:.4f} "
                     f"| {held:.4f} "
                     f"| {sel[0]['docs_seen']:.4f} | {sel[0]['docs_heldout']:.4f} | {seen - sel[0]['docs_seen']:+.4f} "
                     f"| {chosen} | {sd} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run every federation of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "fusion_votes.py", one_run, tables)


if __name__ == "__main__":
    main()
