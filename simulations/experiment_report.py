"""An experiment's report: its targets (no harm first), ``tables.md``, the end-of-run summary and the figures.

Pure functions of the results dict :func:`~synapse_flwr.simulations.experiment.aggregate` assembles.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from synapse_flwr.simulations.experiment_config import ARMS, SPLITS

# How far below docs_only a federated arm may route on tools without experience
# (noise of a test set of a few thousand queries); overall it may not be below at all.
NO_HARM_MARGIN = 0.005
# a target's value is stored at 6 decimals (shown at 3: stored at 4, 0.16247 showed as +0.163 beside a table's 0.162)
# and compared with its goal at 9 (a difference of means is not exact: a drop of exactly the margin read as missed)
VALUE_DIGITS, COMPARE_DIGITS = 6, 9


def no_harm(results: dict) -> dict[str, dict[str, float]]:
    """Federated arms minus docs_only, per split: the no-harm check every dataset reports.

    Unrounded: a gap just past the margin must not round onto it (round for display only).
    """
    arms = results["arms"]
    docs = arms.get("docs_only", {})
    # splits in one order, whether an arm's metrics came fresh or from the (sorted) cache
    return {arm: {split: m["acc_mean"] - docs[split]["acc_mean"]
                  for split, m in sorted(arms[arm].items(), key=lambda sm: (sm[0] != "seen", sm[0]))
                  if split in docs and "acc_mean" in m}
            for arm in ("federated", "federated_private") if arm in arms and docs}


def targets(results: dict) -> list[dict]:
    """The issue's targets, each with its measured value and whether it is met."""
    arms, out = results["arms"], []

    def acc(arm: str, split: str, table: dict | None = None) -> float | None:
        m = (table or arms).get(arm, {}).get(split)
        return m["acc_mean"] if m else None

    def add(name: str, value: float | None, goal: str, ok: Callable[[float], bool]) -> None:
        if value is not None:
            out.append({"target": name, "value": round(value, VALUE_DIGITS), "goal": goal,
                        "met": bool(ok(round(value, COMPARE_DIGITS)))})

    seen = "seen"
    fed, cen, docs = acc("federated", seen), acc("centralized", seen), acc("docs_only", seen)
    if fed is not None and cen is not None:
        add(f"federated - centralized ({seen})", fed - cen, ">= -0.015", lambda v: v >= -0.015)
    if fed is not None and docs is not None:
        add(f"federated - docs_only ({seen})", fed - docs, ">= 0.10", lambda v: v >= 0.10)
    for arm, block in no_harm(results).items():
        for split, gap in block.items():
            goal = NO_HARM_MARGIN if split == "heldout" else 0.0
            add(f"no harm: {arm} - docs_only ({split})", gap, f">= {0.0 - goal:g}", lambda v, g=goal: v >= -g)
    cells = results["ablation_2x2"]
    for split in (seen, "heldout"):
        if acc("typed/typed", split, cells) is not None and acc("typed/flat", split, cells) is not None:
            add(f"typed render - flat render, typed merge ({split})",
                acc("typed/typed", split, cells) - acc("typed/flat", split, cells), ">= 0.05",
                lambda v: v >= 0.05)
    rates = results["contradiction"]
    if "0" in rates and (top := max(rates, key=float)) != "0":
        # a test set without seen queries has no seen row at either rate: no target, as for the rows above
        high, clean = acc("typed/typed", seen, rates[top]), acc("typed/typed", seen, rates["0"])
        if high is not None and clean is not None:
            add(f"typed arm change at {float(top):.0%} contradiction ({seen})", high - clean, ">= -0.03",
                lambda v: v >= -0.03)
    if fed is not None and acc("classifier", seen) is not None:
        add(f"federated - classifier ({seen}, moonshot)", fed - acc("classifier", seen), ">= 0",
            lambda v: v >= 0)
    out += llm_targets(results.get("llm_sample") or {})
    return out


