"""Router: hybrid retrieval and typed-field reranking (lexical embedder: no model needed)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from synapse_flwr.cli import app
from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.catalog import ToolDoc, make_catalog
from synapse_flwr.core.documentation import (
    arguments_text,
    catalog_arguments,
    doc_text,
    documentation_text,
    name_words,
)
from synapse_flwr.core.embed import TfidfEmbedder
from synapse_flwr.core.experience import Event
from synapse_flwr.core.fusion import Fusion
from synapse_flwr.core.merge import merge_flat_majority
from synapse_flwr.core.metrics import evaluate_routes
from synapse_flwr.core.router import (
    Router,
    candidate_set,
)
from synapse_flwr.core.schema import Compendium, Issuer, ToolEntry, WhenNot

CATALOG = make_catalog(
    [
        ToolDoc("get_weather", "get_weather", "Weather forecast: rain, snow and temperature for a city."),
        ToolDoc("book_hotel", "book_hotel", "Book a hotel room for given dates."),
        ToolDoc("convert_currency", "convert_currency", "Convert an amount between fiat currencies."),
        ToolDoc("crypto_ticker", "crypto_ticker", "Live prices of bitcoin, ether and other crypto coins."),
        ToolDoc("visa_rules", "visa_rules", "Visa and passport entry requirements for travellers."),
    ]
)

# Experience that teaches what the descriptions do not say: "umbrella" means weather,
# "stay" means hotel. visa_rules and crypto_ticker have no experience at all.
EVENTS = [
    *(Event(query=f"do I need an umbrella in {c}", tool="get_weather", success=True) for c in "abcdefgh"),
    *(Event(query=f"somewhere to stay in {c} tonight", tool="book_hotel", success=True) for c in "abcdefgh"),
    *(Event(query=f"change {n} euros into dollars", tool="convert_currency", success=True) for n in range(8)),
]


def router(compendium, reranker="fields", render="typed"):
    return Router(compendium, CATALOG, embedder=TfidfEmbedder(), reranker=reranker, render=render)


def central_compendium() -> Compendium:
    return build_compendium(EVENTS, CATALOG, "acme", epsilon=math.inf, seed=0)


@pytest.fixture(scope="module")
def central() -> Compendium:
    return central_compendium()


def test_experience_teaches_what_docs_do_not(central):
    assert router(None, "none").route("umbrella needed in Paris?").tool != "get_weather"
    assert router(central, "none").route("umbrella needed in Paris?").tool == "get_weather"
    assert router(central).route("a place to stay near the station").tool == "book_hotel"


@pytest.mark.parametrize(("name", "words"), [
    ("AusPetrolPrices", "Aus Petrol Prices"), ("getHTTPStatus", "get HTTP Status"), ("get_weather", "get weather"),
    ("search-web", "search web"), ("AutoInfra1", "Auto Infra 1"), ("calculator", "calculator"),
])
def test_names_are_read_as_words(name, words):
    # an uncased embedder reads "auspetrolprices" as one unknown word
    assert name_words(name) == words
    assert doc_text(ToolEntry(tool_id="fuel", description="Fuel prices."), name) == f"{words}: Fuel prices."


SEARCH_FLIGHTS = {"type": "object", "properties": {
    "origin": {"type": "string", "description": "Departure city or  IATA airport code."},
    "returnDate": {"type": "string"}, "passengers": "not a schema"}, "required": ["origin"]}


def test_arguments_are_read_as_words_after_the_description():
    assert arguments_text(SEARCH_FLIGHTS) == "origin: Departure city or IATA airport code.; return Date; passengers"
    assert documentation_text("search_flights", "Find flights.", arguments_text(SEARCH_FLIGHTS)) == (
        "search flights: Find flights. Arguments: origin: Departure city or IATA airport code.; return Date; "
        "passengers.")
    assert documentation_text("search_flights", "", arguments_text({"properties": {"to": {}}})) == (
        "search flights. Arguments: to.")
    # no properties (or no schema): the documentation is the name and description alone
    for schema in (None, {}, {"type": "object"}, {"properties": []}, {"properties": {}}):
        assert documentation_text("search_flights", "Find flights.", arguments_text(schema)) == (
            "search flights: Find flights.")


def test_an_argument_most_tools_take_is_not_read():
    def tool(name, *args):
        return ToolDoc(name, name, "", parameters={"properties": {a: {"description": f"the {a}"} for a in args}})

    # "Limit" and "limit" are one argument, taken by 2 of 3 tools: not read; "city" by 1 of 3: read
    catalog = make_catalog([tool("a", "city", "limit"), tool("b", "Limit"), ToolDoc("c", "c", "")])
    assert catalog_arguments(catalog) == {"a": "city: the city", "b": "", "c": ""}
    # half the tools is not "most": with a fourth tool, "limit" is read again
    catalog = make_catalog([*catalog.tools, ToolDoc("d", "d", "")])
    assert catalog_arguments(catalog)["b"] == "Limit: the Limit"


def test_a_request_naming_only_an_argument_routes_to_the_tool_that_takes_it():
    # "zip code" is in neither description; only find_user's arguments name it
    tools = [ToolDoc("find_user", "find_user", "Look up a customer account.",
                     parameters={"properties": {"zip": {"description": "The customer's zip code, e.g. 90210."}}}),
             ToolDoc("find_order", "find_order", "Look up an order.",
                     parameters={"properties": {"order_id": {"description": "The order number."}}})]
    query = "the zip code is 90210"

    def scores(catalog):
        routed = Router(None, catalog, embedder=TfidfEmbedder(), reranker="none").route(query)
        return routed.tool, {c.tool_id: c.retrieval for c in routed.candidates}

    tool, with_args = scores(make_catalog(tools))
    assert tool == "find_user" and with_args["find_user"] > with_args["find_order"]
    _, without = scores(make_catalog([ToolDoc(d.tool_id, d.name, d.description) for d in tools]))
    assert without == {"find_user": 0.0, "find_order": 0.0}


def test_docs_only_tools_are_not_drowned_by_experience(central):
    r = router(central)
    assert r.route("what are the visa entry requirements for my passport").tool == "visa_rules"
    assert r.route("price of bitcoin and ether now").tool == "crypto_ticker"


def test_a_query_for_a_tool_without_experience_is_scored_exactly_as_docs_only(central):
    # "stay" and "tonight" are released hotel scenarios, but the documentation's choice is
    # visa_rules, which has none: the per-query gate keeps every score docs_only's, and the
    # lexical router's documentation scores keep their own fit (the scenarios' words would
    # move the idf)
    query = "visa requirements for my passport if I stay tonight"
    docs, r = router(None, "none"), router(central, "none")
    assert np.array_equal(r.retrieve([query]), docs.retrieve([query]))
    assert r.route(query).tool == "visa_rules"
    # where the documentation's choice has experience, the same scenarios do count
    assert r.retrieve(["somewhere to stay tonight"])[0][r.position["book_hotel"]] > \
        docs.retrieve(["somewhere to stay tonight"])[0][docs.position["book_hotel"]]
    # unless the fusion adds nothing (the votes' documentation only)
    off = Router(central, CATALOG, embedder=TfidfEmbedder(), reranker="none", fusion=Fusion(prototype=0, prior=0))
    assert np.array_equal(off.retrieve(["somewhere to stay tonight"]), docs.retrieve(["somewhere to stay tonight"]))


def test_a_tool_is_documented_by_the_catalog_not_by_a_compendium_copy(central):
    """Regression: a compendium's description (stale, or one organisation's) replaced the catalog's."""
    lie = "Live prices of bitcoin and crypto coins; also hotel rooms, weather and visas."
    forged = central.model_copy(update={"tools": [
        t.model_copy(update={"description": lie}) if t.tool_id == "visa_rules" else t for t in central.tools]})
    r = router(forged, "none")
    assert r.entries["visa_rules"].description == CATALOG.get("visa_rules").description
    assert r.route("bitcoin price").tool == router(central, "none").route("bitcoin price").tool == "crypto_ticker"
    # a catalog without the text: the compendium's copy is read
    bare = make_catalog([ToolDoc(d.tool_id, d.name, "" if d.tool_id == "visa_rules" else d.description)
                         for d in CATALOG.tools])
    assert Router(forged, bare, embedder=TfidfEmbedder()).entries["visa_rules"].description == lie


