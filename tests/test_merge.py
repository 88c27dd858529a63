"""Merge policies: determinism, order independence, idempotence, conflicts, robustness."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies_hyp import artifact_lists

from synapse_flwr.core.merge import (
    POLICIES,
    MergeConfig,
    group_scenarios,
    merge,
    merge_flat_majority,
    merge_support_weighted,
    merge_typed,
    rate_conflict,
)
from synapse_flwr.core.phrases import token_jaccard
from synapse_flwr.core.prototypes import decode_prototype, encode_prototype
from synapse_flwr.core.render import parse_flat
from synapse_flwr.core.schema import (
    MAX_CONFLICTS_PER_FIELD,
    MAX_COUNT,
    MAX_SCALE,
    Compendium,
    EmbeddingSpace,
    Issuer,
    Precaution,
    Scenario,
    ToolCount,
    ToolEntry,
    ToolStats,
    WhenNot,
)
from synapse_flwr.core.wire import canonical_json, content_hash

SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(artifact_lists, st.randoms(use_true_random=False), st.sampled_from(sorted(POLICIES)))
def test_any_permutation_gives_identical_bytes(arts, rnd, policy):
    shuffled = list(arts)
    rnd.shuffle(shuffled)
    assert canonical_json(merge(arts, policy)) == canonical_json(merge(shuffled, policy))


@SETTINGS
@given(artifact_lists, st.sampled_from(["typed", "support-weighted", "robust"]))
def test_merging_a_global_again_changes_nothing(arts, policy):
    g = merge(arts, policy)
    assert canonical_json(merge([g], policy)) == canonical_json(g)
    # an artifact the global already contains is not counted twice
    assert canonical_json(merge([g, arts[0]], policy)) == canonical_json(g)


@SETTINGS
@given(artifact_lists)
def test_duplicate_delivery_is_counted_once(arts):
    assert canonical_json(merge_typed(arts + arts)) == canonical_json(merge_typed(arts))
    assert canonical_json(merge_flat_majority(arts + arts)) == canonical_json(
        merge_flat_majority(arts)
    )


@SETTINGS
@given(artifact_lists)
def test_typed_merge_keeps_every_tool_and_sums_calls(arts):
    g = merge_typed(arts)
    assert {t.tool_id for t in g.tools} == {t.tool_id for a in arts for t in a.tools}
    unique = {content_hash(a): a for a in arts}.values()
    for entry in g.tools:
        mine = [t for a in unique for t in a.tools if t.tool_id == entry.tool_id]
        assert abs(entry.stats.calls - sum(t.stats.calls for t in mine)) < 1e-3
        # start transitions and next-tool counts are sums of noised counts too
        assert abs(entry.stats.starts - sum(t.stats.starts for t in mine)) < 1e-3
        for nxt in entry.next_tools:
            expected = sum(c.count for t in mine for c in t.next_tools if c.tool == nxt.tool)
            assert abs(nxt.count - expected) < 1e-3
    assert sorted(g.inputs) == sorted({content_hash(a) for a in arts})
    Compendium.model_validate_json(canonical_json(g))  # output is schema-valid


def _org(org: str, when=(), when_not=(), calls=10.0, successes=9.0) -> Compendium:
    return Compendium(
        issuer=Issuer(org=org, round=1),
        tools=[
            ToolEntry(
                tool_id="convert_currency",
                description="Convert money.",
                when=[Scenario(text=t, support=s, orgs=[org]) for t, s in when],
                when_not=[WhenNot(text=t, support=s, orgs=[org], prefer=p) for t, s, p in when_not],
                stats=ToolStats(calls=calls, successes=successes),
            )
        ],
    )


def test_cross_org_contradiction_is_logged_and_minority_kept_as_precaution():
    a = _org("a", when=[("crypto prices", 12.0)])
    b = _org("b", when_not=[("crypto prices", 4.0, "crypto_ticker")])
    g = merge_typed([a, b])
    (entry,) = g.tools
    assert [s.text for s in entry.when] == ["crypto prices"]
    assert entry.when_not == []
    (conflict,) = g.conflicts
    assert conflict.field == "when" and conflict.subject == "crypto prices"
    assert {c.view for c in conflict.claims} == {"when", "when_not (prefer crypto_ticker)"}
    assert conflict.policy == "typed" and "kept in when" in conflict.resolution
    dissent = [p for p in entry.precautions if p.kind == "dissent"]
    assert len(dissent) == 1 and dissent[0].orgs == ["b"] and "crypto_ticker" in dissent[0].text


def test_majority_when_not_wins_and_tie_is_conservative():
    a = _org("a", when=[("crypto prices", 3.0)])
    b = _org("b", when_not=[("crypto prices", 3.0, None)])
    (entry,) = merge_typed([a, b]).tools
    assert entry.when == [] and [w.text for w in entry.when_not] == ["crypto prices"]


def test_a_stray_outcome_against_a_strong_consensus_is_not_a_conflict():
    a = _org("a", when=[("crypto prices", 40.0)])
    b = _org("b", when_not=[("crypto prices", 2.0, None)])
    g = merge_typed([a, b])
    assert g.conflicts == [] and [w.text for w in g.tools[0].when_not] == ["crypto prices"]


def test_same_org_seeing_both_outcomes_is_not_a_conflict():
    a = _org("a", when=[("crypto prices", 3.0)], when_not=[("crypto prices", 1.0, None)])
    g = merge_typed([a])
    assert g.conflicts == []


def test_incompatible_success_rates_are_a_stats_conflict():
    a = _org("a", calls=100.0, successes=95.0)
    b = _org("b", calls=100.0, successes=95.0)
    c = _org("c", calls=100.0, successes=10.0)
    g = merge_typed([a, b, c])
    stats_conflicts = [k for k in g.conflicts if k.field == "stats"]
    assert len(stats_conflicts) == 1
    (entry,) = g.tools
    outliers = [p for p in entry.precautions if p.kind == "dissent"]
    assert [p.orgs for p in outliers] == [["c"]]


def test_near_identical_scenarios_merge_with_summed_support():
    a = _org("a", when=[("weather forecast", 5.0)])
    b = _org("b", when=[("forecast weather", 3.0)])  # same tokens
    c = _org("c", when=[("hotel booking", 2.0)])
    (entry,) = merge_typed([a, b, c]).tools
    by_text = {s.text: s for s in entry.when}
    assert by_text["weather forecast"].support == 8.0
    assert by_text["weather forecast"].orgs == ["a", "b"]
    assert "forecast weather" in by_text["weather forecast"].variants
    assert by_text["hotel booking"].support == 2.0


def test_support_weighted_caps_a_loud_org():
    quiet = [_org(o, when=[("crypto prices", 4.0)], calls=10, successes=9) for o in "abc"]
    loud = _org("z", when_not=[("crypto prices", 500.0, None)], calls=1000, successes=900)
    typed = merge_typed([*quiet, loud]).tools[0]
    weighted = merge_support_weighted([*quiet, loud]).tools[0]
    # plain typed: the loud org's 500 dwarfs three orgs (no dispute even logged);
    # weighted: capped, the three orgs win the now genuine dispute
    assert typed.when_not[0].support == 500.0 and typed.when[0].support == 12.0
    assert [s.text for s in weighted.when] == ["crypto prices"] and weighted.when_not == []


@pytest.mark.parametrize("factor", [100.0, 10_000.0])
def test_support_weighted_caps_a_loud_org_of_two(factor):
    # the median of two is their mean, which the loud org lifts with itself (it kept 98% of the calls at x100)
    honest = _org("a", calls=10, successes=9)
    loud = _org("z", calls=10 * factor, successes=9 * factor)
    stats = merge_support_weighted([honest, loud]).tools[0].stats
    assert stats.calls <= 20.0 + 1e-6


def test_flat_majority_votes_contradictions_away_without_a_log():
    a = _org("a", when=[("crypto prices", 3.0)])
    b = _org("b", when=[("crypto prices", 1.0)])
    c = _org("c", when_not=[("crypto prices", 9.0, None)])
    flat = merge_flat_majority([a, b, c])
    text = flat.texts["convert_currency"]
    assert "use when: crypto prices" in text and "avoid when: crypto prices" not in text
    decoded = parse_flat("convert_currency", text)
    assert [s.text for s in decoded.when] == ["crypto prices"]
    assert decoded.description == "Convert money."


def test_unknown_policy_is_a_clear_error():
    import pytest

    with pytest.raises(ValueError, match="unknown merge policy"):
        merge([_org("a")], "average")
    with pytest.raises(ValueError, match="nothing to merge"):
        merge_typed([])


def _tool(tool_id: str, org: str, when) -> ToolEntry:
    return ToolEntry(tool_id=tool_id, when=[Scenario(text=t, support=s, orgs=[org]) for t, s in when],
                     stats=ToolStats(calls=20.0, successes=20.0))


def test_a_weak_claim_on_another_tools_scenario_is_demoted_and_logged():
    # org b credits one of the currency requests to the weather tool (a mislabelled log)
    a = Compendium(issuer=Issuer(org="a", round=1),
                   tools=[_tool("convert_currency", "a", [("euro to dollar", 15.0), ("shared phrase", 5.0)])])
    b = Compendium(issuer=Issuer(org="b", round=1),
                   tools=[_tool("get_weather", "b", [("euro to dollar", 2.0), ("shared phrase", 4.0),
                                                     ("rain tomorrow", 9.0)])])
    g = merge_typed([a, b])
    tools = {t.tool_id: t for t in g.tools}
    assert {s.text for s in tools["convert_currency"].when} == {"euro to dollar", "shared phrase"}
    # 2 < 0.2 * 15: demoted; 4 >= 0.2 * 5: genuine ambiguity, both keep it
    assert {s.text for s in tools["get_weather"].when} == {"rain tomorrow", "shared phrase"}
    (conflict,) = [c for c in g.conflicts if c.subject == "euro to dollar"]
    assert conflict.tool_id == "get_weather" and conflict.field == "when"
    assert [c.view for c in conflict.claims] == ["when: convert_currency", "when: get_weather"]
    assert "kept on convert_currency" in conflict.resolution
    (dissent,) = [p for p in tools["get_weather"].precautions if p.kind == "dissent"]
    assert dissent.orgs == ["b"] and "euro to dollar" in dissent.text
    assert len(g.conflicts) == 1


def _reference_groups(items, similarity):
    # the quadratic definition the indexed grouping must reproduce: first group whose text is similar
    groups = []
    for item in sorted(items, key=lambda s: (-s.support, s.text, s.orgs)):
        for g in groups:
            if token_jaccard(item.text, g[0]) >= similarity:
                g[1].append(item)
                break
        else:
            groups.append((item.text, [item]))
    return groups


WORDS = st.sampled_from(["weather", "forecast", "city", "rain", "stock", "price", "!", "euro", "dollar"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(WORDS, min_size=1, max_size=4), st.integers(1, 5)), max_size=40),
       st.sampled_from([0.0, 0.3, 0.5, 0.8, 1.0, 1.5]))
def test_indexed_grouping_equals_the_pairwise_definition(texts, similarity):
    items = [Scenario(text=" ".join(ws), support=float(s)) for ws, s in texts]
    got = [(g.text, g.members) for g in group_scenarios(items, similarity)]
    assert got == _reference_groups(items, similarity)


def test_grouping_within_one_tool_is_near_linear_in_orgs():
    # K orgs x 64 distinct scenarios of one tool (pairs of a 300-word vocabulary): 8x the orgs
    # must cost well under 8^2 = 64x the time (it was quadratic: 0.38 s at K=5, 24 s at K=40)
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(300)]

    def items(k):
        return [Scenario(text=f"{rng.choice(vocab)} {rng.choice(vocab)} o{o}s{j}", support=1.0 + j)
                for o in range(k) for j in range(64)]

    def seconds(k):
        batch = items(k)
        t0 = time.perf_counter()
        group_scenarios(batch, 0.5)
        return time.perf_counter() - t0

    small, large = min(seconds(5) for _ in range(3)), min(seconds(40) for _ in range(3))
    assert large < 24 * max(small, 1e-3), (small, large)


def _contested(org: str, n: int) -> Compendium:
    # n scenarios that this org puts in when and the other in when_not: n conflicts on one tool
    side = [(f"topic{i} item{i}", 10.0 + i) for i in range(n)]
    return _org(org, when=side) if org == "a" else _org(org, when_not=[(t, s, None) for t, s in side])


def test_conflict_log_is_bounded_per_tool_and_field_and_counts_the_rest():
    g = merge_typed([_contested("a", MAX_CONFLICTS_PER_FIELD + 5), _contested("b", MAX_CONFLICTS_PER_FIELD + 5)])
    when = [c for c in g.conflicts if c.field == "when"]
    assert len(when) == MAX_CONFLICTS_PER_FIELD
    assert [(d.tool_id, d.field, d.count) for d in g.conflicts_dropped] == [("convert_currency", "when", 5)]
    # the best-supported are the ones kept
    assert min(max(cl.support for cl in c.claims) for c in when) > 14.0
    Compendium.model_validate_json(canonical_json(g))
    assert canonical_json(merge_typed([g])) == canonical_json(g)  # merging again keeps the count, not twice


def test_merge_refuses_too_many_tools_before_the_work(monkeypatch):
    import synapse_flwr.core.merge as merge_module

    monkeypatch.setattr(merge_module, "MAX_TOOLS", 0)
    with pytest.raises(ValueError, match=r"1 distinct tools, a compendium at most 0"):
        merge_typed([_org("a")])


def _at_the_bound(org: str) -> Compendium:
    """Every count of the entry at the schema's MAX_COUNT, the prototype at the top of its int8 range."""
    return Compendium(issuer=Issuer(org=org, round=1), embedding=EmbeddingSpace(model="test", dim=8), tools=[ToolEntry(
        tool_id="convert_currency",
        when=[Scenario(text="crypto prices", support=MAX_COUNT, orgs=[org])],
        precautions=[Precaution(kind="failure_mode", text="times out", support=MAX_COUNT, orgs=[org])],
        stats=ToolStats(calls=MAX_COUNT, successes=MAX_COUNT, starts=MAX_COUNT),
        confusions=[ToolCount(tool="get_weather", count=MAX_COUNT)],
        next_tools=[ToolCount(tool="get_weather", count=MAX_COUNT)],
        prototype=encode_prototype(np.full(8, 127 * MAX_SCALE), MAX_COUNT, MAX_COUNT, MAX_COUNT))])


