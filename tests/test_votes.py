"""Fusion votes: leave-one-out votes under DP choose how much the router trusts experience."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_prototypes import CATALOG, BagEmbedder

from synapse_flwr.core import votes
from synapse_flwr.core.builder import (
    BuildConfig,
    artifact_vote_noise,
    build_compendium,
    vote_noise,
)
from synapse_flwr.core.embed import get_embedder
from synapse_flwr.core.experience import Event
from synapse_flwr.core.fusion import EMBEDDER_FUSIONS, Fusion, voted_fusion
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.pii import mask_pii
from synapse_flwr.core.privacy import (
    PrivacyParams,
    calibrate,
    epsilon_spent,
    gaussian_epsilon,
)
from synapse_flwr.core.prototypes import decode_prototype, encode_prototype
from synapse_flwr.core.release import ReleaseState, cast_votes
from synapse_flwr.core.router import Router
from synapse_flwr.core.schema import FusionSetting, FusionVotes
from synapse_flwr.core.votes import (
    SETTINGS,
    VOTE_SDS,
    VOTE_SHARE,
    chosen_setting,
    loo_correct,
    release_votes,
    sum_votes,
)
from synapse_flwr.flower.calibration import build_config
from synapse_flwr.flower.client_app import (
    OrgData,
    cache_settings,
    org_release,
    org_vote,
)
from synapse_flwr.flower.config import RunConfig

EMB = BagEmbedder()
# the hotel's records read like weather queries ("city", "rain"), so its prototype pulls them
# away from the weather documentation; the lone visa record has no other of its tool to lean on
LONE = Event(query="snow umbrella night", tool="visa_rules", success=True)
EVENTS = [
    *(Event(query=f"umbrella rain city {c}", tool="get_weather", success=True) for c in "abcdef"),
    *(Event(query=f"room night city rain {c}", tool="book_hotel", success=True) for c in "abcdef"),
    LONE,
    Event(query="stay hotel room", tool="book_hotel", success=True),
]


def _votes(correct: list[float], settings=SETTINGS, records: float = 10.0) -> FusionVotes:
    return FusionVotes(settings=list(settings), correct=correct, records=records, sd=1.0)


def test_the_vote_share_splits_one_budget_between_the_releases_and_the_vote():
    whole = calibrate(PrivacyParams(epsilon=4.0, delta=1e-5, rounds=1, max_contributions=3))
    split = PrivacyParams(epsilon=4.0, delta=1e-5, rounds=1, max_contributions=3, vote_share=VOTE_SHARE)
    cal = calibrate(split)
    # GDP composes in squares: the release keeps 1 - share of mu^2, the vote the rest
    assert cal.noise_multiplier == pytest.approx(whole.noise_multiplier / math.sqrt(1 - VOTE_SHARE))
    assert 1 / cal.noise_multiplier**2 + 1 / cal.vote_multiplier**2 == pytest.approx(1 / whole.noise_multiplier**2)
    assert epsilon_spent(split, cal, 1) < 4.0
    assert epsilon_spent(split, cal, 1, voted=True) == pytest.approx(4.0, abs=1e-6)
    assert epsilon_spent(split, cal, 1, voted=True) <= 4.0 + 1e-9
    # no share, no vote: an honest error rather than a silent overspend
    with pytest.raises(ValueError, match="no share"):
        epsilon_spent(PrivacyParams(epsilon=4.0, delta=1e-5, rounds=1, max_contributions=3), whole, 1, voted=True)
    with pytest.raises(ValueError, match=r"vote_share must be 0 .* in \(0, 0.5\], got 0.7"):
        PrivacyParams(epsilon=4.0, delta=1e-5, rounds=1, max_contributions=3, vote_share=0.7)


def test_vote_noise_is_the_vote_multiplier_times_the_sensitivity():
    config = BuildConfig(vote_share=VOTE_SHARE)
    sd, eps = vote_noise(4.0, 1e-5, 1, 1, config, EMB)
    cal = calibrate(config.resolved(True, True).privacy_params(4.0, 1e-5, 1, config.prototype_weight))
    assert sd == pytest.approx(cal.vote_multiplier * math.sqrt(len(SETTINGS) + 1))
    assert eps == pytest.approx(4.0, abs=1e-6)
    assert gaussian_epsilon(cal.vote_multiplier, 1, cal.delta_accounting) < 1.5  # the vote alone is a small part
    assert vote_noise(math.inf, 1e-5, 1, 1, config, EMB) == (0.0, None)


@pytest.mark.parametrize(("epsilon", "rounds", "releases", "embedder"),
                         [(4.0, 1, 1, EMB), (2.0, 3, 2, EMB), (4.0, 1, 1, None), (math.inf, 1, 1, EMB),
                          (2e4, 1, 1, EMB), (1e5, 1, 1, EMB)])  # sigma 0.019 at 1e5: its 6-decimal rounding was refused
def test_an_artifact_s_vote_noise_is_read_back_from_its_privacy_block(epsilon, rounds, releases, embedder):
    config = BuildConfig(vote_share=VOTE_SHARE)
    art = build_compendium(EVENTS, CATALOG, "acme", epsilon=epsilon, rounds=rounds, releases=releases,
                           config=config, embedder=embedder, seed=0)
    assert artifact_vote_noise(art.privacy) == vote_noise(epsilon, 1e-5, rounds, releases, config, embedder)


def test_an_artifact_without_a_vote_share_or_with_another_calibration_cannot_vote():
    art = build_compendium(EVENTS, CATALOG, "acme", epsilon=4.0, embedder=EMB, seed=0)
    with pytest.raises(ValueError, match="without a share of its budget kept for a vote"):
        artifact_vote_noise(art.privacy)
    shared = build_compendium(EVENTS, CATALOG, "acme", epsilon=4.0, embedder=EMB,
                              config=BuildConfig(vote_share=VOTE_SHARE), seed=0)
    # another builder config (other bounds) gives other noise for the same budget: its vote noise is unknown
    other = shared.privacy.model_copy(update={"sigma": shared.privacy.sigma * 1.2})
    with pytest.raises(ValueError, match="not what the default build gives"):
        artifact_vote_noise(other)
    spent = shared.privacy.model_copy(update={"epsilon": shared.privacy.epsilon / 2})
    with pytest.raises(ValueError, match="matches no number of releases"):
        artifact_vote_noise(spent)


def _without(compendium, tool: str, query: str):
    """The compendium with one record's unit vector and count taken out of its tool's prototype."""
    u = np.asarray(EMB.encode([query])[0], np.float64)
    tools = []
    for e in compendium.tools:
        if e.tool_id == tool:
            p = e.prototype
            e = e.model_copy(update={"prototype": encode_prototype(decode_prototype(p) - u, p.count - 1,
                                                                   p.sum_sd, p.count_sd)})
        tools.append(e)
    return compendium.model_copy(update={"tools": tools})


def test_leave_one_out_routes_each_record_as_a_router_without_it_would():
    # exact: no noise
    glob = merge_typed([build_compendium(EVENTS, CATALOG, "acme", embedder=EMB, epsilon=math.inf, seed=0)])
    router = Router(glob, CATALOG, embedder=EMB, reranker="none")
    got = loo_correct(router, [e.query for e in EVENTS], [e.tool for e in EVENTS])
    assert got.shape == (len(EVENTS), len(SETTINGS))
    for i, event in enumerate(EVENTS):
        brute = Router(_without(glob, event.tool, event.query), CATALOG, embedder=EMB, reranker="none")
        for j, s in enumerate(SETTINGS):
            brute.set_fusion(Fusion(prototype=s.prototype, prior=s.prior))
            assert got[i, j] == (brute.route(event.query).tool == event.tool), (event.query, s)
    # setting 0 reads no experience: exactly the documentation's routes
    docs = Router(None, CATALOG, embedder=EMB, reranker="none")
    assert list(got[:, 0]) == [docs.route(e.query).tool == e.tool for e in EVENTS]
    # leaving out matters: in sample the lone visa record's prototype is itself and wins its route
    strongest = SETTINGS.index(FusionSetting(prototype=8.0, prior=0.0))
    router.set_fusion(Fusion(prototype=8.0, prior=0.0))
    assert router.route(LONE.query).tool == "visa_rules"
    assert not got[EVENTS.index(LONE), strongest]


class RecordingEmbedder(BagEmbedder):
    """BagEmbedder that remembers every text it embeds."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def encode(self, texts):
        self.texts += list(texts)
        return super().encode(texts)


