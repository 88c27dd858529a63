"""Rendering a tool entry for a reader: as typed fields, or as one flat string.

The same content can be shown to a reranker either way; that is the paper's
rendering ablation. The flat form is a ``" | "``-joined list of clauses, which
:func:`parse_flat` can decode back into an approximate typed entry (the
"decoded" arm of the 2x2 merge x render experiment). Every text goes through
:func:`~synapse_flwr.core.sanitize.neutralise`: text that reads as an
instruction is never shown to a reader, and any other is shown on one line
(a line break in an artifact's text cannot open a line of the prompt).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from synapse_flwr.core.phrases import normalize_text
from synapse_flwr.core.sanitize import neutralise
from synapse_flwr.core.scenarios import split_when
from synapse_flwr.core.schema import (
    MAX_TEXT,
    MAX_TOOL_ID,
    TOOL_ID_PATTERN,
    Precaution,
    Scenario,
    ToolCount,
    ToolEntry,
    ToolStats,
    WhenNot,
)

FLAT_SEPARATOR = " | "
#: Example requests an LLM reader is shown per tool (each adds ~15 tokens to every prompt).
SHOWN_REQUESTS = 3
_CONTESTED = ("about", "scenario:")


def _scenario_text(s: Scenario) -> str:
    variants = [neutralise(v) for v in s.variants]
    return neutralise(s.text) + (f" ({', '.join(variants)})" if variants else "")


def render_flat(entry: ToolEntry) -> str:
    """One string per tool: every field as a clause, without typed structure."""
    clauses = [f"about: {neutralise(entry.description)}"] if entry.description else []
    clauses += [f"use when: {_scenario_text(s)}" for s in entry.when]
    clauses += [
        f"avoid when: {_scenario_text(w)}" + (f" -> prefer {w.prefer}" if w.prefer else "")
        for w in entry.when_not
    ]
    clauses += [f"caution: {neutralise(p.text)}" for p in entry.precautions]
    if entry.stats.calls > 0:
        rate = entry.stats.success_rate or 0.0
        clauses.append(f"stats: {entry.stats.calls:.0f} calls, {rate:.0%} success")
    clauses += [f"confused with: {c.tool}" for c in entry.confusions]
    clauses += [f"followed by: {c.tool}" for c in entry.next_tools]
    return FLAT_SEPARATOR.join(c.replace(FLAT_SEPARATOR, " / ") for c in clauses)


def flat_clause_key(clause: str) -> str:
    """The voting key of a flat clause: use/avoid clauses on one scenario share a key."""
    head, _, body = clause.partition(": ")
    if head == "about":
        return "about"
    if head in ("use when", "avoid when"):
        scenario = body.split(" -> prefer ")[0].split(" (")[0]
        return "scenario:" + normalize_text(scenario)
    return clause


def is_contested(key: str) -> bool:
    """Whether clauses sharing this key compete (only one may stay)."""
    return key.startswith(_CONTESTED)


# DOTALL: a flat text from an older global may hold a line break (without it, no match: an assertion failed)
_TOOL_ID = re.compile(TOOL_ID_PATTERN)
_VARIANTS = re.compile(r"^(?P<text>.*?)(?: \((?P<variants>[^()]*)\))?$", re.DOTALL)


def _parse_scenario(body: str) -> tuple[str, list[str]]:
    m = _VARIANTS.match(body)
    assert m is not None  # the pattern matches any string
    variants = [v for v in (m.group("variants") or "").split(", ") if v]
    return m.group("text")[:MAX_TEXT] or body[:MAX_TEXT], [v[:MAX_TEXT] for v in variants[:8]]


def _tool_id(text: str) -> str | None:
    """``text`` when it is a tool id, else None: a flat string is free text, and a clause naming no tool id
    ("confused with: Search Flights") is left out rather than refusing the whole artifact where it is read."""
    return text if len(text) <= MAX_TOOL_ID and _TOOL_ID.fullmatch(text) else None


def parse_flat(tool_id: str, text: str) -> ToolEntry:
    """Decode a flat string back into an (approximate) typed entry.

    Supports are not in the flat form; each decoded scenario gets support 1.
    """
    when, when_not, precautions, confusions, nexts = [], [], [], [], []
    description = ""
    for clause in text.split(FLAT_SEPARATOR) if text else []:
        head, _, body = clause.partition(": ")
        if not body:
            continue
        if head == "about":
            description = body
        elif head == "use when":
            t, v = _parse_scenario(body)
            when.append(Scenario(text=t, support=1.0, variants=v))
        elif head == "avoid when":
            scenario, _, prefer = body.partition(" -> prefer ")
            t, v = _parse_scenario(scenario)
            when_not.append(WhenNot(text=t, support=1.0, variants=v, prefer=_tool_id(prefer)))
        elif head == "caution":
            precautions.append(Precaution(kind="failure_mode", text=body[:MAX_TEXT], support=1.0))
        elif head in ("confused with", "followed by") and (tool := _tool_id(body)):
            (confusions if head == "confused with" else nexts).append(ToolCount(tool=tool, count=1.0))
    return ToolEntry(
        tool_id=tool_id,
        description=description[:2000],
        when=when[:64],
        when_not=when_not[:64],
        precautions=precautions[:32],
        stats=ToolStats(),
        confusions=confusions[:32],
        next_tools=nexts[:32],
    )


def render_typed(entry: ToolEntry, max_items: int = 8, examples: Sequence[str] = ()) -> str:
    """A labelled, field-by-field view of a tool for an LLM reader.

    ``examples`` are the tool's public example requests (the catalog's). Those
    the entry's experience supports (listed under ``when``,
    :mod:`synapse_flwr.core.scenarios`) are shown first, by support, as
    "requests seen in use"; the rest fill up to :data:`SHOWN_REQUESTS` as
    "example requests". A documentation-only view shows the same number of
    requests, so the two differ only by what experience says.
    """
    lines = [f"tool: {entry.tool_id}"]
    if entry.description:
        lines.append(f"description: {neutralise(entry.description)}")
    requests, phrases = split_when(entry.when, examples)
    used = sorted(requests, key=lambda s: (-s.support, s.text))[:SHOWN_REQUESTS]
    if used:
        lines.append("requests seen in use: " + "; ".join(neutralise(s.text) for s in used))
    shown = {s.text for s in used}
    rest = [x for x in examples if x not in shown][: SHOWN_REQUESTS - len(used)]
    if rest:
        lines.append("example requests: " + "; ".join(neutralise(x) for x in rest))
    top = sorted(phrases, key=lambda s: -s.support)[:max_items]
    if top:
        lines.append("use when: " + "; ".join(neutralise(s.text) for s in top))
    avoid = sorted(entry.when_not, key=lambda s: -s.support)[:max_items]
    if avoid:
        lines.append(
            "do not use when: "
            + "; ".join(neutralise(w.text) + (f" (use {w.prefer} instead)" if w.prefer else "") for w in avoid)
        )
    if entry.precautions:
        lines.append("precautions: " + "; ".join(neutralise(p.text) for p in entry.precautions[:max_items]))
    if entry.stats.calls >= 1:
        lines.append(f"success rate: {entry.stats.success_rate or 0:.0%} of {entry.stats.calls:.0f} calls")
    if entry.confusions:
        lines.append("often confused with: " + ", ".join(c.tool for c in entry.confusions[:max_items]))
    return "\n".join(lines)
