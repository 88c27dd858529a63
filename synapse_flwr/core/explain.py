"""Route explanation: which fields decided a route, and a readable account of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from synapse_flwr.core.router import Candidate, RouteResult


def _winner_without(ranked: Sequence[Candidate], field: str) -> str:
    """The candidate that would win with ``field``'s part taken from every candidate's score."""
    return min(ranked, key=lambda c: (-(c.score - c.signals.get(field, 0.0)), c.tool_id)).tool_id


def decided_by(ranked: Sequence[Candidate], docs_choice: str) -> list[str]:
    """The fields that made the winner win.

    ``["description"]`` when the documentation alone would have picked the
    same tool (``docs_choice``: its best over the whole catalog); otherwise the
    experience fields with evidence for the winner (``phrases``, ``scenario``,
    ``prototype``: the query's match with the tool's prototype, ``prior``: the
    tool's released count, ``redirected``) without which another candidate
    would win, all of them when none decides alone (they decided together),
    and ``when_not`` when the documentation's choice was ruled out by one of
    its ``when_not`` scenarios. (Every field with evidence was named: the prior
    is above zero for every tool whose prototype is read, and was named beside
    the prototype on routes it did not decide.)
    """
    top = ranked[0]
    if top.tool_id == docs_choice:
        return ["description"]
    fields = [f for f in ("phrases", "scenario", "prototype", "prior", "redirected") if top.signals.get(f, 0) > 0]
    if "redirected" not in fields:  # a redirect's score is its redirecting candidate's: no part to take away
        fields = [f for f in fields if _winner_without(ranked, f) != top.tool_id] or fields
    loser = next((c for c in ranked if c.tool_id == docs_choice), None)
    if loser is not None and loser.signals.get("when_not", 0) > 0:
        fields.append("when_not")
    return fields or ["description"]


def explain_route(result: RouteResult, names: Mapping[str, str] | None = None) -> str:
    """A readable account of one route: the choice, the deciding fields, each candidate's evidence.

    ``names`` maps tool ids to their catalog spelling (``Router.names``).
    """
    names = names or {}
    lines = [f"query: {result.query}",
             f"tool: {names.get(result.tool, result.tool)}  (decided by: {', '.join(result.decided_by)})"]
    if result.experience_off:
        lines.append("  (experience off: the queries routed sit far from the federation's, routed as docs_only; "
                     "docs/experiments.md, \"Query shift\")")
    for c in result.candidates:
        shown = ", ".join(f"{k}={v:.3f}" for k, v in c.signals.items() if v)
        lines.append(f"  {names.get(c.tool_id, c.tool_id)}: score {c.score:.3f}" + (f"  [{shown}]" if shown else ""))
    return "\n".join(lines)
