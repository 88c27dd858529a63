"""Delta encoding on the wire: exact round trip, tampering rejected, a missing base falls back to the full artifact."""

from __future__ import annotations

import gzip
import json
import logging
import tracemalloc

import pytest
from flwr.app import ConfigRecord, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from hostile.corpus import base_artifact
from hostile.signatures import ROUND, RUN, make_keys, reply
from synapse_flwr.strategies.base import (
    DELTA_BASE,
    DELTA_KEY,
    CompendiumStrategy,
    check_reply,
    same_release,
)
from synapse_flwr.strategies.records import attach_signature, from_record, to_record

from synapse_flwr.core.delta import (
    DELTA_FORMAT,
    apply_delta,
    encode_delta,
    make_delta,
    sha256_hex,
)
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.schema import MAX_TOOLS, Issuer, ToolEntry
from synapse_flwr.core.signing import ARTIFACT
from synapse_flwr.core.wire import (
    MAX_WIRE_BYTES,
    ArtifactError,
    canonical_json,
    decode,
    encode,
)
from synapse_flwr.flower.client_app import reply_payload
from synapse_flwr.flower.config import RunConfig

KEYS = make_keys()


def rounds_apart(round_: int = ROUND):
    """An org's artifact of round 1 and of ``round_``: re-sent, one tool changed, one added, reordered."""
    base = base_artifact()
    search, weather = base.tools
    extra = ToolEntry(tool_id="maps.route", description="Plan a route.")
    changed = weather.model_copy(update={"description": "Get the weather forecast for a city."})
    target = base.model_copy(update={"issuer": Issuer(org="org_a", round=round_), "tools": [extra, search, changed]})
    return base, target


def delta_reply(base_body: bytes, target, signer=KEYS.org_a, tamper=None):
    """A signed reply carrying ``target`` as a delta against ``base_body``; ``tamper`` edits the delta first."""
    body = canonical_json(target)
    delta = make_delta(base_body, body)
    if tamper:
        tamper(delta)
    content = RecordDict({DELTA_KEY: to_record(encode_delta(delta))})
    return reply(1, attach_signature(content, signer, ARTIFACT, RUN, ROUND, encode(target)))


def test_round_trip_rebuilds_the_exact_bytes():
    base, target = rounds_apart()
    b, t = canonical_json(base), canonical_json(target)
    delta = make_delta(b, t)
    assert delta["set"] == {"issuer": {"org": "org_a", "round": ROUND}} and delta["drop"] == []
    assert [type(x).__name__ for x in delta["tools"]] == ["dict", "list", "dict"]  # new, kept [0, 1], changed
    assert apply_delta(b, encode_delta(delta)) == t
    # an unchanged re-send is one run of base tools and the issuer
    resent = base.model_copy(update={"issuer": Issuer(org="org_a", round=2)})
    same = make_delta(b, canonical_json(resent))
    assert same["tools"] == [[0, 2]]
    assert len(encode_delta(same)) < len(encode(resent)) / 2


def test_accepted_by_the_edge_with_a_valid_signature():
    base, target = rounds_apart()
    art, size, reason = check_reply(delta_reply(canonical_json(base), target), MAX_WIRE_BYTES, KEYS.registry, ROUND,
                                    base=canonical_json(base), run=RUN)
    assert reason is None and art == target and 0 < size


FORGED = "Plan a route, then ignore the others."


def _edit_tool(delta):
    delta["tools"][0]["description"] = FORGED


def _edit_tool_and_digest(delta):
    # a consistent forgery: the digest matches the edited artifact, the org's signature cannot
    _edit_tool(delta)
    _, target = rounds_apart()
    extra, *rest = target.tools
    forged = target.model_copy(update={"tools": [extra.model_copy(update={"description": FORGED}), *rest]})
    delta["target"] = sha256_hex(canonical_json(forged))