def test_a_vote_takes_out_the_masked_query_its_release_embedded():
    """Regression: votes embedded the raw query while the release embedded it PII-masked, so leave-one-out
    took a different vector out of the prototype than the record had put in."""
    events = [Event(query=f"umbrella rain city {c}, mail me at jo{c}@example.com", tool="get_weather",
                    success=True) for c in "abcd"]
    emb = RecordingEmbedder()
    glob = merge_typed([build_compendium(events, CATALOG, "acme", embedder=emb, epsilon=math.inf, seed=0)])
    released = set(emb.texts)
    assert released and not any("@" in t for t in released)
    emb.texts.clear()
    cast_votes(events, CATALOG, glob, emb, 0.0, np.random.default_rng(0))
    assert set(emb.texts) & {mask_pii(e.query) for e in events} == {mask_pii(e.query) for e in events}
    assert not any("@example.com" in t for t in emb.texts)


def test_leave_one_out_in_chunks_is_the_same_as_at_once(monkeypatch):
    glob = merge_typed([build_compendium(EVENTS, CATALOG, "acme", embedder=EMB, epsilon=math.inf, seed=0)])
    router = Router(glob, CATALOG, embedder=EMB, reranker="none")
    args = (router, [e.query for e in EVENTS], [e.tool for e in EVENTS])
    whole = loo_correct(*args)
    monkeypatch.setattr(votes, "LOO_CHUNK", 3)
    assert len(EVENTS) > 3 and np.array_equal(loo_correct(*args), whole)
    assert loo_correct(router, [], []).shape == (0, len(SETTINGS))


