"""The feedback loop: replayed routing outcomes become next round's experience."""

from __future__ import annotations

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
    docs_router = Router(None, CATALOG, embedder=TfidfEmbedder(), reranker="none")
    replayed = replay_events(EVENTS, docs_router)
    assert len(replayed) == len(EVENTS)
    wrong = [e for e in replayed if not e.success]
    assert wrong and all(e.tool == "convert_currency" and e.gold == "crypto_ticker" for e in wrong)
    comp = build_compendium([*EVENTS, *replayed], CATALOG, "acme", config=BuildConfig(events_per_record=2))
    when_not = comp.tool("convert_currency").when_not
    assert any(w.prefer == "crypto_ticker" and w.text in ("bitcoin", "convert bitcoin") for w in when_not)


def test_replay_doubles_the_contribution_bound_and_the_noise():
    one = build_compendium(EVENTS, CATALOG, "acme", epsilon=4.0)
    two = build_compendium(EVENTS, CATALOG, "acme", epsilon=4.0, config=BuildConfig(events_per_record=2))
    assert abs(two.privacy.clip ** 2 - 2 * one.privacy.clip ** 2) < 1e-4
    assert abs(two.privacy.sigma / one.privacy.sigma - 2 ** 0.5) < 0.02