def test_when_not_with_prefer_redirects_to_the_named_tool():
    entry = ToolEntry(
        tool_id="convert_currency",
        description="Convert an amount between fiat currencies.",
        when_not=[WhenNot(text="convert bitcoin euros", support=9.0, prefer="crypto_ticker")],
    )
    comp = Compendium(kind="global", issuer=Issuer(org="global"), tools=[entry])
    r = router(comp)
    result = r.route("convert bitcoin to euros")
    assert result.tool == "crypto_ticker"
    assert "redirected" in result.decided_by
    # regression: the redirect's score was a numpy float32, and `synapse route` failed to print it as JSON
    assert json.loads(json.dumps(result.to_dict(r.names)))["tool"] == "crypto_ticker"


def test_only_the_matching_when_not_scenario_names_the_tool_to_use_instead():
    """Regression: the avoid-when evidence came from the best-matching scenario, the redirect from the best one
    with a ``prefer``, however weak its match, so a query went to a tool its scenario never named."""
    matching = WhenNot(text="convert bitcoin euros", support=9.0)  # says avoid, names no other tool
    weak = WhenNot(text="hotel room tonight", support=9.0, prefer="visa_rules")
    entry = ToolEntry(tool_id="convert_currency", description="Convert an amount between fiat currencies.",
                      when_not=[matching, weak])
    comp = Compendium(kind="global", issuer=Issuer(org="global"), tools=[entry])
    result = router(comp).route("convert bitcoin to euros")
    assert result.tool != "visa_rules" and "redirected" not in result.decided_by
    ruled_out = next(c for c in result.candidates if c.tool_id == "convert_currency")
    assert ruled_out.signals["when_not"] > 0  # the matching scenario still rules the tool out
    named = entry.model_copy(update={"when_not": [matching.model_copy(update={"prefer": "crypto_ticker"}), weak]})
    assert router(comp.model_copy(update={"tools": [named]})).route("convert bitcoin to euros").tool == "crypto_ticker"


