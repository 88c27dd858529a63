"""Seen and held-out top-1 against epsilon: the private compendium, fedavg_dp, docs_only, the classifier.

In process, no Flower run per point: per seed and epsilon every organisation
builds its artifact in one release (:func:`~synapse_flwr.core.builder.build_compendium`,
as release-once does on clean data), the artifacts are merged with
:func:`~synapse_flwr.core.merge.merge_typed` and the global routes the
``seen`` and ``heldout`` test sets with the default router; ``fedavg_dp``
trains its head at the same per-organisation epsilon with the settings of
the dev grid of ``simulations/tune_fedavg.py`` (read from its results), through
:func:`~synapse_flwr.flower.fedavg_dp.run_in_process`. docs_only and the
pooled TF-IDF + SVM classifier do not depend on epsilon.

Usage: ``python simulations/epsilon_sweep.py configs/epsilon_sweep.toml``
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import sys
from pathlib import Path

from synapse_flwr.simulations.experiment import data_hashes
from synapse_flwr.simulations.tune_fedavg import fedavg_point
from synapse_flwr.simulations.tune_router import accuracy, global_compendium

from synapse_flwr.core.embed import get_embedder
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.router import Router
from synapse_flwr.data.federation import FederatedDataset, load_federated
from synapse_flwr.eval.baselines import tfidf_svm_arm
from synapse_flwr.eval.results import experiment_parser, load_experiment, write_results

log = logging.getLogger("epsilon_sweep")
SPLITS = ("seen", "heldout")
SWEPT = ("federated", "fedavg_dp")
FLAT = ("docs_only", "classifier")


def epsilon_of(value: float | str) -> float:
    """An epsilon from the config (``"inf"``: no privacy)."""
    return math.inf if value == "inf" else float(value)


def tuned_settings(path: str) -> dict:
    """fedavg_dp's settings chosen on the dev split (the ``chosen`` block of tune_fedavg's results)."""
    return json.loads(Path(path).read_text())["chosen"]


def compendium_points(cfg: dict, ds: FederatedDataset, seed: int, emb: object) -> dict:
    """docs_only, the classifier and the private compendium at every epsilon, on one seed."""
    out = {"docs_only": accuracy(Router(None, ds.catalog, embedder=emb, k=cfg["k"]), ds),
           "classifier": {s: round(m["acc"], 4) for s, m in tfidf_svm_arm(
               ds.all_events, ds.catalog, {"seen": ds.seen_test, "heldout": ds.heldout_test}).items()}}
    for value in cfg["epsilons"]:
        comp, _ = global_compendium(ds, epsilon_of(value), cfg["prototype_weight"], cfg, emb, seed)
        out[str(value)] = {"federated": accuracy(Router(comp, ds.catalog, embedder=emb, k=cfg["k"]), ds)}
        log.info("seed %d eps %s: federated %s", seed, value, out[str(value)]["federated"])
    return out


def seed_points(cfg: dict, seed: int, emb: object) -> dict:
    """Every arm's seen/held-out top-1 on one seed: flat arms once, swept arms per epsilon.

    The compendium part is kept in ``<output>/partial_seed<seed>.json`` until
    the seed is complete, so a run stopped in the fedavg_dp part resumes there.
    """
    partial = Path(cfg["output"]) / f"partial_seed{seed}.json"
    ds = None if partial.is_file() else load_federated("metatool", cfg["orgs"], seed, cfg["alpha"], 0.0)
    if ds is None:
        out = json.loads(partial.read_text())
    else:
        out = compendium_points(cfg, ds, seed, emb)
        write_atomic(partial, json.dumps(out))
    todo = [v for v in cfg.get("fedavg_epsilons", cfg["epsilons"]) if "fedavg_dp" not in out[str(v)]]
    settings = tuned_settings(cfg["fedavg_settings"]) if todo else out.get("fedavg_settings")
    if todo and ds is None:
        ds = load_federated("metatool", cfg["orgs"], seed, cfg["alpha"], 0.0)
    for value in cfg.get("fedavg_epsilons", cfg["epsilons"]):
        if value in todo:
            out[str(value)]["fedavg_dp"] = fedavg_point(ds, settings, epsilon_of(value), cfg["delta"],
                                                        cfg["rounds"], emb, seed)
            out["fedavg_settings"] = settings
            write_atomic(partial, json.dumps(out))
        log.info("seed %d eps %s: fedavg_dp %s", seed, value, out[str(value)].get("fedavg_dp"))
    return out


def summarise(per_seed: dict, path: tuple[str, ...]) -> dict:
    """Mean and SD over seeds of the seen/held-out top-1 found at ``path`` in each seed's points."""
    out = {}
    for split in SPLITS:
        vals = []
        for points in per_seed.values():
            node = points
            for key in path:
                node = node.get(key, {})
            if split in node:
                vals.append(node[split])
        if not vals:
            continue
        out[split] = {"mean": round(statistics.fmean(vals), 4),
                      "sd": round(statistics.stdev(vals), 4) if len(vals) > 1 else 0.0}
    return out


