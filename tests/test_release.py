"""Release-once accounting: a record is released in one window, later rounds re-send it."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest

from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.catalog import ToolDoc, make_catalog
from synapse_flwr.core.embed import get_embedder
from synapse_flwr.core.experience import Event, load_experience, write_jsonl
from synapse_flwr.core.noise_claims import noise_claim_problem
from synapse_flwr.core.release import (
    ReleaseState,
    combine,
    logged_keys,
    record_keys,
    release_round,
    settings_fingerprint,
)
from synapse_flwr.core.wire import canonical_json
from synapse_flwr.flower.calibration import noise_bound
from synapse_flwr.flower.client_app import (
    OrgData,
    cache_path,
    cache_settings,
    load_state,
    lost_cache_refusal,
    node_refusal,
    org_release,
    replay_refusal,
    window_due,
    windows_refusal,
)
from synapse_flwr.flower.config import RunConfig

CATALOG = make_catalog([
    ToolDoc("get_weather", "get_weather", "Weather forecast for a city."),
    ToolDoc("book_hotel", "book_hotel", "Book a hotel room."),
])


def _events(n: int, start: int = 0) -> list[Event]:
    return [Event(query=f"weather forecast for city {i}", tool="get_weather", success=True)
            for i in range(start, start + n)] + [
        Event(query=f"book a hotel room in town {i}", tool="book_hotel", success=i % 3 > 0)
        for i in range(start, start + n)]


def _build(events: list[Event]):
    return build_compendium(events, CATALOG, "acme", round_=1, epsilon=4.0, rounds=1, seed=3)


def test_record_keys_tell_duplicates_apart_and_are_stable():
    ev = Event(query="same query", tool="get_weather", success=True)
    keys = record_keys([ev, ev, _events(1)[0]])
    assert len(set(keys)) == 3 and keys == record_keys([ev, ev, _events(1)[0]])


def test_an_org_re_sends_its_release_when_no_window_is_due():
    keyed = list(zip(record_keys(_events(30)), _events(30)))
    first, state, n1 = release_round(keyed, ReleaseState(fingerprint="f"), _build, 1, CATALOG)
    calls = []
    second, state2, n2 = release_round(keyed, state, lambda evs: calls.append(evs) or _build(evs), 2, CATALOG,
                                       due=False)
    assert n1 == 60 and n2 == 0 and not calls  # no new window, no new noise
    assert state2 == state and state2.windows == 1
    assert second.issuer.round == 2 and second.privacy == first.privacy  # epsilon unchanged
    assert second.tools == first.tools


def test_whether_a_window_goes_out_does_not_depend_on_the_records():
    """Regression (privacy audit): a round re-sent the cache exactly when no record had arrived, so the
    server learnt whether one had; the schedule (``window_due``) now decides, never the records."""
    cfg = RunConfig.from_mapping({"epsilon": 4.0, "embedder": "none", "num-rounds": 3})
    old = _events(10)
    logs = (old, [*old, Event(query="weather in oslo", tool="get_weather", success=True)])  # without, with one more
    for rnd, run, due in ((2, 7, False), (3, 7, False), (1, 8, True)):  # later rounds of run 7, then a new run
        for events in logs:
            data = OrgData("acme", CATALOG, events, record_keys(events))
            state = org_release(OrgData("acme", CATALOG, old), cfg, ReleaseState(fingerprint="f"), 1, [], None,
                                run=7)[1]
            assert window_due(cfg, state, rnd, run) is due
            art, after, n = org_release(data, cfg, state, rnd, [], None, run=run)
            resent = art.model_copy(update={"issuer": state.artifact.issuer}) == state.artifact
            assert after.windows == state.windows + due and (resent or due)  # noise alone without the new record
            assert n == (due and len(events) > len(old))


def test_replay_refuses_an_earlier_federation_s_cache_and_resumes_its_own():
    """Regression (privacy audit): with replay a second federation on one cache released records' replays
    again (keys of its own rounds), past the num-rounds releases each record's budget covers."""
    cfg = RunConfig.from_mapping({"epsilon": 4.0, "embedder": "none", "replay": True, "num-rounds": 3})
    _, state, _ = org_release(OrgData("acme", CATALOG, _events(10)), cfg, ReleaseState(fingerprint="f"), 1, [],
                              None, run=7)
    assert "earlier federation" in replay_refusal(cfg, state, 1, 8)
    assert replay_refusal(cfg, state, 4, 8) is None  # a resumed federation continues its rounds
    assert replay_refusal(cfg, state, 1, 7) is None  # its own run (a restarted node)
    assert replay_refusal(dataclasses.replace(cfg, replay=False), state, 1, 8) is None