def test_a_catalog_whose_texts_hold_no_phrase_routes():
    """Regression: with no phrase anywhere in names and descriptions the phrase model raised from scipy."""
    bare = make_catalog([ToolDoc("go", "go", ""), ToolDoc("get", "get", "")])
    assert Router(None, bare, embedder=TfidfEmbedder()).route("go somewhere").tool in ("go", "get")


def test_explain_credits_the_documentation_only_when_it_would_have_chosen_the_same_tool(central):
    """Regression: with k = 1 the documentation's choice was taken among the candidates, i.e. the winner."""
    docs = router(None, "none")
    queries = [*(e.query for e in EVENTS), "bitcoin price", "visa for japan", "a room near the rain"]
    for k in (1, 5):
        r = Router(central, CATALOG, embedder=TfidfEmbedder(), k=k)
        moved = 0
        for q in queries:
            result = r.route(q)
            same = result.tool == docs.route(q).tool
            moved += not same
            assert (result.decided_by == ["description"]) == same, (k, q, result.decided_by)
        assert moved > 0  # experience moved some routes: both sides of the rule are exercised


def test_a_model_is_not_shown_call_statistics_within_noise_of_zero():
    """Regression: under DP a tool never called was rendered "success rate: 0% of 8 calls" from noise alone."""
    private = build_compendium(EVENTS, CATALOG, "acme", epsilon=1.0, seed=4)  # visa_rules: 12.6 calls of noise
    r = Router(private, CATALOG, embedder=TfidfEmbedder(), reranker="none")
    noise_only = [t for t in ("visa_rules", "crypto_ticker") if private.tool(t).stats.calls > 0]
    assert noise_only and r.calls_floor > max(private.tool(t).stats.calls for t in noise_only)
    for t in noise_only:
        assert "success rate" not in r._shown(r.tool_ids.index(t))
    flat = Router(private, CATALOG, embedder=TfidfEmbedder(), reranker="none", render="flat")
    assert all("calls" not in flat.entries[t].description for t in noise_only)
    exact = Router(central_compendium(), CATALOG, embedder=TfidfEmbedder(), reranker="none")
    assert "success rate: 100% of 8 calls" in exact._shown(exact.tool_ids.index("get_weather"))


