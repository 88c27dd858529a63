"""Write MetaTool as a dataset folder (``catalog.json``, ``org_*.jsonl``, ``test.jsonl``).

``synapse experiment`` reads a user's folder through the generic path
(organisations as given, tools without experience found from the test
golds), not the built-in ``metatool`` loader. This writes MetaTool in that
format so the generic path can be measured at MetaTool's scale: the split
of one seed with a share of the tools held out (no organisation has any
experience of them), partitioned non-IID over ``--orgs`` organisations.
No example requests are written: a folder of one's own rarely has them.

Usage: ``python simulations/metatool_folder.py OUT [--seed 3] [--heldout-frac 0.5] [--orgs 5] [--alpha 0.5]``
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from synapse_flwr.simulations.tune_router import dataset, write_folder

log = logging.getLogger("metatool_folder")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write (created; existing files are replaced)")
    parser.add_argument("--seed", type=int, default=3, help="split and partition seed (default 3)")
    parser.add_argument("--heldout-frac", type=float, default=0.5, help="share of the tools held out (default 0.5)")
    parser.add_argument("--orgs", type=int, default=5, help="organisations (default 5)")
    parser.add_argument("--alpha", type=float, default=0.5,
                        help="Dirichlet concentration of the partition (default 0.5)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not 0.0 < args.heldout_frac < 1.0:
        parser.error(f"--heldout-frac must be in (0, 1), got {args.heldout_frac}")
    ds = dataset(args.seed, {"orgs": args.orgs, "alpha": args.alpha}, args.heldout_frac)
    write_folder(ds, args.out)
    log.info("wrote %s: %d tools, %d orgs, %d events, %d test queries (%d on held-out tools)", args.out,
             len(ds.catalog), len(ds.orgs), sum(map(len, ds.orgs.values())),
             len(ds.seen_test) + len(ds.heldout_test), len(ds.heldout_test))


if __name__ == "__main__":
    main()