def test_an_org_s_own_windows_are_no_dissent_between_orgs():
    """Regression (privacy audit): combining an org's windows logged its own rates as a disagreement
    "across orgs" and put a dissent precaution naming it into its artifact."""
    good = [Event(query=f"weather in {i}", tool="get_weather", success=True) for i in range(40)]
    bad = [e.model_copy(update={"query": f"{e.query}!", "success": False}) for e in good]
    windows = [build_compendium(evs, CATALOG, "acme", round_=r, epsilon=math.inf, rounds=1, seed=3)
               for r, evs in ((1, good), (2, bad))]
    combined = combine(*windows)
    assert combined.tool("get_weather").stats.calls == 80
    assert not [p for p in combined.tool("get_weather").precautions if p.kind == "dissent"]


def test_with_replay_a_round_run_again_after_a_crash_re_sends_its_window():
    """Regression (review): a resumed federation runs the crashed round again under a new run id; with replay
    every round was due, so an org that had saved that round's window released a second one."""
    cfg = RunConfig.from_mapping({"epsilon": 4.0, "embedder": "none", "replay": True, "num-rounds": 3})
    data = OrgData("acme", CATALOG, _events(10))
    _, state, _ = org_release(data, cfg, ReleaseState(fingerprint="f"), 1, [], None, run=7)
    art2, state2, _ = org_release(data, cfg, state, 2, [], None, run=7)
    assert state2.windows == 2 and state2.window_round == 2
    again, state2b, n = org_release(data, cfg, state2, 2, [], None, run=8)  # round 2 again, resumed
    assert n == 0 and state2b.windows == 2 and again == art2  # the same bytes, epsilon included
    assert org_release(data, cfg, state2b, 3, [], None, run=8)[1].windows == 3
    # a server that announces rounds past num-rounds gets the cached release, not a window past the budget
    state3 = org_release(data, cfg, state2b, 3, [], None, run=8)[1]
    for rnd in (4, 50):
        assert not window_due(cfg, state3, rnd, 8) and org_release(data, cfg, state3, rnd, [], None, run=8)[2] == 0


def test_a_cache_holding_max_windows_windows_releases_no_more_and_stays_within_the_server_s_bound(caplog):
    """Each run adds a window (noise alone without new records) to a pinned cache; past the run's max-windows
    the server would refuse the noise it carries, so the cache re-sends its release and releases no record."""
    cfg = RunConfig.from_mapping({"epsilon": 4.0, "embedder": "static", "max-windows": 2})
    bound = noise_bound(cfg)
    state = ReleaseState(fingerprint="f")
    for run in (7, 8, 9):
        data = OrgData("acme", CATALOG, _events(10 * run))  # new records in every run
        art, state, n = org_release(data, cfg, state, 1, [], get_embedder("static"), run=run)
        assert noise_claim_problem(art, bound) is None
    assert state.windows == 2 and n == 0 and "holds 2 windows, the run's max-windows (2)" in caplog.text
    assert not window_due(cfg, state, 1, 10) and windows_refusal(cfg, state) is None
    # the claimed noise is two windows' (the bound reached exactly): a third window's would be refused
    two = bound.sigma[1] * math.sqrt(2)
    assert [t.prototype.count_sd for t in art.tools] == pytest.approx([two] * len(art.tools), abs=1e-6)
    # a lowered max-windows: the cache refuses the run, naming both, instead of a release refused every round
    lowered = dataclasses.replace(cfg, max_windows=1)
    assert windows_refusal(lowered, state) == (
        "this release cache holds 2 release windows, more than the run's max-windows 1: the server would refuse "
        "the noise they carry; the operator can raise max-windows to 2 or more (run config)")
    assert noise_claim_problem(art, noise_bound(lowered)).startswith("tools[")