def test_votes_for_documentation_only_silence_when_not_too():
    """Experience is read only where the votes beat documentation alone: a veto leaves no redirect."""
    from synapse_flwr.core.schema import FusionVotes
    from synapse_flwr.core.votes import SETTINGS

    entry = ToolEntry(
        tool_id="convert_currency",
        description="Convert an amount between fiat currencies.",
        when_not=[WhenNot(text="convert bitcoin euros", support=9.0, prefer="crypto_ticker")],
    )
    query = "convert bitcoin to euros"
    for docs_wins, expected in ((True, "convert_currency"), (False, "crypto_ticker")):
        best = 0 if docs_wins else 1
        votes = FusionVotes(settings=list(SETTINGS), correct=[100.0 if j == best else 10.0 for j in range(len(SETTINGS))],
                            records=100.0, sd=1.0)
        comp = Compendium(kind="global", issuer=Issuer(org="global"), tools=[entry], votes=votes)
        r = router(comp)
        assert r.route(query).tool == expected
        # nor does an LLM reranker read any candidate's experience under the veto
        assert (r.experience_read(r.evidence([query])["prototype"][0], [0, 1, 2]) == set()) == docs_wins
        assert router(None).route(query).tool == "convert_currency"
    # fusion constants given by hand override the votes
    assert Router(comp.model_copy(update={"votes": votes.model_copy(update={"correct": [100.0] + [10.0] * 8})}),
                  CATALOG, embedder=TfidfEmbedder(), fusion=Fusion()).route(query).tool == "crypto_ticker"


def test_when_not_below_the_margin_redirects_nothing(monkeypatch):
    from synapse_flwr.core import router as router_module

    entry = ToolEntry(
        tool_id="convert_currency",
        description="Convert an amount between fiat currencies.",
        when_not=[WhenNot(text="convert bitcoin euros", support=9.0, prefer="crypto_ticker")],
    )
    comp = Compendium(kind="global", issuer=Issuer(org="global"), tools=[entry])
    r = router(comp)
    ruled_out = next(c for c in r.route("convert bitcoin to euros").candidates if c.tool_id == "convert_currency")
    excess = ruled_out.signals["when_not"] + router_module.WHEN_NOT_MARGIN
    assert excess > router_module.WHEN_NOT_MARGIN
    monkeypatch.setattr(router_module, "WHEN_NOT_MARGIN", excess + 0.01)  # the same match, now inside the margin
    result = r.route("convert bitcoin to euros")
    assert result.tool == "convert_currency" and "redirected" not in result.decided_by


def test_result_lists_k_ranked_candidates_and_the_deciding_fields(central):
    result = router(central).route("umbrella needed in Oslo?")
    assert len(result.candidates) >= 5
    scores = [c.score for c in result.candidates]
    assert scores == sorted(scores, reverse=True)
    assert result.decided_by and not result.fallback
    json.dumps(result.to_dict())  # JSON-ready


def test_flat_render_and_flat_compendium_route(central):
    flat = merge_flat_majority([central])
    assert router(flat).route("umbrella needed in Oslo?").tool == "get_weather"
    assert router(central, render="flat").route("somewhere to stay tonight").tool == "book_hotel"


def test_a_flat_clause_naming_no_tool_id_is_left_out_not_refused():
    """Regression (LLM review): a flat compendium (free text, valid at load) whose "confused with" or "prefer"
    named no tool id ("Search Flights") made every Router of it fail with a pydantic error."""
    from synapse_flwr.core.schema import FlatCompendium

    flat = FlatCompendium(issuer=Issuer(org="a"), texts={"book_hotel": (
        "about: Book hotel rooms. | confused with: Visa Rules | followed by: get_weather | "
        "avoid when: a visa for Japan -> prefer Visa Rules | use when: somewhere to stay")})
    entry = router(flat).entries["book_hotel"]
    assert entry.confusions == [] and [c.tool for c in entry.next_tools] == ["get_weather"]
    assert entry.when_not[0].prefer is None and router(flat).route("somewhere to stay").tool == "book_hotel"


