"""Readable private scenarios over public sentences: what survives the noise, on the seed-7 dev split.

Three measurements, in process, before any field is built (issue 11):

1. **DP votes over public sentences.** A tool's candidate sentences are public:
   its own description and those of its ``neighbours`` nearest tools (by
   description embedding). Each labelled event votes for the candidate of its
   tool nearest its query; the merged votes get the noise the vote would carry
   in the same Gaussian release at weight ``w`` (``sigma * sqrt(S^2 + w^2) / (S w)``
   per org, ``S`` today's sensitivity). Reported: cells above 3 merged SDs,
   those naming another tool's sentence (the readable routing knowledge), and
   the extra noise every other field pays.
2. **Free anchors.** Post-processing of the released prototypes: tools whose
   prototype direction is closer to another tool's description than to its own.
3. **A (documentation pick -> label) table** as retrieval evidence inside the
   per-query gate, exact counts (the best case) and noised.

Usage: ``python simulations/scenario_lab.py configs/scenario_lab.toml``
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np

from synapse_flwr.core.builder import BuildConfig, build_compendium
from synapse_flwr.core.embed import get_embedder
from synapse_flwr.core.experience import event_label
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.pii import mask_pii
from synapse_flwr.core.privacy import calibrate
from synapse_flwr.core.router import Router
from synapse_flwr.data.federation import load_federated
from synapse_flwr.data.pins import verified_hashes
from synapse_flwr.eval.results import experiment_parser, load_experiment, write_results


def labelled(ds, router: Router) -> tuple[list[int], list[str]]:
    """Every org's labelled events: tool positions and PII-masked queries."""
    pairs = [(router.position[y], mask_pii(e.query)) for events in ds.orgs.values() for e in events
             if (y := event_label(e, ds.catalog))]
    return [y for y, _ in pairs], [t for _, t in pairs]


def votes(ys: list[int], q: np.ndarray, docs: np.ndarray, cfg: dict, sigma: float, s2: float) -> list[dict]:
    """Cells of the vote histogram above 3 merged noise SDs, per vote weight."""
    sim = docs @ docs.T
    cands = [np.array([i] + [j for j in np.argsort(-sim[i]) if j != i][: cfg["neighbours"]]) for i in range(len(docs))]
    cells = Counter()
    for y, qv in zip(ys, q):
        cells[(y, int(cands[y][np.argmax(docs[cands[y]] @ qv)]))] += 1
    rows = []
    for w in cfg["vote_weights"]:
        sd = sigma * math.sqrt(s2 + w * w) / math.sqrt(s2) / w * math.sqrt(cfg["orgs"])
        above = [(y, j) for (y, j), n in cells.items() if n > 3 * sd]
        other = [(y, j) for y, j in above if y != j]
        rows.append({"weight": w, "merged_sd": round(sd, 2), "cells_above": len(above), "other_tool": len(other),
                     "tools_with_other": len({y for y, _ in other}),
                     "extra_noise_elsewhere": round(math.sqrt((s2 + w * w) / s2) - 1, 4)})
    return rows


def free_anchors(router: Router, docs: np.ndarray) -> dict:
    """Used prototypes whose direction is closer to another tool's description (top 8) than to its own."""
    dirs, gain, _ = router.prototypes
    used = np.flatnonzero(gain > 0)
    closer = {router.tool_ids[y]: [router.tool_ids[a] for a in np.argsort(-(docs @ dirs[y]))[:8]
                                   if a != y and docs[a] @ dirs[y] >= docs[y] @ dirs[y]] for y in used}
    return {"used": len(used), "with_closer_description": sum(bool(v) for v in closer.values()),
            "examples": {t: v[:3] for t, v in sorted(closer.items()) if v}}


def table_evidence(router: Router, ds, ys: list[int], texts: list[str], q: np.ndarray, cfg: dict,
                   sigma: float) -> list[dict]:
    """Top-1 with beta * P(label | docs pick) added inside the gate; exact and noised tables."""
    n = len(router.tool_ids)
    picks = np.argmax(router.evidence(texts, q)["description"], 1)
    table = np.zeros((n, n))
    np.add.at(table, (picks, ys), 1.0)
    noised = np.maximum(table + np.random.default_rng(cfg["seed"]).normal(0, sigma * math.sqrt(cfg["orgs"]), table.shape), 0)
    splits = {s: (items, router.evidence([t.query for t in items])) for s, items in
              (("seen", ds.seen_test), ("heldout", ds.heldout_test))}
    rows = []
    for name, t in (("exact", table), ("noised", noised)):
        for beta in [0.0, *cfg["table_betas"]]:
            row = {"table": name, "beta": beta}
            for split, (items, parts) in splits.items():
                d = np.argmax(parts["description"], 1)
                gate = (router.prototypes[1][d] > 0)[:, None]
                p = t[d] / np.maximum(t[d].sum(1, keepdims=True), 1)
                scores = sum(parts.values()) + beta * p * gate
                row[split] = round(float(np.mean([router.tool_ids[int(np.argmax(s))] in it.gold
                                                  for s, it in zip(scores, items)])), 4)
            rows.append(row)
    return rows


def main() -> None:
    """Run the three measurements and write results.json, manifest.json and tables.md."""
    args = experiment_parser(__doc__).parse_args()
    cfg = load_experiment(args.config)
    emb = get_embedder(cfg["embedder"])
    ds = load_federated("metatool", cfg["orgs"], cfg["seed"], cfg["alpha"])
    config = BuildConfig()
    params = config.privacy_params(cfg["epsilon"], cfg["delta"], 1, config.prototype_weight)
    sigma, s2 = calibrate(params).sigma, params.l2_sensitivity**2
    arts = [build_compendium(ev, ds.catalog, org, epsilon=cfg["epsilon"], delta=cfg["delta"], seed=cfg["seed"],
                             embedder=emb) for org, ev in sorted(ds.orgs.items())]
    router = Router(merge_typed(arts), ds.catalog, embedder=emb, reranker="none")
    docs = router.vectors[router.doc_rows]
    ys, texts = labelled(ds, router)
    q = router._embed(texts)
    res = {"sigma": sigma, "squared_sensitivity": s2, "labelled_events": len(ys),
           "votes": votes(ys, q, docs, cfg, sigma, s2), "free_anchors": free_anchors(router, docs),
           "table": table_evidence(router, ds, ys, texts, q, cfg, sigma)}
    out = Path(cfg["output"])
    write_results(out, res, cfg, verified_hashes(["metatool"]), f"python simulations/scenario_lab.py {args.config}")
    lines = [f"# Readable private scenarios: what survives (MetaTool seed {cfg['seed']}, dev)", "",
             "| vote weight | merged SD | cells > 3 SD | naming another tool | tools | extra noise elsewhere |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['weight']} | {r['merged_sd']} | {r['cells_above']} | {r['other_tool']} | {r['tools_with_other']} "
              f"| {r['extra_noise_elsewhere']:+.1%} |" for r in res["votes"]]
    fa = res["free_anchors"]
    examples = dict(list(fa["examples"].items())[:4])
    lines += ["", (f"Free anchors: {fa['with_closer_description']} of {fa['used']} used prototypes sit closer to "
                   f"another tool's description; e.g. {examples}"), "",
              "| table | beta | seen | held-out |", "|---|---|---|---|"]
    lines += [f"| {r['table']} | {r['beta']} | {r['seen']:.4f} | {r['heldout']:.4f} |" for r in res["table"]]
    write_atomic(out / "tables.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
