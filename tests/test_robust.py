"""The robust merge policy: bounded per-org influence, lone claims cannot displace several orgs' claims."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import RecordDict
from hostile.signatures import reply
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies_hyp import org_artifacts
from synapse_flwr.strategies import RobustStrategy, make_strategy
from synapse_flwr.strategies.records import from_record, to_record

from synapse_flwr.core import budget
from synapse_flwr.core.influence import (
    clip_tool_influence,
    prototype_mass,
    scale_compendium,
    tool_mass,
)
from synapse_flwr.core.merge import ROBUST, merge_robust, merge_typed
from synapse_flwr.core.prototypes import decode_prototype, encode_prototype
from synapse_flwr.core.schema import (
    MAX_COUNT,
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
from synapse_flwr.core.wire import canonical_json, decode, encode, json_values

SETTINGS = settings(max_examples=40, deadline=None)
louder = st.sampled_from([10.0, 1e3])
distinct_orgs = st.lists(st.sampled_from(["org0", "org1", "org2", "org3"]), min_size=3, max_size=4, unique=True)


@st.composite
def federations(draw) -> list[Compendium]:
    """Three or four artifacts of distinct orgs (the first is the one that gets loud)."""
    return [draw(org_artifacts(org)) for org in draw(distinct_orgs)]


def _loud(art: Compendium, others: list[Compendium], factor: float) -> Compendium:
    # loud enough to exceed every cap: factor x the whole federation's mass
    total = math.fsum(tool_mass(e) for c in others for e in c.tools) + 1.0
    mass = math.fsum(tool_mass(e) for e in art.tools)
    return scale_compendium(art, factor * total / mass) if mass > 0 else art


def _calls(g: Compendium) -> dict[str, float]:
    return {e.tool_id: e.stats.calls for e in g.tools}


@settings(max_examples=20, deadline=None)
@given(federations(), st.randoms(use_true_random=False))
def test_a_louder_poisoner_gains_nothing(arts, rnd):
    """Per-org influence is bounded: 10x or 1,000x the federation's mass gives the same merged counts."""
    first, *others = arts
    # the caps are medians: they need at least two other orgs with something to say
    assume(sum(math.fsum(tool_mass(e) for e in c.tools) > 0 for c in others) >= 2)
    merged = []
    for factor in (10.0, 1e3):
        shuffled = [_loud(first, others, factor), *others]
        rnd.shuffle(shuffled)
        merged.append(_calls(merge_robust(shuffled)))
    assert merged[0].keys() == merged[1].keys()
    for tool, calls in merged[0].items():
        assert math.isclose(calls, merged[1][tool], rel_tol=1e-3, abs_tol=1e-2), (tool, calls, merged[1][tool])