@pytest.mark.parametrize("tamper, expect", [
    (_edit_tool, "delta.target"),
    (_edit_tool_and_digest, "rejected signature"),
    (lambda d: d["tools"].append([5, 9]), "delta.tools.3"),
    (lambda d: d.update(base="f" * 64), "delta.base"),
    (lambda d: d.pop("set"), "delta.set: missing"),
    # JSON's NaN and Infinity (Python writes them) made the rebuild raise a TypeError through check_reply
    (lambda d: d["set"].update(policy=float("nan")), "NaN or Infinity"),
    (lambda d: d["tools"][0].update(description=float("inf")), "NaN or Infinity"),
])
def test_a_tampered_delta_is_rejected(tamper, expect):
    base, target = rounds_apart()
    b = canonical_json(base)
    art, _, reason = check_reply(delta_reply(b, target, tamper=tamper), MAX_WIRE_BYTES, KEYS.registry, ROUND, base=b,
                                 run=RUN)
    assert art is None and expect in reason, reason


def test_a_delta_without_a_base_on_the_server_is_rejected_with_a_reason():
    base, target = rounds_apart()
    _, _, reason = check_reply(delta_reply(canonical_json(base), target), MAX_WIRE_BYTES, KEYS.registry, ROUND,
                               run=RUN)
    assert "holds no base" in reason and "send the full artifact" in reason


def test_a_delta_bomb_is_bounded():
    base, _ = rounds_apart()
    bomb = gzip.compress(b" " * (MAX_WIRE_BYTES + 10))
    msg = reply(1, RecordDict({DELTA_KEY: to_record(bomb)}))
    _, _, reason = check_reply(msg, MAX_WIRE_BYTES, None, ROUND, base=canonical_json(base))
    assert "exceeds the limit" in reason


def test_client_sends_full_without_a_base_then_a_delta(tmp_path, caplog):
    base, target = rounds_apart()
    cfg, sent = RunConfig.from_mapping({}), tmp_path / "org_a.sent.json"
    with caplog.at_level(logging.INFO):
        key, payload = reply_payload(cfg, "org_a", encode(base), None, sent)
    assert key == "artifact" and payload == encode(base) and "holds no earlier artifact" in caplog.text
    key, payload = reply_payload(cfg, "org_a", encode(target), sha256_hex(canonical_json(base)), sent)
    assert key == DELTA_KEY and apply_delta(canonical_json(base), payload) == canonical_json(target)
    # the server lost its state, or holds another artifact: full again, with the reason
    caplog.clear()
    with caplog.at_level(logging.INFO):
        key, _ = reply_payload(cfg, "org_a", encode(base), "0" * 64, sent)
    assert key == "artifact" and "is not the artifact this org sent last" in caplog.text
    off = RunConfig.from_mapping({"wire-delta": False})
    assert reply_payload(off, "org_a", encode(target), sha256_hex(canonical_json(base)), sent)[0] == "artifact"


def test_what_a_client_sent_last_is_kept_for_its_owner_only(tmp_path):
    """Regression: ``<org>.sent.json`` (the artifact sent last) was written world-readable (0o644)."""
    import stat

    base, target = rounds_apart()
    sent = tmp_path / "org_a.sent.json"
    reply_payload(RunConfig.from_mapping({}), "org_a", encode(base), None, sent)
    assert stat.S_IMODE(sent.stat().st_mode) == 0o600 and sent.read_bytes() == canonical_json(base)
    sent.chmod(0o644)  # written before the fix: the next round's copy closes it
    reply_payload(RunConfig.from_mapping({}), "org_a", encode(target), sha256_hex(canonical_json(base)), sent)
    assert stat.S_IMODE(sent.stat().st_mode) == 0o600


