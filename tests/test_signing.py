"""Signed artifacts and globals: keys, registry files, rotation, every bad signature rejected with its reason."""

from __future__ import annotations

import json
import logging
import stat

import pytest
from flwr.app import ConfigRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from hostile.corpus import base_artifact
from hostile.signatures import (
    ROUND,
    RUN,
    all_cases,
    artifact_wire,
    make_keys,
    signed_reply,
)
from synapse_flwr.strategies.base import CompendiumStrategy, check_reply
from synapse_flwr.strategies.records import (
    attach_signature,
    signature_problem,
    to_record,
)
from typer.testing import CliRunner

from synapse_flwr import cli
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.schema import Issuer
from synapse_flwr.core.signing import (
    ARTIFACT,
    GLOBAL,
    SERVER,
    DemoRegistry,
    KeyFileError,
    Signer,
    add_to_registry,
    demo_registry,
    demo_signer,
    load_private_key,
    load_registry,
    new_signer,
)
from synapse_flwr.core.wire import MAX_WIRE_BYTES, canonical_json, encode, unwrap
from synapse_flwr.flower.config import RunConfig
from synapse_flwr.flower.keys import registry_for, signer_for

KEYS = make_keys()
CASES = all_cases(KEYS)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_signature_is_rejected_with_its_reason(case):
    reason = case.check()
    assert reason is not None and case.expect in reason, reason


def test_an_artifact_stamped_with_a_later_round_is_refused():
    """One org could name any round for the global, which takes the largest of its inputs'."""
    ahead = base_artifact("org_a").model_copy(update={"issuer": Issuer(org="org_a", round=ROUND + 1000)})
    art, _, reason = check_reply(signed_reply(encode(ahead), KEYS.org_a), MAX_WIRE_BYTES, KEYS.registry, ROUND,
                                 run=RUN)
    assert art is None and f"issuer.round {ROUND + 1000} is ahead of the server's {ROUND}" in reason


def test_a_good_signature_is_accepted():
    art, _, reason = check_reply(signed_reply(artifact_wire(), KEYS.org_a), MAX_WIRE_BYTES, KEYS.registry, ROUND,
                                 run=RUN)
    assert reason is None and art is not None and art.issuer.org == "org_a"
    wire = artifact_wire()
    content = attach_signature(RecordDict({}), KEYS.server, GLOBAL, RUN, ROUND, wire)
    assert signature_problem(content, KEYS.registry, GLOBAL, RUN, ROUND, wire) is None


def test_signature_covers_org_run_round_kind_and_bytes():
    body = canonical_json(base_artifact())
    sig = KEYS.org_a.sign(ARTIFACT, RUN, ROUND, body)
    assert KEYS.registry.verify(sig, ARTIFACT, body, RUN, ROUND) is None
    assert KEYS.registry.verify(sig, ARTIFACT, body + b" ", RUN, ROUND) is not None
    assert KEYS.registry.verify(sig, GLOBAL, body, RUN, ROUND) is not None
    assert KEYS.registry.verify(sig, ARTIFACT, body, RUN, ROUND + 1) is not None
    assert "signature.run" in KEYS.registry.verify(sig, ARTIFACT, body, RUN + 1, ROUND)
    # the run is signed, not only compared: a signature relabelled with the current run does not verify
    moved = type(sig)(sig.signer, sig.key_id, RUN + 1, sig.round, sig.value)
    assert "signature.value" in KEYS.registry.verify(moved, ARTIFACT, body, RUN + 1, ROUND)


def test_the_strategy_signs_the_global_it_broadcasts(monkeypatch):
    for attr in ("_run_id", "_node_id", "_task_id"):  # a Message outside a running app needs its identity
        monkeypatch.setattr(TaskIdentity, attr, 1)
    strategy = CompendiumStrategy(merge_typed, "typed", min_nodes=1, registry=KEYS.registry, signer=KEYS.server,
                                  run_id=RUN, round_offset=2, wait_timeout=0.0)

    class Grid:
        def get_node_ids(self):
            return [7]

    wire = artifact_wire()
    (msg,) = strategy.configure_train(1, to_record(wire), ConfigRecord({}), Grid())
    assert msg.content["config"]["server-round"] == 3
    assert signature_problem(msg.content, KEYS.registry, GLOBAL, RUN, 3, wire) is None
    assert "signature.round" in signature_problem(msg.content, KEYS.registry, GLOBAL, RUN, 4, wire)
    assert "signature.run" in signature_problem(msg.content, KEYS.registry, GLOBAL, RUN - 1, 3, wire)