@SETTINGS
@given(federations(), louder, st.floats(1.0, 3.0))
def test_no_org_carries_more_than_its_share_of_a_tool(arts, factor, share):
    first, *others = arts
    inputs = [_loud(first, others, factor), *others]
    holders = {t: sorted(tool_mass(e) for c in inputs for e in c.tools if e.tool_id == t and tool_mass(e) > 0)
               for t in {e.tool_id for c in inputs for e in c.tools}}
    for before, after in zip(inputs, clip_tool_influence(inputs, share, sds=3.0)):
        for b, a in zip(before.tools, after.tools):
            masses = holders[b.tool_id]
            if len(masses) < 2:
                assert a == b  # nobody to compare with: left alone
                continue
            cap = share * masses[(len(masses) - 1) // 2]  # the lower median
            assert tool_mass(a) <= cap * (1 + 1e-3) + 1e-3
            assert tool_mass(a) <= tool_mass(b) + 1e-3  # never scaled up


def _org(org: str, tool: str = "convert_currency", when=(), when_not=(), calls=10.0) -> Compendium:
    return Compendium(issuer=Issuer(org=org, round=1), tools=[ToolEntry(
        tool_id=tool,
        when=[Scenario(text=t, support=s, orgs=[org]) for t, s in when],
        when_not=[WhenNot(text=t, support=s, orgs=[org]) for t, s in when_not],
        stats=ToolStats(calls=calls, successes=calls))])


@SETTINGS
@given(st.floats(2.0, 50.0), st.floats(2.0, 50.0), st.floats(3.0, 1e9), st.randoms(use_true_random=False))
def test_a_lone_when_not_cannot_displace_a_when_of_several_orgs(a, b, loud, rnd):
    arts = [_org("a", when=[("crypto prices", a)]), _org("b", when=[("crypto prices", b)]),
            _org("z", when_not=[("crypto prices", loud)])]
    rnd.shuffle(arts)
    g = merge_robust(arts)
    (entry,) = g.tools
    assert [(s.text, s.orgs) for s in entry.when] == [("crypto prices", ["a", "b"])] and entry.when_not == []
    (conflict,) = g.conflicts
    assert conflict.policy == ROBUST and conflict.field == "when" and ["z"] in [c.orgs for c in conflict.claims]
    assert "backing orgs (2 vs 1" in conflict.resolution
    assert [p.orgs for p in entry.precautions if p.kind == "dissent"] == [["z"]]


def test_typed_lets_the_same_lone_claim_through_unlogged():
    """The contrast: typed keeps the loud lone when_not beside the when and logs nothing."""
    arts = [_org("a", when=[("crypto prices", 3.0)]), _org("b", when=[("crypto prices", 3.0)]),
            _org("z", when_not=[("crypto prices", 500.0)])]
    g = merge_typed(arts)
    assert g.conflicts == [] and [w.text for w in g.tools[0].when_not] == ["crypto prices"]


@SETTINGS
@given(st.floats(1.0, 1e9), st.randoms(use_true_random=False))
def test_a_lone_claim_on_another_tool_cannot_take_a_scenario_from_several_orgs(loud, rnd):
    arts = [_org("a", when=[("euro to dollar", 2.0)]), _org("b", when=[("euro to dollar", 2.0)]),
            _org("z", tool="get_weather", when=[("euro to dollar", loud)])]
    rnd.shuffle(arts)
    g = merge_robust(arts)
    tools = {t.tool_id: t for t in g.tools}
    assert [s.text for s in tools["convert_currency"].when] == ["euro to dollar"]
    assert tools["get_weather"].when == []
    (conflict,) = g.conflicts
    assert conflict.tool_id == "get_weather" and "kept on convert_currency" in conflict.resolution
    assert [p.orgs for p in tools["get_weather"].precautions if p.kind == "dissent"] == [["z"]]


SPACE = EmbeddingSpace(model="test", dim=8)


def _proto_org(org: str, direction: np.ndarray, count: float) -> Compendium:
    p = encode_prototype(0.8 * count * direction, count, 0.0, 0.0)
    return Compendium(issuer=Issuer(org=org, round=1), embedding=SPACE, tools=[ToolEntry(
        tool_id="get_weather", stats=ToolStats(calls=count, successes=count), prototype=p)])


def _cos(x: np.ndarray, y: np.ndarray) -> float:
    return float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))


@SETTINGS
@given(st.integers(2, 4), st.floats(1.0, 1e6), st.randoms(use_true_random=False))
def test_a_lone_prototype_pointing_elsewhere_is_left_out_and_logged(honest, loud, rnd):
    d, e = np.eye(8)[0], np.eye(8)[1]
    arts = [_proto_org(f"h{i}", d + 0.1 * i * e, 20.0) for i in range(honest)] + [_proto_org("z", e, loud)]
    rnd.shuffle(arts)
    g = merge_robust(arts)
    assert _cos(decode_prototype(g.tools[0].prototype), d) > 0.95
    lone = [c for c in g.conflicts if c.field == "prototype" and "left out" in c.resolution]
    assert len(lone) == 1 and lone[0].claims[0].orgs == ["z"]


