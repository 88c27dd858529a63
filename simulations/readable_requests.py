"""Readable ``when`` scenarios under privacy: do the requests a private global lists match real traffic?

Each federation (K orgs, one release each, merged typed) is built twice from
the same experience: without noise (the exact supports of every example
request, :mod:`synapse_flwr.core.scenarios`) and at the run's epsilon (per
draw). For the tools whose private global lists requests, the lab compares
the private ranking with the exact one: the top request agrees (beside the
chance of picking one of the tool's requests at random), and the share of
the exact top 3 among the private top 3. It also counts the tools and
requests listed and an organisation's artifact size with and without them.

Usage: ``python simulations/readable_requests.py configs/readable_requests.toml``
"""

from __future__ import annotations

import logging
import math
from statistics import mean

from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.router import without_requests
from synapse_flwr.core.scenarios import split_when
from synapse_flwr.core.schema import Compendium
from synapse_flwr.core.wire import encode
from synapse_flwr.data.federation import load_federated
from synapse_flwr.eval.results import run_lab

log = logging.getLogger("readable_requests")


def ranked_requests(comp: Compendium, examples: dict[str, set[str]]) -> dict[str, list[str]]:
    """Per tool, the example requests its ``when`` lists, highest support first."""
    out = {}
    for t in comp.tools:
        listed = sorted(split_when(t.when, examples[t.tool_id])[0], key=lambda s: (-s.support, s.text))
        if listed:
            out[t.tool_id] = [s.text for s in listed]
    return out


def one_run(run: dict, cfg: dict, emb) -> list[dict]:
    """Every draw of one (dataset, orgs, epsilon) federation against its exact build."""
    ds = load_federated(run["dataset"], run["orgs"], cfg["seed"])
    examples = {d.tool_id: set(d.examples) for d in ds.catalog.tools}

    def build(eps: float, draw: int) -> list[Compendium]:
        return [build_compendium(ev, ds.catalog, org, round_=draw, epsilon=eps, delta=cfg["delta"], rounds=1,
                                 seed=cfg["seed"], embedder=emb) for org, ev in sorted(ds.orgs.items())]

    exact = ranked_requests(merge_typed(build(math.inf, 0)), examples)
    rows = []
    for draw in run["draws"]:
        orgs = build(float(run["epsilon"]), draw)
        private = ranked_requests(merge_typed(orgs), examples)
        both = [t for t in private if t in exact]
        row = {"dataset": run["dataset"], "orgs": run["orgs"], "epsilon": run["epsilon"], "draw": draw,
               "tools_with_examples": sum(bool(e) for e in examples.values()),
               "tools_exact": len(exact), "tools_private": len(private),
               "requests_private": sum(map(len, private.values())),
               "top1_agree": mean(private[t][0] == exact[t][0] for t in both) if both else None,
               "top1_chance": mean(1 / len(examples[t]) for t in both) if both else None,
               "top3_overlap": mean(len(set(private[t][:3]) & set(exact[t][:3])) / min(3, len(exact[t]))
                                    for t in both) if both else None,
               "org_gzip": mean(len(encode(c)) for c in orgs),
               "org_gzip_without": mean(len(encode(c.model_copy(update={"tools": [
                   without_requests(t, examples[t.tool_id]) for t in c.tools]}))) for c in orgs)}
        log.info("%s", row)
        rows.append(row)
    return rows


def tables(rows: list[dict], cfg: dict) -> str:
    """Markdown: per federation, means over draws."""
    def cell(rs: list[dict], key: str, fmt: str) -> str:
        values = [r[key] for r in rs if r[key] is not None]
        return format(mean(values), fmt) if values else "-"

    lines = [f"# Readable requests under privacy (seed {cfg['seed']}; private ranking vs the exact one)", "",
             ("| dataset | orgs | epsilon | draws | tools with examples | tools listed (exact) | tools listed "
              "(private) | requests listed | top request agrees | chance | top-3 overlap | org gzip bytes "
              "(without requests) |"), "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in dict.fromkeys((r["dataset"], r["orgs"], r["epsilon"]) for r in rows):
        rs = [r for r in rows if (r["dataset"], r["orgs"], r["epsilon"]) == key]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {len(rs)} | {rs[0]['tools_with_examples']} | "
                     f"{rs[0]['tools_exact']} | {cell(rs, 'tools_private', '.1f')} | "
                     f"{cell(rs, 'requests_private', '.1f')} | {cell(rs, 'top1_agree', '.3f')} | "
                     f"{cell(rs, 'top1_chance', '.3f')} | {cell(rs, 'top3_overlap', '.3f')} | "
                     f"{cell(rs, 'org_gzip', ',.0f')} ({cell(rs, 'org_gzip_without', ',.0f')}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run every federation of the config and write results.json, manifest.json and tables.md."""
    run_lab(__doc__, "readable_requests.py", one_run, tables)


if __name__ == "__main__":
    main()
