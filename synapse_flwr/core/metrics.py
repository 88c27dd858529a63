"""Routing metrics: top-1 accuracy and recall@k of rankings against acceptable gold ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from synapse_flwr.core.router import RouteResult


def ranking_metrics(
    rankings: Sequence[Sequence[str]], golds: Sequence[Sequence[str]], k: int = 5
) -> dict[str, float]:
    """Top-1 accuracy and recall@k of rankings against acceptable gold ids.

    The one definition every evaluation shares: routed results
    (:func:`evaluate_routes`) and score matrices (through :func:`top_ids`).

    Parameters
    ----------
    rankings : sequence of sequence of str
        Per query, tool ids best first; the first is the pick.
    golds : sequence of sequence of str
        Per query, the acceptable tool ids.
    k : int
        Recall cut-off.

    Returns
    -------
    dict
        ``acc`` (the pick in gold), ``r5`` (any of the first ``k`` in gold)
        and ``n``; zeros for no queries.
    """
    if not rankings:
        return {"acc": 0.0, "r5": 0.0, "n": 0}
    pairs = list(zip(rankings, golds, strict=True))
    hits = sum(len(ranked) > 0 and ranked[0] in gold for ranked, gold in pairs)
    recall = sum(any(t in gold for t in ranked[:k]) for ranked, gold in pairs)
    return {"acc": hits / len(pairs), "r5": recall / len(pairs), "n": len(pairs)}


def top_ids(scores: np.ndarray, columns: Sequence[str], k: int = 5) -> list[list[str]]:
    """The ids of the ``k`` best-scoring columns of each row, best first (ties keep column order).

    Parameters
    ----------
    scores : numpy.ndarray
        ``(n, len(columns))`` scores, higher is better.
    columns : sequence of str
        Tool id of each column.
    k : int
        How many to keep per row.

    Returns
    -------
    list of list of str
        One ranking per row (see :func:`ranking_metrics`).
    """
    order = np.argsort(-np.asarray(scores), axis=1, kind="stable")[:, :k]
    return np.asarray(columns, dtype=object)[order].tolist()


def evaluate_routes(results: Sequence[RouteResult], golds: Sequence[Sequence[str]], k: int = 5) -> dict[str, float]:
    """Top-1 accuracy and recall@k of routed results against acceptable gold ids."""
    return ranking_metrics([[c.tool_id for c in r.candidates] for r in results], golds, k)
