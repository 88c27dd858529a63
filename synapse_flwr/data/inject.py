"""Contradiction injection: corrupt a fixed share of every organisation's experience.

For the robustness experiments a share ``rate`` of each organisation's
events is corrupted, half of them each way:

``wrong_tool``
    the query is credited to a different tool, as a success (an
    organisation's scenario assigned to the wrong tool); the tools drawn
    from are those with experience
    (:func:`~synapse_flwr.data.federation.experienced_tools`), so a tool
    held out of the experience stays without any;
``inverted``
    the outcome is flipped (a success logged as a failure of the right
    tool, which turns into a ``when_not`` clause).

The choice depends only on the organisation's events, its name and the seed,
never on the arm, so every arm of a (rate, seed) sees the identical injected
set, and the sets are nested: the events corrupted at 20% are among those
corrupted at 40%. :class:`Injection` carries a sha256 of the set for the
results.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from synapse_flwr.core.experience import Event

KINDS = ("wrong_tool", "inverted")


@dataclass(frozen=True)
class Injection:
    """What was injected.

    Parameters
    ----------
    rate : float
        Share of each organisation's events that was corrupted.
    seed : int
        Seed of the choice.
    counts : dict of str to int
        Corrupted events per kind.
    sha256 : str
        Hash of the injected set: every (org, event index, kind, new tool).
    """

    rate: float
    seed: int
    counts: dict[str, int]
    sha256: str


def _org_seed(seed: int, org: str) -> list[int]:
    # crc32 is stable across processes (unlike hash()), so Flower clients and
    # the experiment driver draw the same set
    return [seed, zlib.crc32(org.encode())]


def corrupt_org(
    events: Sequence[Event], org: str, rate: float, seed: int, tools: Sequence[str],
    kinds: Sequence[str] = KINDS,
) -> tuple[list[Event], list[tuple[str, int, str, str]]]:
    """Corrupt ``round(rate * len(events))`` of one organisation's events.

    Parameters
    ----------
    events : sequence of Event
        The organisation's experience.
    org : str
        Its name (part of the seed).
    rate : float
        Share to corrupt, in ``[0, 1]``.
    seed : int
        Seed of the choice.
    tools : sequence of str
        Tool ids a wrong-tool reassignment may credit (at least two): the
        tools with experience, so that held-out tools stay without any.
    kinds : sequence of str
        The corruptions, taken in turn (the default: half each way;
        ``("wrong_tool",)``: every corrupted event is credited to a wrong tool).

    Returns
    -------
    (list of Event, list of tuple)
        The corrupted experience (same order) and the injected records
        ``(org, index, kind, tool)``.
    """
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"injection rate must be in [0, 1], not {rate}")
    if len(tools) < 2:
        raise ValueError("wrong-tool injection needs a catalog of at least two tools")
    if not kinds or set(kinds) - set(KINDS):
        raise ValueError(f"injection kinds must be among {', '.join(KINDS)}, got {list(kinds)}")
    rng = np.random.default_rng(_org_seed(seed, org))
    order = rng.permutation(len(events))
    # one replacement draw per event, made whatever the rate, so sets are nested
    offsets = rng.integers(1, len(tools), size=len(events))
    position = {t: i for i, t in enumerate(tools)}
    out, records = list(events), []
    for rank, index in enumerate(order[: round(rate * len(events))]):
        event = events[index]
        if kinds[rank % len(kinds)] == "wrong_tool":
            right = event.gold or event.tool
            wrong = tools[(position.get(right, 0) + offsets[index]) % len(tools)]
            out[index] = event.model_copy(update={"tool": wrong, "gold": wrong, "success": True})
            records.append((org, int(index), "wrong_tool", wrong))
        else:
            out[index] = event.model_copy(update={"success": not event.success, "gold": None})
            records.append((org, int(index), "inverted", event.tool))
    return out, records


def inject_contradictions(
    orgs: Mapping[str, Sequence[Event]], rate: float, seed: int, tools: Sequence[str]
) -> tuple[dict[str, list[Event]], Injection]:
    """Corrupt every organisation's experience at ``rate``; see the module docstring.

    Parameters
    ----------
    orgs : mapping of str to sequence of Event
        Each organisation's experience.
    rate : float
        Share of each organisation's events to corrupt, in ``[0, 1]``.
    seed : int
        Seed of the choice.
    tools : sequence of str
        Tool ids a wrong-tool reassignment may credit (see :func:`corrupt_org`).

    Returns
    -------
    (dict, Injection)
        The corrupted experience per organisation and the injection record.
    """
    out, records = {}, []
    for org in sorted(orgs):
        out[org], injected = corrupt_org(orgs[org], org, rate, seed, tools)
        records.extend(injected)
    counts = {k: sum(r[2] == k for r in records) for k in KINDS}
    digest = hashlib.sha256(json.dumps(records, separators=(",", ":")).encode()).hexdigest()
    return out, Injection(rate, seed, counts, digest)