@pytest.mark.parametrize("org", ["pick", "Select", "only", "must"])
def test_a_lone_dissenter_named_like_a_routing_verb_leaves_a_valid_global(org):
    def art(name: str, dissent: bool) -> Compendium:
        # agrees with the others on three tools (so it is not left out as a whole), points away on the fourth
        dirs = [np.eye(8)[7 if dissent and i == 0 else i] for i in range(4)]
        return Compendium(issuer=Issuer(org=name, round=1), embedding=SPACE, tools=[ToolEntry(
            tool_id=f"t{i}", stats=ToolStats(calls=20.0, successes=20.0),
            prototype=encode_prototype(16.0 * v, 20.0, 0.0, 0.0)) for i, v in enumerate(dirs)])

    g = merge_robust([art("h0", False), art("h1", False), art(org, True)])
    (lone,) = [c for c in g.conflicts if c.field == "prototype"]
    assert lone.tool_id == "t0" and lone.claims[0].orgs == [org]
    assert decode(encode(g)) == g  # the merge's own text passes every reader's check


def test_typed_lets_a_loud_lone_prototype_turn_the_direction():
    d, e = np.eye(8)[0], np.eye(8)[1]
    arts = [_proto_org(f"h{i}", d, 20.0) for i in range(3)] + [_proto_org("z", e, 1000.0)]
    assert _cos(decode_prototype(merge_typed(arts).tools[0].prototype), d) < 0.5


def test_two_orgs_that_disagree_are_both_kept():
    """One against one: no side is backed by several, so nothing is left out."""
    d, e = np.eye(8)[0], np.eye(8)[1]
    g = merge_robust([_proto_org("a", d, 20.0), _proto_org("b", e, 20.0)])
    assert g.tools[0].prototype.count == 40.0
    assert not any("left out" in c.resolution for c in g.conflicts)


def test_clean_agreeing_orgs_merge_as_typed():
    arts = [_org(o, when=[("crypto prices", 4.0)]) for o in "abc"]
    assert canonical_json(merge_robust(arts)) == canonical_json(merge_typed(arts)).replace(b'"typed"', b'"robust"')


def test_the_robust_strategy_merges_a_round_without_the_loud_org_taking_over():
    strategy = make_strategy(ROBUST, min_nodes=3)
    assert isinstance(strategy, RobustStrategy)
    arts = [_org("a", when=[("crypto prices", 3.0)]), _org("b", when=[("crypto prices", 3.0)]),
            _org("z", when_not=[("crypto prices", 900.0)], calls=50.0)]
    replies = [reply(i + 1, RecordDict({"artifact": to_record(encode(a))})) for i, a in enumerate(arts)]
    record, metrics = strategy.aggregate_train(1, replies)
    g = decode(from_record(record))
    assert g.policy == ROBUST and metrics["accepted"] == 3 and metrics["conflicts"] == 1
    assert [s.text for s in g.tools[0].when] == ["crypto prices"] and g.tools[0].when_not == []
    assert g.tools[0].stats.calls <= 3 * 10.0  # the loud org's 50 calls scaled with its 900 support


def _noisy_federation(poisoned: bool, tools: int = 40, dim: int = 16) -> list[Compendium]:
    """Four orgs, every tool's prototype under heavy noise; org ``z`` shifts every tool's queries onto the next."""
    rng = np.random.default_rng(5)
    dirs = rng.normal(size=(tools, dim))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    sd, space = 1.0, EmbeddingSpace(model="test", dim=dim)
    arts = []
    for org in ("a", "b", "c", "z"):
        shift = 1 if poisoned and org == "z" else 0
        entries = [ToolEntry(tool_id=f"tool{t:02d}", stats=ToolStats(calls=6.0, successes=6.0),
                             prototype=encode_prototype(6.0 * dirs[(t + shift) % tools] + rng.normal(0, sd, dim),
                                                        6.0, sd, 10.0)) for t in range(tools)]
        arts.append(Compendium(issuer=Issuer(org=org, round=1), embedding=space, tools=entries))
    return arts