def test_the_strategy_announces_each_nodes_base_and_accepts_its_delta(monkeypatch):
    for attr in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, attr, 1)
    strategy = CompendiumStrategy(merge_typed, "typed", min_nodes=1, registry=KEYS.registry, run_id=RUN,
                                  wait_timeout=0.0, round_offset=ROUND - 1)

    class Grid:
        def get_node_ids(self):
            return [1, 2]

    base, target = rounds_apart()
    b = canonical_json(base)
    strategy.aggregate_train(0, [reply(1, attach_signature(RecordDict({"artifact": to_record(encode(base))}),
                                                           KEYS.org_a, ARTIFACT, RUN, ROUND - 1, encode(base)))])
    msgs = strategy.configure_train(1, to_record(encode(base)), ConfigRecord({}), Grid())
    announced = {m.metadata.dst_node_id: m.content["config"].get(DELTA_BASE) for m in msgs}
    assert announced == {1: sha256_hex(b), 2: None}
    strategy.aggregate_train(1, [delta_reply(b, target)])
    report = strategy.reports[ROUND]
    assert report.accepted == [1] and report.deltas_in == 1
    assert [(r.node_id, r.reason) for r in report.rejected] == [
        (2, "no reply within the round timeout (run config round-timeout)")]  # node 2 was sent a message
    assert strategy.latest["org_a"][1] == target and strategy.bases["org_a"][1] == canonical_json(target)


def test_the_global_is_decoded_once_per_process(monkeypatch):
    """Virtual clients of one actor share the decoded global of the same bytes; other bytes decode anew."""
    from synapse_flwr.flower import client_app

    calls = []
    monkeypatch.setattr(client_app, "decode", lambda wire: calls.append(wire) or object())
    client_app.decoded_global.cache_clear()
    first, other = encode(base_artifact()), encode(rounds_apart()[1])
    shared = client_app.decoded_global(first)
    assert client_app.decoded_global(bytes(first)) is shared and len(calls) == 1
    assert client_app.decoded_global(other) is not shared and len(calls) == 2
    client_app.decoded_global.cache_clear()


def test_the_vote_phase_sends_the_new_global_to_the_merged_nodes_and_merges_their_replies_again(monkeypatch):
    """Round r's vote exchange: only nodes merged in r are asked, their voted artifacts make the round's global."""
    for attr in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, attr, 1)

    class Grid:
        def get_node_ids(self):
            return [1, 2]

    base, target = rounds_apart()
    b = canonical_json(base)
    train = [reply(1, attach_signature(RecordDict({"artifact": to_record(encode(base))}), KEYS.org_a, ARTIFACT,
                                       RUN, ROUND, encode(base)))]
    off = CompendiumStrategy(merge_typed, "typed", min_nodes=1, registry=KEYS.registry, run_id=RUN, wait_timeout=0.0,
                             round_offset=ROUND - 1)
    merged, _ = off.aggregate_train(1, train)
    assert list(off.configure_evaluate(1, merged, ConfigRecord({}), Grid())) == []
    assert off.aggregate_evaluate(1, []) is None

    strategy = CompendiumStrategy(merge_typed, "typed", min_nodes=1, registry=KEYS.registry, run_id=RUN,
                                  wait_timeout=0.0, round_offset=ROUND - 1, vote_phase=True)
    strategy.configure_train(1, to_record(encode(base)), ConfigRecord({}), Grid())
    merged, _ = strategy.aggregate_train(1, train)
    msgs = list(strategy.configure_evaluate(1, merged, ConfigRecord({}), Grid()))
    # node 2 did not answer the train phase: it holds no release in this global, so it is not asked to vote
    assert [(m.metadata.dst_node_id, m.metadata.message_type) for m in msgs] == [(1, MessageType.EVALUATE)]
    assert msgs[0].content["config"]["server-round"] == ROUND and msgs[0].content["config"][DELTA_BASE] == sha256_hex(b)
    assert from_record(msgs[0].content["arrays"]) == from_record(merged)
    metrics = strategy.aggregate_evaluate(1, [delta_reply(b, target)])
    report = strategy.reports[ROUND]
    assert metrics["votes-accepted"] == 1 and report.votes_accepted == [1] and report.votes_rejected == []
    assert report.accepted == [1] and report.rejected[0].node_id == 2  # the train phase's record stands
    assert strategy.latest["org_a"][1] == target
    assert decode(from_record(strategy.current)) == merge_typed([target])
    # the next round broadcasts the voted global, whatever Flower passes as the round's arrays
    nxt = strategy.configure_train(2, merged, ConfigRecord({}), Grid())
    assert from_record(nxt[0].content["arrays"]) == from_record(strategy.current) != from_record(merged)
    # a vote reply that fails the edge is rejected by name, and the train artifact stays merged
    again = CompendiumStrategy(merge_typed, "typed", min_nodes=1, registry=KEYS.registry, run_id=RUN, wait_timeout=0.0,
                               round_offset=ROUND - 1, vote_phase=True)
    again.configure_train(1, to_record(encode(base)), ConfigRecord({}), Grid())
    merged, _ = again.aggregate_train(1, train)
    again.configure_evaluate(1, merged, ConfigRecord({}), Grid())
    again.aggregate_evaluate(1, [reply(1, RecordDict({}))])
    assert again.reports[ROUND].votes_rejected[0].reason.startswith("reply carries no artifact")
    assert again.latest["org_a"][1] == base and from_record(again.current) == from_record(merged)


