"""Ed25519 signatures on artifacts and globals: keys, a public-key registry, sign and verify.

Every party (an organisation, or the server under :data:`SERVER`) holds one
private key; a registry file lists the public keys of all parties, so that the
server can check who sent an artifact and every client can check the global it
receives. A signature covers a domain tag, what is signed (``artifact`` or
``global``), the signer's id, the Flower run, the server round and the sha256
of the canonical JSON bytes, so that it cannot be moved to another org, run,
round or payload (a new federation numbers its rounds from 1 again, so the
round alone would let an earlier federation's round-1 artifact pass in a later
one's round 1).

The demo key set (:func:`demo_keys`) is derived from public names: anyone can
compute it. It exercises the code path of a real key set and is never a secret.
No private key is ever logged, put in an exception or written into an artifact.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from synapse_flwr.core.errors import SynapseError, warn_once
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.schema import RESERVED_ORGS, org_id_problem

log = logging.getLogger(__name__)

SERVER = "server"
REGISTRY_FORMAT = "synapse-keys/1"
ARTIFACT = "artifact"
GLOBAL = "global"
_DOMAIN = b"synapse-flwr/signature/v2"  # v2: the run is signed too
_DEMO_LABEL = b"synapse-flwr demo key (public, not a secret)"


class KeyFileError(SynapseError):
    """A key or registry file that cannot be read or is malformed."""


def key_id(public: Ed25519PublicKey) -> str:
    """Short id of a public key: the first 16 hex digits of the sha256 of its raw bytes."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def signed_bytes(what: str, signer: str, run: int, round_: int, body: bytes) -> bytes:
    """The message a signature covers: domain, kind, signer, run, round and sha256 of the body."""
    digest = hashlib.sha256(body).hexdigest()
    fields = [_DOMAIN, what.encode(), signer.encode(), str(run).encode(), str(round_).encode(), digest.encode()]
    return b"\n".join(fields)


@dataclass(frozen=True)
class Signature:
    """A detached signature as it travels beside an artifact.

    Parameters
    ----------
    signer : str
        Org id (or :data:`SERVER`) the signer claims to be.
    key_id : str
        Id of the public key that verifies it.
    run : int
        Flower run id it was made in.
    round : int
        Server round it was made for.
    value : str
        Base64 of the 64 signature bytes.
    """

    signer: str
    key_id: str
    run: int
    round: int
    value: str


class Signer:
    """One party's private key.

    Parameters
    ----------
    owner : str
        Org id or :data:`SERVER`.
    private : Ed25519PrivateKey
        The key (never shown by ``repr``).
    """

    def __init__(self, owner: str, private: Ed25519PrivateKey) -> None:
        self.owner = owner
        self._private = private
        self.key_id = key_id(private.public_key())

    def __repr__(self) -> str:
        return f"Signer(owner={self.owner!r}, key_id={self.key_id!r})"

    @property
    def public(self) -> Ed25519PublicKey:
        """The matching public key."""
        return self._private.public_key()

    def sign(self, what: str, run: int, round_: int, body: bytes) -> Signature:
        """Sign ``body`` (canonical JSON bytes) as ``what`` for round ``round_`` of run ``run``."""
        raw = self._private.sign(signed_bytes(what, self.owner, run, round_, body))
        return Signature(self.owner, self.key_id, run, round_, base64.b64encode(raw).decode("ascii"))

    def private_pem(self) -> bytes:
        """The private key as unencrypted PKCS#8 PEM (for :func:`save_private_key` only)."""
        return self._private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


@dataclass(frozen=True)
class Registry:
    """The registered public keys: key id -> (owner, key).

    An owner may have several keys (during a rotation); a key has one owner.
    """

    keys: dict[str, tuple[str, Ed25519PublicKey]]

    def verify(self, sig: Signature | None, what: str, body: bytes, run: int, round_: int) -> str | None:
        """Why ``sig`` does not authenticate ``body`` for round ``round_`` of run ``run``, or None. Never raises.

        Parameters
        ----------
        sig : Signature or None
            What came with the payload (None: unsigned).
        what : str
            :data:`ARTIFACT` or :data:`GLOBAL`.
        body : bytes
            The canonical JSON bytes received.
        run : int
            The current Flower run: a signature from another run is a replay.
        round_ : int
            The current server round: an older signature is a replay.
        """
        if sig is None:
            return "signature: missing (unsigned payload)"
        entry = self.lookup(sig)
        if entry is None:
            return f"signature.key_id: {sig.key_id!r} is not a registered key"
        owner, public = entry
        if owner != sig.signer:
            return f"signature.signer: key {sig.key_id!r} belongs to {owner!r}, not {sig.signer!r}"
        if sig.run != run:
            return f"signature.run: signed in run {sig.run}, this is run {run} (replay from another run)"
        if sig.round < round_:
            return f"signature.round: signed for round {sig.round}, current round is {round_} (replay)"
        if sig.round > round_:
            return f"signature.round: signed for round {sig.round}, ahead of the current round {round_}"
        try:
            public.verify(base64.b64decode(sig.value, validate=True), signed_bytes(what, owner, run, round_, body))
        except (InvalidSignature, binascii.Error, ValueError):
            return f"signature.value: does not verify {what} bytes under key {sig.key_id!r} of {owner!r}"
        return None

    def lookup(self, sig: Signature) -> tuple[str, Ed25519PublicKey] | None:
        """The registered (owner, key) of the signature's key id, or None."""
        return self.keys.get(sig.key_id)

    def to_json(self) -> str:
        """The registry file's text (public keys only)."""
        rows = [
            {"owner": owner, "key_id": kid, "public": _public_hex(public)}
            for kid, (owner, public) in sorted(self.keys.items(), key=lambda kv: (kv[1][0], kv[0]))
        ]
        return json.dumps({"format": REGISTRY_FORMAT, "keys": rows}, indent=2) + "\n"

    def owners(self) -> set[str]:
        """Parties with at least one registered key."""
        return {owner for owner, _ in self.keys.values()}