@pytest.mark.parametrize("policy", ["typed", "support-weighted", "robust"])
def test_sums_past_the_schemas_bound_saturate_instead_of_failing_the_merge(policy):
    """Two orgs claiming the bound sum past it: the merge clamps every sum at MAX_COUNT, it never raises."""
    g = merge([_at_the_bound("a"), _at_the_bound("b"), _org("c")], policy)
    Compendium.model_validate_json(canonical_json(g))
    (entry,) = g.tools
    counts = [entry.stats.calls, entry.stats.successes, entry.stats.starts, *(s.support for s in entry.when),
              *(p.support for p in entry.precautions), *(t.count for t in (*entry.confusions, *entry.next_tools)),
              entry.prototype.count, entry.prototype.sum_sd, entry.prototype.count_sd]
    assert max(counts) <= MAX_COUNT and entry.prototype.scale <= MAX_SCALE
    x = decode_prototype(entry.prototype)
    assert np.allclose(x, x[0]) and x[0] > 0  # shrunk whole: the direction is kept
    if policy == "typed":  # nothing scaled down: every sum saturates
        assert entry.stats.calls == entry.stats.starts == entry.confusions[0].count == MAX_COUNT
        assert entry.prototype.count == MAX_COUNT and entry.stats.successes <= entry.stats.calls


def test_an_org_s_entries_are_pooled_before_rates_are_compared_across_orgs():
    """Regression (review): with two orgs rated, two entries of one org (its windows) were compared with each
    other: an org whose windows average what the other org sees was logged as a dissent."""
    good, bad = ToolStats(calls=40, successes=40), ToolStats(calls=40, successes=0)
    half = ToolStats(calls=80, successes=40)
    assert rate_conflict("t", [("a", good, 0.0), ("a", bad, 0.0), ("b", half, 0.0)], MergeConfig(), "typed") is None
    conflict, _ = rate_conflict("t", [("a", good, 0.0), ("a", good, 0.0), ("b", bad, 0.0)],
                                MergeConfig(), "typed")
    assert {c.orgs[0] for c in conflict.claims} == {"a", "b"} and len(conflict.claims) == 2