def llm_targets(llm: dict) -> list[dict]:
    """Targets of the LLM sample: answered, above retrieval order, no harm against docs_only's LLM, order-free.

    An LLM call that fails routes in retrieval order, so the first two rows
    would hold trivially for an LLM that never answers: every arm's LLM
    calls must answer, and the order check must have compared some query.
    """
    arms, out = llm.get("arms", {}), []
    # splits in SPLITS order, whether the metrics came fresh or from the (sorted) cache
    answered = [(f"{arm} ({split})", 1.0 - by_split[split]["fallbacks"] / max(by_split[split]["n"], 1))
                for arm, by_split in arms.items() for split in SPLITS if split in by_split]
    rows = [{"target": f"LLM sample: share of queries the LLM answered, {name}", "value": round(share, VALUE_DIGITS),
             "goal": "= 1", "met": share == 1.0} for name, share in answered]
    fed = arms.get("federated", {})
    for split, m in ((s, fed[s]) for s in SPLITS if s in fed):
        out.append(("LLM sample: federated - retrieval order, same queries", split, m["acc"] - m["retrieval_acc"], 0.0))
        if docs := arms.get("docs_only", {}).get(split):
            margin = NO_HARM_MARGIN if split == "heldout" else 0.0
            out.append(("LLM sample, no harm: federated - docs_only", split, m["acc"] - docs["acc"], -margin))
    rows += [{"target": f"{name} ({split})", "value": round(value, VALUE_DIGITS), "goal": f">= {goal + 0.0:g}",
              "met": round(value, COMPARE_DIGITS) >= goal} for name, split, value, goal in out]
    checks = llm.get("order_check", {})
    for split, c in ((s, checks[s]) for s in SPLITS if s in checks):
        checked = c["checked"]
        # each order over the queries it compared (a share over twice the smaller count overstated it)
        compared = c.get("checked_reversed", checked) + c.get("checked_shuffled", checked)
        moved = (c["reversed"] + c["shuffled"]) / max(compared, 1)
        rows.append({"target": f"LLM sample: share of picks moved by reversing or shuffling the candidates "
                               f"({split}, {checked} of {c['n']} queries compared)",
                     "value": round(moved, VALUE_DIGITS),
                     "goal": "= 0, on at least one query", "met": moved == 0 and checked > 0})
    return rows


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _cell(m: dict | None) -> str:
    return f"{m['acc_mean']:.3f} ± {m['acc_sd']:.3f} / {m['r5_mean']:.3f}" if m else "-"


def _partition(results: dict) -> str:
    """How the organisations' data came about."""
    if results.get("orgs_as_given"):
        return "the dataset's org files as given"
    return f"re-partitioned non-IID, Dirichlet alpha {results['alpha']}"


def _leak_line(results: dict) -> str:
    """The leak filter's counts per seed (or that the dataset has none)."""
    found = {s: r for s, r in results["leak_filter"].items() if r}
    if not found:
        return "Leak filter: not applied (the dataset has no test set)."
    cells = "; ".join(f"seed {s}: {r['exact']} exact, {r['near']} near duplicates and {r['garbage']} garbage "
                      f"dropped of {r['total']}" for s, r in found.items())
    skipped = ", ".join(f"{name} {n}" for name, n in (results.get("skipped_records") or {}).items())
    return f"Leak filter (training events vs every test query): {cells}." + (
        f" Records skipped where read, their query holding no letter or digit: {skipped}." if skipped else "")


def _privacy(results: dict) -> str:
    """Epsilon spent by each arm where it applies."""
    parts = []
    if results.get("epsilon") is not None:
        parts.append(f"`federated_private` spent epsilon {_round(results['epsilon'])} (target "
                     f"{results['epsilon_target']}, delta {results['delta']}) per organisation")
    if "fedavg_dp" in results["arms"]:
        eps = results.get("fedavg_dp_epsilon")
        parts.append(f"`fedavg_dp` spent epsilon {_round(eps)}" if eps is not None
                     else "`fedavg_dp` reported no epsilon")
    return ("; ".join(parts) or "no private arm ran") + "."