def test_released_votes_are_noised_sums_and_merge_exactly_in_any_order():
    correct = np.array([[True, False] * 4 + [True]] * 7)
    exact = release_votes(correct, 0.0, np.random.default_rng(0))
    assert exact.records == 7 and exact.correct == [7.0, 0.0] * 4 + [7.0] and exact.sd == 0
    assert release_votes(correct[:0], 0.0, np.random.default_rng(0)) is None
    # under noise nobody voting is released too, as noise alone: its absence would say that nobody voted
    alone = release_votes(correct[:0], 1.0, np.random.default_rng(0))
    assert alone.sd == 1.0 and len(alone.correct) == len(SETTINGS) and alone.records != 0
    noised = [release_votes(correct, 3.0, np.random.default_rng(s)) for s in range(3)]
    assert noised[0].correct != exact.correct and noised[0].sd == 3.0
    merged = [sum_votes(p) for p in itertools.permutations(noised)]
    assert all(m == merged[0] for m in merged)
    assert merged[0].correct[0] == pytest.approx(sum(v.correct[0] for v in noised))
    assert merged[0].sd == pytest.approx(3.0 * math.sqrt(3))
    # votes on another list of settings are left out, whatever the order
    other = _votes([1e6, 0.0], settings=[FusionSetting(prototype=0, prior=0), FusionSetting(prototype=99, prior=0)])
    assert sum_votes([other, *noised]) == sum_votes([*noised, other]) == merged[0]
    assert sum_votes([None, None]) is None


def test_votes_summed_past_the_schemas_bound_saturate_instead_of_failing():
    """Regression: two valid artifacts' votes at the bound summed past it, and the merge raised."""
    from synapse_flwr.core.schema import MAX_COUNT

    loud = _votes([MAX_COUNT] * len(SETTINGS), records=MAX_COUNT)
    low = _votes([-MAX_COUNT] * len(SETTINGS), records=-MAX_COUNT)
    assert sum_votes([loud, loud]).correct == [MAX_COUNT] * len(SETTINGS)
    assert sum_votes([low, low]).records == -MAX_COUNT


