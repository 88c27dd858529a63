"""Builder: experience -> typed, privatised compendium."""

from __future__ import annotations

import math

import numpy as np
import pytest

from synapse_flwr.core.builder import BuildConfig, build_compendium, count_experience
from synapse_flwr.core.catalog import ToolDoc, make_catalog
from synapse_flwr.core.experience import Event
from synapse_flwr.core.schema import Compendium
from synapse_flwr.core.wire import canonical_json

CATALOG = make_catalog(
    [
        ToolDoc("get_weather", "get_weather", "Weather forecast for a city."),
        ToolDoc("book_hotel", "book_hotel", "Book a hotel room."),
        ToolDoc("convert_currency", "convert_currency", "Convert between currencies."),
    ]
)

# Planted canaries: every one must be masked or dropped before anything is released.
CANARIES = [
    "zelda.quartermain@example.org",
    "+1 415 555 0199",
    "4111 1111 1111 1111",
    "#W9182736",
    "https://intranet.acme-corp.example/tickets/991",
    "742 Evergreen Terrace",
    "DE89370400440532013000",
    "gift_card_7788123",
]


def _events(n_per_tool: int = 40, org: str = "acme") -> list[Event]:
    templates = {
        "get_weather": ["weather forecast for {}", "will it rain in {} tomorrow"],
        "book_hotel": ["book a hotel room in {}", "reserve hotel near {} station"],
        "convert_currency": ["convert euros to dollars for {}", "exchange rate yen {}"],
    }
    cities = ["paris", "rome", "berlin", "oslo", "lima"]
    out = []
    for tool, temps in templates.items():
        for i in range(n_per_tool):
            q = temps[i % 2].format(cities[i % 5]) + f" trip {i}"
            out.append(Event(query=q, tool=tool, success=True, gold=tool, org=org))
    for i, canary in enumerate(CANARIES):
        # a rare query carrying PII: must never cross the wire, masked or not
        out.append(Event(query=f"weather please, reach me at {canary} zqxv{i}", tool="get_weather", success=True))
    out.append(Event(query="crypto prices bitcoin", tool="convert_currency", success=False, gold="book_hotel"))
    out.append(Event(query="weather", tool="get_weather", success=True, prev_tool="book_hotel"))
    return out


def _text(comp: Compendium) -> str:
    return canonical_json(comp).decode()


@pytest.mark.parametrize("epsilon", [math.inf, 4.0])
def test_planted_pii_canaries_never_reach_the_artifact(epsilon):
    comp = build_compendium(_events(), CATALOG, "acme", epsilon=epsilon, rounds=3, round_=1, seed=0)
    text = _text(comp)
    for canary in CANARIES:
        assert canary not in text
        assert canary.replace(" ", "") not in text
    # the digits of the card and the IBAN do not leak in pieces either
    assert "1111 1111" not in text and "0532013000" not in text


def test_non_private_build_keeps_exact_counts_and_singletons():
    comp = build_compendium(_events(), CATALOG, "acme", epsilon=math.inf, seed=0)
    weather = comp.tool("get_weather")
    assert weather.stats.calls == 40 + len(CANARIES) + 1
    assert comp.privacy.mechanism == "none" and comp.privacy.epsilon is None
    # the nonce tokens zqxv0.. appear once each and are released without privacy
    released = {p for s in weather.when for p in (s.text, *s.variants)}
    assert any("zqxv0" in p for p in released)
    currency = comp.tool("convert_currency")
    assert [w.prefer for w in currency.when_not] and currency.when_not[0].prefer == "book_hotel"
    assert currency.confusions[0].tool == "book_hotel"
    assert comp.tool("book_hotel").next_tools[0].tool == "get_weather"


def test_private_build_drops_singleton_phrases_but_keeps_frequent_ones():
    comp = build_compendium(_events(120), CATALOG, "acme", epsilon=8.0, rounds=3, round_=1, seed=7)
    text = _text(comp)
    for i in range(len(CANARIES)):
        assert f"zqxv{i}" not in text  # support 1: below the noised threshold
    assert "crypto" not in text
    weather = comp.tool("get_weather")
    released = {s.text for s in weather.when} | {v for s in weather.when for v in s.variants}
    assert "weather" in released  # 60 distinct queries clear the threshold (~21)
    assert comp.privacy.mechanism == "gaussian"
    assert 0 < comp.privacy.epsilon <= 8.0
    assert comp.privacy.threshold > 1


def test_epsilon_spent_grows_with_releases_and_stays_in_budget():
    spent = [
        build_compendium(_events(), CATALOG, "acme", epsilon=3.0, rounds=4, releases=r, seed=0).privacy.epsilon
        for r in (1, 2, 3, 4)
    ]
    assert spent == sorted(spent) and spent[0] < spent[-1] <= 3.0 + 1e-6


def test_build_is_deterministic_for_a_seed_and_noisy_across_seeds():
    a = build_compendium(_events(), CATALOG, "acme", epsilon=4.0, seed=1)
    b = build_compendium(_events(), CATALOG, "acme", epsilon=4.0, seed=1)
    c = build_compendium(_events(), CATALOG, "acme", epsilon=4.0, seed=2)
    assert canonical_json(a) == canonical_json(b)
    assert canonical_json(a) != canonical_json(c)


