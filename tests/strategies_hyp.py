"""Hypothesis strategies that generate schema-valid organisation artifacts."""

from __future__ import annotations

from hypothesis import strategies as st

from synapse_flwr.core.schema import (
    Compendium,
    Issuer,
    Precaution,
    Provenance,
    Scenario,
    ToolCount,
    ToolEntry,
    ToolStats,
    WhenNot,
)

TOOLS = ["alpha", "beta", "gamma", "delta"]
WORDS = ["weather", "forecast", "hotel", "booking", "rain", "price", "crypto", "order", "refund"]

supports = st.floats(min_value=0.0, max_value=50.0, allow_nan=False).map(lambda x: round(x, 4))
phrases = st.lists(st.sampled_from(WORDS), min_size=1, max_size=2, unique=True).map(" ".join)


@st.composite
def tool_entries(draw, tool_id: str, org: str) -> ToolEntry:
    when_texts = draw(st.lists(phrases, max_size=4, unique=True))
    not_texts = draw(st.lists(phrases, max_size=3, unique=True))
    calls = draw(supports)
    successes = round(draw(st.floats(0.0, 1.0)) * calls, 4)
    others = [t for t in TOOLS if t != tool_id]
    return ToolEntry(
        tool_id=tool_id,
        description=f"{tool_id} does things",
        when=sorted(
            (Scenario(text=t, support=draw(supports), orgs=[org]) for t in when_texts),
            key=lambda s: s.text,
        ),
        when_not=sorted(
            (
                WhenNot(
                    text=t,
                    support=draw(supports),
                    orgs=[org],
                    prefer=draw(st.sampled_from([None, *others])),
                )
                for t in not_texts
            ),
            key=lambda s: (s.text, s.prefer or ""),
        ),
        precautions=[
            Precaution(kind="failure_mode", text=f"failed for '{t}'", support=1.0, orgs=[org])
            for t in sorted(draw(st.lists(phrases, max_size=2, unique=True)))
        ],
        stats=ToolStats(calls=calls, successes=successes, starts=draw(supports)),
        confusions=[
            ToolCount(tool=t, count=draw(supports))
            for t in sorted(draw(st.lists(st.sampled_from(others), max_size=2, unique=True)))
        ],
        next_tools=[
            ToolCount(tool=t, count=draw(supports))
            for t in sorted(draw(st.lists(st.sampled_from(others), max_size=2, unique=True)))
        ],
        provenance=Provenance(orgs=[org], rounds=[1]),
    )


@st.composite
def org_artifacts(draw, org: str | None = None) -> Compendium:
    org = org or draw(st.sampled_from(["org0", "org1", "org2", "org3"]))
    tool_ids = sorted(draw(st.lists(st.sampled_from(TOOLS), min_size=1, max_size=4, unique=True)))
    return Compendium(
        kind="org",
        issuer=Issuer(org=org, round=draw(st.integers(0, 3))),
        tools=[draw(tool_entries(t, org)) for t in tool_ids],
    )


artifact_lists = st.lists(org_artifacts(), min_size=1, max_size=4)