def test_a_poisoner_hidden_by_noise_tool_by_tool_is_found_pooled_over_tools():
    # counts of 6 under a count noise SD of 10: no single tool's prototypes can be compared
    g = merge_robust(_noisy_federation(poisoned=True))
    pooled = [c for c in g.conflicts if "left out every prototype of z" in c.resolution]
    assert len(pooled) == 40 and all(c.claims[0].orgs == ["z"] for c in pooled)
    assert not any("left out every prototype" in c.resolution for c in merge_robust(_noisy_federation(False)).conflicts)


def _counted_org(org: str, loud: str | None = None, n: float = 3.0, tool: str = "convert_currency") -> Compendium:
    """10 calls, 1 start, ``n`` confusions, next tools and precaution support; ``loud`` names one set to 1e9."""
    big = {loud: 1e9} if loud else {}
    return Compendium(issuer=Issuer(org=org, round=1), tools=[ToolEntry(
        tool_id=tool, stats=ToolStats(calls=10.0, successes=5.0, starts=big.get("starts", 1.0)),
        confusions=[ToolCount(tool="get_weather", count=big.get("confusions", n))],
        next_tools=[ToolCount(tool="get_weather", count=big.get("next_tools", n))],
        precautions=[Precaution(kind="failure_mode", text="times out", support=big.get("precautions", n),
                                orgs=[org])])])


def _counts(e: ToolEntry) -> dict[str, float]:
    return {"starts": e.stats.starts, "confusions": e.confusions[0].count, "next_tools": e.next_tools[0].count,
            "precautions": e.precautions[0].support}


@pytest.mark.parametrize("loud", ["starts", "confusions", "next_tools", "precautions"])
def test_a_loud_count_of_any_kind_moves_the_merged_one_by_at_most_its_share(loud):
    """calls=10 but one other count at 1e9: that count is capped like calls (tool_share x the median holder)."""
    honest = [_counted_org(o, n=n) for o, n in (("a", 3.0), ("b", 2.0), ("c", 4.0))]
    merged = _counts(merge_robust([*honest, _counted_org("z", loud)]).tools[0])
    alone = {k: math.fsum(_counts(c.tools[0])[k] for c in honest) for k in merged}
    # z's mass on the tool is capped at 2 x the median holder's (10 calls): it adds at most 20 to any count
    # (the honest orgs are only ever scaled down)
    assert merged[loud] <= alone[loud] + 2 * 10.0 + 1e-3, merged


def test_a_loud_count_on_a_tool_only_it_holds_is_capped_with_the_org():
    """No one to compare a tool with: the cap on the org's whole mass counts its confusions too."""
    arts = [_counted_org(o) for o in "abc"] + [_counted_org("z", "confusions", tool="get_weather")]
    (entry,) = [e for e in merge_robust(arts).tools if e.tool_id == "get_weather"]
    # the median org's whole mass: 10 calls + 1 start + 3 x 3 (confusions, next tools, precaution)
    assert entry.confusions[0].count <= 20.0


def test_a_count_at_the_schemas_bound_does_not_fail_the_robust_merge():
    arts = [_counted_org("a"), _counted_org("b"), _counted_org("z")]
    arts[2] = arts[2].model_copy(update={"tools": [arts[2].tools[0].model_copy(
        update={"confusions": [ToolCount(tool="get_weather", count=MAX_COUNT)]})]})
    g = merge_robust(arts)
    assert g.tools[0].confusions[0].count <= 3.0 + 3.0 + 2 * 10.0 + 1e-3


def _dissenting_federation(tools: int = 20) -> list[Compendium]:
    """Four orgs, ``z``'s prototypes pointing the other way on every tool: its prototypes are all left out."""
    space = EmbeddingSpace(model="test", dim=4)
    return [Compendium(issuer=Issuer(org=o, round=1), embedding=space, tools=[ToolEntry(
        tool_id=f"tool{t:02d}", stats=ToolStats(calls=10.0, successes=10.0),
        prototype=encode_prototype(np.array([-9.0 if o == "z" else 9.0, 1.0, 0.0, 0.0]), 10.0, 0.0, 0.0))
        for t in range(tools)]) for o in "abcz"]