def _wire(results: dict) -> str:
    """Bytes per client and round, or that no federation ran to measure them (never a 0 that was not measured).

    A run without a federated arm (docs_only and the classifier) has no
    Flower run, and one without ``federated_private`` no private one: their
    sizes are None in ``results.json``, which this line says instead of
    printing 0 bytes.
    """
    private, clean = results.get("bytes_per_client_round_private"), results.get("bytes_per_client_round")
    if clean is None and private is None:
        return "Wire: not measured (no federation ran)."
    with_privacy = (f"{private:,.0f} bytes per client per round (train and vote replies) with privacy on"
                    if private is not None else "no federation with privacy on ran")
    without = (f"{clean:,.0f} on average over the federations without privacy" if clean is not None
               else "no federation without privacy ran")
    return (f"Wire (gzip JSON): {with_privacy}; {without}; the largest in any round of any federation "
            f"{results.get('bytes_per_client_round_max') or 0:,}.")


def _shift_line(results: dict) -> str | None:
    """The compendium arms whose test set turned experience off (the query-shift test), or None when none did."""
    arms = results["arms"]
    off = [f"{arm} ({m['experience_off_seeds']} of {m['seeds']} seeds)" for arm in ARMS
           for m in [next(iter(arms.get(arm, {}).values()), {})] if m.get("experience_off_seeds")]
    if not off:
        return None
    return ("Experience turned off by the query-shift test (the test queries sit far from the organisations' "
            "queries, where experience routed below the documentation; those arms route as docs_only does; "
            "docs/experiments.md, \"Query shift\"): " + "; ".join(off) + ".")


def _gate_line(results: dict) -> str | None:
    """Per compendium arm and split, the share of queries whose route reads no prototype, or None when none says.

    On a catalog where most tools have no experience, most seen queries have a
    documentation-best tool without any and route as docs_only does: this line
    says so beside the arms' accuracy, instead of leaving a small gain over
    docs_only unexplained.
    """
    arms = results["arms"]
    shares = [f"{arm} " + ", ".join(f"{split} {m['docs_gated_mean']:.0%}" for split, m in arms[arm].items()
                                    if "docs_gated_mean" in m)
              for arm in ARMS if any("docs_gated_mean" in m for m in arms.get(arm, {}).values())]
    if not shares:
        return None
    return ("Queries whose route reads no prototype (their documentation-best tool has none the router reads, "
            "the query is a tool's name, the votes chose the documentation only, or the query-shift test turned "
            "experience off: they route as docs_only does unless released scenarios or a when_not scenario move "
            "them; docs/experiments.md, \"Limits measured\"): " + "; ".join(shares) + ".")


def _globals_line(results: dict) -> str | None:
    """Where the first seed's final globals are (``synapse route --compendium`` reads them), or None."""
    seed, info = next(iter(results.get("seed_info", {}).items()), (None, {}))
    if not info.get("globals"):
        return None
    return (f"Final globals of seed {seed} (`synapse route --compendium PATH`): "
            + "; ".join(f"{arm} {path}" for arm, path in info["globals"].items()) + ".")


def _votes_line(results: dict) -> str | None:
    """What the fusion votes chose per federated arm and seed, or None when no seed says."""
    chose: dict[str, dict[str, list[float] | None]] = {}
    for seed, info in results.get("seed_info", {}).items():
        for arm, setting in info.get("votes_chose", {}).items():
            chose.setdefault(arm, {})[seed] = setting

    def said(setting: list[float] | None) -> str:
        if setting is None:
            return "no votes (the embedder's default fusion)"
        return "documentation only" if not any(setting) else f"prototype weight {setting[0]:g}, prior {setting[1]:g}"

    parts = []
    for arm, by_seed in chose.items():
        settings = {said(v) for v in by_seed.values()}
        cells = (f"{settings.pop()} on every seed" if len(settings) == 1 else
                 ", ".join(f"seed {seed}: {said(v)}" for seed, v in by_seed.items()))
        parts.append(f"`{arm}` {cells}")
    if not parts:
        return None
    return "Fusion votes (how much the router adds experience to the documentation): " + "; ".join(parts) + "."


# Below this many test queries per split a goal's margin is mostly sampling noise
SMALL_SPLIT = 100


