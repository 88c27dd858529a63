"""Signature cases: replies and globals whose signature must not verify, each named.

Every case is checked the way the federation checks it: an org's reply by
:func:`synapse_flwr.strategies.base.check_reply` (the strategy's edge), a
global by :func:`synapse_flwr.strategies.records.signature_problem` (what a
client runs before using it). Used by ``tests/test_signing.py`` and
``simulations/hostile_bench.py``.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import dataclass

from flwr.app import ConfigRecord, Message, MessageType, Metadata, RecordDict
from flwr.app.message.message import make_message
from synapse_flwr.strategies.base import check_reply
from synapse_flwr.strategies.records import (
    SIGNATURE_KEY,
    attach_signature,
    signature_problem,
    signature_record,
    to_record,
)

from hostile.corpus import base_artifact
from synapse_flwr.core.schema import Issuer
from synapse_flwr.core.signing import (
    ARTIFACT,
    GLOBAL,
    SERVER,
    Registry,
    Signature,
    Signer,
    demo_signer,
    new_signer,
)
from synapse_flwr.core.wire import MAX_WIRE_BYTES, canonical_json, encode

ROUND = 3
RUN = 2**63 + 5  # past a signed 64-bit integer, as Flower run ids may be


@dataclass(frozen=True)
class SigCase:
    """One signature case: ``check()`` returns the rejection reason, or None if accepted."""

    name: str
    check: Callable[[], str | None]
    expect: str


def reply(node: int, content: RecordDict) -> Message:
    """A reply from ``node`` as the strategy receives it."""
    meta = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0, reply_to_message_id="m",
                    group_id="1", created_at=time.time(), ttl=3600.0, message_type=MessageType.TRAIN)
    return make_message(meta, content)


def artifact_wire(org: str = "org_a") -> bytes:
    """The wire bytes of a valid org artifact issued as ``org``."""
    return encode(base_artifact(org))


def signed_reply(wire: bytes, signer: Signer | None, round_: int = ROUND, node: int = 1,
                 what: str = ARTIFACT, run: int = RUN) -> Message:
    """A reply carrying ``wire``, signed by ``signer`` (unsigned when None)."""
    return reply(node, attach_signature(RecordDict({"artifact": to_record(wire)}), signer, what, run, round_, wire))


@dataclass(frozen=True)
class Keys:
    """A registry of two orgs and the server, with their signers."""

    registry: Registry
    org_a: Signer
    org_b: Signer
    server: Signer


def make_keys() -> Keys:
    """Fresh random keys for ``org_a``, ``org_b`` and the server."""
    a, b, s = new_signer("org_a"), new_signer("org_b"), new_signer(SERVER)
    return Keys(Registry({k.key_id: (k.owner, k.public) for k in (a, b, s)}), a, b, s)


def _edge(keys: Keys, msg: Message) -> Callable[[], str | None]:
    return lambda: check_reply(msg, MAX_WIRE_BYTES, keys.registry, ROUND, run=RUN)[2]


def _global(keys: Keys, content: RecordDict, wire: bytes) -> Callable[[], str | None]:
    return lambda: signature_problem(content, keys.registry, GLOBAL, RUN, ROUND, wire, signer=SERVER)


def _with_signature(wire: bytes, **fields) -> RecordDict:
    rec = {"signer": "org_a", "key-id": "0" * 16, "run": str(RUN), "round": ROUND,
           "value": base64.b64encode(b"\0" * 64).decode()}
    rec.update(fields)
    return RecordDict({"artifact": to_record(wire), SIGNATURE_KEY: ConfigRecord(rec)})


def _tampered(wire: bytes, signer: Signer) -> Message:
    msg = signed_reply(wire, signer)
    other = encode(base_artifact().model_copy(update={"issuer": Issuer(org="org_a", round=2)}))
    msg.content["artifact"] = to_record(other)
    return msg


def edge_cases(keys: Keys) -> list[SigCase]:
    """Org replies the strategy must reject."""
    wire = artifact_wire()
    forged = keys.org_a.sign(ARTIFACT, RUN, ROUND, canonical_json(base_artifact()))
    stranger = new_signer("org_a")
    return [
        SigCase("unsigned", _edge(keys, signed_reply(wire, None)), "signature: missing"),
        SigCase("forged-value", _edge(keys, reply(1, _with_signature(
            wire, **{"key-id": keys.org_a.key_id, "value": base64.b64encode(b"\x01" * 64).decode()}))),
            "signature.value"),
        SigCase("tampered-after-signing", _edge(keys, _tampered(wire, keys.org_a)), "signature.value"),
        SigCase("wrong-org-key", _edge(keys, reply(1, _with_signature(
            wire, signer="org_b", **{"key-id": keys.org_a.key_id, "value": forged.value}))), "signature.signer"),
        SigCase("issuer-not-signer", _edge(keys, signed_reply(artifact_wire("org_b"), keys.org_a)), "issuer.org"),
        SigCase("replayed-older-round", _edge(keys, signed_reply(wire, keys.org_a, round_=ROUND - 1)),
                "signature.round"),
        SigCase("future-round", _edge(keys, signed_reply(wire, keys.org_a, round_=ROUND + 1)), "signature.round"),
        SigCase("replayed-from-another-run", _edge(keys, signed_reply(wire, keys.org_a, run=RUN - 1)),
                "signature.run"),
        SigCase("unregistered-key", _edge(keys, signed_reply(wire, stranger)), "signature.key_id"),
        SigCase("demo-key-under-registry", _edge(keys, signed_reply(wire, demo_signer("org_a", 42))),
                "signature.key_id"),
        SigCase("global-signature-as-artifact", _edge(keys, signed_reply(wire, keys.org_a, what=GLOBAL)),
                "signature.value"),
        SigCase("server-key-as-org", _edge(keys, signed_reply(artifact_wire(SERVER), keys.server)), "issuer.org"),
        SigCase("malformed-record", _edge(keys, reply(1, RecordDict({
            "artifact": to_record(wire), SIGNATURE_KEY: ConfigRecord({"signer": "org_a"})}))), "signature: malformed"),
        SigCase("value-not-base64", _edge(keys, reply(1, _with_signature(
            wire, **{"key-id": keys.org_a.key_id, "value": "***"}))), "signature.value"),
        SigCase("round-not-int", _edge(keys, reply(1, _with_signature(wire, round="3"))), "signature: malformed"),
        SigCase("run-not-decimal", _edge(keys, reply(1, _with_signature(wire, run="-1"))), "signature: malformed"),
        SigCase("run-not-text", _edge(keys, reply(1, _with_signature(wire, run=5))), "signature: malformed"),
    ]


def global_cases(keys: Keys) -> list[SigCase]:
    """Globals a client must refuse to use."""
    wire = artifact_wire()  # any compendium bytes: only the signature is checked here
    good = attach_signature(RecordDict({"arrays": to_record(wire)}), keys.server, GLOBAL, RUN, ROUND, wire)
    older = attach_signature(RecordDict({"arrays": to_record(wire)}), keys.server, GLOBAL, RUN, ROUND - 1, wire)
    other_run = attach_signature(RecordDict({"arrays": to_record(wire)}), keys.server, GLOBAL, RUN + 1, ROUND, wire)
    as_server = Signature(SERVER, keys.org_a.key_id, RUN, ROUND, keys.org_a.sign(GLOBAL, RUN, ROUND, canonical_json(
        base_artifact())).value)  # an org's key, claiming to be the server
    by_org = RecordDict({"arrays": to_record(wire), SIGNATURE_KEY: signature_record(as_server)})
    other = encode(base_artifact().model_copy(update={"policy": "x"}))
    return [
        SigCase("global-unsigned", _global(keys, RecordDict({"arrays": to_record(wire)}), wire),
                "signature: missing"),
        SigCase("global-replayed-older-round", _global(keys, older, wire), "signature.round"),
        SigCase("global-from-another-run", _global(keys, other_run, wire), "signature.run"),
        SigCase("global-signed-by-an-org", _global(keys, by_org, wire), "signature.signer"),
        SigCase("global-signed-by-an-org-as-itself", _global(keys, attach_signature(
            RecordDict({"arrays": to_record(wire)}), keys.org_a, GLOBAL, RUN, ROUND, wire), wire), "signature.signer"),
        SigCase("global-tampered", _global(keys, good, other), "signature.value"),
        SigCase("global-org-artifact-signature", _global(
            keys, attach_signature(RecordDict({}), keys.server, ARTIFACT, RUN, ROUND, wire), wire), "signature.value"),
    ]


def all_cases(keys: Keys | None = None) -> list[SigCase]:
    """Every signature case, names unique."""
    keys = keys or make_keys()
    out = edge_cases(keys) + global_cases(keys)
    assert len({c.name for c in out}) == len(out)
    return out
