"""The feedback loop: replayed routing outcomes become next round's experience."""

from __future__ import annotations

import math

import pytest

from synapse_flwr.core.builder import BuildConfig, build_compendium, count_experience
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


def test_replay_in_one_window_calibrates_to_a_failure_replayed_onto_its_own_tool():
    """A failed call whose replay the global still routes to the same wrong tool moves its call, confusion and
    transition counters twice each: the bound counts E^2 per such slot, phrases (once per tool and query) E."""
    failed = Event(query="convert 5 bitcoin to euros", tool="convert_currency", success=False, gold="crypto_ticker",
                   prev_tool="crypto_ticker")
    replayed = Event(query=failed.query, tool=failed.tool, success=False, gold=failed.gold, prev_tool=failed.prev_tool)
    config = BuildConfig(events_per_record=2).resolved(True, False)  # phrases on: no embedder
    counts = count_experience([failed, replayed], config)
    moved = sum(v * v for c in (counts.calls, counts.successes, counts.when, counts.when_not, counts.confusions,
                                counts.transitions) for v in c.values())
    assert moved == 3 * 2 ** 2 + len(counts.when_not)  # three counters moved twice; each phrase once
    one, two = (BuildConfig(events_per_record=e).resolved(True, False) for e in (1, 2))
    phrases = one.max_unigrams + one.max_bigrams
    assert one.max_contributions == phrases + 4 and two.max_contributions == 2 * phrases + 4 * 2 ** 2 >= moved
    a = build_compendium(EVENTS, CATALOG, "acme", epsilon=4.0, seed=0)
    b = build_compendium(EVENTS, CATALOG, "acme", epsilon=4.0, config=BuildConfig(events_per_record=2), seed=0)
    assert b.privacy.clip ** 2 == pytest.approx(two.max_contributions, abs=1e-4)
    assert b.privacy.sigma / a.privacy.sigma == pytest.approx(math.sqrt(two.max_contributions / one.max_contributions),
                                                              rel=0.01)


def test_replay_in_one_window_calibrates_to_one_tools_doubled_prototype():
    """An event and its replayed outcome add the same unit vector to one tool's prototype: norm 2(1+c^2)^(1/2)."""
    c = 8.0
    one = BuildConfig(prototype_weight=c).privacy_params(4.0, 1e-5, 1, c)
    two = BuildConfig(prototype_weight=c, events_per_record=2).privacy_params(4.0, 1e-5, 1, c)
    assert one.l2_sensitivity ** 2 == pytest.approx(one.max_contributions + 1 + c * c)
    phrases = BuildConfig().max_unigrams + BuildConfig().max_bigrams  # unresolved: the phrase slots count
    assert two.l2_sensitivity ** 2 == pytest.approx(2 * phrases + 4 * 2 ** 2 + 4 * (1 + c * c))