def tables(cfg: dict, summary: dict) -> str:
    """The sweep as markdown: one row per epsilon, mean ± SD over seeds."""
    def cell(m: dict, split: str) -> str:
        return f"{m[split]['mean']:.3f} ± {m[split]['sd']:.3f}" if split in m else "not run"

    head = [f"{a} {s}" for a in SWEPT for s in SPLITS]
    lines = [f"# Epsilon sweep (MetaTool, seeds {cfg['seeds']}, K={cfg['orgs']}, alpha {cfg['alpha']})", "",
             "Top-1, mean ± SD over seeds. Epsilon per record (compendium) and per example (fedavg_dp), per "
             f"organisation, delta {cfg['delta']:g}. In process: one release per org and an in-process merge "
             "(no Flower run per point); fedavg_dp with the seed-7 dev settings of docs/results/fedavg_tuning. "
             "`not run`: an epsilon left out of the config's `fedavg_epsilons`.",
             "", "| epsilon | " + " | ".join(head) + " |", "|" + "---|" * (len(head) + 1)]
    for value in cfg["epsilons"]:
        row = summary[str(value)]
        lines.append(f"| {value} | " + " | ".join(cell(row[a], s) for a in SWEPT for s in SPLITS) + " |")
    lines += ["", "| arm (no epsilon) | seen | heldout |", "|---|---|---|"]
    lines += [f"| {a} | {cell(summary[a], 'seen')} | {cell(summary[a], 'heldout')} |" for a in FLAT]
    return "\n".join(lines) + "\n"


def figure(cfg: dict, summary: dict, path: Path) -> None:
    """Seen and held-out panels: the swept arms against epsilon, the flat arms as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = [epsilon_of(v) for v in cfg["epsilons"] if v != "inf"]
    xs = [epsilon_of(v) if v != "inf" else 2 * max(finite) for v in cfg["epsilons"]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, split in zip(axes, SPLITS):
        for arm in SWEPT:
            pts = [(x, summary[str(v)][arm][split]) for x, v in zip(xs, cfg["epsilons"])
                   if split in summary[str(v)][arm]]
            ax.errorbar([x for x, _ in pts], [p["mean"] for _, p in pts], yerr=[p["sd"] for _, p in pts],
                        marker="o", capsize=3,
                        label=arm if arm != "federated" else "federated (compendium)")
        for arm, style in zip(FLAT, ("--", ":")):
            ax.axhline(summary[arm][split]["mean"], linestyle=style, color="grey" if arm == "docs_only" else "k",
                       label=arm)
        ax.set_xscale("log")
        ax.set_xticks(xs, [str(v) for v in cfg["epsilons"]])
        ax.set(xlabel="epsilon", ylabel="top-1 accuracy", title=f"{split} tools")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> None:
    """Run every seed; write results.json, manifest.json, tables.md and epsilon_sweep.png."""
    args = experiment_parser(__doc__).parse_args(argv)
    cfg = load_experiment(args.config)
    emb = get_embedder(cfg["embedder"])
    per_seed = {str(seed): seed_points(cfg, seed, emb) for seed in cfg["seeds"]}
    summary = {a: summarise(per_seed, (a,)) for a in FLAT}
    summary |= {str(v): {a: summarise(per_seed, (str(v), a)) for a in SWEPT} for v in cfg["epsilons"]}
    out = Path(cfg["output"])
    write_results(out, {"per_seed": per_seed, "summary": summary}, cfg, data_hashes("metatool"),
                  f"python simulations/epsilon_sweep.py {args.config}")
    write_atomic(out / "tables.md", tables(cfg, summary))
    figure(cfg, summary, out / "epsilon_sweep.png")
    for seed in cfg["seeds"]:
        (out / f"partial_seed{seed}.json").unlink(missing_ok=True)
    log.info("wrote %s", out)


if __name__ == "__main__":
    main(sys.argv[1:])