def _public_hex(public: Ed25519PublicKey) -> str:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def new_signer(owner: str) -> Signer:
    """A fresh random key pair for ``owner``."""
    return Signer(owner, Ed25519PrivateKey.generate())


def demo_signer(owner: str, seed: int) -> Signer:
    """The demo key of ``owner``, derived from its name and the run seed: public, NOT a secret."""
    material = hashlib.sha256(b"\0".join([_DEMO_LABEL, str(seed).encode(), owner.encode()])).digest()
    return Signer(owner, Ed25519PrivateKey.from_private_bytes(material))


@dataclass(frozen=True)
class DemoRegistry(Registry):
    """The demo key set: every party's key is :func:`demo_signer` of its name (public, NOT secrets).

    Verification runs exactly as with a registry file; it only shows that the
    bytes were not altered and that the signer used its own demo key.
    """

    seed: int = 0

    def lookup(self, sig: Signature) -> tuple[str, Ed25519PublicKey] | None:
        """The demo key of the claimed signer, when the signature names that key."""
        if sig.key_id in self.keys:
            return self.keys[sig.key_id]
        signer = demo_signer(sig.signer, self.seed)
        return (signer.owner, signer.public) if signer.key_id == sig.key_id else None


def demo_registry(seed: int) -> DemoRegistry:
    """The demo key set of a run seeded ``seed`` (see :class:`DemoRegistry`)."""
    return DemoRegistry({}, seed)


def load_registry(path: str | Path) -> Registry:
    """Read a registry file written by :func:`add_to_registry` (``synapse keygen``).

    Raises
    ------
    KeyFileError
        For a missing or malformed file, naming the entry.
    """
    try:
        doc = json.loads(Path(path).read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"keys file {path}: cannot read it as JSON ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("format") != REGISTRY_FORMAT or not isinstance(doc.get("keys"), list):
        raise KeyFileError(f"keys file {path}: expected {{'format': {REGISTRY_FORMAT!r}, 'keys': [...]}}")
    keys: dict[str, tuple[str, Ed25519PublicKey]] = {}
    for i, row in enumerate(doc["keys"]):
        try:
            public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(row["public"]))
            owner = str(row["owner"])
        except (KeyError, TypeError, ValueError):
            raise KeyFileError(f"keys file {path}: keys.{i} needs 'owner' and a 32-byte hex 'public'") from None
        if owner in RESERVED_ORGS and owner != SERVER:  # an earlier keygen wrote it; no key can sign as the global
            warn_once(log, f"keys file {path}: keys.{i}: a key of {owner!r} is left out (no party signs as it)")
            continue
        if problem := _row_problem(keys, owner, public, row.get("key_id")):
            raise KeyFileError(f"keys file {path}: keys.{i}: {problem}")
        keys[key_id(public)] = (owner, public)
    return Registry(keys)


def _row_problem(keys: dict[str, tuple[str, Ed25519PublicKey]], owner: str, public: Ed25519PublicKey,
                 listed_id: object = None) -> str | None:
    """Why a registry may not give ``public`` to ``owner``, or None.

    A key has one owner: a later row giving an organisation's key to another
    owner silently took it over (every honest reply of the first was then
    rejected as signed by the wrong org).
    """
    if owner != SERVER and (problem := org_id_problem(owner)):
        return f"owner {owner[:80]!r}: {problem}"
    kid = key_id(public)
    if listed_id is not None and listed_id != kid:
        return f"key_id {str(listed_id)[:40]!r} is not the key's id {kid!r}"
    if kid in keys and keys[kid][0] != owner:
        return f"key {kid!r} of {owner!r} is already registered to {keys[kid][0]!r}: a key has one owner"
    return None


def save_private_key(path: str | Path, signer: Signer) -> Path:
    """Write ``signer``'s private key as PEM, readable by its owner only."""
    path = Path(path)
    write_atomic(path, signer.private_pem(), mode=0o600)
    return path


def load_private_key(path: str | Path, owner: str) -> Signer:
    """Read a PEM private key written by :func:`save_private_key` as ``owner``'s signer.

    Raises
    ------
    KeyFileError
        For a missing, unreadable or non-Ed25519 key (the message never holds key bytes).
    """
    try:
        private = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise KeyFileError(f"private key {path}: cannot load it ({type(exc).__name__})") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise KeyFileError(f"private key {path}: not an Ed25519 key")
    return Signer(owner, private)


def add_to_registry(path: str | Path, signer: Signer, replace: bool = False) -> Registry:
    """Register ``signer``'s public key in the registry file (created if missing).

    Parameters
    ----------
    path : str or Path
        The registry file.
    signer : Signer
        Whose public key to add.
    replace : bool
        Drop the owner's other keys (the end of a rotation).

    Raises
    ------
    KeyFileError
        For an unreadable registry, an owner that is not an org id (or the
        server), or a key already registered to another owner.
    """
    path = Path(path)
    keys = dict(load_registry(path).keys) if path.exists() else {}
    if replace:
        keys = {kid: entry for kid, entry in keys.items() if entry[0] != signer.owner}
    if problem := _row_problem(keys, signer.owner, signer.public):
        raise KeyFileError(f"keys file {path}: {problem}")
    keys[signer.key_id] = (signer.owner, signer.public)
    registry = Registry(keys)
    write_atomic(path, registry.to_json())
    return registry