def test_a_cache_belongs_to_its_vote_share(monkeypatch):
    """Regression (privacy audit): the vote share's constant was no setting of a cache, so records released under
    one share would have voted at another version's noise and spent more than their budget."""
    from synapse_flwr.core import release

    before = settings_fingerprint(cache_settings(RunConfig.from_mapping({}), "acme"))
    monkeypatch.setattr(release, "VOTE_SHARE", 0.1)
    assert settings_fingerprint(cache_settings(RunConfig.from_mapping({}), "acme")) != before


def test_new_events_are_what_gets_released():
    old, new = _events(30), _events(10, start=100)
    state = ReleaseState(fingerprint="f")
    _, state, _ = release_round(list(zip(record_keys(old), old)), state, _build, 1, CATALOG)
    released_events = []

    def build(evs):
        released_events.extend(evs)
        return _build(evs)

    both = [*old, *new]
    artifact, state, n = release_round(list(zip(record_keys(both), both)), state, build, 2, CATALOG)
    assert n == 20 and sorted(e.query for e in released_events) == sorted(e.query for e in new)
    assert state.windows == 2 and len(state.released) == 80
    # the combined release adds up both windows' noised calls
    calls = artifact.tool("get_weather").stats.calls
    assert abs(calls - 40) < 6 * 4 * artifact.privacy.sigma + 1
    assert artifact.kind == "org" and not artifact.conflicts
    assert artifact.privacy.epsilon <= 4.0 + 1e-6  # disjoint windows: one window's epsilon


def test_a_changed_catalog_keeps_the_cache_and_what_is_sent_carries_todays_catalog():
    """Regression: a re-sent or combined release carried the documentation of the catalog it was made under."""
    events = _events(20)
    _, state, _ = release_round(list(zip(record_keys(events), events)), ReleaseState(fingerprint="f"), _build, 1,
                                CATALOG)
    renewed = make_catalog([  # book_hotel removed, book_flight added, get_weather documented anew
        ToolDoc("get_weather", "get_weather", "Today's forecast and the week ahead for any city."),
        ToolDoc("book_flight", "book_flight", "Book a flight."),
    ])
    kept = [e for e in events if e.tool == "get_weather"]  # the log as the renewed catalog still loads it
    resent, state2, n = release_round(list(zip(record_keys(kept), kept)), state, _build, 2, renewed, due=False)
    assert n == 0 and state2.released == state.released and state2.windows == 1  # nothing released again
    assert [t.tool_id for t in resent.tools] == ["get_weather"]  # a gained tool waits for a window
    assert resent.tool("get_weather").description == "Today's forecast and the week ahead for any city."
    assert resent.tool("get_weather").stats == state.artifact.tool("get_weather").stats
    assert state2.artifact == resent.model_copy(update={"issuer": state.artifact.issuer})  # the cache holds it
    more = [*kept, Event(query="fly me to Oslo", tool="book_flight", success=True)]
    built = []
    combined, _, n = release_round(list(zip(record_keys(more), more)), state2, lambda evs: built.extend(evs) or
                                   build_compendium(evs, renewed, "acme", round_=3, epsilon=4.0, rounds=1, seed=3),
                                   3, renewed)
    assert n == 1 and [e.query for e in built] == ["fly me to Oslo"]
    assert sorted(t.tool_id for t in combined.tools) == ["book_flight", "get_weather"]
    assert combined.tool("get_weather").description == "Today's forecast and the week ahead for any city."