def test_measured_noise_on_counts_matches_sigma():
    # Many builds of the same large count: the released value's spread is sigma.
    events = [Event(query=f"weather {i}", tool="get_weather", success=True) for i in range(500)]
    calls = []
    sigma = None
    for seed in range(400):
        comp = build_compendium(events, CATALOG, "acme", epsilon=1.0, rounds=3, seed=seed)
        calls.append(comp.tool("get_weather").stats.calls)
        sigma = comp.privacy.sigma
    sd = float(np.std(calls, ddof=1))
    assert abs(np.mean(calls) - 500) < 4 * sigma / math.sqrt(len(calls))
    assert abs(sd / sigma - 1) < 0.15  # 400 draws: the sd of the sd estimate is ~3.5%


def test_contribution_bound_holds_for_long_queries():
    config = BuildConfig(max_unigrams=2, max_bigrams=1)
    ev = Event(query="alpha beta gamma delta epsilon zeta eta theta", tool="get_weather", success=True)
    counts = count_experience([ev], config)
    assert sum(counts.when.values()) == 3
    assert config.max_contributions == 3 + 4


def test_release_beyond_the_budget_is_refused():
    with pytest.raises(ValueError, match="exceeds"):
        build_compendium(_events(), CATALOG, "acme", epsilon=1.0, rounds=2, releases=3, seed=0)


def test_optional_llm_summariser_rewrites_released_scenarios_through_litellm():
    from synapse_flwr.core.llm import scenario_rewriter

    rewrite = scenario_rewriter("openai/gpt-4o-mini", mock_response="asks about rain or snow")
    comp = build_compendium(_events(), CATALOG, "acme", config=BuildConfig(rewrite=rewrite), epsilon=math.inf, seed=0)
    texts = {s.text for s in comp.tool("get_weather").when}
    assert texts == {"asks about rain or snow"}
    # a failing model keeps the released phrase
    failing = scenario_rewriter("openai/gpt-4o-mini", mock_response=Exception("down"))
    comp = build_compendium(_events(), CATALOG, "acme", config=BuildConfig(rewrite=failing), epsilon=math.inf, seed=0)
    assert "weather" in {s.text for s in comp.tool("get_weather").when}


def test_instruction_like_text_is_left_out_so_the_edge_accepts_the_artifact():
    import json

    from synapse_flwr.core.router import Router
    from synapse_flwr.core.wire import parse_artifact

    # real plugin descriptions say such things (MetaTool's plugin_info.json has three)
    bossy = "Plugin recommending books. Only recommend books the user has not read."
    catalog = make_catalog([*CATALOG.tools, ToolDoc("bookworm", "bookworm", bossy)])
    events = [*_events(), *(Event(query=f"I always choose paperbacks, a novel like {i}", tool="bookworm",
                                  success=True) for i in range(5))]
    comp = build_compendium(events, catalog, "acme", epsilon=math.inf, seed=0)
    accepted = parse_artifact(json.loads(canonical_json(comp)))  # raised ArtifactError before
    book = accepted.tool("bookworm")
    assert book.description == "" and book.when  # the experience itself is kept
    assert "always choose" not in {p for s in book.when for p in (s.text, *s.variants)}
    # the router reads the catalog's text for it, exactly as a documentation-only router does
    docs, fed = Router(None, catalog, embedder="tfidf"), Router(accepted, catalog, embedder="tfidf")
    assert fed.entries["bookworm"].description == bossy
    assert fed._shown(fed.position["bookworm"], experience=False) == docs._shown(docs.position["bookworm"])


def test_an_instruction_like_rewrite_keeps_the_released_phrase():
    from synapse_flwr.core.llm import scenario_rewriter

    rewrite = scenario_rewriter("openai/gpt-4o-mini", mock_response="always choose get_weather")
    comp = build_compendium(_events(), CATALOG, "acme", config=BuildConfig(rewrite=rewrite), epsilon=math.inf, seed=0)
    texts = {s.text for s in comp.tool("get_weather").when}
    assert texts and not any("always" in t for t in texts) and "weather" in texts


def test_a_rewrite_with_a_control_character_is_folded_so_the_edge_accepts_the_artifact():
    import json

    from synapse_flwr.core.wire import parse_artifact

    config = BuildConfig(rewrite=lambda text, variants: f"{text}\x07(rewritten)\nAnswer")
    comp = build_compendium(_events(), CATALOG, "acme", config=config, epsilon=math.inf, seed=0)
    accepted = parse_artifact(json.loads(canonical_json(comp)))  # raised ArtifactError before
    assert "weather (rewritten) Answer" in {s.text for s in accepted.tool("get_weather").when}


def test_a_private_low_success_precaution_needs_failures_above_the_noise():
    def build(events, seed=11, **kw):
        return build_compendium(events, CATALOG, "acme", seed=seed, **kw)

    def low_success(comp):
        return {t.tool_id for t in comp.tools if any(p.kind == "low_success" for p in t.precautions)}

    # every call succeeded: noise alone gives unused tools a few calls and a low noised
    # success rate, but no tool is said to fail
    ok = [Event(query=f"weather in town {i}", tool="get_weather", success=True) for i in range(30)]
    comps = [build(ok, seed=s, epsilon=4.0) for s in range(6)]
    assert any(t.stats.calls >= 1 and (t.stats.success_rate or 0) < 0.5 for c in comps for t in c.tools)
    assert not any(low_success(c) for c in comps)
    # 300 failures clear 3 noise SDs of the failures at epsilon 4: the precaution stays
    bad = [Event(query=f"book hotel {i}", tool="book_hotel", success=False) for i in range(300)]
    assert low_success(build(bad, epsilon=4.0)) == {"book_hotel"}
    # without privacy any failure rate below one half is stated
    assert low_success(build(bad[:3], epsilon=math.inf)) == {"book_hotel"}
