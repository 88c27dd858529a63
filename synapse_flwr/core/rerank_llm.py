"""LLM reranking: the prompts an LLM reads its candidates in, and how its scores join retrieval's.

The LLM's score is added to each candidate's standing among the candidates
(its standardised retrieval score, or for a tool without experience for the
query the better of that and its documentation score, the standing docs_only
gives it), weighted by the model's dev weight (:func:`llm_weight_for`): it
refines retrieval and never replaces it blindly (:func:`fuse_llm`).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# Weight of the LLM's standardised score beside retrieval's, for a model
# without dev evidence: a moderate blend, not a tuned optimum. Choose a model's
# weight on your own dev split (``llm_weight``, ``synapse route --llm-weight``).
LLM_WEIGHT = 0.5
# Per-model weights chosen on the seed-7 MetaTool dev split, 200 queries per
# split, federated typed, fused by :func:`fuse_llm` (simulations/llm_fusion.py,
# docs/results/tuning/llm_fusion; seen/held-out top-1; retrieval order
# 0.655/0.615). local/smollm2: 0.66/0.665 at 0.25 (0.64/0.665 at 0.5);
# local/gemma3: 0.68/0.67 at 0.25 (0.675/0.665 at 0.5). docs_only's LLM route
# there: 0.62/0.625 and 0.625/0.635. Fused with retrieval alone (the rule
# before), held-out fell below docs_only's LLM route at every weight above 0.
LLM_WEIGHTS: dict[str, float] = {"local/smollm2": 0.25, "local/gemma3": 0.25}
# What follows a tool's entry in a channel prompt; the query continues it.
CHANNEL_CUE = "\nA user request this tool handles:"


# Every candidate has the same fields and the answers sit at positions 1, 3
# and 2: the examples teach no position (both answered last before, issue 11).
FEW_SHOT = """You route a user's request to exactly one tool.

Example request: will it snow in Oslo this weekend?
Candidates:
tool: get_weather
description: Weather forecast for a city.
use when: rain; forecast tomorrow
tool: search_hotels
description: Find hotel rooms.
use when: hotel room; book hotel
tool: send_email
description: Send an email message.
use when: write email; mail to
Answer: get_weather

Example request: tell my landlord by mail that the rent will be late
Candidates:
tool: search_hotels
description: Find hotel rooms.
use when: hotel room; book hotel
tool: get_weather
description: Weather forecast for a city.
use when: rain; forecast tomorrow
tool: send_email
description: Send an email message.
use when: write email; mail to
Answer: send_email

Example request: I want to book a room near the station
Candidates:
tool: send_email
description: Send an email message.
use when: write email; mail to
tool: search_hotels
description: Find hotel rooms.
use when: hotel room; book hotel
tool: get_weather
description: Weather forecast for a city.
use when: rain; forecast tomorrow
Answer: search_hotels
"""


def llm_prompt(query: str, shown: Sequence[str]) -> str:
    """Few-shot prompt whose continuation is the chosen tool's id."""
    return f"{FEW_SHOT}\nRequest: {query}\nCandidates:\n" + "\n".join(shown) + "\nAnswer: "


def cyclic_orders(k: int) -> list[list[int]]:
    """``k`` orders of ``range(k)`` in which every item takes every position exactly once."""
    return [[(shift + i) % k for i in range(k)] for shift in range(k)]


