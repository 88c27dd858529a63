"""The scale generator: large catalogs and replicated artifacts stay valid and keep a tool's structure."""

from __future__ import annotations

import pytest
from synapse_flwr.simulations.catalog_gen import (
    GENERATED_PREFIX,
    replicate_artifact,
    replicate_org,
    scaled_catalog,
)
from test_datasets import needs_data

from synapse_flwr.core.catalog import ToolDoc, make_catalog
from synapse_flwr.core.phrases import token_jaccard
from synapse_flwr.core.schema import (
    Compendium,
    Issuer,
    Scenario,
    ToolCount,
    ToolEntry,
    WhenNot,
)
from synapse_flwr.core.wire import canonical_json

REAL = make_catalog(ToolDoc(t, t, f"Does {t} things. Second sentence about {t}.") for t in ("alpha", "beta", "gamma"))


def _art() -> Compendium:
    def entry(t: str, other: str) -> ToolEntry:
        return ToolEntry(
            tool_id=t, description="x",
            when=[Scenario(text=f"{t} weather forecast", support=5.0, orgs=["o"]),
                  Scenario(text=f"{t} weather today", support=3.0, variants=["weather now"], orgs=["o"])],
            when_not=[WhenNot(text="stock prices", support=2.0, orgs=["o"], prefer=other)],
            confusions=[ToolCount(tool=other, count=1.0)],
        )
    return Compendium(issuer=Issuer(org="o", round=1), tools=[entry("alpha", "beta"), entry("beta", "alpha")])


def test_scaled_catalog_keeps_real_tools_then_generates():
    cat = scaled_catalog(10, seed=1, real=REAL)
    assert len(cat) == 10
    assert {"alpha", "beta", "gamma"} <= set(cat.ids)
    generated = [d for d in cat.tools if d.tool_id.startswith(GENERATED_PREFIX)]
    assert len(generated) == 7 and all(d.description for d in generated)
    assert scaled_catalog(10, seed=1, real=REAL) == cat  # deterministic
    assert len(scaled_catalog(2, real=REAL)) == 2


def test_replicated_artifact_is_valid_and_replicas_are_disjoint():
    cat = scaled_catalog(7, seed=0, real=REAL)
    big = replicate_artifact(_art(), cat)
    Compendium.model_validate_json(canonical_json(big))  # schema-valid, re-validated from bytes
    assert [t.tool_id for t in big.tools] == cat.ids
    by_id = {t.tool_id: t for t in big.tools}
    texts = [{s.text for s in t.when} for t in big.tools]
    assert all(a.isdisjoint(b) for i, a in enumerate(texts) for b in texts[i + 1:])
    # pointers stay inside the catalog, and the similarity inside a tool is the real one
    for t in big.tools:
        assert all(c.tool in by_id for c in t.confusions)
        assert all(w.prefer is None or w.prefer in by_id for w in t.when_not)
        a, b = (s.text for s in t.when)
        assert token_jaccard(a, b) == pytest.approx(token_jaccard("alpha weather forecast", "alpha weather today"))


def test_replicated_org_is_renamed_and_varied():
    other = replicate_org(_art(), "org7", seed=3, keep=0.5)
    Compendium.model_validate_json(canonical_json(other))
    assert other.issuer.org == "org7"
    assert all(s.orgs == ["org7"] for t in other.tools for s in (*t.when, *t.when_not))
    assert canonical_json(other) != canonical_json(_art())


@needs_data
def test_real_catalog_scales_to_3180():
    cat = scaled_catalog(3180, seed=0)
    assert len(cat) == 3180
    assert sum(not d.tool_id.startswith(GENERATED_PREFIX) for d in cat.tools) > 199  # real plugin manifests too


@needs_data
def test_the_scale_folder_is_a_dataset_folder_with_taught_and_held_out_generated_tools(tmp_path):
    from synapse_flwr.simulations.scale_folder import (
        HELD_OUT_TEST,
        REAL_TEST,
        write_scale_folder,
    )

    from synapse_flwr.data.check import require_valid
    from synapse_flwr.data.federation import load_folder

    tools, events, test = write_scale_folder(tmp_path, 1000, 0)
    report = require_valid(tmp_path)
    assert report.tools == tools == 1000 and sum(report.orgs.values()) == events and report.test == test
    data = load_folder(tmp_path)
    held_out = {g for item in data.heldout_test for g in item.gold}
    assert held_out and all(g.startswith(GENERATED_PREFIX) for g in held_out)
    assert len(data.heldout_test) == min(HELD_OUT_TEST, len(held_out)) and test > REAL_TEST + len(held_out)