def _size_lines(results: dict) -> list[str]:
    """Test queries per split (range over seeds); an empty split and a small one are said, not hidden."""
    sizes = [info.get("test_sizes", {}) for info in results.get("seed_info", {}).values()]
    if not sizes:
        return []
    ns = {split: [s.get(split, 0) for s in sizes] for split in SPLITS}
    shown = ", ".join(f"{split} {min(n):,}" + (f"-{max(n):,}" if max(n) != min(n) else "") for split, n in ns.items())
    lines = [f"  test queries per seed: {shown}"]
    taught = {seed: f"{i['tools_with_experience']:,} of {i['catalog_tools']:,}"
              for seed, i in results["seed_info"].items() if "tools_with_experience" in i}
    if taught:
        counts = next(iter(taught.values())) if len(set(taught.values())) == 1 else ", ".join(
            f"{n} (seed {seed})" for seed, n in taught.items())
        lines.append(f"  tools with experience: {counts} in the catalog (the others route on their documentation)")
    what = {"seen": "on tools with experience", "heldout": "on tools without experience"}
    lines += [f"  note: no {split} queries ({what[split]}) in the test set of some seed: that split is not measured"
              for split, n in ns.items() if min(n) == 0]
    lines += [f"  note: {split} has {min(n)} queries: one query moves its top-1 by {1 / min(n):.3f}, so goals "
              "met or missed by a few of those are noise" for split, n in ns.items() if 0 < min(n) < SMALL_SPLIT]
    return lines


def summary_lines(results: dict) -> list[str]:
    """The end-of-run summary: top-1 per arm and split (mean over seeds), privacy, and every target."""
    arms = results["arms"]
    splits = sorted({s for m in arms.values() for s in m}, key=SPLITS.index)
    title = f"{results['name']}: {results['dataset']}, seeds {results['seeds']}, K={results['orgs']}, top-1 (mean over seeds)"
    lines = [title, f"  {'arm':<18}" + "".join(f"{s:>10}" for s in splits)]
    for arm in (a for a in ARMS if a in arms):
        lines.append(f"  {arm:<18}" + "".join(
            f"{arms[arm][s]['acc_mean']:>10.3f}" if s in arms[arm] else f"{'-':>10}" for s in splits))
    lines += [f"  {arm:<18}left out: {why}" for arm, why in results.get("arms_left_out", {}).items()]
    lines += _size_lines(results)
    lines.append(f"  privacy: {_privacy(results)}")
    if votes := _votes_line(results):
        lines.append(f"  {votes[0].lower()}{votes[1:]}")
    if gated := _gate_line(results):
        lines.append(f"  {gated[0].lower()}{gated[1:]}")
    if shifted := _shift_line(results):
        lines.append(f"  {shifted[0].lower()}{shifted[1:]}")
    if found := _globals_line(results):
        lines.append(f"  {found[0].lower()}{found[1:]}")
    for t in results["targets"]:
        lines.append(f"  {'met   ' if t['met'] else 'MISSED'} {t['target']}: {t['value']:+.3f} (goal {t['goal']})")
    return lines