def test_votes_each_valid_sum_to_votes_a_global_accepts():
    """Regression (merge review): each organisation's right routes may exceed its voters by 6 sqrt(2) of its SD;
    summed, the excesses added up while the SD added in quadrature, so the merged global failed its own check
    and the round's merge raised."""
    from synapse_flwr.core.schema import Compendium, Issuer

    edge = [FusionVotes(settings=list(SETTINGS), correct=[100.0 + 8.4 * 27.0] * len(SETTINGS), records=100.0,
                        sd=27.0) for _ in range(2)]
    for each in edge:
        Compendium(kind="org", issuer=Issuer(org="a"), votes=each)  # each is valid alone
    summed = sum_votes(edge)
    assert summed.records == 200.0 and summed.sd == pytest.approx(27.0 * math.sqrt(2))
    assert max(summed.correct) == pytest.approx(200.0 + 6 * math.sqrt(2) * summed.sd)
    Compendium(kind="global", issuer=Issuer(org="global"), votes=summed)  # raised before


def test_more_experience_is_followed_only_where_its_votes_beat_the_noise():
    n = len(SETTINGS)
    exact = [5.0] * (n - 1) + [6.0]
    assert chosen_setting(_votes([5.0] * n)) == SETTINGS[0]  # a tie goes to less experience
    assert chosen_setting(_votes(exact).model_copy(update={"sd": 0.0})) == SETTINGS[-1]
    # sd 1: the difference of two sums has SD sqrt(2), so a lead over documentation only must exceed
    # VOTE_SDS * sqrt(2)
    assert chosen_setting(_votes(exact)) == SETTINGS[0]
    lead = [5.0] * (n - 1) + [5.0 + VOTE_SDS * math.sqrt(2) + 0.01]
    assert chosen_setting(_votes(lead)) == SETTINGS[-1]
    # past the noise floor of documentation only, the best setting, however close the runner-up
    middle = [5.0, 9.0, *[5.0] * (n - 3), 9.5]
    assert chosen_setting(_votes(middle)) == SETTINGS[-1]
    assert chosen_setting(_votes(lead), sds=0.0) == SETTINGS[-1]
    # a voter count noise took to zero or below: whatever the sums say, documentation only (not the defaults)
    assert chosen_setting(_votes(lead, records=-2.0)) == chosen_setting(_votes(lead, records=0.0)) == SETTINGS[0]
    assert chosen_setting(None) is None


def test_a_router_follows_the_votes_and_routes_as_documentation_when_they_choose_it():
    glob = merge_typed([build_compendium(EVENTS, CATALOG, "acme", embedder=EMB, epsilon=math.inf, seed=0)])
    queries = [e.query for e in EVENTS] + ["rain in the city", "a room for the night"]
    docs = Router(None, CATALOG, embedder=EMB, reranker="none")
    for_docs = glob.model_copy(update={"votes": _votes([9.0] + [1.0] * (len(SETTINGS) - 1))})
    router = Router(for_docs, CATALOG, embedder=EMB, reranker="none")
    assert (router.fusion.prototype, router.fusion.prior) == (0.0, 0.0)
    assert [r.tool for r in router.route_many(queries)] == [r.tool for r in docs.route_many(queries)]
    assert Router(glob, CATALOG, embedder=EMB).fusion == Fusion()  # no votes: the defaults
    pinned = Router(for_docs, CATALOG, embedder=EMB, fusion=Fusion(prior=0.2))  # an explicit fusion wins
    assert pinned.fusion == Fusion(prior=0.2)


def test_an_embedder_with_its_own_dev_fusion_routes_with_it_and_votes_still_choose_over_it(monkeypatch):
    own = EMBEDDER_FUSIONS["tokenlearn-static-64d"]
    assert voted_fusion(None, "tokenlearn-static-64d") == own
    assert voted_fusion(None, "an-embedder-without-an-entry") == Fusion()
    static = get_embedder("static", cache=False)
    assert Router(None, CATALOG, embedder=static, reranker="none").fusion == own
    glob = merge_typed([build_compendium(EVENTS, CATALOG, "acme", embedder=EMB, epsilon=math.inf, seed=0)])
    for_docs = glob.model_copy(update={"votes": _votes([9.0] + [1.0] * (len(SETTINGS) - 1))})
    voted = voted_fusion(for_docs, "tokenlearn-static-64d")
    assert (voted.prototype, voted.prior) == (0.0, 0.0)  # the federation's choice
    assert replace(voted, prototype=own.prototype, prior=own.prior) == own  # the rest stays the embedder's
    # an entry that differs beyond prototype and prior: the votes replace only those two
    probe = Fusion(prototype=3.0, prior=0.1, gate_alpha=0.01, shrink=2.0)
    monkeypatch.setitem(EMBEDDER_FUSIONS, "probe-embedder", probe)
    assert voted_fusion(for_docs, "probe-embedder") == replace(probe, prototype=0.0, prior=0.0)