def balanced_list_scores(model: str, query: str, shown: Sequence[str], ids: Sequence[str]) -> np.ndarray:
    """A list-prompt LLM's score of each candidate, averaged over every cyclic order of the list.

    Each candidate is shown once in each position, so a model that favours a
    position (the last one, for SmolLM2) gives that favour to every candidate
    equally; what is left is its reading of the fields. Reversing or shuffling
    ``shown`` leaves the scores unchanged up to the model's arithmetic.

    Parameters
    ----------
    model : str
        litellm model string (log-likelihoods for ``local/``, one vote per order for hosted).
    query : str
        The request.
    shown : sequence of str
        Rendered candidates.
    ids : sequence of str
        Their tool ids (what the model answers), in the same order.

    Returns
    -------
    numpy.ndarray
        One score per candidate, in the order given; an order whose reply
        named no candidate counts as no preference.

    Raises
    ------
    LLMError
        When a call fails, or no order's reply named a candidate (the router
        then routes the query in retrieval order, a fallback).

    Notes
    -----
    A hosted model is asked for the orders at once (up to
    :func:`~synapse_flwr.core.llm.calls_at_once`): one query then waits about
    one round trip, not k of them (``synapse serve`` answers an agent per query).
    """
    from synapse_flwr.core.llm import LLMError, calls_at_once, score_choices

    orders = cyclic_orders(len(ids))

    def score(order: list[int]) -> list[float] | None:
        return score_choices(model, llm_prompt(query, [shown[i] for i in order]), [ids[i] for i in order])

    with ThreadPoolExecutor(max_workers=min(calls_at_once(model), max(len(orders), 1))) as pool:
        scores = list(pool.map(score, orders))
    if all(got is None for got in scores):  # an answer that never names a candidate is no answer: a fallback
        raise LLMError(f"{model!r} named no candidate in any of the {len(orders)} orders")
    total = np.zeros(len(ids))
    for order, got in zip(orders, scores, strict=True):
        total[order] += got if got is not None else 1.0 / len(ids)  # an order without a pick: no preference
    return total / len(ids)


def standardise(x: np.ndarray) -> np.ndarray:
    """``x`` centred on its mean and divided by its SD (zeros when ``x`` is constant)."""
    sd = float(np.std(x))
    return (x - x.mean()) / sd if sd > 1e-9 else np.zeros_like(x, dtype=np.float64)


def llm_weight_for(model: str) -> float:
    """The LLM weight a router uses for ``model``: its dev weight (:data:`LLM_WEIGHTS`), else :data:`LLM_WEIGHT`."""
    return LLM_WEIGHTS.get(model, LLM_WEIGHT)


def llm_answered(scores: np.ndarray | None) -> bool:
    """Whether an LLM's candidate scores say anything: a call that failed (None) or scores alike are no answer.

    Scores alike for every candidate (each cyclic order's reply named the
    same position, so every candidate was picked once), read as an answer,
    were reported as the LLM's choice, and the documentation's standing
    could still reorder the candidates. One candidate is always answered.

    Parameters
    ----------
    scores : ndarray or None
        One query's LLM score per candidate.
    """
    return scores is not None and (len(scores) < 2 or bool(np.ptp(scores) > 0))


def fuse_llm(retrieval: np.ndarray, docs: np.ndarray, llm: np.ndarray, weight: float) -> np.ndarray:
    """Final candidate scores: each candidate's standing plus ``weight`` times the LLM's.

    Everything is standardised among the candidates. A candidate with
    experience for the query (retrieval above its documentation score) stands
    where retrieval puts it; one without stands at the better of that and
    where the documentation alone puts it. Once a query's gate opens, the
    count prior ranks every experienced tool above the tools without
    experience, so fused with retrieval alone an LLM could not bring back a
    documented tool that docs_only's LLM route picks (seed-7 held-out
    0.61-0.615 against docs_only's 0.625-0.65; ``simulations/llm_fusion.py``).
    ``docs`` equal to ``retrieval`` (docs_only, or a closed gate) is plain
    retrieval plus the LLM; ``weight = 0`` or an LLM that scores every
    candidate alike (a position-biased one, balanced) orders by standing.

    Parameters
    ----------
    retrieval, docs, llm : numpy.ndarray
        Per candidate: retrieval score, documentation score (what docs_only
        retrieves it with; experience only adds to it) and the LLM's raw score.
    weight : float
        Weight of the LLM's standardised score (``>= 0``).
    """
    retrieval, docs = np.asarray(retrieval, np.float64), np.asarray(docs, np.float64)
    z_ret = standardise(retrieval)
    standing = np.where(retrieval > docs, z_ret, np.maximum(z_ret, standardise(docs)))
    return standing + weight * standardise(np.asarray(llm, np.float64))
