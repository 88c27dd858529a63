"""Delta encoding of an organisation's artifact against the one it sent before.

With release-once an organisation re-sends the same release round after round
(only ``issuer.round`` changes), so after round 1 most of its artifact is
already on the server. A delta names the sha256 of the base (the canonical
JSON the server accepted from this organisation last) and of the target (the
canonical JSON of the new artifact), replaces the top-level blocks that
changed, and lists the new ``tools`` as runs of base tools (``[start, stop]``,
kept as they are) and whole new tool entries. The receiver rebuilds the
target's canonical bytes exactly (:func:`apply_delta`), checks their sha256,
and then verifies the signature and validates them as any full artifact: a
delta adds no field to what leaves the organisation, it only omits what the
server already holds.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from typing import Any

from synapse_flwr.core.schema import MAX_TOOLS
from synapse_flwr.core.wire import MAX_WIRE_BYTES, ArtifactError, parse_json, unwrap

DELTA_FORMAT = "synapse-delta/1"
_SHA256_HEX = 64


def _dump(obj: Any) -> bytes:
    # the canonical form of core.wire.canonical_json, for an already decoded JSON object
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256_hex(body: bytes) -> str:
    """sha256 (hex) of canonical JSON bytes: how a delta names its base and target."""
    return hashlib.sha256(body).hexdigest()


def tool_runs(base_tools: list[Any], tools: list[Any]) -> list[Any]:
    """``tools`` as ``[start, stop]`` runs of equal base tools and whole changed or new entries."""
    index: dict[bytes, int] = {}
    for i, tool in enumerate(base_tools):
        index.setdefault(_dump(tool), i)
    out: list[Any] = []
    for tool in tools:
        at = index.get(_dump(tool))
        if at is None:
            out.append(tool)
        elif out and isinstance(out[-1], list) and out[-1][1] == at:
            out[-1][1] = at + 1
        else:
            out.append([at, at + 1])
    return out


def make_delta(base: bytes, target: bytes) -> dict[str, Any]:
    """The delta that rebuilds ``target`` from ``base`` (both canonical JSON of an artifact).

    Parameters
    ----------
    base : bytes
        Canonical JSON the receiver holds (what this organisation sent before).
    target : bytes
        Canonical JSON of the new artifact.

    Returns
    -------
    dict
        ``format``, ``base`` and ``target`` (sha256 hex), ``set`` (top-level
        blocks other than ``tools`` that changed or are new), ``drop`` (blocks
        gone) and ``tools`` (see :func:`tool_runs`).
    """
    old, new = json.loads(base), json.loads(target)
    changed = {k: v for k, v in new.items() if k != "tools" and (k not in old or _dump(old[k]) != _dump(v))}
    return {
        "format": DELTA_FORMAT, "base": sha256_hex(base), "target": sha256_hex(target), "set": changed,
        "drop": sorted(k for k in old if k not in new), "tools": tool_runs(old.get("tools", []), new.get("tools", [])),
    }


def encode_delta(delta: dict[str, Any]) -> bytes:
    """Wire bytes of a delta: its canonical JSON, gzip-compressed (deterministically)."""
    return gzip.compress(_dump(delta), compresslevel=9, mtime=0)


def _shape_problems(delta: Any) -> list[str]:
    if not isinstance(delta, dict):
        return ["(delta): must be a JSON object"]
    problems = [f"delta.{k}: missing" for k in ("format", "base", "target", "set", "drop", "tools") if k not in delta]
    if problems:
        return problems
    if delta["format"] != DELTA_FORMAT:
        problems.append(f"delta.format: {delta['format']!r}, expected {DELTA_FORMAT!r}")
    for key in ("base", "target"):
        if not (isinstance(delta[key], str) and len(delta[key]) == _SHA256_HEX):
            problems.append(f"delta.{key}: expected a sha256 hex digest")
    if not isinstance(delta["set"], dict) or "tools" in delta["set"]:
        problems.append("delta.set: expected an object of top-level blocks other than tools")
    if not (isinstance(delta["drop"], list) and all(isinstance(k, str) for k in delta["drop"])):
        problems.append("delta.drop: expected a list of block names")
    if not isinstance(delta["tools"], list):
        problems.append("delta.tools: expected a list of [start, stop] runs and tool entries")
    return problems


def _prefix_sizes(tools: list[Any]) -> list[int]:
    # sizes[k]: bytes of the first k tools as canonical JSON, a comma after each (a run's size in O(1))
    sizes = [0]
    for tool in tools:
        sizes.append(sizes[-1] + len(_dump(tool)) + 1)
    return sizes


def _rebuilt_tools(runs: list[Any], base_tools: list[Any], max_bytes: int = MAX_WIRE_BYTES) -> list[Any]:
    """The target's tools: ``runs`` (:func:`tool_runs`) expanded against ``base_tools``.

    Counted before anything is copied: a few bytes of runs repeating the base
    could otherwise rebuild millions of tools before the size check.

    Raises
    ------
    ArtifactError
        If an item is neither a tool entry nor a run within the base, or the
        tools pass :data:`MAX_TOOLS` or their JSON ``max_bytes``.
    """
    sizes = _prefix_sizes(base_tools)
    tools: list[Any] = []
    count = size = 0
    for i, item in enumerate(runs):
        if isinstance(item, dict):
            count, size = count + 1, size + len(_dump(item)) + 1
        elif (isinstance(item, list) and len(item) == 2 and all(type(v) is int for v in item)
              and 0 <= item[0] < item[1] <= len(base_tools)):
            count, size = count + item[1] - item[0], size + sizes[item[1]] - sizes[item[0]]
        else:
            raise ArtifactError([(f"delta.tools.{i}: expected a tool entry or a [start, stop] run "
                                  f"within the base's {len(base_tools)} tools")])
        if count > MAX_TOOLS:
            raise ArtifactError([f"delta.tools.{i}: rebuilds at least {count} tools, at most {MAX_TOOLS} allowed"])
        if size > max_bytes:
            raise ArtifactError([(f"delta.tools.{i}: rebuilds at least {size} bytes of tools, "
                                  f"over the limit of {max_bytes} bytes")])
        tools += [item] if isinstance(item, dict) else base_tools[item[0]:item[1]]
    return tools


def apply_delta(base: bytes, data: bytes, max_bytes: int = MAX_WIRE_BYTES) -> bytes:
    """Rebuild the canonical JSON bytes a delta describes, checked against its target digest.

    Parameters
    ----------
    base : bytes
        Canonical JSON of the artifact the server accepted from this organisation last.
    data : bytes
        The delta as received (gzip or plain JSON).
    max_bytes : int
        Limit on the received delta, its decompressed form and the rebuilt artifact.

    Raises
    ------
    ArtifactError
        If the delta is oversized or malformed, names another base, or does not
        rebuild bytes whose sha256 is its target (a tampered or corrupt delta).
    """
    delta = parse_json(unwrap(data, max_bytes))
    if problems := _shape_problems(delta):
        raise ArtifactError(problems)
    if delta["base"] != sha256_hex(base):
        raise ArtifactError([(f"delta.base: {delta['base'][:16]}... is not the artifact the server holds "
                              f"({sha256_hex(base)[:16]}...); send the full artifact")])
    old = json.loads(base)
    new = {k: v for k, v in old.items() if k != "tools" and k not in delta["drop"]}
    new.update(delta["set"])
    try:
        new["tools"] = _rebuilt_tools(delta["tools"], old.get("tools", []), max_bytes - len(_dump(new)))
        body = _dump(new)
    except TypeError:  # parse_json reads NaN and Infinity as a marker that JSON cannot write back
        raise ArtifactError(["delta: holds NaN or Infinity, which JSON does not allow"]) from None
    if len(body) > max_bytes:
        raise ArtifactError([f"(delta): rebuilt artifact of {len(body)} bytes exceeds the limit of {max_bytes} bytes"])
    if sha256_hex(body) != delta["target"]:
        raise ArtifactError(["delta.target: the rebuilt artifact's sha256 differs (tampered or corrupt delta)"])
    return body