# --------------------------------------------------------------------------- demo keys


def test_demo_keys_verify_and_are_per_org_and_seed():
    reg = demo_registry(42)
    body = b"{}"
    assert reg.verify(demo_signer("org_a", 42).sign(ARTIFACT, RUN, 1, body), ARTIFACT, body, RUN, 1) is None
    other_seed = demo_signer("org_a", 7).sign(ARTIFACT, RUN, 1, body)
    assert "not a registered key" in reg.verify(other_seed, ARTIFACT, body, RUN, 1)
    a = demo_signer("org_a", 42).sign(ARTIFACT, RUN, 1, body)
    claimed = type(a)("org_b", a.key_id, a.run, a.round, a.value)
    assert "not a registered key" in reg.verify(claimed, ARTIFACT, body, RUN, 1)
    assert demo_signer("org_a", 42).key_id == demo_signer("org_a", 42).key_id != demo_signer("org_b", 42).key_id


def test_run_config_picks_the_keys(tmp_path):
    assert registry_for(RunConfig.from_mapping({"sign": False})) is None
    assert signer_for(RunConfig.from_mapping({"sign": False}), "org_a") is None
    cfg = RunConfig.from_mapping({})
    assert cfg.sign and cfg.keys_file == ""
    assert isinstance(registry_for(cfg), DemoRegistry)
    assert signer_for(cfg, "org_a").key_id == demo_signer("org_a", cfg.seed).key_id
    runner = CliRunner()
    for owner in ("org_a", SERVER):
        assert runner.invoke(cli.app, ["keygen", owner, "--dir", str(tmp_path)]).exit_code == 0
    cfg = RunConfig.from_mapping({"keys-file": str(tmp_path / "keys.json")})
    reg = registry_for(cfg)
    assert reg.owners() == {"org_a", SERVER}
    signer = signer_for(cfg, "org_a")
    assert signer.key_id in reg.keys
    moved = tmp_path / "elsewhere.key"
    moved.write_bytes((tmp_path / "org_a.key").read_bytes())
    assert signer_for(cfg, "org_a", {"signing-key": str(moved)}).key_id == signer.key_id
    with pytest.raises(KeyFileError, match="org_b.key"):
        signer_for(cfg, "org_b")


# --------------------------------------------------------------------------- keygen, files, rotation