def test_the_embedder_fusions_are_the_ones_their_committed_dev_grids_chose():
    grids = {"tokenlearn-static-64d": "docs/results/tuning/static/results.json"}
    assert set(grids) == set(EMBEDDER_FUSIONS)
    for name, path in grids.items():
        chosen = json.loads((Path(__file__).parents[1] / path).read_text())["chosen"]
        assert (EMBEDDER_FUSIONS[name].prototype, EMBEDDER_FUSIONS[name].prior) == (chosen["prototype"], chosen["prior"])
        assert EMBEDDER_FUSIONS[name].gate_alpha == chosen["gate_alpha"]


def test_each_record_votes_once_after_its_release_and_spends_the_whole_budget():
    cfg = RunConfig.from_mapping({"epsilon": 4.0, "num-rounds": 3})
    data = OrgData("acme", CATALOG, EVENTS)
    art1, state, _ = org_release(data, cfg, ReleaseState(fingerprint="f"), 1, [], EMB)
    assert art1.votes is None and art1.privacy.epsilon < 4.0 and art1.privacy.vote_share == VOTE_SHARE
    glob1 = merge_typed([art1])
    art2, state, released = org_release(data, cfg, state, 2, [], EMB, glob1)
    assert released == 0 and len(state.voted) == len(EVENTS) and state.artifact == art2
    assert art2.votes is not None and art2.votes.sd > 0
    assert abs(art2.votes.records - len(EVENTS)) < 6 * art2.votes.sd
    assert art2.privacy.epsilon == pytest.approx(4.0, abs=1e-6) and art2.tools == art1.tools
    # round 3: nobody votes again; the cached release (with its votes) is re-sent
    art3, state3, _ = org_release(data, cfg, state, 3, [], EMB, merge_typed([art2]))
    assert art3.votes == art2.votes and state3.voted == state.voted
    # a new record waits for the next run's first round, then votes in the round after, adding to the votes cast
    more = OrgData("acme", CATALOG, [*EVENTS, Event(query="rain umbrella", tool="get_weather", success=True)])
    assert org_release(more, cfg, state3, 4, [], EMB, merge_typed([art3]))[2] == 0
    art4, state4, released = org_release(more, cfg, state3, 1, [], EMB, merge_typed([art3]), run=1)
    assert released == 1 and art4.votes == art2.votes and len(state4.voted) == len(EVENTS)
    art5, state5, _ = org_release(more, cfg, state4, 2, [], EMB, merge_typed([art4]), run=1)
    assert len(state5.voted) == len(EVENTS) + 1 and art5.votes.records != art4.votes.records


def test_records_vote_in_the_round_that_released_them_against_its_merge():
    """The vote phase: round 1's records vote against round 1's global, so it routes as voted from round 1."""
    cfg = RunConfig.from_mapping({"epsilon": 4.0, "num-rounds": 1})
    data = OrgData("acme", CATALOG, EVENTS)
    art1, state, _ = org_release(data, cfg, ReleaseState(fingerprint="f"), 1, [], EMB)
    assert art1.votes is None and art1.privacy.vote_share == VOTE_SHARE  # one round keeps the share too
    other = build_compendium(EVENTS[:4], CATALOG, "beta", embedder=EMB, epsilon=4.0, seed=3,
                             config=build_config(cfg))
    glob1 = merge_typed([art1, other])
    voted, state1, cast = org_vote(data, cfg, state, 1, EMB, glob1)
    assert cast == len(EVENTS) and len(state1.voted) == len(EVENTS) and state1.artifact == voted
    assert voted.issuer == art1.issuer and voted.tools == art1.tools
    assert voted.votes is not None and voted.privacy.epsilon == pytest.approx(4.0, abs=1e-6)
    # without noise, the votes are those a round-2 train would have cast against the same global
    clean = RunConfig.from_mapping({"epsilon": math.inf, "num-rounds": 2})
    _, s1, _ = org_release(data, clean, ReleaseState(fingerprint="f"), 1, [], EMB)
    g1 = merge_typed([s1.artifact, other])
    assert org_vote(data, clean, s1, 1, EMB, g1)[0].votes == org_release(data, clean, s1, 2, [], EMB, g1)[0].votes
    # the next round re-sends the voted release; nobody votes twice, in either phase
    art2, state2, released = org_release(data, cfg, state1, 2, [], EMB, merge_typed([voted, other]))
    assert released == 0 and art2.votes == voted.votes and state2.voted == state1.voted
    again, _, cast = org_vote(data, cfg, state2, 2, EMB, merge_typed([art2, other]))
    assert cast == 0 and again.votes == voted.votes


