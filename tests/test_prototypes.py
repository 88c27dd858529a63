"""Query prototypes: sums, noise, int8 round trip, sensitivity, space checks, merge, no-harm routing."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from pydantic import ValidationError
from test_embed import CountingEmbedder

from synapse_flwr.core.builder import BuildConfig, build_compendium
from synapse_flwr.core.catalog import ToolDoc, make_catalog
from synapse_flwr.core.embed import l2_normalize
from synapse_flwr.core.experience import Event
from synapse_flwr.core.explain import decided_by, explain_route
from synapse_flwr.core.fusion import Fusion
from synapse_flwr.core.merge import (
    POLICIES,
    ROBUST,
    SUPPORT_WEIGHTED,
    TYPED,
    merge_typed,
)
from synapse_flwr.core.privacy import PrivacyParams, calibrate
from synapse_flwr.core.prototypes import (
    along_documentation,
    decode_prototype,
    encode_prototype,
    merge_prototypes,
    noise_prototypes,
    noise_pvalue,
    prototype_sensitivity,
    readable,
    signal_energy,
    space_of,
    sum_prototypes,
)
from synapse_flwr.core.release import combine
from synapse_flwr.core.router import (
    Candidate,
    Router,
)
from synapse_flwr.core.schema import Compendium, EmbeddingSpace, Issuer, ToolEntry
from synapse_flwr.core.wire import canonical_json

CATALOG = make_catalog([
    ToolDoc("get_weather", "get_weather", "Weather forecast: rain, snow and temperature for a city."),
    ToolDoc("book_hotel", "book_hotel", "Book a hotel room for given dates."),
    ToolDoc("visa_rules", "visa_rules", "Visa and passport entry requirements for travellers."),
])
WORDS = ["umbrella", "rain", "stay", "room", "night", "visa", "passport", "city", "snow", "hotel"]


class BagEmbedder:
    """A deterministic bag-of-words embedder (no model): name, dim and unit rows."""

    name = "bag-of-words-test"
    dim = len(WORDS)

    def encode(self, texts):
        rows = [[t.lower().count(w) + 0.01 for w in WORDS] for t in texts]
        return l2_normalize(np.array(rows, np.float32))


EVENTS = [
    *(Event(query=f"do I need an umbrella in {c}", tool="get_weather", success=True) for c in "abcdefgh"),
    *(Event(query=f"somewhere to stay in {c} tonight", tool="book_hotel", success=True) for c in "abcdefgh"),
    Event(query="umbrella for tomorrow", tool="book_hotel", success=False, gold="get_weather"),
]


def test_sums_count_labelled_unit_vectors():
    vecs = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]])
    sums, counts = sum_prototypes(["a", None, "a"], vecs, ["a", "b"])
    assert counts.tolist() == [2.0, 0.0]
    assert np.allclose(sums[0], [0.6, 1.8]) and not sums[1].any()


def test_int8_round_trip_is_within_half_a_step():
    rng = np.random.default_rng(0)
    v = rng.normal(0, 5, 384)
    p = encode_prototype(v, 12.0, 1.5, 6.0)
    back = decode_prototype(p)
    assert np.abs(back - v).max() <= p.scale / 2 + 1e-12
    assert len(p.data) == 512  # base64 of 384 bytes


def test_noise_has_sd_sigma_over_c_on_sums_and_sigma_on_counts():
    rng = np.random.default_rng(1)
    sums, counts = np.zeros((200, 384)), np.full(200, 1000.0)
    noised, noised_counts = noise_prototypes(sums, counts, 4.0, 8.0, rng)
    assert abs(noised.std() - 2.0) < 0.05
    assert abs(noised_counts.std() - 8.0) < 1.5


def test_one_record_moves_the_release_by_at_most_the_stated_l2():
    # neighbouring logs differ by one event: the counters it touches (+1 each) and c * u
    config = BuildConfig(prototype_weight=4.0)
    bound = prototype_sensitivity(config.max_contributions, 4.0)
    assert bound == pytest.approx(math.sqrt(config.max_contributions + 1 + 16))
    emb = BagEmbedder()
    u = emb.encode(["do I need an umbrella in x"])[0].astype(np.float64)
    a, _ = sum_prototypes(["get_weather"] * 3, emb.encode(["x"] * 3), ["get_weather"])
    b, _ = sum_prototypes(["get_weather"] * 4, np.vstack([emb.encode(["x"] * 3), u]), ["get_weather"])
    counters = config.max_contributions + 1
    assert math.sqrt(counters + float(np.sum((4.0 * (b - a)) ** 2))) <= bound + 1e-9
    params = PrivacyParams(4.0, 1e-5, 1, config.max_contributions, prototype_weight=4.0)
    assert calibrate(params).sigma == pytest.approx(calibrate(params).noise_multiplier * bound)


def test_prototype_weight_out_of_range_is_a_clear_error():
    with pytest.raises(ValueError, match=r"1 <= prototype_weight <= 100, got 0.5"):
        PrivacyParams(4.0, 1e-5, 1, 12, prototype_weight=0.5)


def test_private_build_with_prototypes_spends_nothing_on_phrases():
    # enough distinct supporting queries for "umbrella" to clear the threshold when phrases are released
    events = [Event(query=f"do I need an umbrella in town {i}", tool="get_weather", success=True) for i in range(300)]
    kw = {"epsilon": 8.0, "embedder": BagEmbedder(), "seed": 3}
    auto = build_compendium(events, CATALOG, "acme", **kw)
    forced = build_compendium(events, CATALOG, "acme", config=BuildConfig(phrases=True), **kw)
    c = auto.privacy.prototype_weight
    assert auto.privacy.clip == pytest.approx(math.sqrt(4 + 1 + c * c), abs=1e-5)
    assert forced.privacy.clip == pytest.approx(math.sqrt(12 + 1 + c * c), abs=1e-5)
    assert auto.privacy.sigma < forced.privacy.sigma  # the freed budget lowers every other field's noise
    assert not any(t.when or t.when_not for t in auto.tools)
    assert any(t.when for t in forced.tools)
    # without privacy, or without prototypes, phrases cost nothing extra and are released
    exact = build_compendium(events, CATALOG, "acme", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    assert any(t.when for t in exact.tools)
    plain = build_compendium(events, CATALOG, "acme", epsilon=8.0, seed=3)
    assert plain.privacy.clip == pytest.approx(math.sqrt(12), abs=1e-5)
    assert BuildConfig().resolved(private=True, prototypes=True).max_contributions == 4
    assert BuildConfig(phrases=False).resolved(private=False, prototypes=False).max_contributions == 4


def test_built_artifact_names_its_space_and_bound():
    comp = build_compendium(EVENTS, CATALOG, "acme", epsilon=4.0, embedder=BagEmbedder(), seed=3)
    assert comp.embedding == EmbeddingSpace(model="bag-of-words-test", dim=len(WORDS))
    assert comp.privacy.prototype_weight == BuildConfig().prototype_weight
    c = comp.privacy.prototype_weight
    # private with prototypes: no phrase counters, so calls, successes, a confusion and a transition
    assert comp.privacy.clip == pytest.approx(math.sqrt(4 + 1 + c * c), abs=1e-5)
    # privately, every catalog tool has a prototype (presence is not revealed)
    assert all(t.prototype is not None for t in comp.tools)
    exact = build_compendium(EVENTS, CATALOG, "acme", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    assert exact.tool("visa_rules").prototype is None
    assert exact.tool("get_weather").prototype.count == 9  # 8 successes + 1 event whose gold it is


def test_wrong_dimension_or_missing_space_is_rejected():
    comp = build_compendium(EVENTS, CATALOG, "acme", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    data = comp.model_dump()
    data["embedding"]["dim"] = 7
    with pytest.raises(ValidationError, match="prototype has 10 dimensions"):
        Compendium.model_validate(data)
    data["embedding"] = None
    with pytest.raises(ValidationError, match="names no embedding space"):
        Compendium.model_validate(data)
    bad = comp.model_dump()
    bad["tools"][0]["prototype"]["scale"] = float("nan")
    with pytest.raises(ValidationError):
        Compendium.model_validate(bad)


def test_merge_sums_prototypes_and_refuses_mixed_spaces():
    a = build_compendium(EVENTS[:8], CATALOG, "a", epsilon=4.0, embedder=BagEmbedder(), seed=1)
    b = build_compendium(EVENTS[8:], CATALOG, "b", epsilon=4.0, embedder=BagEmbedder(), seed=2)
    g = merge_typed([a, b])
    for tool in ("get_weather", "book_hotel", "visa_rules"):
        pa, pb, pg = a.tool(tool).prototype, b.tool(tool).prototype, g.tool(tool).prototype
        assert pg.count == pytest.approx(pa.count + pb.count, abs=1e-3)
        assert pg.sum_sd == pytest.approx(math.hypot(pa.sum_sd, pb.sum_sd), abs=1e-5)
        assert np.abs(decode_prototype(pg) - decode_prototype(pa) - decode_prototype(pb)).max() <= (
            pg.scale / 2 + pa.scale / 2 + pb.scale / 2 + 1e-9)
    other = b.model_copy(update={"embedding": EmbeddingSpace(model="other", dim=len(WORDS))})
    with pytest.raises(ValueError, match="different embedding spaces"):
        merge_typed([a, other])


def test_merged_prototypes_do_not_depend_on_input_order():
    arts = [build_compendium(EVENTS[i::3], CATALOG, f"o{i}", epsilon=4.0, embedder=BagEmbedder(), seed=i)
            for i in range(3)]
    reference = canonical_json(merge_typed(arts))
    for seed in range(5):
        shuffled = list(arts)
        random.Random(seed).shuffle(shuffled)
        assert canonical_json(merge_typed(shuffled)) == reference
    assert merge_prototypes([arts[0].tools[0].prototype]) is not None


def test_disagreeing_prototypes_are_a_prototype_conflict():
    weather = [Event(query=f"umbrella rain {i}", tool="get_weather", success=True) for i in range(20)]
    wrong = [Event(query=f"hotel room night {i}", tool="get_weather", success=True) for i in range(20)]
    a = build_compendium(weather, CATALOG, "a", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    b = build_compendium(wrong, CATALOG, "b", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    clash = [c for c in merge_typed([a, b]).conflicts if c.field == "prototype"]
    assert [c.tool_id for c in clash] == ["get_weather"]
    c_art = build_compendium(weather[:10], CATALOG, "c", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    assert not [c for c in merge_typed([a, c_art]).conflicts if c.field == "prototype"]


def test_one_org_s_own_windows_whose_prototypes_disagree_combine_without_a_conflict():
    """A replaying org's new window may point away from its earlier release: not a disagreement between orgs."""
    weather = [Event(query=f"umbrella rain {i}", tool="get_weather", success=True) for i in range(20)]
    wrong = [Event(query=f"hotel room night {i}", tool="get_weather", success=True) for i in range(20)]
    first = build_compendium(weather, CATALOG, "a", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    window = build_compendium(wrong, CATALOG, "a", round_=2, embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    assert not [c for c in merge_typed([first, window]).conflicts if c.field == "prototype"]
    # the same two releases from two organisations are a disagreement
    other = window.model_copy(update={"issuer": window.issuer.model_copy(update={"org": "b"})})
    assert [c for c in merge_typed([first, other]).conflicts if c.field == "prototype"]
    both = combine(first, window)
    assert both.tool("get_weather").prototype.count == 40


def _router(comp):
    return Router(comp, CATALOG, embedder=BagEmbedder(), reranker="fields")


def test_a_tool_without_experience_keeps_exactly_its_docs_only_score():
    comp = build_compendium(EVENTS, CATALOG, "acme", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    queries = ["passport and visa for japan", "umbrella in rome", "a room to stay"]
    docs, fed = _router(None), _router(comp)
    i = fed.position["visa_rules"]
    assert np.array_equal(docs.retrieve(queries)[:, i], fed.retrieve(queries)[:, i])


def test_noise_level_prototypes_route_exactly_as_docs_only():
    # experienced tools whose prototypes carry nothing above noise
    noisy = [e.model_copy(update={"prototype": encode_prototype(
        np.random.default_rng(i).normal(0, 1.0, len(WORDS)), 1.0, 1.0, 5.0)})
        for i, e in enumerate(ToolEntry(tool_id=d.tool_id, description=d.description) for d in CATALOG.tools)]
    comp = Compendium(kind="global", issuer=Issuer(org="global"), tools=noisy, embedding=space_of(BagEmbedder()))
    queries = ["passport and visa", "will it snow", "book a hotel room", "umbrella"]
    assert [r.to_dict() for r in _router(comp).route_many(queries)] == [
        r.to_dict() for r in _router(None).route_many(queries)]


def test_prototypes_in_another_space_are_ignored_with_a_warning(caplog):
    comp = build_compendium(EVENTS, CATALOG, "acme", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    moved = comp.model_copy(update={"embedding": EmbeddingSpace(model="elsewhere", dim=len(WORDS))})
    with caplog.at_level("WARNING"):
        r = _router(moved)
    assert r.prototypes is None and "ignoring the compendium's query prototypes" in caplog.text


def test_explain_names_the_deciding_field():
    comp = build_compendium(EVENTS, CATALOG, "acme", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    result = _router(comp).route("umbrella umbrella")
    assert result.tool == "get_weather" and result.candidates[0].signals["prototype"] > 0
    text = explain_route(result)
    assert "tool: get_weather" in text and "decided by:" in text and "prototype=" in text


def test_explain_reports_the_count_prior_apart_from_the_query_match():
    comp = build_compendium(EVENTS, CATALOG, "acme", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    r = Router(comp, CATALOG, embedder=BagEmbedder(), reranker="fields", fusion=Fusion(prior=0.5))
    result = r.route("umbrella umbrella")
    top = result.candidates[0]
    scored = r.evidence(["umbrella umbrella"])["prototype"][0, r.position[top.tool_id]]
    assert top.signals["prototype"] > 0
    assert top.signals["prior"] == pytest.approx(0.5 * math.log1p(comp.tool(top.tool_id).prototype.count), rel=1e-5)
    assert top.signals["prototype"] + top.signals["prior"] == pytest.approx(float(scored), rel=1e-5)
    # a route the released count alone decided is not credited to the query's likeness
    ranked = [Candidate("get_weather", 2.0, 2.0, {"prototype": 0.0, "prior": 1.5}), Candidate("visa_rules", 1.0, 1.0)]
    assert decided_by(ranked, "visa_rules") == ["prior"]


def test_explain_names_only_the_fields_without_which_another_tool_wins():
    """Regression (inference review): the prior, above zero for every tool whose prototype is read, was named
    beside the prototype on 18 of the demo's 21 experience-decided routes it did not decide."""
    docs_pick = Candidate("visa_rules", 1.0, 1.0, {"description": 1.0})
    match = [Candidate("get_weather", 1.6, 1.6, {"description": 0.8, "prototype": 0.7, "prior": 0.1}), docs_pick]
    assert decided_by(match, "visa_rules") == ["prototype"]  # without the prior get_weather still wins
    count = [Candidate("get_weather", 1.3, 1.3, {"description": 0.9, "prototype": 0.05, "prior": 0.35}), docs_pick]
    assert decided_by(count, "visa_rules") == ["prior"]
    together = [Candidate("get_weather", 1.2, 1.2, {"description": 0.9, "prototype": 0.15, "prior": 0.15}), docs_pick]
    assert decided_by(together, "visa_rules") == ["prototype", "prior"]  # neither alone: both decided


def test_experience_is_silent_when_the_docs_choice_has_none():
    comp = build_compendium(EVENTS, CATALOG, "acme", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    fed, docs = _router(comp), _router(None)
    new_kind = "passport visa and an umbrella"  # documentation points at visa_rules, which has no experience
    assert docs.route(new_kind).tool == "visa_rules"
    assert fed.evidence([new_kind])["prototype"].max() == 0
    assert [(c.tool_id, c.retrieval) for c in fed.route(new_kind).candidates] == [
        (c.tool_id, c.retrieval) for c in docs.route(new_kind).candidates]
    # where the documentation already points at an experienced tool, its prototype adds evidence
    known_kind = "umbrella and rain"
    assert docs.route(known_kind).tool == "get_weather"
    assert fed.evidence([known_kind])["prototype"][0, fed.position["get_weather"]] > 0


def test_the_share_of_queries_reading_no_prototype_is_the_closed_gate_s():
    """What ``synapse experiment`` reports beside each compendium arm (a catalog mostly without experience leaves
    most seen queries to the documentation; the line says so instead of leaving a small gain unexplained)."""
    comp = build_compendium(EVENTS, CATALOG, "acme", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    fed, docs = _router(comp), _router(None)
    assert fed.prototypes_read().tolist() == [t != "visa_rules" for t in fed.tool_ids]
    queries = ["passport visa and an umbrella", "umbrella and rain", "a room to stay tonight", "visa for japan"]
    assert [docs.route(q).tool for q in queries] == ["visa_rules", "get_weather", "book_hotel", "visa_rules"]
    assert fed.docs_gated_share(queries, batch=3) == 0.5  # the two whose documentation-best tool is visa_rules
    assert docs.docs_gated_share(queries) == 1.0 and fed.docs_gated_share([]) == 0.0
    silent = Router(comp, CATALOG, embedder=BagEmbedder(), fusion=Fusion(prototype=0.0, prior=0.0))
    assert silent.fusion.docs_only and silent.docs_gated_share(queries) == 1.0


def test_the_flat_render_reads_no_prototype_and_shows_the_llm_its_strings():
    """Regression: a typed compendium rendered flat loaded its prototypes against the flat entries, which carry
    none, so every tool read as without experience: retrieval weighed the flat strings as a prototype router does,
    and an LLM reranker was shown the documentation alone, never the flat arm's strings (issue 11's typed minus
    flat compared typed fields with documentation)."""
    from synapse_flwr.core.router import SCENARIO_WEIGHTS

    comp = build_compendium(EVENTS, CATALOG, "acme", embedder=BagEmbedder(), epsilon=math.inf, seed=0)
    flat = Router(comp, CATALOG, embedder=BagEmbedder(), render="flat")
    assert flat.prototypes is None and flat.weights == SCENARIO_WEIGHTS
    assert flat.experience_read(np.zeros(len(flat.tool_ids)), [0, 1, 2]) == {0, 1, 2}
    hotel = flat.position["book_hotel"]
    assert flat._shown(hotel) == flat._shown(hotel, True) and "calls" in flat._shown(hotel)
    assert "calls" not in flat._shown(hotel, False)  # what docs_only shows
    assert Router(comp, CATALOG, embedder=BagEmbedder()).prototypes is not None  # typed: read as before


def test_the_llm_reads_experience_only_where_the_prototype_gate_counts_it(monkeypatch):
    shown: list[tuple[str, str]] = []

    def record(model, pairs):
        shown.extend(pairs)
        return [0.0] * len(pairs)

    monkeypatch.setattr("synapse_flwr.core.llm.channel_scores", record)
    comp = build_compendium(EVENTS, CATALOG, "acme", embedder=BagEmbedder(), epsilon=math.inf, seed=0)

    def prompts(compendium, query):
        shown.clear()
        Router(compendium, CATALOG, embedder=BagEmbedder(), reranker="llm", k=3,
               model="local/smollm2").route(query)
        return sorted(shown)

    # documentation points at visa_rules, which has no experience: the LLM sees what docs_only shows
    new_kind = "passport visa and an umbrella"
    assert prompts(comp, new_kind) == prompts(None, new_kind)
    # where the gate is open, the experienced tool's entry carries its experience
    fed, docs = prompts(comp, "umbrella and rain"), prompts(None, "umbrella and rain")
    weather = [p for p, _ in fed if p.startswith("tool: get_weather")]
    assert weather and "success rate" in weather[0] and weather != [p for p, _ in docs if "get_weather" in p]
    # a candidate shown without its experience reads as docs_only shows it, in either render
    for render in ("typed", "flat"):
        fed_router = Router(comp, CATALOG, embedder=BagEmbedder(), render=render)
        docs_router = Router(None, CATALOG, embedder=BagEmbedder(), render=render)
        assert all(fed_router._shown(i, experience=False) == docs_router._shown(i) for i in range(len(CATALOG)))


def test_noise_alone_rarely_passes_the_gate_even_over_a_large_catalog():
    rng = np.random.default_rng(3)
    n, dim, sd = 3000, 384, 1.3
    # counts well above their noise, so the length test alone holds noise back here
    noise = [encode_prototype(rng.normal(0, sd, dim), 100.0, sd, 10.5) for _ in range(n)]
    # a fixed 3-SD rule on |x|^2 lets about 0.23% of pure noise through: several tools here
    assert sum(signal_energy(p)[0] > 3 * signal_energy(p)[1] for p in noise) >= 3
    pvalues = np.array([noise_pvalue(p) for p in noise])
    assert 0.45 < pvalues.mean() < 0.55  # uniform under noise alone
    assert (pvalues <= Fusion().gate_alpha / n).sum() == 0
    # a tool with real experience (60 queries near one direction) clears it by far
    direction = l2_normalize(rng.normal(size=(1, dim)))[0]
    real = encode_prototype(60 * 0.6 * direction + rng.normal(0, sd, dim), 60.0, sd, 10.5)
    assert noise_pvalue(real) < 1e-12 and noise_pvalue(encode_prototype(np.ones(4), 1.0, 0.0, 0.0)) == 0.0
    # readable() is that gate over a catalog: Bonferroni over the noised prototypes
    assert readable([*noise, real, None], Fusion().gate_alpha) == [False] * n + [True, False]
    exact = [encode_prototype(np.ones(4), 1.0, 0.0, 0.0), encode_prototype(np.zeros(4), 0.0, 0.0, 0.0)]
    assert readable(exact, 0.05) == [True, False]  # without noise: any non-zero sum


@pytest.mark.parametrize("policy", [TYPED, SUPPORT_WEIGHTED, ROBUST])
def test_merged_noise_alone_keeps_the_gate_s_level_under_every_typed_policy(policy):
    """The length test's level holds for a merged sum only if the merge's weights do not read the noise.

    Five private organisations use 20 of 400 tools; the other 380 carry noise-only
    prototypes, whose merged p-values must stay uniform. Weights read off each sum's
    own length (tuning/unshipped.md 28) fail this: mean p 0.24, 8% below 0.01.
    """
    catalog = make_catalog([ToolDoc(f"t{i}", f"t{i}", f"tool number {i}") for i in range(400)])
    arts = [build_compendium([Event(query=f"org {k} request {j}", tool=f"t{j % 20}", success=True)
                              for j in range(200)], catalog, f"o{k}", epsilon=4.0, delta=1e-5, rounds=1,
                             seed=k + 1, embedder=CountingEmbedder()) for k in range(5)]
    merged = POLICIES[policy](arts)
    p = np.array([noise_pvalue(e.prototype) for e in merged.tools if int(e.tool_id[1:]) >= 20])
    assert len(p) == 380 and 0.45 < p.mean() < 0.57 and (p < 0.01).mean() <= 0.03


def test_the_gate_also_asks_the_released_count_to_clear_its_noise():
    rng = np.random.default_rng(4)
    dim, sd, count_sd = 384, 1.3, 10.5
    direction = l2_normalize(rng.normal(size=(1, dim)))[0]
    long_sum = 60 * 0.6 * direction + rng.normal(0, sd, dim)
    # a sum far above its noise with a count within one count SD (the count's noise is drawn apart): not read
    proto = {n: encode_prototype(long_sum, n, sd, count_sd) for n in (5.0, 11.0)}
    gate = Fusion()
    assert gate.gate_count_sds == 1.0
    assert readable([proto[5.0], proto[11.0]], gate.gate_alpha, gate.gate_count_sds) == [False, True]
    assert readable([proto[5.0]], gate.gate_alpha, 0.0) == [True]
    # noise alone clears the count test about as often as N(0, 1) exceeds 1 (0.159): it divides the false passes
    counts = np.maximum(rng.normal(0, count_sd, 4000), 0.0)
    passed = np.mean([readable([encode_prototype(long_sum, c, sd, count_sd)], 1.0, 1.0)[0] for c in counts])
    assert 0.13 < passed < 0.19
    with pytest.raises(ValueError, match="gate_count_sds"):
        Fusion(gate_count_sds=-1.0)


def test_the_gate_asks_a_noised_prototype_to_point_along_its_documentation():
    rng = np.random.default_rng(5)
    n, dim, sd = 4000, 384, 1.3
    docs = l2_normalize(rng.normal(size=(n, dim)))
    # noise alone: the projection on a fixed public vector is N(0, sd^2), so 2 SDs pass about 2.3% of tools
    noise = [encode_prototype(rng.normal(0, sd, dim), 100.0, sd, 10.5) for _ in range(n)]
    assert 0.015 < np.mean(along_documentation(noise, docs, 2.0)) < 0.032
    # ... even among the noise-only sums long enough to pass the length test (about 1.2x the variance there)
    long_noise = [encode_prototype(x * math.sqrt(1.3), 100.0, sd, 10.5) for x in rng.normal(0, sd, (n, dim))]
    assert 0.03 < np.mean(along_documentation(long_noise, docs, 2.0)) < 0.06
    # a tool's real queries point along its documentation: read; the same sum beside another tool's is not
    real = encode_prototype(40 * (0.5 * docs[0] + 0.5 * docs[1]) + rng.normal(0, sd, dim), 40.0, sd, 10.5)
    assert along_documentation([real, real, real], docs[[0, 1, 2]], 2.0) == [True, True, False]
    exact = encode_prototype(-docs[2], 1.0, 0.0, 0.0)  # without noise every prototype passes, as with no test
    assert along_documentation([exact, real, None], docs[[0, 2, 3]], None) == [True, True, False]
    assert along_documentation([exact], docs[[0]], 2.0) == [True]
    with pytest.raises(ValueError):
        along_documentation([real], docs[[0, 1]], 2.0)
    # the router applies it through gate_reads: a sum only as long as a marginal noise pass (p = 0.005 against
    # the level 0.05 / 3) is read along its tool's documentation, not against it, unless far longer (p < 1e-9)
    def catalog_with(hotel_sign: float, energy: float) -> Compendium:
        hotel = hotel_sign * math.sqrt(energy) * BagEmbedder().encode([CATALOG.get("book_hotel").description])[0]
        entries = [ToolEntry(tool_id=d.tool_id, description=d.description, prototype=encode_prototype(
            hotel if d.tool_id == "book_hotel" else 6.0 * BagEmbedder().encode([d.description])[0], 8.0,
            1.0 if d.tool_id == "book_hotel" else 0.1, 0.5)) for d in CATALOG.tools]
        return Compendium(kind="global", issuer=Issuer(org="global"), tools=entries, embedding=space_of(BagEmbedder()))

    from scipy.stats import chi2

    marginal, clear = chi2.isf(0.005, len(WORDS)), chi2.isf(1e-9, len(WORDS))
    assert Fusion().gate_doc_sds == 2.0
    for sign, energy, read in ((1.0, marginal, True), (-1.0, marginal, False), (-1.0, clear, True)):
        router = _router(catalog_with(sign, energy))
        gains = router.prototypes[1]
        assert (gains[router.position["book_hotel"]] > 0) == read, (sign, energy)
        assert all(g > 0 for i, g in enumerate(gains) if i != router.position["book_hotel"])
    router = _router(catalog_with(-1.0, marginal))
    router.set_fusion(Fusion(gate_doc_sds=None))
    assert router.prototypes[1][router.position["book_hotel"]] > 0
    with pytest.raises(ValueError, match="gate_doc_sds"):
        Fusion(gate_doc_sds=-1.0)
