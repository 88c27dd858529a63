"""tau-bench per-step scoring: the transition prior, step items and step accuracy.

Everything uses the lexical TF-IDF embedder (no model download). The test
marked ``data`` reads the real tau-bench files and is skipped without them.
"""

from __future__ import annotations

import math

import pytest

from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.catalog import ToolDoc, make_catalog
from synapse_flwr.core.embed import TfidfEmbedder
from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.router import Candidate, Router, RouteResult
from synapse_flwr.core.schema import Compendium, Issuer, ToolCount, ToolEntry
from synapse_flwr.data.pins import data_dir
from synapse_flwr.data.taubench import (
    Task,
    load_taubench,
    taubench_events,
    taubench_step_items,
)
from synapse_flwr.eval.taubench import (
    VARIANTS,
    rerank_with_transitions,
    step_accuracy,
    transition_prior,
)

CATALOG = make_catalog(
    [
        ToolDoc("find_user", "find_user", "Find a user id by name and zip code."),
        ToolDoc("get_order", "get_order", "Get the status and details of an order."),
        ToolDoc("cancel_order", "cancel_order", "Cancel a pending order."),
        ToolDoc("return_items", "return_items", "Return items of a delivered order for a refund."),
    ]
)

TRAIN = [
    Task(i, f"user_{i}", f"Your name is User {i}, zip 9{i:04d}. Cancel order #W{i:05d}, it is pending.",
         ("find_user", "get_order", "cancel_order"))
    for i in range(6)
] + [
    Task(10 + i, f"user_{i}", f"You are User {i}. Return the delivered items of order #W{i:05d}.",
         ("find_user", "get_order", "return_items"))
    for i in range(6)
]
TEST = [
    Task(0, "ann", "Your name is Ann Lee, zip 12345. Cancel your pending order #W00099.",
         ("find_user", "get_order", "cancel_order")),
    Task(1, "bob", "You are Bob. Return the lamp you got in order #W00042.",
         ("find_user", "get_order", "return_items")),
    Task(2, "eve", "You just want to chat.", ()),
]


def _compendium(next_tools: dict[str, dict[str, float]]) -> Compendium:
    return Compendium(
        kind="global",
        issuer=Issuer(org="global"),
        tools=[
            ToolEntry(
                tool_id=t,
                next_tools=[ToolCount(tool=b, count=c) for b, c in sorted(next_tools.get(t, {}).items())],
            )
            for t in CATALOG.ids
        ],
    )


def _result(scores: dict[str, float]) -> RouteResult:
    ranked = sorted(scores.items(), key=lambda kv: -kv[1])
    return RouteResult("q", ranked[0][0], [Candidate(t, s, s) for t, s in ranked], ["retrieval"])


# --------------------------------------------------------------------------- prior


def test_prior_is_smoothed_and_sums_to_one():
    comp = _compendium({"get_order": {"cancel_order": 8.0}})
    prior = transition_prior(comp, "get_order")
    assert math.isclose(sum(prior.values()), 1.0)
    assert prior["cancel_order"] == pytest.approx(9 / 12)
    assert prior["find_user"] == pytest.approx(1 / 12)


def test_prior_is_uniform_without_knowledge():
    comp = _compendium({"get_order": {"cancel_order": 8.0}})
    for prev in (None, "find_user", "unknown_tool"):
        assert set(transition_prior(comp, prev).values()) == {0.25}
    with pytest.raises(ValueError, match="smoothing"):
        transition_prior(comp, "get_order", smoothing=0)


def test_transition_prior_breaks_an_ambiguous_ranking():
    comp = _compendium({"get_order": {"cancel_order": 20.0}})
    ambiguous = _result({"return_items": 0.52, "cancel_order": 0.50, "get_order": 0.30})
    assert rerank_with_transitions(ambiguous, comp, None)[0] == "return_items"
    assert rerank_with_transitions(ambiguous, comp, "get_order", weight=0)[0] == "return_items"
    ranked = rerank_with_transitions(ambiguous, comp, "get_order")
    assert ranked[0] == "cancel_order"
    # every tool is ranked, retrieved or not
    assert sorted(ranked) == sorted(CATALOG.ids)


def test_transition_prior_does_not_overturn_a_clear_win():
    comp = _compendium({"get_order": {"cancel_order": 20.0}})
    clear = _result({"return_items": 1.5, "cancel_order": 0.5})
    assert rerank_with_transitions(clear, comp, "get_order")[0] == "return_items"


def test_transition_prior_can_bring_in_an_unretrieved_tool():
    comp = _compendium({"get_order": {"cancel_order": 50.0}})
    result = _result({"return_items": 0.41, "get_order": 0.40})
    ranked = rerank_with_transitions(result, comp, "get_order")
    assert ranked[0] == "cancel_order"
    assert rerank_with_transitions(result, comp, None) == ["return_items", "get_order", "cancel_order", "find_user"]
    with pytest.raises(ValueError, match="weight"):
        rerank_with_transitions(result, comp, "get_order", weight=-1)


# --------------------------------------------------------------------------- steps


def test_step_items_count_equals_gold_actions():
    items = taubench_step_items(TEST)
    assert len(items) == sum(len(t.actions) for t in TEST) == 6
    assert [i.prev_tool for i in items[:3]] == [None, "find_user", "get_order"]


def test_step_accuracy_with_learned_transitions():
    comp = build_compendium(taubench_events(TRAIN), CATALOG, "central")
    router = Router(comp, CATALOG, embedder=TfidfEmbedder())
    items = taubench_step_items(TEST)
    scores = step_accuracy(router, items)
    assert set(scores) == set(VARIANTS)
    for m in scores.values():
        assert m["n"] == len(items)
        assert 0.0 <= m["acc"] <= m["r5"] <= 1.0
    # find_user is always followed by get_order in training: the prior knows it
    second = [i for i in items if i.prev_tool == "find_user"]
    assert step_accuracy(router, second, transition_weight=1.0)["transition"]["acc"] == 1.0


def test_docs_only_router_is_unchanged_by_the_prior():
    router = Router(None, CATALOG, embedder=TfidfEmbedder())
    scores = step_accuracy(router, taubench_step_items(TEST), transition_weight=1.0)
    assert scores["router"] == scores["transition"]


# --------------------------------------------------------------------------- real data


def _data_missing() -> str | None:
    try:
        root = data_dir()
    except SynapseError as exc:
        return f"benchmark data not found ({exc})"
    return None if (root / "taubench-retail").is_dir() else f"no taubench-retail/ in {root}"


@pytest.mark.data
@pytest.mark.skipif(_data_missing() is not None, reason=str(_data_missing()))
def test_real_data_smoke():
    catalog, test = load_taubench(split="test")
    few = [t for t in test if t.actions][:5]
    router = Router(None, catalog, embedder=TfidfEmbedder())
    scores = step_accuracy(router, taubench_step_items(few))
    n = sum(len(t.actions) for t in few)
    for variant in VARIANTS:
        assert scores[variant]["n"] == n