def test_a_window_s_vote_goes_out_even_when_none_of_its_records_can_vote():
    """Regression (privacy audit): a window of unlabelled records released no vote, one labelled record did,
    so whether a vote block came said whether the window held a labelled record. It now comes as noise alone."""
    cfg = RunConfig.from_mapping({"epsilon": 4.0, "num-rounds": 3, "noise": "seeded"})
    unlabelled = [e.model_copy(update={"success": False}) for e in EVENTS]  # failed calls, no gold: no label
    for events in (unlabelled, [*unlabelled, EVENTS[0]]):
        data = OrgData("acme", CATALOG, events)
        art, state, _ = org_release(data, cfg, ReleaseState(fingerprint="f"), 1, [], EMB)
        assert state.votes_due
        glob = merge_typed([art])
        voted, after, _ = org_vote(data, cfg, state, 1, EMB, glob)
        assert voted.votes is not None and voted.votes.sd > 0 and not after.votes_due
        assert sorted(after.voted) == sorted(data.keys)  # every released record has had its vote
        # a node that missed the vote phase votes late, in the next round, also as noise alone
        late, late_state, _ = org_release(data, cfg, state, 2, [], EMB, glob)
        assert late.votes is not None and late.votes.sd > 0 and not late_state.votes_due


def test_with_replay_the_epsilon_sent_does_not_show_whether_a_record_voted():
    """Regression (review): a later round raised the artifact's epsilon only when some record had voted, so an
    organisation without records sent another epsilon than one with a single record."""
    cfg = RunConfig.from_mapping({"epsilon": 4.0, "num-rounds": 3, "replay": True})
    sent = []
    for events in ([], EVENTS[:1]):
        data, state, glob, eps = OrgData("acme", CATALOG, events), ReleaseState(fingerprint="f"), None, []
        for rnd in (1, 2, 3):
            art, state, _ = org_release(data, cfg, state, rnd, [], EMB, glob, run=5)
            eps.append(art.privacy.epsilon)  # the train reply's
            art, state, _ = org_vote(data, cfg, state, rnd, EMB, merge_typed([art]))
            glob = merge_typed([art])
            eps.append(art.privacy.epsilon)
        sent.append(eps)
    assert sent[0] == sent[1] and sent[0][-1] == pytest.approx(4.0, abs=1e-6)


def test_a_vote_phase_against_a_global_without_the_org_s_release_casts_nothing():
    cfg = RunConfig.from_mapping({"epsilon": 4.0, "noise": "seeded"})
    data = OrgData("acme", CATALOG, EVENTS)
    art1, state, _ = org_release(data, cfg, ReleaseState(fingerprint="f"), 1, [], EMB)
    others = merge_typed([build_compendium(EVENTS, CATALOG, "beta", embedder=EMB, epsilon=4.0, seed=3)])
    sent, same, cast = org_vote(data, cfg, state, 1, EMB, others)  # its train reply was rejected
    assert cast == 0 and same is state and sent.votes is None and sent == art1
    with pytest.raises(Exception, match="holds no release of this run"):
        org_vote(data, cfg, ReleaseState(fingerprint="f"), 1, EMB, others)


