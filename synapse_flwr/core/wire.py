"""Canonical JSON, content hashes, compression and edge validation of artifacts.

Canonical JSON (sorted keys, no insignificant whitespace, UTF-8) makes equal
compendia byte-identical, so a sha256 of it identifies an artifact. On the wire
an artifact may be gzip-compressed (deterministically: no timestamp).
Decoding is defensive: size limits before and after decompression, JSON
parsing, then strict schema validation, every failure reported as one
:class:`ArtifactError` listing field paths.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.schema import Compendium, FlatCompendium

MAX_WIRE_BYTES = 64 * 1024 * 1024
_GZIP_MAGIC = b"\x1f\x8b"

Artifact = Compendium | FlatCompendium


class ArtifactError(SynapseError):
    """An artifact failed to decode or validate.

    Parameters
    ----------
    errors : list of str
        One line per problem, each naming the field path.
    """

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("; ".join(errors[:5]) + (f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""))


def canonical_json(artifact: BaseModel) -> bytes:
    """Byte-stable JSON of a model: sorted keys, compact separators, UTF-8."""
    return json.dumps(
        artifact.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")


def content_hash(artifact: BaseModel) -> str:
    """sha256 (hex) of the canonical JSON."""
    return hashlib.sha256(canonical_json(artifact)).hexdigest()


def encode(artifact: BaseModel, compress: bool = True) -> bytes:
    """Serialise for the wire: canonical JSON, gzip-compressed unless told not to."""
    raw = canonical_json(artifact)
    return gzip.compress(raw, compresslevel=9, mtime=0) if compress else raw


def _inflate(data: bytes, max_bytes: int) -> bytes:
    # Bounded decompression: a small bomb must not exhaust memory.
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise ArtifactError([f"(wire): corrupt gzip data: {exc}"]) from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise ArtifactError([f"(wire): decompressed size exceeds the limit of {max_bytes} bytes"])
    if not inflater.eof:
        raise ArtifactError(["(wire): corrupt gzip data: truncated stream"])
    return out


def validation_errors(exc: ValidationError) -> list[str]:
    """One ``path: message`` line per pydantic error."""
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(root)"
        lines.append(f"{path}: {err['msg']}")
    return lines


def parse_artifact(obj: Any) -> Artifact:
    """Validate a decoded JSON object as a typed or flat compendium.

    Raises
    ------
    ArtifactError
        With one line per schema violation.
    """
    if not isinstance(obj, dict):
        raise ArtifactError(["(root): an artifact must be a JSON object"])
    model = FlatCompendium if "texts" in obj else Compendium
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise ArtifactError(validation_errors(exc)) from None


def decode(data: bytes, max_bytes: int = MAX_WIRE_BYTES) -> Artifact:
    """Decode and validate bytes from the wire (gzip or plain JSON).

    Parameters
    ----------
    data : bytes
        What the client sent.
    max_bytes : int
        Limit on both the received and the decompressed size.

    Raises
    ------
    ArtifactError
        If the artifact is oversized, corrupt, not JSON, or not schema-valid.
    """
    if len(data) > max_bytes:
        raise ArtifactError([f"(wire): {len(data)} bytes exceeds the limit of {max_bytes} bytes"])
    raw = _inflate(data, max_bytes) if data[:2] == _GZIP_MAGIC else data
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # incl. JSONDecodeError, UnicodeDecodeError
        raise ArtifactError([f"(wire): not valid JSON: {exc}"]) from None
    return parse_artifact(obj)


def load_artifact(path: str | Path, max_bytes: int = MAX_WIRE_BYTES) -> Artifact:
    """Read and validate an artifact file (plain or gzipped JSON).

    Raises
    ------
    ArtifactError
        Also for a missing or unreadable file.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ArtifactError([f"(file): cannot read {path}: {exc.strerror or exc}"]) from None
    return decode(data, max_bytes)


def save_artifact(path: str | Path, artifact: BaseModel) -> Path:
    """Write an artifact atomically; gzip when the name ends in ``.gz``."""
    path = Path(path)
    return write_atomic(path, encode(artifact, compress=path.suffix == ".gz"))
