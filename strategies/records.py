"""Carrying artifacts in Flower records: wire bytes as one uint8 array.

As in Flower's own ``FedXgbBagging`` (serialised trees as bytes), a compendium
travels as a single ``uint8`` :class:`~flwr.app.Array` inside an
:class:`~flwr.app.ArrayRecord`, so it flows through ``Strategy.start`` like
model weights do.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord

ARTIFACT_KEY = "compendium"


def to_record(wire_bytes: bytes) -> ArrayRecord:
    """Wrap wire bytes (see :func:`synapse_flwr.core.wire.encode`) as an ArrayRecord."""
    return ArrayRecord({ARTIFACT_KEY: Array(np.frombuffer(wire_bytes, dtype=np.uint8))})


def from_record(record: ArrayRecord) -> bytes:
    """Unwrap the wire bytes from an ArrayRecord.

    Raises
    ------
    KeyError
        If the record holds no artifact.
    """
    return record[ARTIFACT_KEY].numpy().tobytes()