def test_a_tool_renamed_in_the_catalog_keeps_its_records_keys_and_its_released_entry(tmp_path):
    """Regression: keys of the resolved events changed with a rename, so a cache released the records again."""
    log = tmp_path / "org_acme.jsonl"
    log.write_text(write_jsonl(_events(6)))
    renamed = make_catalog([  # get_weather is now weather_now; its old name stays an alias, so the log loads
        ToolDoc("weather_now", "weather_now", "Weather forecast for a city.", aliases=("get_weather",)),
        ToolDoc("book_hotel", "book_hotel", "Book a hotel room."),
    ])
    before, after = load_experience(log, CATALOG), load_experience(log, renamed)
    assert record_keys(before) != record_keys(after)  # what the cache used to key on
    assert logged_keys(log) == record_keys(before)  # a log naming tools by their ids keeps its old keys
    _, state, n1 = release_round(list(zip(logged_keys(log), before)), ReleaseState(fingerprint="f"), _build, 1,
                                 CATALOG)
    resent, state2, n2 = release_round(list(zip(logged_keys(log), after)), state, _build, 2, renamed, due=False)
    assert n1 == 12 and n2 == 0 and state2.released == state.released
    # the cached entry follows the rename (post-processing), its released values untouched
    assert [t.tool_id for t in resent.tools] == ["book_hotel", "weather_now"]
    assert resent.tool("weather_now").stats == state.artifact.tool("get_weather").stats
    assert OrgData("acme", renamed, after, logged_keys(log)).keys == logged_keys(log)
    with pytest.raises(ValueError, match="12 record keys for 11 events"):
        OrgData("acme", renamed, after[:11], logged_keys(log))


def test_a_restarted_client_reads_its_cache_and_does_not_re_release(tmp_path):
    cfg = RunConfig.from_mapping({"epsilon": 4.0, "embedder": "none", "output-dir": str(tmp_path)})
    context = SimpleNamespace(node_config={})
    data = OrgData("acme", CATALOG, _events(20))
    path = cache_path(cfg, context, "acme")
    fp = cache_settings(cfg, "acme")
    art1, state, n1 = org_release(data, cfg, load_state(path, fp), 1, [], None)
    path.parent.mkdir(parents=True)
    path.write_text(state.model_dump_json())
    art2, _, n2 = org_release(data, cfg, load_state(path, fp), 2, [], None)  # "restarted"
    assert n1 == 40 and n2 == 0
    assert canonical_json(art2.model_copy(update={"issuer": art1.issuer})) == canonical_json(art1)
    # other settings: another run, a fresh state
    other = RunConfig.from_mapping({"epsilon": 2.0, "embedder": "none", "output-dir": str(tmp_path)})
    assert load_state(path, cache_settings(other, "acme")).windows == 0


def test_replayed_outcomes_are_new_windows_accounted_as_their_record():
    cfg = RunConfig.from_mapping({"epsilon": 4.0, "embedder": "none", "replay": True, "num-rounds": 3})
    data = OrgData("acme", CATALOG, _events(20))
    _, state, _ = org_release(data, cfg, ReleaseState(fingerprint="f"), 1, [], None)
    replayed = [e.model_copy(update={"success": not e.success}) for e in data.events[:5]]
    art, state, n = org_release(data, cfg, state, 2, replayed, None)
    assert n == 5 and state.windows == 2
    # a record now took part in two of the three planned releases
    single = build_compendium(data.events, CATALOG, "acme", epsilon=4.0, rounds=3, releases=2, seed=0)
    assert math.isclose(art.privacy.epsilon, single.privacy.epsilon) and art.privacy.epsilon < 4.0


def test_windows_with_prototypes_combine_in_their_space():
    """Regression: the combined release kept the prototypes but dropped the embedding space (invalid)."""
    from synapse_flwr.core.embed import get_embedder

    emb = get_embedder("static")

    def build(evs):
        return build_compendium(evs, CATALOG, "acme", round_=1, epsilon=4.0, rounds=2, seed=3, embedder=emb)

    old, new = _events(5), _events(5, start=100)
    _, state, _ = release_round(list(zip(record_keys(old), old)), ReleaseState(fingerprint="f"), build, 1, CATALOG)
    both = [*old, *new]
    artifact, _, n = release_round(list(zip(record_keys(both), both)), state, build, 2, CATALOG)
    assert n == 10 and artifact.embedding == state.artifact.embedding is not None
    assert all(t.prototype is not None for t in artifact.tools)


