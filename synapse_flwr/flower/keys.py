"""Which keys a run signs and verifies with, from its run config (``sign``, ``keys-file``).

- ``sign = false``: nothing is signed or verified (only when asked for).
- ``keys-file = "<dir>/keys.json"``: the registry of public keys written by
  ``synapse keygen``; a party's private key is its node config's
  ``signing-key`` when given, else ``<dir>/<owner>.key`` (the server's:
  ``<dir>/server.key``). A SuperNode may name its own copy of the registry
  with node config ``keys-file``.
- ``keys-file = ""``: the demo key set, derived from the party names and the
  run seed. It exercises signing end to end but anyone can compute it: demo
  keys are not secrets.
- A node config that names ``keys-file`` or ``signing-key`` refuses a run
  with ``sign = false`` or the demo key set (:func:`key_refusal`): the
  operator's run config does not override an organisation's own keys.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from synapse_flwr.core.signing import (
    Registry,
    Signer,
    demo_registry,
    demo_signer,
    load_private_key,
    load_registry,
)
from synapse_flwr.flower.config import RunConfig

log = logging.getLogger(__name__)


def _keys_file(cfg: RunConfig, node_config: Mapping[str, Any] | None) -> str:
    return str((node_config or {}).get("keys-file", "")) or cfg.keys_file


def key_refusal(cfg: RunConfig, node_config: Mapping[str, Any] | None) -> str | None:
    """Why an organisation whose node config names its own keys refuses the run; None when it takes part.

    A node config ``keys-file`` or ``signing-key`` is the organisation's
    choice to verify and sign with registered keys. The operator's run config
    must not undo it: ``sign = false`` would accept an unsigned global (and
    send unsigned replies), and the demo key set (run config ``keys-file``
    empty, node config without ``keys-file``) is public, so anyone could sign
    a global the node would accept. Never raises.

    Parameters
    ----------
    cfg : RunConfig
        The operator's run config (``sign``, ``keys-file``).
    node_config : mapping or None
        The organisation's node config.
    """
    nc = node_config or {}
    own = [key for key in ("keys-file", "signing-key") if str(nc.get(key, ""))]
    if not own:
        return None
    named = " and ".join(own)
    if not cfg.sign:
        return (f"the run turns signing off (run config sign=false), but this organisation's node config names "
                f"its own {named}: it signs and verifies, or does not take part")
    if not _keys_file(cfg, nc):
        return (f"the run would use the demo key set (run config keys-file is empty), whose keys are public, but "
                f"this organisation's node config names its own {named}: set node config keys-file to its copy "
                "of the registry, or the run config's keys-file")
    return None


def registry_for(cfg: RunConfig, node_config: Mapping[str, Any] | None = None) -> Registry | None:
    """The public keys to verify against; None when the run config turns signing off."""
    if not cfg.sign:
        return None
    path = _keys_file(cfg, node_config)
    return _demo(cfg.seed) if not path else load_registry(path)


@functools.lru_cache(maxsize=4)
def _demo(seed: int) -> Registry:
    # once per process: the warning is not repeated every round
    log.warning("signing with the demo key set (keys-file is empty): demo keys are public, not secrets")
    return demo_registry(seed)


def key_path(keys_file: str | Path, owner: str) -> Path:
    """Where ``owner``'s private key lies by default: beside the keys file, ``<owner>.key``."""
    return Path(keys_file).parent / f"{owner}.key"


def signer_for(cfg: RunConfig, owner: str, node_config: Mapping[str, Any] | None = None) -> Signer | None:
    """``owner``'s private key; None when signing is off."""
    if not cfg.sign:
        return None
    path = _keys_file(cfg, node_config)
    if not path:
        return demo_signer(owner, cfg.seed)
    key = str((node_config or {}).get("signing-key", "")) or str(key_path(path, owner))
    return load_private_key(key, owner)