def test_the_pooled_dissenters_conflicts_fit_the_wires_budget(monkeypatch):
    """A global just within the budget before the pooled dissenter's conflicts still fits with them."""
    arts = _dissenting_federation()
    g = merge_robust(arts)
    pooled = [c for c in g.conflicts if "left out every prototype of z" in c.resolution]
    assert len(pooled) == 20
    # the budget: what the global holds without those conflicts, and half the room they take
    without = json_values(canonical_json(g.model_copy(update={"conflicts": [c for c in g.conflicts
                                                                            if c not in pooled]})))
    limit = without + (json_values(canonical_json(g)) - without) // 2
    monkeypatch.setattr(budget, "budget_problems", lambda raw, tools: [] if json_values(raw) <= limit else ["over"])
    fitted = merge_robust(arts)
    assert json_values(canonical_json(fitted)) <= limit
    assert len(fitted.conflicts) < len(pooled) and fitted.conflicts_dropped  # trimmed, and counted as dropped


def test_a_short_count_cannot_carry_a_long_prototype_past_the_cap():
    """count=1 with a count SD of 70 passes the edge with a sum 400 long: the cap reads the length too."""
    rng = np.random.default_rng(0)
    dirs = rng.normal(size=(40, 8))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    space = EmbeddingSpace(model="test", dim=8)

    def org(name: str) -> Compendium:
        return Compendium(issuer=Issuer(org=name, round=1), embedding=space, tools=[ToolEntry(
            tool_id=f"tool{t:02d}", stats=ToolStats(calls=100.0, successes=90.0),
            prototype=encode_prototype(95.0 * d, 100.0, 0.0, 0.0)) for t, d in enumerate(dirs)])

    z = org("z")
    flipped = ToolEntry(tool_id="tool00", stats=ToolStats(calls=1.0, successes=1.0),
                        prototype=encode_prototype(-400.0 * dirs[0], 1.0, 0.0, 70.0))
    z = z.model_copy(update={"tools": [flipped, *z.tools[1:]]})
    decode(encode(z))  # accepted at the edge
    g = merge_robust([org("a"), org("b"), org("c"), z])
    assert not any("left out every prototype" in c.resolution for c in g.conflicts)  # per tool, not pooled
    assert _cos(decode_prototype(g.tools[0].prototype), dirs[0]) > 0.9  # was -1.0: the 400 outweighed 3 x 95
    assert tool_mass(flipped) > 390.0


def test_noise_alone_hardly_lifts_an_honest_orgs_mass():
    """A noised sum of n unit vectors: its mass stays within a few noise SDs of n, and noise alone rarely has any."""
    rng = np.random.default_rng(1)
    dim, sd = 384, 2.0
    for n in (0.0, 5.0, 50.0, 500.0):
        masses = []
        for _ in range(200):
            u = rng.normal(size=dim)
            p = encode_prototype(n * u / np.linalg.norm(u) + rng.normal(0.0, sd, dim), n, sd, sd)
            masses.append(prototype_mass(p))
        assert max(masses) <= n + 5 * sd, (n, max(masses))
        if n == 0:
            assert sum(m > 0 for m in masses) <= 4  # at most 2% of pure-noise prototypes carry any mass


def test_a_scaled_entry_never_has_more_successes_than_calls():
    """Regression (merge review): calls and successes within the schema's tolerance of each other, rounded apart
    after scaling, gave successes > calls, and the support-weighted and robust merges raised."""
    from synapse_flwr.core.influence import scale_entry
    from synapse_flwr.core.schema import ToolEntry, ToolStats

    factor = 0.8146
    calls = 0.00025 / factor - 5e-10  # scaled: just below a rounding boundary, its successes just above it
    entry = ToolEntry(tool_id="t", stats=ToolStats(calls=calls, successes=calls + 1e-9))
    scaled = scale_entry(entry, factor)
    assert scaled.stats.successes <= scaled.stats.calls
