"""Readable `when` scenarios: public example requests with supports read off the released prototype."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_prototypes import CATALOG, BagEmbedder

from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.catalog import with_examples
from synapse_flwr.core.experience import Event
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.prototypes import decode_prototype, encode_prototype
from synapse_flwr.core.render import SHOWN_REQUESTS, render_typed
from synapse_flwr.core.router import Router
from synapse_flwr.core.scenarios import SUPPORT_SDS, supported_requests

REQUESTS = {
    "get_weather": ["will it snow in the city", "do I need an umbrella for the rain", "weather for my visa trip"],
    "book_hotel": ["a hotel room for one night", "somewhere to stay"],
}
RICH = with_examples(CATALOG, REQUESTS)
UMBRELLA = [Event(query=f"umbrella and rain in town {i}", tool="get_weather", success=True) for i in range(40)]
STAY = [Event(query=f"a room to stay in {i}", tool="book_hotel", success=True) for i in range(40)]


def unit(texts):
    return np.asarray(BagEmbedder().encode(texts), np.float64)


def test_support_is_the_similarity_weighted_count_and_noise_stays_out():
    vectors = unit(REQUESTS["get_weather"])
    # five queries that read exactly like the second request: its support is 5, the others' their cosine x 5
    exact = encode_prototype(5 * vectors[1], 5.0, 0.0, 0.0)
    got = supported_requests(exact, REQUESTS["get_weather"], vectors)
    assert got[0][0] == "do I need an umbrella for the rain"
    assert got[0][1] == pytest.approx(5.0, rel=0.01)
    assert [r for r, _ in got] == [r for r, _ in sorted(got, key=lambda rs: -rs[1])]
    assert supported_requests(exact, REQUESTS["get_weather"], vectors, limit=1) == got[:1]
    # a count inside the noise, or a support below SUPPORT_SDS noise SDs, lists nothing
    quiet = encode_prototype(5 * vectors[1], 5.0, sum_sd=1.0, count_sd=5.0)
    assert supported_requests(quiet, REQUESTS["get_weather"], vectors) == []
    faint = encode_prototype(5 * vectors[1], 50.0, sum_sd=5.0 / SUPPORT_SDS + 0.01, count_sd=1.0)
    assert supported_requests(faint, REQUESTS["get_weather"], vectors) == []
    assert supported_requests(None, REQUESTS["get_weather"], vectors) == []


def test_private_build_lists_supported_requests_at_no_privacy_cost():
    events = UMBRELLA + STAY
    kw = {"epsilon": 4.0, "embedder": BagEmbedder(), "seed": 5}
    plain, rich = build_compendium(events, CATALOG, "acme", **kw), build_compendium(events, RICH, "acme", **kw)
    assert rich.privacy == plain.privacy  # post-processing: the same bound, noise and epsilon
    assert [t.prototype for t in rich.tools] == [t.prototype for t in plain.tools]
    assert not any(t.when for t in plain.tools)  # a private build with prototypes releases no phrases
    weather = rich.tool("get_weather")
    assert weather.when and {s.text for s in weather.when} <= set(REQUESTS["get_weather"])
    best = max(weather.when, key=lambda s: s.support)
    assert best.text == "do I need an umbrella for the rain" and best.orgs == ["acme"]
    assert weather.provenance.orgs == ["acme"]
    # the supports are the projections of the released prototype (exactly what a reader can recompute)
    proto = decode_prototype(weather.prototype)
    for s in weather.when:
        assert s.support == pytest.approx(float(unit([s.text])[0] @ proto), abs=1e-3)
    # a tool whose prototype is noise lists nothing
    assert not rich.tool("visa_rules").when


def test_merged_supports_add_up_like_the_prototypes():
    kw = {"embedder": BagEmbedder(), "seed": 5, "epsilon": math.inf}
    orgs = [build_compendium(UMBRELLA[:20] + STAY, RICH, "a", **kw), build_compendium(UMBRELLA[20:], RICH, "b", **kw)]
    merged = merge_typed(orgs).tool("get_weather")
    proto = decode_prototype(merged.prototype)
    requests = [s for s in merged.when if s.text in REQUESTS["get_weather"]]
    assert len(requests) == len(REQUESTS["get_weather"])
    for s in requests:
        assert s.orgs == ["a", "b"]
        assert s.support == pytest.approx(float(unit([s.text])[0] @ proto), rel=0.02)


def test_requests_change_what_the_llm_reads_not_what_retrieval_scores():
    comp = build_compendium(UMBRELLA + STAY, RICH, "acme", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    bare = comp.model_copy(update={"tools": [t.model_copy(update={"when": [
        s for s in t.when if s.text not in REQUESTS.get(t.tool_id, [])]}) for t in comp.tools]})
    assert any(t.when != b.when for t, b in zip(comp.tools, bare.tools))
    with_req, without = Router(comp, RICH, embedder=BagEmbedder()), Router(bare, RICH, embedder=BagEmbedder())
    queries = ["umbrella for the rain", "a room for the night", "passport and visa"]
    a, b = with_req.evidence(queries), without.evidence(queries)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    weather = with_req.position["get_weather"]
    shown = with_req._shown(weather)
    assert "requests seen in use: do I need an umbrella for the rain" in shown
    # the documentation-only view shows as many public requests, without saying which are used
    docs = Router(None, RICH, embedder=BagEmbedder())._shown(weather)
    assert "requests seen in use" not in docs
    assert sum(r in docs for r in REQUESTS["get_weather"]) == sum(r in shown for r in REQUESTS["get_weather"]) \
        == min(SHOWN_REQUESTS, len(REQUESTS["get_weather"]))


def test_typed_render_shows_used_requests_first_then_fills_with_the_rest():
    exact = build_compendium(UMBRELLA, RICH, "acme", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    entry = merge_typed([exact]).tool("get_weather")
    text = render_typed(entry, examples=REQUESTS["get_weather"])
    requests = [s for s in entry.when if s.text in REQUESTS["get_weather"]]
    used = [s.text for s in sorted(requests, key=lambda s: -s.support)][:SHOWN_REQUESTS]
    assert text.split("\n")[2] == "requests seen in use: " + "; ".join(used)
    shown = sum(text.count(r) for r in REQUESTS["get_weather"])
    assert shown == min(SHOWN_REQUESTS, len(REQUESTS["get_weather"]))
    phrases = next(line for line in text.split("\n") if line.startswith("use when: "))
    assert not any(r in phrases for r in REQUESTS["get_weather"])  # requests are not repeated as phrases
    docs = render_typed(entry.model_copy(update={"when": []}), examples=REQUESTS["get_weather"])
    assert docs.split("\n")[2] == "example requests: " + "; ".join(REQUESTS["get_weather"][:SHOWN_REQUESTS])
    assert sum(r in docs for r in REQUESTS["get_weather"]) == shown
