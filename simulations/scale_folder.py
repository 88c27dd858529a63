"""Write a large dataset folder for a scale check: MetaTool's real tools and requests, generated tools beyond.

The catalog is :func:`~synapse_flwr.simulations.catalog_gen.scaled_catalog`
(MetaTool's labelled tools and plugin manifests first, then tools whose
description splices two real ones). Every MetaTool request is an event of
its tool; 2,000 of them are test queries instead. Seven in ten generated
tools are taught by three requests each, cut from their own description
(a run of 5-10 of its words), and three in ten of those get one such test
query; 1,000 of the others get one test query each and no experience.
Events are dealt round-robin to five organisations. The spliced
descriptions make generated tools near duplicates of real ones, so the
folder measures time, memory and bytes at scale, not accuracy.

Usage: ``python simulations/scale_folder.py OUT [--tools 10000] [--seed 0]``
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
from pathlib import Path

from synapse_flwr.simulations.catalog_gen import GENERATED_PREFIX, scaled_catalog

from synapse_flwr.data.metatool import load_metatool

log = logging.getLogger("scale_folder")

ORGS = "abcde"
REAL_TEST = 2000
HELD_OUT_TEST = 1000


def _request(description: str, rng: random.Random) -> str:
    words = re.findall(r"[A-Za-z]+", description)
    k = min(len(words), rng.randint(5, 10))
    start = rng.randrange(max(1, len(words) - k + 1))
    return " ".join(words[start:start + k]).lower() or "help"


def write_scale_folder(out: Path, tools: int, seed: int) -> tuple[int, int, int]:
    """Write the folder, replacing its catalog, test set and organisation logs.

    Parameters
    ----------
    out : Path
        The folder (created; an earlier dataset's files in it are removed).
    tools : int
        Catalog size: MetaTool's 432 tools (labelled and plugin manifests), generated ones beyond.
    seed : int
        Seed of the generated descriptions, the requests and the split.

    Returns
    -------
    (int, int, int)
        Tools, events and test queries written.
    """
    rng = random.Random(seed)
    metatool = load_metatool(with_extra_tools=True)
    catalog = scaled_catalog(tools, seed=seed, real=metatool.catalog)
    events = [{"query": e.query, "tool": e.tool, "success": True} for e in metatool.events]
    rng.shuffle(events)
    test = [{"query": e["query"], "gold": e["tool"]} for e in events[:REAL_TEST]]
    events = events[REAL_TEST:]
    generated = [d for d in catalog.tools if d.tool_id.startswith(GENERATED_PREFIX)]
    rng.shuffle(generated)
    taught = int(len(generated) * 0.7)
    for doc in generated[:taught]:
        events += [{"query": _request(doc.description, rng), "tool": doc.tool_id, "success": True} for _ in range(3)]
        if rng.random() < 0.3:
            test.append({"query": _request(doc.description, rng), "gold": doc.tool_id})
    test += [{"query": _request(d.description, rng), "gold": d.tool_id} for d in generated[taught:][:HELD_OUT_TEST]]
    rng.shuffle(events)
    out.mkdir(parents=True, exist_ok=True)
    # an earlier folder's organisations would join this one's, its other files would be read with it
    for stale in [*out.glob("org_*.jsonl"), *(out / name for name in ("catalog.jsonl", "aliases.json",
                                                                       "examples.json"))]:
        stale.unlink(missing_ok=True)
    entries = [{"name": d.tool_id, "description": d.description, **({"parameters": d.parameters} if d.parameters
                                                                      else {})} for d in catalog.tools]
    (out / "catalog.json").write_text(json.dumps(entries))
    for i, org in enumerate(ORGS):
        (out / f"org_{org}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events[i::len(ORGS)]))
    (out / "test.jsonl").write_text("".join(json.dumps(t) + "\n" for t in test))
    return len(entries), len(events), len(test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path,
                        help="folder to write (created; its catalog, test set and org logs are replaced)")
    parser.add_argument("--tools", type=int, default=10000, help="catalog size (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.tools < 1000:
        parser.error(f"--tools must be at least 1000 (MetaTool's 432 tools come first; the generated ones beyond "
                     f"are taught or held out), got {args.tools}")
    tools, events, test = write_scale_folder(args.out, args.tools, args.seed)
    log.info("wrote %s: %d tools, %d events over %d orgs, %d test queries", args.out, tools, events, len(ORGS), test)


if __name__ == "__main__":
    main()
