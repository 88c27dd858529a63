"""Position-bias check of an LLM reranker: do its picks move when the candidates are shown in another order?

A reader that picks by position rather than by content changes its pick
when each query's candidates are shown reversed or shuffled. The check
scores the same candidates in the retrieval order and in both permutations
and counts the queries whose fused pick (:func:`~synapse_flwr.core.rerank_llm.fuse_llm`)
changes, at every weight asked. At weight 0 the fused pick is retrieval's
and cannot move; a check that never moves at the router's own weight is the
evidence that the LLM's contribution does not depend on the order.
"""

from __future__ import annotations

import numpy as np

from synapse_flwr.core.rerank_llm import fuse_llm, llm_answered
from synapse_flwr.core.router import Router, candidate_set


def order_changes(router: Router, queries: list[str], seed: int, weights: list[float]) -> dict:
    """Fused picks, at every weight, that change when each query's candidates are shown reversed or shuffled.

    Parameters
    ----------
    router : Router
        An LLM-reranking router (its model and render are the ones checked; while its query-shift test has
        turned experience off, its documentation-only twin, whose candidates its routes read).
    queries : list of str
        The queries to recheck (each costs two more LLM passes over its candidates).
    seed : int
        Seed of the shuffled orders.
    weights : list of float
        LLM weights at which picks are compared.

    Returns
    -------
    dict
        ``n`` (queries), ``checked``: per order the queries compared (a
        query the LLM did not answer in either order, :func:`llm_answered`, is not), and
        ``by_weight``: ``str(weight) -> {"reversed": changes, "shuffled": changes}``.
    """
    rng = np.random.default_rng(seed)
    if router.shifted():  # the candidates its routes read (Router.route_many)
        router = router.docs_router()
    parts = router.evidence(queries)
    fused = sum(parts.values())
    cands = [candidate_set(row, docs, router.k, router.docs_candidates) for row, docs in zip(fused, parts["description"])]
    reads = [router.experience_read(parts["prototype"][row], c) for row, c in enumerate(cands)]
    orders = {"reversed": [c[::-1] for c in cands], "shuffled": [list(rng.permutation(c)) for c in cands]}
    base = router.llm_scores(queries, cands, reads)
    scored = [(fused[row][c], parts["description"][row][c]) for row, c in enumerate(cands)]  # retrieval, docs
    out: dict = {"n": len(queries), "checked": {}, "by_weight": {str(w): {} for w in weights}}
    for name, perm in orders.items():
        other = router.llm_scores(queries, perm, reads)
        # each permuted row's scores back in the candidates' order; no answer in either order (a failed call,
        # scores alike: the router routes those by retrieval) is not a pick the order could move
        aligned = {row: np.array([dict(zip(p, other[row]))[t] for t in c]) for row, (c, p) in enumerate(zip(cands, perm))
                   if llm_answered(base[row]) and llm_answered(other[row])}
        out["checked"][name] = len(aligned)
        for w in weights:
            out["by_weight"][str(w)][name] = sum(
                int(np.argmax(fuse_llm(*scored[row], base[row], w))) != int(np.argmax(fuse_llm(*scored[row], scores, w)))
                for row, scores in aligned.items())
    return out
