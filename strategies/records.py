"""Carrying artifacts in Flower records: wire bytes as one uint8 array.

As in Flower's own ``FedXgbBagging`` (serialised trees as bytes), a compendium
travels as a single ``uint8`` :class:`~flwr.app.Array` inside an
:class:`~flwr.app.ArrayRecord`, so it flows through ``Strategy.start`` like
model weights do. Its detached signature travels beside it as a
:class:`~flwr.app.ConfigRecord` under :data:`SIGNATURE_KEY` of the same
``RecordDict``, so the artifact's bytes and schema are unchanged.
"""

from __future__ import annotations

import io

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.common.constant import SType

from synapse_flwr.core.signing import Registry, Signature, Signer
from synapse_flwr.core.wire import ArtifactError, unwrap

ARTIFACT_KEY = "compendium"


def to_record(wire_bytes: bytes) -> ArrayRecord:
    """Wrap wire bytes (see :func:`synapse_flwr.core.wire.encode`) as an ArrayRecord."""
    return ArrayRecord({ARTIFACT_KEY: Array(np.frombuffer(wire_bytes, dtype=np.uint8))})


def from_record(record: ArrayRecord, max_bytes: int | None = None) -> bytes:
    """Unwrap the wire bytes from an ArrayRecord, reading the array's header before its data.

    The array comes from another party, and ``Array.numpy()`` allocates what
    its header claims (a 1 TiB claim is a MemoryError, an empty payload an
    EOFError): the header is read and checked first, and the bytes after it
    are returned as they are.

    Parameters
    ----------
    record : ArrayRecord
        The record that carries the artifact under :data:`ARTIFACT_KEY`.
    max_bytes : int, optional
        Refuse an array whose header claims more bytes.

    Raises
    ------
    KeyError
        If the record holds no artifact.
    ValueError
        If the artifact is not a one-dimensional uint8 numpy array whose
        header agrees with its payload, or (with ``max_bytes``) claims more bytes.
    """
    array = record[ARTIFACT_KEY]
    if array.stype != SType.NUMPY:
        raise ValueError(f"the artifact is serialised as {str(array.stype)[:40]!r}, not {SType.NUMPY!r}")
    stream = io.BytesIO(array.data)
    try:
        version = np.lib.format.read_magic(stream)
        read = _HEADER_READERS.get(version)
        if read is None:
            raise ValueError(f"numpy format version {version}, expected one of {sorted(_HEADER_READERS)}")
        shape, _, dtype = read(stream)
    except (ValueError, EOFError, SyntaxError, TypeError) as exc:  # what numpy raises on a malformed header
        raise ValueError(f"the artifact is not a numpy array ({type(exc).__name__}: {exc})") from None
    if dtype != np.uint8 or len(shape) != 1:
        raise ValueError(f"the artifact is a {dtype} array of shape {shape}, expected one dimension of uint8")
    if max_bytes is not None and shape[0] > max_bytes:
        raise ValueError(f"the artifact's header claims {shape[0]} bytes, over the limit of {max_bytes}")
    body = array.data[stream.tell():]
    if len(body) != shape[0]:
        raise ValueError(f"the artifact's header claims {shape[0]} bytes and {len(body)} follow it")
    return bytes(body)


_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


SIGNATURE_KEY = "signature"
_SIGNATURE_FIELDS = ("signer", "key-id", "run", "round", "value")
_MAX_RUN_DIGITS = 20  # Flower run ids are unsigned 64-bit


def signature_record(sig: Signature) -> ConfigRecord:
    """A detached signature as the ConfigRecord that travels beside the artifact (public data only).

    The run id travels as decimal text: one form for every run id (Flower
    draws them as unsigned 64-bit integers), whatever integer types a record
    keeps."""
    return ConfigRecord({"signer": sig.signer, "key-id": sig.key_id, "run": str(sig.run), "round": sig.round,
                         "value": sig.value})


def signature_from(content: RecordDict) -> tuple[Signature | None, str | None]:
    """The signature carried in a message's content: ``(signature, None)``, ``(None, None)`` when
    there is none, or ``(None, reason)`` when it is malformed. Never raises."""
    if SIGNATURE_KEY not in content.config_records:
        return None, None
    rec = content.config_records[SIGNATURE_KEY]
    missing = [k for k in _SIGNATURE_FIELDS if k not in rec]
    if missing:
        return None, f"signature: malformed record, missing {', '.join(missing)}"
    signer, kid, run, round_, value = (rec[k] for k in _SIGNATURE_FIELDS)
    if not (isinstance(signer, str) and isinstance(kid, str) and isinstance(value, str) and isinstance(run, str)
            and isinstance(round_, int) and not isinstance(round_, bool)):
        return None, "signature: malformed record, expected str signer, key-id, run, value and int round"
    if len(signer) > 128 or len(kid) > 64 or len(value) > 256 or len(run) > _MAX_RUN_DIGITS:
        return None, "signature: malformed record, a field is longer than a signature's"
    if not (run.isascii() and run.isdigit()):
        return None, f"signature: malformed record, run {run!r} is not a decimal run id"
    return Signature(signer, kid, int(run), round_, value), None


def attach_signature(content: RecordDict, signer: Signer | None, what: str, run: int, round_: int,
                     wire: bytes) -> RecordDict:
    """``content`` with ``signer``'s signature of the wire payload's JSON bytes for round ``round_`` of run
    ``run`` added (unchanged when signing is off)."""
    if signer is not None:
        content[SIGNATURE_KEY] = signature_record(signer.sign(what, run, round_, unwrap(wire)))
    return content


def signature_problem(content: RecordDict, registry: Registry | None, what: str, run: int, round_: int,
                      wire: bytes, signer: str | None = None) -> str | None:
    """Why the signature beside ``wire`` in ``content`` is not valid for ``round_`` of ``run``; None when it is
    (or signing is off). Never raises: a payload that cannot be unwrapped is reported too.

    Parameters
    ----------
    content : RecordDict
        The message content holding the signature record.
    registry : Registry or None
        The registered public keys (None: signing is off, nothing is checked).
    what : str
        :data:`~synapse_flwr.core.signing.ARTIFACT` or :data:`~synapse_flwr.core.signing.GLOBAL`.
    run : int
        The current Flower run.
    round_ : int
        The current server round.
    wire : bytes
        The payload's wire bytes.
    signer : str or None
        The party that must have signed (a client passes
        :data:`~synapse_flwr.core.signing.SERVER` for a global); None: any
        registered party, under its own key.
    """
    if registry is None:
        return None
    sig, malformed = signature_from(content)
    if malformed:
        return malformed
    if sig is not None and signer is not None and sig.signer != signer:
        # a registered org's valid signature authenticates that org, not the party this payload must come from
        return f"signature.signer: signed by {sig.signer!r}, but only {signer!r} may sign a {what}"
    try:
        body = unwrap(wire)
    except ArtifactError as exc:
        return str(exc)
    return registry.verify(sig, what, body, run, round_)
