"""Artifacts that fit the wire: what a builder or a merge produces, every receiver's decoder accepts.

The decoder holds an artifact to a budget per tool (``wire.MAX_TOOL_BYTES``,
``wire.MAX_TOOL_VALUES``) before it validates it. The schema's list bounds
allow more than that on every tool at once, and a global without privacy
over a large catalog, with a long conflict log, can reach it: an 811-tool
federation replaying its misroutes merged a round-3 global of 825,249 JSON
values against a budget of 821,000, which the server's own checkpoint and
every client refused. :func:`fit_wire_budget` trims, only when an artifact
is over, the least-supported readable text: first the conflict log (the
dropped ones counted in ``conflicts_dropped``), then precautions, then
``when_not`` and ``when``, halving what each tool keeps until the artifact
fits. What routing reads (prototypes, statistics, descriptions, transitions,
confusions, fusion votes) is never trimmed.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence

from synapse_flwr.core.schema import (
    MAX_CONFLICTS_PER_FIELD,
    MAX_ITEMS,
    MAX_SCENARIOS,
    Compendium,
    Conflict,
    DroppedConflicts,
    ToolEntry,
)
from synapse_flwr.core.wire import budget_problems, canonical_json

log = logging.getLogger(__name__)


def _halvings(start: int) -> list[int]:
    """``start``, its halves down to 1, then 0."""
    out = [start]
    while out[-1] > 1:
        out.append(out[-1] // 2)
    return [*out, 0]


def fits(artifact: Compendium) -> bool:
    """Whether the decoder's budget for this artifact's tools admits its canonical JSON."""
    return not budget_problems(canonical_json(artifact), len(artifact.tools))


def conflict_key(c: Conflict) -> tuple:
    """A conflict's identity and order in a log: tool, field, subject, then its whole content."""
    return (c.tool_id, c.field, c.subject, c.model_dump_json())


def bounded_log(
    conflicts: dict[tuple, Conflict], inputs: Sequence[Compendium], cap: int = MAX_CONFLICTS_PER_FIELD
) -> tuple[list[Conflict], list[DroppedConflicts]]:
    """At most ``cap`` conflicts per tool and field (keyed by :func:`conflict_key`), the best-supported kept.

    The rest are counted, plus the largest count any input already dropped for
    that tool and field (a global merged again keeps its count, not twice).
    Order-independent: the choice depends only on the set of conflicts.
    """
    by_field: dict[tuple[str, str], list[tuple]] = defaultdict(list)
    for key, c in conflicts.items():
        by_field[c.tool_id, c.field].append(key)
    carried: dict[tuple[str, str], int] = defaultdict(int)
    for c in inputs:
        for d in c.conflicts_dropped:
            carried[d.tool_id, d.field] = max(carried[d.tool_id, d.field], d.count)
    kept: list[tuple] = []
    for where, keys in by_field.items():
        keys.sort(key=lambda k: (-max(cl.support for cl in conflicts[k].claims), k))
        kept += keys[:cap]
        carried[where] += max(0, len(keys) - cap)
    dropped = [DroppedConflicts(tool_id=t, field=f, count=n) for (t, f), n in sorted(carried.items()) if n > 0]
    return [conflicts[k] for k in sorted(kept)], dropped


def cap_conflicts(artifact: Compendium, cap: int) -> Compendium:
    """At most ``cap`` conflicts per tool and field, as the merge bounds its log; the rest counted as dropped."""
    logged, dropped = bounded_log({conflict_key(c): c for c in artifact.conflicts}, [artifact], cap)
    return artifact.model_copy(update={"conflicts": logged, "conflicts_dropped": dropped})


def _best(items: list, cap: int) -> list:
    """The ``cap`` best-supported items, in their order."""
    if len(items) <= cap:
        return items
    keep = {id(x) for x in sorted(items, key=lambda x: (-x.support, x.text))[:cap]}
    return [x for x in items if id(x) in keep]


def cap_lists(artifact: Compendium, fields: tuple[str, ...], cap: int) -> Compendium:
    """Each tool keeps at most ``cap`` of each list in ``fields``, the best-supported."""
    def trimmed(e: ToolEntry) -> ToolEntry:
        update = {f: _best(getattr(e, f), cap) for f in fields if len(getattr(e, f)) > cap}
        return e.model_copy(update=update) if update else e

    return artifact.model_copy(update={"tools": [trimmed(e) for e in artifact.tools]})


def fit_wire_budget(artifact: Compendium) -> Compendium:
    """``artifact`` unchanged when it fits the wire's budget, else trimmed until it does (see the module).

    Raises
    ------
    ValueError
        If even without conflicts, precautions and scenarios it would not fit
        (the schema's bounds on what is left make that impossible).
    """
    if fits(artifact):
        return artifact
    before = len(canonical_json(artifact))
    steps = [("conflicts per tool and field", cap_conflicts, _halvings(MAX_CONFLICTS_PER_FIELD)),
             ("precautions per tool", lambda a, n: cap_lists(a, ("precautions",), n), _halvings(MAX_ITEMS)),
             ("when / when_not scenarios per tool", lambda a, n: cap_lists(a, ("when_not", "when"), n),
              _halvings(MAX_SCENARIOS))]
    for what, trim, caps in steps:
        for cap in caps:
            artifact = trim(artifact, cap)
            if fits(artifact):
                log.warning("%s artifact of %d tools over the wire's budget (%d bytes): kept at most %d %s, "
                            "the best-supported (%d bytes)", artifact.kind, len(artifact.tools), before, cap, what,
                            len(canonical_json(artifact)))
                return artifact
    raise ValueError(f"a {artifact.kind} artifact of {len(artifact.tools)} tools exceeds the wire's budget even "
                     "without conflicts, precautions and scenarios")
