"""The feedback loop: replayed routing outcomes become next round's experience."""

from __future__ import annotations

import math

import pytest

from synapse_flwr.core.builder import BuildConfig, build_compendium
from synapse_flwr.core.catalog import ToolDoc, make_catalog
from synapse_flwr.core.embed import TfidfEmbedder
from synapse_flwr.core.experience import Event
from synapse_flwr.core.replay import replay_events
from synapse_flwr.core.router import Router

CATALOG = make_catalog(
    [
        ToolDoc("convert_currency", "convert_currency", "Convert money between currencies: dollars, euros."),
        ToolDoc("crypto_ticker", "crypto_ticker", "Live market data."),
    ]
)
# The docs make convert_currency look right for crypto conversions; the org knows better.
EVENTS = [
    Event(query=f"convert {n} bitcoin to euros", tool="crypto_ticker", success=True, gold="crypto_ticker")
    for n in range(6)
] + [Event(query="convert 5 dollars to euros", tool="convert_currency", success=True)]


def test_misroutes_become_when_not_with_prefer():
    # the global knows convert_currency from experience (the dollar event), crypto_ticker from its docs only
    known = build_compendium(EVENTS[-1:], CATALOG, "other", epsilon=math.inf, seed=0)
    replayed = replay_events(EVENTS, Router(known, CATALOG, embedder=TfidfEmbedder(), reranker="none"))
    assert replayed and len(replayed) < len(EVENTS)  # routes that were right are not replayed
    assert all(not e.success and e.tool == "convert_currency" and e.gold == "crypto_ticker" for e in replayed)
    comp = build_compendium([*EVENTS, *replayed], CATALOG, "acme", config=BuildConfig(events_per_record=2),
                            epsilon=math.inf, seed=0)
    when_not = comp.tool("convert_currency").when_not
    assert any(w.prefer == "crypto_ticker" and w.text in ("bitcoin", "convert bitcoin") for w in when_not)


def test_no_failure_is_invented_for_a_tool_known_only_from_its_docs():
    # a docs-only global: every misroute lands on a tool without experience, so nothing is replayed
    docs_router = Router(None, CATALOG, embedder=TfidfEmbedder(), reranker="none")
    assert docs_router.route_many([EVENTS[0].query])[0].tool == "convert_currency"  # a misroute
    assert replay_events(EVENTS, docs_router) == []


def test_replay_doubles_the_contribution_bound_and_the_noise():
    one = build_compendium(EVENTS, CATALOG, "acme", epsilon=4.0, seed=0)
    two = build_compendium(EVENTS, CATALOG, "acme", epsilon=4.0, config=BuildConfig(events_per_record=2), seed=0)
    assert abs(two.privacy.clip ** 2 - 2 * one.privacy.clip ** 2) < 1e-4
    assert abs(two.privacy.sigma / one.privacy.sigma - 2 ** 0.5) < 0.02


def test_replay_in_one_window_calibrates_to_one_tools_doubled_prototype():
    """An event and its replayed outcome add the same unit vector to one tool's prototype: norm 2(1+c^2)^(1/2)."""
    c = 8.0
    one = BuildConfig(prototype_weight=c).privacy_params(4.0, 1e-5, 1, c)
    two = BuildConfig(prototype_weight=c, events_per_record=2).privacy_params(4.0, 1e-5, 1, c)
    assert one.l2_sensitivity ** 2 == pytest.approx(one.max_contributions + 1 + c * c)
    assert two.l2_sensitivity ** 2 == pytest.approx(2 * one.max_contributions + 4 * (1 + c * c))