def test_a_run_resumed_with_more_rounds_keeps_its_cache(tmp_path):
    """Regression: num-rounds was in the fingerprint, so resuming with more rounds started a new cache
    and released every record again (its budget spent twice)."""
    base = {"epsilon": 4.0, "embedder": "none", "output-dir": str(tmp_path)}
    planned = RunConfig.from_mapping({**base, "num-rounds": 3})
    resumed = RunConfig.from_mapping({**base, "num-rounds": 5})
    data = OrgData("acme", CATALOG, _events(20))
    path = cache_path(planned, SimpleNamespace(node_config={}), "acme")
    _, state, n1 = org_release(data, planned, load_state(path, cache_settings(planned, "acme")), 3, [], None)
    path.parent.mkdir(parents=True)
    path.write_text(state.model_dump_json())
    art, _, n4 = org_release(data, resumed, load_state(path, cache_settings(resumed, "acme")), 4, [], None)
    assert n1 == 40 and n4 == 0 and art.privacy == state.artifact.privacy
    # with replay the rounds set the calibration (one release per round): another run
    replay = [RunConfig.from_mapping({**base, "replay": True, "num-rounds": r}) for r in (3, 5)]
    assert len({settings_fingerprint(cache_settings(c, "acme")) for c in replay}) == 2


def test_an_org_s_noise_is_secret_unless_the_run_asks_for_seeded_noise():
    # the server knows the run's seed, the org and the round: noise derived from them alone it could remove
    data = OrgData("acme", CATALOG, _events(20))

    def release(noise: str):
        cfg = RunConfig.from_mapping({"epsilon": 4.0, "embedder": "none", "noise": noise})
        return org_release(data, cfg, ReleaseState(fingerprint="f"), 1, [], None)[0].tools

    assert release("secret") != release("secret")
    assert release("seeded") == release("seeded")


def test_a_cache_the_organisation_pinned_is_its_ledger_and_another_run_cannot_replace_it(tmp_path, caplog):
    # the operator sets the run config: changing a setting (here the budget) would start "another run" and
    # release every record again; an org that pinned its cache in its node config refuses that
    data = OrgData("acme", CATALOG, _events(20))
    path = tmp_path / "acme.json"
    first = RunConfig.from_mapping({"epsilon": 4.0, "embedder": "none"})
    _, state, _ = org_release(data, first, load_state(path, cache_settings(first, "acme"), pinned=True), 1,
                              [], None)
    path.write_text(state.model_dump_json())
    other = cache_settings(RunConfig.from_mapping({"epsilon": 2.0, "embedder": "none"}), "acme")
    with pytest.raises(RuntimeError, match="does not release its records again"):
        load_state(path, other, pinned=True)
    assert "move the cache away to allow it" in caplog.text
    assert "(epsilon: 4.0 in the cache, 2.0 now)" in caplog.text  # what differs, by name
    assert load_state(path, other).windows == 0  # unpinned, the run's settings decide
    assert load_state(path, cache_settings(first, "acme"), pinned=True) == state
    path.write_text("{not json")
    caplog.clear()
    with pytest.raises(RuntimeError, match="pinned release cache"):
        load_state(path, other, pinned=True)
    assert "is unreadable (Invalid JSON" in caplog.text and "errors.pydantic.dev" not in caplog.text


def test_on_its_own_data_an_org_s_cache_ignores_the_split_settings_the_operator_may_change():
    def fp(own_data: bool, **changes) -> dict[str, str]:
        cfg = RunConfig.from_mapping({"epsilon": 4.0, "seed": 1, "alpha": 0.5, "dataset": "demo", **changes})
        return cache_settings(cfg, "acme", own_data=own_data)

    split = ({"seed": 2}, {"alpha": 0.1}, {"dataset": "metatool"}, {"inject": 0.2})
    assert all(fp(True, **c) == fp(True) for c in split)  # they shape no record of a node's own log
    assert all(fp(False, **c) != fp(False) for c in split)  # in simulation they are the records' split
    assert fp(True, epsilon=2.0) != fp(True)  # the budget is always one of the settings