def test_keygen_writes_a_private_key_and_registers_the_public_one(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    result = CliRunner().invoke(cli.app, ["keygen", "org_a", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    key_file, reg_file = tmp_path / "org_a.key", tmp_path / "keys.json"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    signer = load_private_key(key_file, "org_a")
    assert signer.key_id in result.output
    assert list(load_registry(reg_file).keys) == [signer.key_id]
    pem = signer.private_pem()
    secret = pem.splitlines()[1]
    for text in (result.output, reg_file.read_text(), caplog.text, repr(signer)):
        assert secret.decode() not in text and "PRIVATE" not in text
    again = CliRunner().invoke(cli.app, ["keygen", "org_a", "--dir", str(tmp_path)])
    assert again.exit_code != 0 and load_private_key(key_file, "org_a").key_id == signer.key_id


@pytest.mark.parametrize("args, words", [
    (["acme", "--registry", "{dir}/acme.key"], "--registry {dir}/acme.key is one of the inputs"),  # its own key file
    (["global"], "'global' is reserved"),  # no key is the global's: it failed in the registry, after the key
])
def test_keygen_refuses_before_any_key_is_written(tmp_path, args, words):
    runner, key_dir = CliRunner(), tmp_path / "k"
    res = runner.invoke(cli.app, ["keygen", *[a.format(dir=key_dir) for a in args], "--dir", str(key_dir)])
    assert res.exit_code != 0 and words.format(dir=key_dir) in str(res.exception), res.exception
    assert not key_dir.exists() or not any(key_dir.iterdir())


def test_rotation_keeps_then_drops_the_old_key(tmp_path):
    reg_file = tmp_path / "keys.json"
    runner = CliRunner()
    assert runner.invoke(cli.app, ["keygen", "org_a", "--dir", str(tmp_path / "old"), "--registry", str(reg_file)]).exit_code == 0
    assert runner.invoke(cli.app, ["keygen", "org_a", "--dir", str(tmp_path / "new"), "--registry", str(reg_file)]).exit_code == 0
    old = load_private_key(tmp_path / "old" / "org_a.key", "org_a")
    new = load_private_key(tmp_path / "new" / "org_a.key", "org_a")
    body = b"{}"
    both = load_registry(reg_file)
    assert both.verify(old.sign(ARTIFACT, RUN, 1, body), ARTIFACT, body, RUN, 1) is None  # overlap: both verify
    assert both.verify(new.sign(ARTIFACT, RUN, 1, body), ARTIFACT, body, RUN, 1) is None
    assert runner.invoke(cli.app, ["keygen", "org_a", "--dir", str(tmp_path / "new"), "--registry", str(reg_file),
                                   "--replace"]).exit_code == 0
    newest = load_private_key(tmp_path / "new" / "org_a.key", "org_a")
    after = load_registry(reg_file)
    assert list(after.keys) == [newest.key_id]
    assert "not a registered key" in after.verify(old.sign(ARTIFACT, RUN, 1, body), ARTIFACT, body, RUN, 1)


@pytest.mark.parametrize("text, match", [
    ("not json", "cannot read it as JSON"),
    ('{"format": "other", "keys": []}', "expected"),
    ('{"format": "synapse-keys/1", "keys": [{"owner": "a", "public": "zz"}]}', "keys.0"),
    ('{"format": "synapse-keys/1", "keys": [{"public": "' + "00" * 32 + '"}]}', "keys.0"),
])
def test_malformed_registry_names_the_problem(tmp_path, text, match):
    path = tmp_path / "keys.json"
    path.write_text(text)
    with pytest.raises(KeyFileError, match=match):
        load_registry(path)


def _row(owner: str, signer) -> dict:
    return {"owner": owner, "key_id": signer.key_id, "public": signer.public.public_bytes_raw().hex()}


def test_a_global_row_an_earlier_keygen_wrote_is_left_out_with_a_warning(tmp_path, caplog):
    a, g = new_signer("org_a"), new_signer("global")
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"format": "synapse-keys/1", "keys": [_row("global", g), _row("org_a", a)]}))
    with caplog.at_level(logging.WARNING):
        assert load_registry(path).owners() == {"org_a"}
    assert "a key of 'global' is left out" in caplog.text


@pytest.mark.parametrize("second, match", [
    ("zz-mallory", "already registered to 'org_a': a key has one owner"),  # a later row took the key over
    ("two words", "owner 'two words'"),
])
def test_a_registry_giving_a_key_to_a_second_or_invalid_owner_is_refused(tmp_path, second, match):
    a = new_signer("org_a")
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"format": "synapse-keys/1", "keys": [_row("org_a", a), _row(second, a)]}))
    with pytest.raises(KeyFileError, match=match):
        load_registry(path)


def test_a_row_whose_key_id_is_not_its_key_s_is_refused(tmp_path):
    a, b = new_signer("org_a"), new_signer("org_b")
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"format": "synapse-keys/1", "keys": [{**_row("org_a", a), "key_id": b.key_id}]}))
    with pytest.raises(KeyFileError, match="is not the key's id"):
        load_registry(path)


def test_registering_another_owner_s_key_is_refused_and_the_file_kept(tmp_path):
    a = new_signer("org_a")
    path = tmp_path / "keys.json"
    add_to_registry(path, a)
    before = path.read_text()
    with pytest.raises(KeyFileError, match="already registered to 'org_a'"):
        add_to_registry(path, Signer("zz-mallory", a._private))
    assert path.read_text() == before and load_registry(path).lookup(a.sign(ARTIFACT, RUN, 1, b"{}"))[0] == "org_a"


def test_a_non_key_file_is_refused_without_its_bytes(tmp_path):
    path = tmp_path / "x.key"
    path.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    with pytest.raises(KeyFileError) as info:
        load_private_key(path, "org_a")
    assert "AAAA" not in str(info.value)


def test_signed_bytes_are_the_wire_payloads_json():
    wire = artifact_wire()
    content = attach_signature(RecordDict({}), KEYS.org_a, ARTIFACT, RUN, 1, wire)
    sig_value = content["signature"]["value"]
    assert KEYS.org_a.sign(ARTIFACT, RUN, 1, unwrap(wire)).value == sig_value  # Ed25519 is deterministic
    assert new_signer("org_a").key_id != KEYS.org_a.key_id