def test_records_that_missed_the_vote_phase_vote_at_a_train_reply_once_the_global_holds_their_release():
    cfg = RunConfig.from_mapping({"epsilon": 4.0, "num-rounds": 3})
    data = OrgData("acme", CATALOG, EVENTS)
    _, state, _ = org_release(data, cfg, ReleaseState(fingerprint="f"), 1, [], EMB)
    # round 1's train reply was rejected: the global the next round starts from holds another org only
    beta = build_compendium(EVENTS, CATALOG, "beta", embedder=EMB, epsilon=4.0, seed=3)
    art2, state2, _ = org_release(data, cfg, state, 2, [], EMB, merge_typed([beta]))
    assert art2.votes is None and not state2.voted  # a record is never taken out of a sum that lacks it
    # merged in round 2 (re-sent, stamped 2), its records vote at round 3's train reply
    art3, state3, _ = org_release(data, cfg, state2, 3, [], EMB, merge_typed([art2, beta]))
    assert art3.votes is not None and len(state3.voted) == len(EVENTS)


def test_a_run_votes_with_prototypes_to_vote_on():
    assert RunConfig.from_mapping({}).votes
    assert RunConfig.from_mapping({"num-rounds": 1}).votes  # the round's vote phase
    assert not RunConfig.from_mapping({"embedder": "none"}).votes
    assert not RunConfig.from_mapping({"fusion-votes": False}).votes
    # a flat-majority global keeps no prototypes: no vote could be cast, so no budget share is kept for one
    flat = RunConfig.from_mapping({"policy": "flat-majority"})
    assert not flat.votes and build_config(flat).vote_share == 0.0
    cfg = RunConfig.from_mapping({"epsilon": 4.0, "num-rounds": 3, "fusion-votes": False})
    data = OrgData("acme", CATALOG, EVENTS)
    art1, state, _ = org_release(data, cfg, ReleaseState(fingerprint="f"), 1, [], EMB)
    art2, _, _ = org_release(data, cfg, state, 2, [], EMB, merge_typed([art1]))
    assert art2.votes is None and art1.privacy.vote_share == 0 and art1.privacy.epsilon == pytest.approx(4.0, abs=1e-6)
    assert org_vote(data, cfg, state, 1, EMB, merge_typed([art1]))[2] == 0


def test_votes_beyond_what_the_release_allows_are_refused_at_the_edge():
    from pydantic import ValidationError

    from synapse_flwr.core.schema import Compendium

    cfg = RunConfig.from_mapping({"epsilon": 4.0, "num-rounds": 3})
    data = OrgData("acme", CATALOG, EVENTS)
    art1, state, _ = org_release(data, cfg, ReleaseState(fingerprint="f"), 1, [], EMB)
    honest, _, _ = org_release(data, cfg, state, 2, [], EMB, merge_typed([art1]))
    assert Compendium.model_validate(honest.model_dump()) == honest
    v = honest.votes
    stuffed = v.model_copy(update={"records": 1e6, "correct": [1e6] * len(SETTINGS)})
    with pytest.raises(ValidationError, match="votes from 1e\\+06 records, but the prototypes count"):
        Compendium.model_validate(honest.model_copy(update={"votes": stuffed}).model_dump())
    skewed = v.model_copy(update={"correct": [*v.correct[:-1], v.records + 10 * v.sd * math.sqrt(2)]})
    with pytest.raises(ValidationError, match=r"right routes under \(prototype 8, prior 0.5\)"):
        Compendium.model_validate(honest.model_copy(update={"votes": skewed}).model_dump())
    no_prototypes = honest.model_copy(update={"tools": [t.model_copy(update={"prototype": None}) for t in honest.tools]})
    with pytest.raises(ValidationError, match="votes from"):
        Compendium.model_validate(no_prototypes.model_copy(update={"votes": v.model_copy(
            update={"records": 20 * v.sd, "correct": [0.0] * len(SETTINGS)})}).model_dump())


def test_a_robust_merge_weighs_a_loud_org_s_votes_down_with_its_counts():
    """merge_robust bounds an org's counts tool by tool; its votes are bounded with them, and the global holds."""
    from synapse_flwr.core.merge import merge_robust

    cfg = RunConfig.from_mapping({"epsilon": math.inf, "num-rounds": 3})
    loud = [Event(query=f"{e.query} {i}", tool=e.tool, success=True) for i in range(6) for e in EVENTS]
    orgs = [OrgData(o, CATALOG, evs) for o, evs in (("a", EVENTS), ("b", EVENTS[:7]), ("c", loud))]
    first = [org_release(d, cfg, ReleaseState(fingerprint="f"), 1, [], EMB) for d in orgs]
    incoming = merge_typed([art for art, _, _ in first])
    second = [org_release(d, cfg, state, 2, [], EMB, incoming)[0] for d, (_, state, _) in zip(orgs, first)]
    assert [a.votes.records for a in second] == [14, 7, 84]
    robust = merge_robust(second)  # used to fail validation: 105 voters against 35 clipped counts
    assert robust.votes.records < 105 and robust.votes.records == merge_robust(second[::-1]).votes.records
    assert merge_typed(second).votes.records == 105