def test_the_organisation_s_node_config_bounds_what_the_operator_s_run_config_may_ask():
    def refusal(node: dict, **run) -> str | None:
        return node_refusal(RunConfig.from_mapping({"epsilon": 4.0, **run}), node)

    own = {"data-path": "/data/acme.jsonl"}
    assert refusal({}) is None and refusal(own) is None  # the defaults: no cap, secret noise
    assert refusal({**own, "max-epsilon": 4.0}) is None
    assert "above this organisation's node config max-epsilon 4" in refusal({**own, "max-epsilon": 4}, epsilon=8.0)
    assert "epsilon inf" in refusal({"max-epsilon": "4"}, epsilon=math.inf)  # privacy off, also in simulation
    for bad in ("four", 0, -1.0):
        assert "max-epsilon must be a positive number" in refusal({"max-epsilon": bad})
    # seeded noise can be regenerated by the server: on its own data an org refuses it unless it allows it
    assert "seeded noise" in refusal(own, noise="seeded")
    assert refusal({**own, "noise": "seeded"}, noise="seeded") is None
    assert refusal({"partition-id": 0, "num-partitions": 3}, noise="seeded") is None  # a simulation's split


def test_the_organisation_s_node_config_caps_delta_as_it_caps_epsilon():
    """Regression: the operator could raise delta up to 0.1 and an organisation had no way to refuse it."""
    def refusal(node: dict, **run) -> str | None:
        return node_refusal(RunConfig.from_mapping({"epsilon": 4.0, "delta": 1e-5, **run}), node)

    own = {"data-path": "/data/acme.jsonl"}
    assert refusal(own, delta=0.1) is None  # the default: no cap, the run config is obeyed
    assert refusal({**own, "max-delta": 1e-5}) is None and refusal({**own, "max-delta": "1e-4"}) is None
    assert refusal({**own, "max-delta": 1e-5}, delta=0.1) == (
        "the run asks for delta 0.1, above this organisation's node config max-delta 1e-05")
    assert "delta 0.001, above" in refusal({"max-delta": 1e-5}, delta=1e-3)  # also in simulation
    for bad in ("small", 0, -1e-5, float("nan")):
        assert refusal({"max-delta": bad}) == f"node config max-delta must be a positive number, got {bad!r}"
    both = {"max-epsilon": 4.0, "max-delta": 1e-5}
    assert "max-epsilon 4" in refusal(both, epsilon=8.0, delta=0.1)  # each cap holds on its own
    assert "max-delta 1e-05" in refusal(both, delta=0.1)


def test_the_release_cache_is_readable_by_its_owner_only(tmp_path):
    """Regression: the cache (what was released, the last artifact) was written world-readable (0o644)."""
    import stat

    from synapse_flwr.core.release import save_release_state as save_state

    path = save_state(tmp_path / "cache" / "acme.json", ReleaseState(fingerprint="f"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)  # a cache written before the fix: rewriting it closes it too
    save_state(path, ReleaseState(fingerprint="g"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ReleaseState.model_validate_json(path.read_text()).fingerprint == "g"



def test_an_organisation_whose_cache_was_lost_does_not_release_again(tmp_path):
    """Regression (deployment rehearsal): a release cache deleted before a resume released every record again,
    and the run still printed the one budget."""
    from synapse_flwr.core.merge import merge_typed

    art = build_compendium(_events(5), CATALOG, "acme", epsilon=math.inf, embedder=None, seed=0)
    merged = merge_typed([art])
    assert merged.orgs == ["acme"]
    empty = ReleaseState(fingerprint="f")
    reason = lost_cache_refusal(empty, merged, "acme", tmp_path / "acme.json")
    assert "already holds a release of organisation 'acme'" in reason and "restore the cache" in reason
    assert "holds none" in reason and str(tmp_path) not in reason  # the server is told no local path
    (tmp_path / "acme.json").write_text("{}")  # a cache of other settings, started afresh: the same double release
    assert "was made under other settings" in lost_cache_refusal(empty, merged, "acme", tmp_path / "acme.json")
    assert lost_cache_refusal(empty, merged, "globex", tmp_path / "globex.json") is None  # a new organisation
    assert lost_cache_refusal(empty, merged.model_copy(update={"orgs": []}), "acme", tmp_path) is None  # older global
    assert lost_cache_refusal(empty.model_copy(update={"artifact": art}), merged, "acme", tmp_path) is None
