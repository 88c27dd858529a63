"""The core Python API's defaults, and the clear errors it gives for a caller's mistakes."""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import pytest
from synapse_flwr.strategies import make_strategy
from synapse_flwr.strategies.base import CompendiumStrategy
from test_prototypes import CATALOG, EVENTS, BagEmbedder

from synapse_flwr.core import builder
from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.embed import TfidfEmbedder
from synapse_flwr.core.experience import Event, load_testset
from synapse_flwr.core.merge import merge, merge_flat_majority, merge_typed
from synapse_flwr.core.privacy import DEFAULT_EPSILON
from synapse_flwr.core.router import Router
from synapse_flwr.core.wire import encode, load_artifact, save_artifact


@pytest.fixture(scope="module")
def exact():
    return build_compendium(EVENTS, CATALOG, "acme", epsilon=math.inf, seed=0)


# ------------------------------------------------------------------ 1. private, secret-seeded by default


def test_build_is_private_by_default_with_a_secret_seed():
    params = inspect.signature(build_compendium).parameters
    assert params["epsilon"].default == DEFAULT_EPSILON == 4.0
    assert params["seed"].default is None
    first, second = build_compendium(EVENTS, CATALOG, "acme"), build_compendium(EVENTS, CATALOG, "acme")
    assert first.privacy.mechanism == "gaussian" and first.privacy.epsilon_target == DEFAULT_EPSILON
    # a fresh secret seed each time: the noise differs, so it cannot be regenerated from a public seed
    assert [t.stats for t in first.tools] != [t.stats for t in second.tools]
    # an explicit seed still reproduces
    kw = {"epsilon": 4.0, "seed": 0}
    assert build_compendium(EVENTS, CATALOG, "acme", **kw) == build_compendium(EVENTS, CATALOG, "acme", **kw)


def test_the_secret_seed_comes_from_secrets(monkeypatch):
    drawn = []

    def randbits(k):
        drawn.append(k)
        return 12345

    monkeypatch.setattr(builder.secrets, "randbits", randbits)
    art = build_compendium(EVENTS, CATALOG, "acme")
    assert drawn == [63]
    assert art == build_compendium(EVENTS, CATALOG, "acme", seed=12345)


# ------------------------------------------------------------------ 2. unknown tool names are refused


def test_events_naming_tools_the_catalog_does_not_know_are_refused():
    bad = [*EVENTS, Event(query="x", tool="nope", success=True), Event(query="y", tool="Get Weather", success=True)]
    with pytest.raises(ValueError, match=r"2 of 19 events .*'Get Weather', 'nope'.*load_experience\(path, catalog\)"):
        build_compendium(bad, CATALOG, "acme", epsilon=math.inf, seed=0)
    gold = [*EVENTS, Event(query="x", tool="get_weather", success=False, gold="missing_tool")]
    with pytest.raises(ValueError, match=r"1 of 18 events .*'missing_tool'"):
        build_compendium(gold, CATALOG, "acme", epsilon=math.inf, seed=0)
    # a transition from a tool the catalog does not know used to leave no count, without a word
    prev = [*EVENTS, Event(query="x", tool="get_weather", success=True, prev_tool="geocode")]
    with pytest.raises(ValueError, match=r"1 of 18 events .*'geocode'"):
        build_compendium(prev, CATALOG, "acme", epsilon=math.inf, seed=0)


# ------------------------------------------------------------------ 3. an embedder by name


def test_build_takes_an_embedder_by_name(monkeypatch):
    names = []

    def get_embedder(name):
        names.append(name)
        return BagEmbedder()

    monkeypatch.setattr(builder, "get_embedder", get_embedder)
    kw = {"epsilon": math.inf, "seed": 0}
    by_name = build_compendium(EVENTS, CATALOG, "acme", embedder="minilm", **kw)
    assert names == ["minilm"]
    assert by_name == build_compendium(EVENTS, CATALOG, "acme", embedder=BagEmbedder(), **kw)


# ------------------------------------------------------------------ 4. the org id is checked first


@pytest.mark.parametrize(("org", "why"), [("global", "reserved"), ("server", "reserved"), ("bad org!", "use ")])
def test_build_refuses_an_invalid_or_reserved_org(org, why):
    with pytest.raises(ValueError, match=rf"org {org!r} is not a valid organisation id: .*{why}"):
        build_compendium(EVENTS, CATALOG, org, epsilon=math.inf, seed=0)