def tables(results: dict) -> str:
    """``tables.md``: mean ± SD over seeds, like the paper's tables."""
    arms = results["arms"]
    splits = sorted({s for m in arms.values() for s in m}, key=SPLITS.index)
    head = "| " + " | ".join(splits) + " |"
    lines = [f"# {results['name']}", "",
             f"Dataset `{results['dataset']}`, seeds {results['seeds']}, K={results['orgs']} orgs "
             f"({_partition(results)}), {results['rounds']} rounds, embedder "
             f"`{results['embedder']}`, reranker `{results['reranker']}`. Cells: top-1 accuracy mean ± SD "
             f"over seeds / recall@{results['k']}.", "", "## Arms", "", "| arm " + head,
             "|---" * (len(splits) + 1) + "|"]
    for arm in ARMS:
        if arm in arms:
            lines.append(f"| {arm} | " + " | ".join(_cell(arms[arm].get(s)) for s in splits) + " |")
    if results.get("arms_left_out"):
        lines += [""] + [f"Left out of this run: `{arm}`, {why}." for arm, why in results["arms_left_out"].items()]
    if sizes := _size_lines(results):  # as the run's summary says them: a split absent or small is not hidden
        lines += [""] + [f"- {line.strip().removeprefix('note: ')}" for line in sizes]
    lines += ["", _leak_line(results)]
    if results.get("cache"):
        lines += ["", f"Units of work: {results['cache']['computed']} computed in this run, "
                      f"{results['cache']['hits']} read from an earlier run's cache."]
    lines += ["", f"Privacy: {_privacy(results)} {_wire(results)}"]
    if votes := _votes_line(results):
        lines += ["", votes]
    if gated := _gate_line(results):
        lines += ["", gated]
    if shifted := _shift_line(results):
        lines += ["", shifted]
    if results["ablation_2x2"]:
        lines += ["", "## Merge x render (2x2, clean)", "", "| merge / render " + head,
                  "|---" * (len(splits) + 1) + "|"]
    for cell, m in results["ablation_2x2"].items():
        lines.append(f"| {cell} | " + " | ".join(_cell(m.get(s)) for s in splits) + " |")
    # rate 0 alone is no sweep: its row is the 2x2's, and a table of it read as a contradiction result
    swept = {} if set(results["contradiction"]) == {"0"} else results["contradiction"]
    if any(swept.values()):
        lines += ["", "## Contradiction injection", "", "| rate | arm " + head, "|---" * (len(splits) + 2) + "|"]
    for rate, row in swept.items():
        for cell, m in row.items():
            lines.append(f"| {float(rate):.0%} | {cell} | " + " | ".join(_cell(m.get(s)) for s in splits) + " |")
    injected = [(seed, rate, inj) for seed, by_rate in results["injection"].items()
                for rate, inj in by_rate.items() if inj["injection_sha256"]]
    if injected:
        lines += ["", "Injected sets (identical for every arm of a rate and seed; verified against the "
                  "artifact hashes Flower merged):", "", "| seed | rate | wrong_tool | inverted | sha256 | verified |",
                  "|---|---|---|---|---|---|"]
    for seed, rate, inj in injected:
        c = inj["injection_counts"]
        lines.append(f"| {seed} | {float(rate):.0%} | {c['wrong_tool']} | {c['inverted']} | "
                     f"`{inj['injection_sha256'][:16]}` | {inj['verified']} |")
    if results["per_round"]:
        lines += ["", "## Per round", "", "| arm | round " + head, "|---" * (len(splits) + 2) + "|"]
        for arm, rounds in results["per_round"].items():
            for i, m in enumerate(rounds, start=1):
                lines.append(f"| {arm} | {i} | " + " | ".join(_cell(m.get(s)) for s in splits) + " |")
    if results["llm_sample"]:
        lines += _llm_lines(results["llm_sample"], results["seeds"][0], splits)
    if not results["targets"]:  # not a table with no rows
        none = ("No target measured: every target compares arms this run did not run (the federated arms beside "
                "docs_only, centralized or the classifier).")
        return "\n".join([*lines, "", "## Targets", "", none]) + "\n"
    lines += ["", "## Targets", "", "| target | measured | goal | met |", "|---|---|---|---|"]
    for t in results["targets"]:
        lines.append(f"| {t['target']} | {t['value']:+.3f} | {t['goal']} | {'yes' if t['met'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def _llm_lines(llm: dict, seed: int, splits: Sequence[str]) -> list[str]:
    """The LLM sample's table: its top-1 beside retrieval order on the same queries, and the order check."""
    lines = ["", f"## LLM reranker (sample, seed {seed})", "",
             ("| arm | split | LLM top-1 | retrieval order top-1 | LLM - retrieval | recall@k | n | fell back (no LLM "
              "answer) |"),
             "|---|---|---|---|---|---|---|---|"]
    for arm, m in llm["arms"].items():
        for split in (s for s in splits if s in m):
            r = m[split]
            # the query-shift test routed this arm as docs_only: the row is the documentation's
            shown = f"{arm} (experience off)" if r.get("experience_off") else arm
            lines.append(f"| {shown} | {split} | {r['acc']:.3f} | {r['retrieval_acc']:.3f} | "
                         f"{r['acc'] - r['retrieval_acc']:+.3f} | {r['r5']:.3f} | {r['n']} | "
                         f"{r['fallbacks']} |")
    by_split = llm["order_check"]
    checks = [f"{s} {by_split[s]['reversed']} and {by_split[s]['shuffled']} of {by_split[s]['checked']}"
              for s in SPLITS if s in by_split]
    order_arm = llm.get("order_arm", "federated")
    off = any(m.get("experience_off") for m in llm["arms"].get(order_arm, {}).values())
    read = ", its experience off: the documentation's candidates" if off else ""
    note = (f"Order check ({order_arm} arm{read}, at the router's LLM weight): picks changed with "
            "the candidates reversed and shuffled: ")
    lines += ["", note + "; ".join(checks) + "."]
    return lines


def _panel_figure(out_dir: Path, name: str, splits: Sequence[str], draw: Callable[[Any, str], None]) -> Path:
    """One panel per split, drawn by ``draw(ax, split)``, saved as ``out_dir/name``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(splits), figsize=(5 * len(splits), 3.6), squeeze=False)
    for ax, split in zip(axes[0], splits):
        draw(ax, split)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=120)
    plt.close(fig)
    return out_dir / name


FIGURES = ("accuracy_vs_contradiction.png", "accuracy_per_round.png")


def figures(results: dict, out_dir: Path) -> list[Path]:
    """PNG figures: accuracy vs contradiction rate (unless rate 0 ran alone), and accuracy per round.

    A figure of :data:`FIGURES` that these results do not draw is removed from ``out_dir``: left by an earlier
    run into the same folder (a sweep, or a config with the federated arms), it showed results these are not.
    """
    written = _draw_figures(results, out_dir)
    for name in FIGURES:
        if out_dir / name not in written:
            (out_dir / name).unlink(missing_ok=True)
    return written


def _draw_figures(results: dict, out_dir: Path) -> list[Path]:
    """The figures these results draw, written into ``out_dir``."""
    written = []
    rates = {} if set(results["contradiction"]) == {"0"} else results["contradiction"]  # rate 0 alone: no sweep
    splits = [s for s in SPLITS if any(s in m for row in rates.values() for m in row.values())]
    if rates and splits:
        xs = sorted(rates, key=float)
        # only the arms measured at every rate (the 2x2's mixed cells are clean-only)
        cells = sorted(set.intersection(*(set(row) for row in rates.values())))

        def by_rate(ax, split: str) -> None:
            for cell in cells:
                pts = [(100 * float(r), rates[r][cell][split]) for r in xs if split in rates[r][cell]]
                if pts:
                    ax.errorbar([p[0] for p in pts], [p[1]["acc_mean"] for p in pts],
                                yerr=[p[1]["acc_sd"] for p in pts], marker="o", capsize=3, label=cell)
            ax.set(xlabel="contradicted contributions (%)", ylabel="top-1 accuracy", title=split)

        written.append(_panel_figure(out_dir, "accuracy_vs_contradiction.png", splits, by_rate))
    per_round = results["per_round"]
    if per_round:
        splits = [s for s in SPLITS if any(s in m for rounds in per_round.values() for m in rounds)]

        def by_round(ax, split: str) -> None:
            for arm, rounds in per_round.items():
                ax.errorbar(range(1, len(rounds) + 1), [m[split]["acc_mean"] for m in rounds],
                            yerr=[m[split]["acc_sd"] for m in rounds], marker="o", capsize=3, label=arm)
            docs = results["arms"].get("docs_only", {}).get(split)
            if docs:
                ax.axhline(docs["acc_mean"], color="grey", ls="--", label="docs_only")
            ax.set(xlabel="round", ylabel="top-1 accuracy", title=split,
                   xticks=range(1, max(len(r) for r in per_round.values()) + 1))

        written.append(_panel_figure(out_dir, "accuracy_per_round.png", splits, by_round))
    return written
