"""What a builder or a merge produces fits the wire: an over-budget artifact is trimmed, least support first."""

from __future__ import annotations

import pytest

from synapse_flwr.core.budget import fit_wire_budget, fits
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.schema import (
    Claim,
    Compendium,
    Conflict,
    Issuer,
    Precaution,
    Scenario,
    ToolEntry,
    ToolStats,
    WhenNot,
)
from synapse_flwr.core.wire import ArtifactError, decode, encode

TOOLS = 60


def _scenario(kind: type, tool: int, j: int, orgs: list[str]) -> Scenario:
    # words of its own: no two scenarios are similar enough for the merge to group them
    return kind(text=" ".join(f"t{tool}s{j}w{k}" for k in range(28)), support=float(j + 1),
                variants=[f"variant {v} of {j}" for v in range(8)], orgs=orgs)


def _heavy(kind: str) -> Compendium:
    """An artifact whose lists are all within the schema's bounds yet far over the wire's budget."""
    orgs = ["a", "b"] if kind == "global" else ["a"]  # an org artifact attributes only to its issuer
    tools = [ToolEntry(tool_id=f"t{i:03d}", description=f"Tool {i}.", stats=ToolStats(calls=9.0, successes=8.0),
                       when=[_scenario(Scenario, i, j, orgs) for j in range(64)],
                       when_not=[_scenario(WhenNot, i, j, orgs) for j in range(64)],
                       precautions=[Precaution(kind="dissent", text=f"caveat {j}", support=float(j)) for j in range(32)])
             for i in range(TOOLS)]
    conflicts = [Conflict(tool_id=f"t{i:03d}", field="when", subject=f"s{j}", policy="typed", resolution="kept",
                          claims=[Claim(view="when", support=float(j), orgs=["a"]),
                                  Claim(view="when_not", support=1.0, orgs=["b"])])
                 for i in range(TOOLS) for j in range(16)] if kind == "global" else []
    return Compendium(kind=kind, issuer=Issuer(org="global" if kind == "global" else "a", round=3),
                      policy="typed" if kind == "global" else None, tools=tools, conflicts=conflicts)


def test_an_artifact_that_fits_is_returned_unchanged():
    small = _heavy("org").model_copy(update={"tools": [ToolEntry(tool_id="t", description="d.")]})
    assert fits(small) and fit_wire_budget(small) is small


@pytest.mark.parametrize("kind", ["org", "global"])
def test_an_over_budget_artifact_is_trimmed_least_support_first_until_it_decodes(kind):
    heavy = _heavy(kind)
    with pytest.raises(ArtifactError, match="exceeds the budget"):
        decode(encode(heavy))
    fitted = fit_wire_budget(heavy)
    assert fits(fitted) and decode(encode(fitted)).tools == fitted.tools
    for before, after in zip(heavy.tools, fitted.tools, strict=True):
        # what routing reads is never trimmed
        assert (after.tool_id, after.description, after.stats) == (before.tool_id, before.description, before.stats)
        for field in ("when", "when_not", "precautions"):
            kept, every = getattr(after, field), getattr(before, field)
            assert kept == [s for s in every if s in kept]  # in their order
            assert not kept or min(s.support for s in kept) >= max(
                (s.support for s in every if s not in kept), default=0.0)
    if kind == "global":  # the log goes first, and what it drops is counted
        assert not fitted.conflicts
        assert sum(d.count for d in fitted.conflicts_dropped) == len(heavy.conflicts)


def test_a_merge_never_produces_a_global_the_wire_refuses():
    """Two orgs that list the same texts under when and when_not: a conflict log and lists over the budget."""
    org = _heavy("org")
    merged = merge_typed([org, org.model_copy(update={"issuer": Issuer(org="b", round=3)})])
    assert fits(merged) and max(len(e.when) for e in merged.tools) < 64  # trimmed to fit
    assert decode(encode(merged)).tools == merged.tools