def test_the_round_report_names_each_signature_rejection():
    strategy = CompendiumStrategy(merge_typed, "typed", min_nodes=1, registry=KEYS.registry, signer=KEYS.server,
                                  run_id=RUN, round_offset=ROUND - 1)
    replies = [
        signed_reply(artifact_wire("org_a"), KEYS.org_a, node=1),
        signed_reply(artifact_wire("org_b"), None, node=2),
        signed_reply(artifact_wire("org_b"), KEYS.org_b, round_=ROUND - 1, node=3),
        signed_reply(artifact_wire("org_a"), KEYS.org_b, node=4),
        signed_reply(artifact_wire("org_b"), KEYS.org_b, run=RUN - 1, node=5),
    ]
    merged, _ = strategy.aggregate_train(1, replies)
    report = strategy.reports[ROUND]
    assert merged is not None and report.accepted == [1]
    reasons = {r.node_id: r.reason for r in report.rejected}
    assert "signature: missing" in reasons[2]
    assert "signature.round" in reasons[3] and "replay" in reasons[3]
    assert "issuer.org 'org_a' is not the signer 'org_b'" in reasons[4]
    assert "signature.run" in reasons[5] and "replay from another run" in reasons[5]


# --------------------------------------------------------------------------- who may sign a global


def test_a_client_uses_only_a_global_the_server_signed():
    """Regression: a global signed by any registered key (an org's, as itself) was accepted by every client."""
    from synapse_flwr.flower.client_app import global_problem

    wire = artifact_wire()

    def signed_by(signer) -> RecordDict:
        return attach_signature(RecordDict({"arrays": to_record(wire)}), signer, GLOBAL, RUN, ROUND, wire)

    assert global_problem(signed_by(KEYS.server), KEYS.registry, RUN, ROUND) is None
    assert signature_problem(signed_by(KEYS.org_a), KEYS.registry, GLOBAL, RUN, ROUND, wire) is None  # an org key
    problem = global_problem(signed_by(KEYS.org_a), KEYS.registry, RUN, ROUND)
    assert problem == "signature.signer: signed by 'org_a', but only 'server' may sign a global"
    demo = demo_registry(42)  # under the demo key set too: an org's demo key is no server's
    assert global_problem(signed_by(demo_signer(SERVER, 42)), demo, RUN, ROUND) is None
    assert "only 'server' may sign" in global_problem(signed_by(demo_signer("org_b", 42)), demo, RUN, ROUND)
    assert global_problem(signed_by(None), None, RUN, ROUND) is None  # signing off (sign=false): nothing to check


# --------------------------------------------------------------------------- an organisation's own keys


def test_a_node_that_names_its_own_keys_refuses_a_run_that_would_not_use_them(tmp_path):
    """Regression: run config sign=false or the demo key set silently overrode a node's keys-file/signing-key."""
    from synapse_flwr.flower.client_app import node_refusal
    from synapse_flwr.flower.keys import key_refusal

    registry, key = str(tmp_path / "keys.json"), str(tmp_path / "org_a.key")
    off, demo = RunConfig.from_mapping({"sign": False}), RunConfig.from_mapping({"keys-file": ""})
    operator = RunConfig.from_mapping({"keys-file": str(tmp_path / "operator" / "keys.json")})
    assert registry_for(off, {"keys-file": registry}) is None  # what the node would otherwise get
    for node in ({"keys-file": registry}, {"signing-key": key}, {"keys-file": registry, "signing-key": key}):
        refusal = node_refusal(off, node)
        assert refusal is not None and "sign=false" in refusal and "node config names its own" in refusal
        assert key_refusal(operator, node) is None  # registered keys: the node's own registry or the run's
    assert "own keys-file and signing-key" in key_refusal(off, {"keys-file": registry, "signing-key": key})
    assert isinstance(registry_for(demo, {"signing-key": key}), DemoRegistry)  # what the node would otherwise get
    refusal = node_refusal(demo, {"signing-key": key})
    assert refusal is not None and "demo key set" in refusal and "own signing-key" in refusal
    assert key_refusal(demo, {"keys-file": registry, "signing-key": key}) is None  # its own registry, not demo
    for node in ({}, {"keys-file": "", "signing-key": ""}, None):  # names nothing: the run config decides
        assert key_refusal(off, node) is None and key_refusal(demo, node) is None
