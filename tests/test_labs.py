"""The accounting, when_not, readable-requests and name-words labs: what their committed tables stand on."""

from __future__ import annotations

from unittest.mock import patch

from synapse_flwr.simulations.accounting import rdp_multiplier, tables
from synapse_flwr.simulations.name_words import RENDERINGS
from synapse_flwr.simulations.readable_requests import ranked_requests
from synapse_flwr.simulations.when_not import flips

from synapse_flwr.core import documentation, experience, privacy
from synapse_flwr.core.documentation import doc_text
from synapse_flwr.core.router import Router
from synapse_flwr.core.schema import Compendium, Issuer, Scenario, ToolEntry, WhenNot
from synapse_flwr.data.federation import load_federated


def test_rdp_arm_is_opacus_calibration_and_asks_more_noise_than_exact():
    exact = privacy.gaussian_noise_multiplier(4.0, 0.5e-5, 1)
    assert rdp_multiplier(4.0, 0.5e-5, 1) == privacy.noise_multiplier_for(4.0, 0.5e-5, 1.0, 1)
    assert rdp_multiplier(4.0, 0.5e-5, 1) > 1.05 * exact


def test_accounting_table_pairs_draws():
    base = {"dataset": "demo", "orgs": 3, "epsilon": 4.0, "docs_seen": 0.7, "docs_heldout": 1.0, "heldout": 1.0}
    rows = [{**base, "accountant": "exact", "draw": d, "z": 1.0, "sigma": 9.0, "seen": s}
            for d, s in ((0, 0.70), (1, 0.74))]
    rows += [{**base, "accountant": "rdp", "draw": d, "z": 1.1, "sigma": 9.9, "seen": s}
             for d, s in ((0, 0.68), (1, 0.74))]
    text = tables(rows, {"seed": 7})
    assert "per draw +0.0200, +0.0000 (mean +0.0100)" in text
    assert "noise +10.0% under RDP" in text
    assert "| demo | 3 | 4.0 | exact | 1.000 | 9.00 | 0.7200 |" in text


def test_flips_counts_routes_fixed_and_broken_against_retrieval_order():
    demo = load_federated("demo", 3, 7)
    # a when_not that sends every weather request to hotels: the fields reranker
    # breaks what retrieval order gets right, and fixes nothing
    weather = next(t for t in demo.catalog.tools if "weather" in t.tool_id)
    hotel = next(t for t in demo.catalog.tools if t.tool_id == "book_hotel")
    comp = Compendium(kind="global", issuer=Issuer(org="global"), tools=[ToolEntry(
        tool_id=weather.tool_id, description=weather.description,
        when_not=[WhenNot(text="weather forecast rain temperature", support=9.0, prefer=hotel.tool_id)])])
    items = [experience.TestItem(query=q, gold=(weather.tool_id,)) for q in
             ("weather forecast rain temperature", "weather forecast rain and temperature tomorrow")]
    fields = Router(comp, demo.catalog, embedder="tfidf")
    none = Router(comp, demo.catalog, embedder="tfidf", reranker="none")
    assert [r.tool for r in none.route_many([t.query for t in items])] == [weather.tool_id] * 2
    queries = [t.query for t in items]
    fixed, broke = flips(items, fields.route_many(queries), none.route_many(queries))
    assert (fixed, broke) == (0, 2)
    assert flips(items, none.route_many(queries), fields.route_many(queries)) == (2, 0)


def test_ranked_requests_lists_only_catalog_requests_by_support():
    when = [Scenario(text="rain", support=50), Scenario(text="will it rain", support=3),
            Scenario(text="umbrella today?", support=7)]
    comp = Compendium(kind="org", issuer=Issuer(org="a"), tools=[ToolEntry(tool_id="h"),
                                                                  ToolEntry(tool_id="w", when=when)])
    examples = {"w": {"will it rain", "umbrella today?", "never listed"}, "h": {"a room"}}
    assert ranked_requests(comp, examples) == {"w": ["umbrella today?", "will it rain"]}


def test_name_words_lab_switches_the_rendering_the_router_embeds():
    entry = ToolEntry(tool_id="auspetrolprices", description="Fuel prices.")
    seen = {}
    for label, render in RENDERINGS.items():
        with patch.object(documentation, "name_words", render):
            seen[label] = doc_text(entry, "AusPetrolPrices_v2")
    assert seen == {"words": "Aus Petrol Prices v 2: Fuel prices.", "separators": "AusPetrolPrices v2: Fuel prices."}