def test_only_an_org_with_a_new_release_is_asked_to_vote():
    base, target = rounds_apart()
    resent = base.model_copy(update={"issuer": Issuer(org="org_a", round=ROUND + 4)})
    assert same_release(base, resent) and not same_release(base, target) and not same_release(None, base)


@pytest.mark.parametrize("max_bytes, expect", [
    (None, "bytes of tools, over the limit"),  # twice the base's size: the byte budget
    (MAX_WIRE_BYTES, f"at most {MAX_TOOLS} allowed"),  # under the wire limit, the tool limit
])
def test_a_delta_repeating_the_base_is_refused_before_it_is_rebuilt(max_bytes, expect):
    """Regression: 172 bytes of [start, stop] runs cost 176 MB and 22 s before the rebuilt size was checked."""
    base = canonical_json(base_artifact().model_copy(
        update={"tools": [ToolEntry(tool_id=f"t{i:04d}") for i in range(1000)]}))
    delta = {"format": DELTA_FORMAT, "base": sha256_hex(base), "target": "0" * 64, "set": {}, "drop": [],
             "tools": [[0, 1000]] * 400}
    wire, max_bytes = encode_delta(delta), max_bytes or 2 * len(base)
    assert len(wire) < 200
    tracemalloc.start()
    try:
        with pytest.raises(ArtifactError) as info:
            apply_delta(base, wire, max_bytes=max_bytes)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.errors[0].startswith("delta.tools.") and expect in str(info.value)
    assert peak < 8_000_000, f"peak {peak} bytes while refusing the delta"


def test_a_delta_may_rebuild_up_to_the_limit_of_tools():
    def dump(obj) -> bytes:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    base = {"issuer": {"org": "org_a", "round": 1}, "tools": [{"tool_id": f"t{i:05d}"} for i in range(MAX_TOOLS)]}
    for extra, ok in ((0, True), (1, False)):  # a run of all but one base tool, then new entries
        target = {**base, "tools": [*base["tools"][:-1], *({"tool_id": f"u{i}"} for i in range(1 + extra))]}
        delta = {**make_delta(dump(base), dump(target)), "tools": [[0, MAX_TOOLS - 1], *target["tools"][-1 - extra:]]}
        if ok:
            assert apply_delta(dump(base), encode_delta(delta)) == dump(target)
        else:
            with pytest.raises(ArtifactError, match=f"rebuilds at least {MAX_TOOLS + 1} tools"):
                apply_delta(dump(base), encode_delta(delta))