def test_route_many_matches_route_and_evaluate_counts(central):
    r = router(central)
    queries = ["umbrella in Rome?", "somewhere to stay in Rome", "visa for Japan"]
    batch = r.route_many(queries, batch_size=2)
    assert [b.tool for b in batch] == [r.route(q).tool for q in queries]
    metrics = evaluate_routes(batch, [("get_weather",), ("book_hotel",), ("visa_rules",)])
    assert metrics == {"acc": 1.0, "r5": 1.0, "n": 3}


def test_bad_arguments_are_clear_errors(central):
    with pytest.raises(ValueError, match="unknown reranker"):
        router(central, reranker="magic")
    with pytest.raises(ValueError, match="unknown render"):
        router(central, render="pretty")


def test_cli_route_prints_json(tmp_path, central):
    from typer.testing import CliRunner

    from synapse_flwr.core.wire import save_artifact

    cat = tmp_path / "catalog.json"
    cat.write_text(json.dumps([{"name": d.tool_id, "description": d.description} for d in CATALOG.tools]))
    comp = save_artifact(tmp_path / "g.json", central)
    res = CliRunner().invoke(
        app, ["route", "--catalog", str(cat), "--compendium", str(comp), "--embedder", "tfidf",
              "umbrella in Lima?"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["tool"] == "get_weather"


def test_cli_route_answers_the_catalog_spelling_an_agent_calls(tmp_path, central):
    from typer.testing import CliRunner

    from synapse_flwr.core.wire import save_artifact

    # "Get Weather" normalises to the compendium's id get_weather; an agent must call "Get Weather"
    cat = tmp_path / "catalog.json"
    spelt = {"get_weather": "Get Weather"}
    cat.write_text(json.dumps([{"name": spelt.get(d.tool_id, d.tool_id), "description": d.description}
                               for d in CATALOG.tools]))
    comp = save_artifact(tmp_path / "g.json", central)
    args = ["route", "--catalog", str(cat), "--compendium", str(comp), "--embedder", "tfidf", "umbrella in Lima?"]
    answer = json.loads(CliRunner().invoke(app, args).stdout)
    assert (answer["tool"], answer["tool_id"]) == ("Get Weather", "get_weather")
    assert {c["tool"] for c in answer["candidates"]} >= {"Get Weather"}
    explained = CliRunner().invoke(app, [*args, "--explain"])
    assert explained.exit_code == 0, explained.output
    assert "tool: Get Weather" in explained.stdout


def test_force_puts_a_gold_tool_among_the_candidates(central):
    r = Router(central, CATALOG, embedder=TfidfEmbedder(), reranker="none", k=1)
    query = "do I need an umbrella in Rome"
    assert r.route(query).tool == "get_weather"
    # the gold tool is not retrieved: the oracle swaps it in for the last candidate
    forced = r.route_many([query], force=[("visa_rules", "crypto_ticker")])[0]
    assert [c.tool_id for c in forced.candidates] == [max(
        ("visa_rules", "crypto_ticker"), key=lambda t: r.retrieve([query])[0][r.position[t]])]
    # a gold tool already retrieved changes nothing; unknown ids are ignored
    assert r.route_many([query], force=[("get_weather", "no_such_tool")])[0].tool == "get_weather"
    with pytest.raises(ValueError, match="one sequence"):
        r.route_many([query, query], force=[("get_weather",)])


def test_success_prior_ignores_stats_within_privacy_noise():
    from synapse_flwr.core.schema import PrivacyBlock, ToolStats

    entry = ToolEntry(tool_id="visa_rules", description="Visa and passport entry requirements for travellers.",
                      stats=ToolStats(calls=4.0, successes=0.5))
    noisy = Compendium(kind="global", issuer=Issuer(org="global"), tools=[entry],
                       privacy=PrivacyBlock(mechanism="gaussian", sigma=3.0))
    exact = noisy.model_copy(update={"privacy": PrivacyBlock()})
    query = "visa rules for my passport"
    signals = {c.tool_id: c.signals for c in router(noisy).route(query).candidates}
    assert signals["visa_rules"]["success_prior"] == 0.0
    signals = {c.tool_id: c.signals for c in router(exact).route(query).candidates}
    assert signals["visa_rules"]["success_prior"] < 0.0


def test_candidates_keep_the_documentations_favourites_and_retrievals_top_one():
    import numpy as np

    docs = np.array([0.9, 0.8, 0.7, 0.1, 0.0, 0.0])
    fused = docs + np.array([0.0, 0.0, 0.0, 2.0, 1.5, 1.2])  # experience lifts tools 3, 4, 5 above docs' 0, 1
    assert candidate_set(fused, docs, 3, 0) == [3, 4, 5]
    # docs' top 2 displace retrieval's lowest candidates, go last, and retrieval's top-1 stays first
    assert candidate_set(fused, docs, 3, 2) == [3, 0, 1]
    assert candidate_set(fused, docs, 4, 2) == [3, 4, 0, 1]
    # nothing to add when retrieval already holds them; at most k - 1 are added
    assert candidate_set(docs, docs, 3, 2) == [0, 1, 2]
    assert candidate_set(fused, docs, 2, 5) == [3, 0]
    assert candidate_set(fused, docs, 1, 2) == [3]
    rng = np.random.default_rng(0)
    for _ in range(200):
        d, f = rng.random(12), rng.random(12)
        c = candidate_set(f, d, 5, 2)
        assert len(set(c)) == 5 and c[0] == int(np.argmax(f))
        assert set(np.argsort(-d, kind="stable")[:2]) <= set(c)


def test_negative_docs_candidates_is_a_clear_error(central):
    with pytest.raises(ValueError, match="docs_candidates must be >= 0, got -1"):
        Router(central, CATALOG, embedder=TfidfEmbedder(), docs_candidates=-1)


def test_a_served_request_is_embedded_and_forgotten(tmp_path):
    """Regression: every request a server routed wrote one embedding file to the on-disk cache, which grew without
    bound, slowed each cache miss by listing it, and kept users' requests on disk. A batch (a test set an
    experiment scores again) is still cached."""
    from synapse_flwr.core.embed import CachedEmbedder, get_embedder

    cached = CachedEmbedder(get_embedder("static"), tmp_path)
    r = Router(None, CATALOG, embedder=cached)
    shards = set(cached.shard_dir.glob("*.npz"))
    assert r.route("will it rain in Oslo tomorrow").tool == "get_weather"
    assert set(cached.shard_dir.glob("*.npz")) == shards
    assert r.route_many(["will it rain in Oslo tomorrow"])[0].tool == "get_weather"
    assert len(set(cached.shard_dir.glob("*.npz")) - shards) == 1


def test_a_query_that_is_not_utf8_text_is_refused_before_it_is_embedded():
    """Regression: a Latin-1 shell's byte reached the embedder's cache key as a lone surrogate: a traceback."""
    from synapse_flwr.core.router import query_problem

    assert query_problem("weather in Z\udcfcrich").startswith("is not UTF-8 text")
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        router(None).route("weather in Z\udcfcrich")
    assert query_problem("weather in Zürich") is None


def test_a_served_query_of_megabytes_is_routed_on_its_first_characters_as_a_logged_one_is():
    """Regression (inference review): ``route`` (``synapse serve``'s tool) embedded and scored a 4 MB request whole,
    holding the router for seconds; logs and test sets cut a query at MAX_QUERY characters."""
    from synapse_flwr.core.experience import MAX_QUERY

    r = router(None)
    head = "will it rain in Oslo tomorrow " * (MAX_QUERY // 30 + 1)
    long = r.route(head + "book a hotel room " * 200_000)
    assert long.query == head.strip()[:MAX_QUERY] and long.tool == r.route(head).tool == "get_weather"
    # what is routed is checked: a request whose first MAX_QUERY characters hold no word is refused
    with pytest.raises(ValueError, match="has no letter or digit"):
        r.route("-" * MAX_QUERY + " will it rain in Oslo tomorrow")
