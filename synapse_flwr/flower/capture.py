"""Privacy audit: a ClientApp mod that keeps a copy of every message a client sends.

With run config ``capture-dir`` set, each reply leaves a file
``<capture-dir>/node<id>_round<r>_<uuid>.msg`` holding the serialised
Flower message (metadata, records, error) exactly as it goes to the
SuperLink; a ClientApp that raises leaves the error reason Flower sends in its
place (``.err``). The audit (``simulations/privacy_audit.py``) searches these
bytes for the canaries planted in the raw experience. Off (empty), the mod
only passes the message on.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

from flwr.app import Context, Message
from flwr.common.serde import message_to_proto

from synapse_flwr.core.files import write_atomic
from synapse_flwr.flower.config import RunConfig


def flower_error_reason(exc: BaseException) -> str:
    """The reason Flower's runtime sends for a ClientApp exception (its own format)."""
    return str(type(exc)) + ":<'" + str(exc) + "'>"


def capture_mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """Run the ClientApp; write what it sends back under ``capture-dir`` when that is set."""
    folder = RunConfig.from_mapping(context.run_config).capture_dir
    if not folder:
        return call_next(msg, context)
    config = msg.content.config_records.get("config") if msg.has_content() else None
    round_ = config.get("server-round", 0) if config else 0
    stem = Path(folder) / f"node{context.node_id}_round{round_}_{uuid.uuid4().hex}"
    try:
        reply = call_next(msg, context)
    except Exception as exc:
        write_atomic(stem.with_suffix(".err"), flower_error_reason(exc))
        raise
    write_atomic(stem.with_suffix(".msg"), message_to_proto(reply).SerializeToString())
    return reply