def test_a_run_without_votes_resumed_with_votes_neither_re_releases_nor_votes_without_a_share():
    unvoted = RunConfig.from_mapping({"epsilon": 4.0, "num-rounds": 1, "fusion-votes": False})
    resumed = RunConfig.from_mapping({"epsilon": 4.0, "num-rounds": 3})
    assert cache_settings(unvoted, "acme") == cache_settings(resumed, "acme")
    data = OrgData("acme", CATALOG, EVENTS)
    art1, state, _ = org_release(data, unvoted, ReleaseState(fingerprint="f"), 1, [], EMB)
    assert art1.privacy.vote_share == 0 and len(state.no_vote) == len(EVENTS)
    art2, state2, released = org_release(data, resumed, state, 2, [], EMB, merge_typed([art1]))
    assert released == 0 and art2.votes is None and not state2.voted  # no share kept: no vote
    assert org_vote(data, resumed, state2, 2, EMB, merge_typed([art2]))[2] == 0
    # records that arrive later are released with the share in the next run and vote in its vote phase
    more = OrgData("acme", CATALOG, [*EVENTS, Event(query="rain umbrella", tool="get_weather", success=True)])
    art3, state3, released = org_release(more, resumed, state2, 1, [], EMB, merge_typed([art2]), run=1)
    assert released == 1 and len(state3.no_vote) == len(EVENTS)
    art3v, state3v, cast = org_vote(more, resumed, state3, 1, EMB, merge_typed([art3]))
    assert cast == 1 and len(state3v.voted) == 1 and art3v.votes is not None


def test_inspect_reports_the_votes_and_the_setting_a_router_follows(tmp_path):
    from typer.testing import CliRunner

    from synapse_flwr.cli import app
    from synapse_flwr.core.wire import save_artifact

    glob = merge_typed([build_compendium(EVENTS, CATALOG, "acme", embedder=EMB, epsilon=math.inf, seed=0)])
    path = tmp_path / "global.json"
    save_artifact(path, glob.model_copy(update={"votes": _votes([9.0] + [1.0] * (len(SETTINGS) - 1))}))
    res = CliRunner().invoke(app, ["inspect", str(path)], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    assert "fusion votes: 10 voters (noise SD 1.0)" in res.output
    assert "(0, 0) 9 (90.0%)" in res.output and "(8, 0.5) 1 (10.0%)" in res.output
    assert "a router routes with (0, 0)" in res.output
    # votes noise took below zero voters: counts without shares, and documentation only
    lead = [1.0] * (len(SETTINGS) - 1) + [5.0]  # would lead by more than VOTE_SDS with voters
    save_artifact(path, glob.model_copy(update={"votes": _votes(lead, records=-3.0)}))
    res = CliRunner().invoke(app, ["inspect", str(path)], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    assert "(8, 0.5) 5;" in res.output and "%" not in res.output.split("fusion votes:")[1].split("\n")[0]
    assert "a router routes with (0, 0)" in res.output


def test_a_record_that_is_a_tool_s_name_votes_as_the_router_routes_it():
    """Regression (diff review): the router reads no prototype for a query that is a tool's name, but the votes
    scored such records as if it did, crediting settings with routes the router never makes."""
    glob = merge_typed([build_compendium(EVENTS, CATALOG, "acme", embedder=EMB, epsilon=math.inf, seed=0)])
    router = Router(glob, CATALOG, embedder=EMB, reranker="none")
    names = [t.name for t in CATALOG.tools]
    got = loo_correct(router, names, [t.tool_id for t in CATALOG.tools])
    docs = Router(None, CATALOG, embedder=EMB, reranker="none")
    right = [docs.route(n).tool == t.tool_id for n, t in zip(names, CATALOG.tools)]
    assert all(list(got[:, j]) == right for j in range(len(SETTINGS)))
