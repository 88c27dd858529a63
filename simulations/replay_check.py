"""The feedback loop in process on MetaTool: per-round accuracy with replay.

Each round every organisation builds its artifact from its experience plus the
misroutes it replayed with each earlier round's global
(:func:`~synapse_flwr.core.replay.replay_events`; the release-once ClientApp
re-sends earlier windows, so replays accumulate), the artifacts are merged
(typed) and the global is scored on the seen-tool and held-out-tool test sets;
privacy off, as the experiment's ``federated_replay`` arm. Run::

    python -m synapse_flwr.simulations.replay_check --seeds 42 123 456 --embedder static
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Sequence

from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.embed import get_embedder
from synapse_flwr.core.merge import merge
from synapse_flwr.core.metrics import evaluate_routes
from synapse_flwr.core.replay import replay_events
from synapse_flwr.core.router import Router
from synapse_flwr.data.federation import load_federated

log = logging.getLogger(__name__)


def replay_rounds(seed: int, rounds: int = 3, orgs: int = 5, alpha: float = 0.5,
                  embedder: str = "static", reranker: str = "fields") -> list[dict[str, float]]:
    """Top-1 accuracy per split of each round's global, replay on.

    Returns
    -------
    list of dict
        Per round: ``seen`` and ``heldout`` accuracy, and ``replayed`` (the
        misroutes replayed into that round's artifacts, all rounds so far).
    """
    ds = load_federated("metatool", orgs, seed, alpha)
    emb = get_embedder(embedder)
    replayed: dict[str, list] = {o: [] for o in ds.orgs}
    out = []
    for round_ in range(1, rounds + 1):
        arts = [build_compendium(ds.orgs[o] + replayed[o], ds.catalog, o, round_=round_, seed=seed, epsilon=math.inf)
                for o in sorted(ds.orgs)]
        router = Router(merge(arts), ds.catalog, embedder=emb, reranker=reranker, k=5)
        row = {"replayed": float(sum(map(len, replayed.values())))}
        for split, items in (("seen", ds.seen_test), ("heldout", ds.heldout_test)):
            routes = router.route_many([i.query for i in items])
            row[split] = round(evaluate_routes(routes, [i.gold for i in items], 5)["acc"], 3)
        log.info("seed %d round %d: %s", seed, round_, row)
        out.append(row)
        if round_ < rounds:
            replayed = {o: replayed[o] + replay_events(ds.orgs[o], router) for o in ds.orgs}
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: per-round accuracy with replay for each seed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 123, 456])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--embedder", default="static")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for seed in args.seeds:
        rows = replay_rounds(seed, args.rounds, embedder=args.embedder)
        drops = [s for s in ("seen", "heldout") if any(b[s] < a[s] for a, b in zip(rows, rows[1:]))]
        log.info("seed %d: %s; non-decreasing: %s", seed, rows, "yes" if not drops else f"NO ({drops})")


if __name__ == "__main__":
    main()