# ------------------------------------------------------------------ 5. type mistakes at the entry points


@pytest.mark.parametrize("events", [Path("org_a.jsonl"), "org_a.jsonl", [{"query": "x", "tool": "get_weather"}]])
def test_build_refuses_events_that_are_not_events(events):
    with pytest.raises(TypeError, match=r"events must be Event objects \(load a log with load_experience"):
        build_compendium(events, CATALOG, "acme", epsilon=math.inf, seed=0)


@pytest.mark.parametrize(("kw", "message"), [({"epsilon": "4"}, r"epsilon must be a number .*got '4' \(str\)"),
                                             ({"epsilon": True}, r"epsilon must be a number"),
                                             ({"delta": None}, r"delta must be a number .*got None")])
def test_build_refuses_a_budget_that_is_not_a_number(kw, message):
    with pytest.raises(TypeError, match=message):  # numpy's "must be real number, not str" before
        build_compendium(EVENTS, CATALOG, "acme", seed=0, **kw)


def test_build_refuses_a_catalog_path():
    with pytest.raises(TypeError, match=r"catalog must be a Catalog .*got PosixPath"):
        build_compendium(EVENTS, Path("catalog.json"), "acme", epsilon=math.inf, seed=0)


@pytest.mark.parametrize("merger", [merge_typed, merge, merge_flat_majority])
def test_merges_refuse_paths_dicts_and_a_lone_artifact(merger, exact):
    with pytest.raises(TypeError, match=r"must be .*Compendium.* objects .*got PosixPath"):
        merger([Path("a.json"), Path("b.json")])
    with pytest.raises(TypeError, match=r"got dict"):
        merger([exact.model_dump()])
    with pytest.raises(TypeError, match=r"must be a list of .*got Compendium"):
        merger(exact)


def test_router_refuses_paths_and_empty_or_non_string_queries(exact):
    with pytest.raises(TypeError, match=r"compendium must be a Compendium.*got PosixPath"):
        Router(Path("global.json"), CATALOG, embedder=TfidfEmbedder())
    with pytest.raises(TypeError, match=r"catalog must be a Catalog.*got PosixPath"):
        Router(exact, Path("catalog.json"), embedder=TfidfEmbedder())
    router = Router(exact, CATALOG, embedder=TfidfEmbedder())
    for query in (None, ["a", "b"]):
        with pytest.raises(TypeError, match=r"query must be a string, got"):
            router.route(query)
    for query in ("", "   \n"):
        with pytest.raises(ValueError, match=r"query is empty: nothing to route"):
            router.route(query)
    assert router.route("do I need an umbrella").tool == "get_weather"
    # regression: an infinite LLM weight passed, and inf times a zero standardised score is a NaN that argmax picks
    with pytest.raises(ValueError, match=r"llm_weight must be a finite number >= 0, got inf"):
        Router(exact, CATALOG, embedder=TfidfEmbedder(), reranker="llm", llm_weight=math.inf)


# ------------------------------------------------------------------ 6. documented parameters


@pytest.mark.parametrize("fn", [Router.route, merge, load_artifact, save_artifact, encode, load_testset])
def test_public_functions_document_their_parameters(fn):
    doc = inspect.getdoc(fn)
    assert "Parameters\n----------" in doc and "Returns\n-------" in doc
    for name in inspect.signature(fn).parameters:
        if name != "self":
            assert f"{name} :" in doc, f"{fn.__qualname__} does not document {name}"


# ------------------------------------------------------------------ 7. strategy settings


@pytest.mark.parametrize(("kw", "message"), [
    ({"min_nodes": 0}, r"min_nodes must be an integer >= 1, got 0"),
    ({"min_nodes": "2"}, r"min_nodes must be an integer >= 1, got '2'"),
    ({"min_nodes": True}, r"min_nodes must be an integer >= 1, got True"),
    ({"max_bytes": -1}, r"max_bytes must be a positive integer \(bytes, >= 1\), got -1"),
    ({"max_bytes": 0}, r"max_bytes must be a positive integer \(bytes, >= 1\), got 0"),
])
def test_strategies_refuse_impossible_node_counts_and_byte_limits(kw, message):
    with pytest.raises(ValueError, match=message):
        make_strategy("typed", **kw)
    with pytest.raises(ValueError, match=message):
        CompendiumStrategy(merge_typed, "typed", **kw)
    assert make_strategy("typed", min_nodes=1, max_bytes=1).min_nodes == 1
