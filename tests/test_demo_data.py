"""The embedded demo dataset: parses, has the promised shape, and regenerates exactly."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import pytest

import synapse_flwr
from synapse_flwr.core import experience
from synapse_flwr.core.catalog import Catalog, load_catalog
from synapse_flwr.core.experience import Event, load_experience, load_testset

DEMO = Path(synapse_flwr.__file__).parent / "data" / "demo"
SCRIPT = Path(__file__).resolve().parent.parent / "simulations" / "make_demo.py"
ORGS = ("org_a", "org_b", "org_c")
FILES = ("catalog.json", "org_a.jsonl", "org_b.jsonl", "org_c.jsonl", "test.jsonl", "README.md")
DOC_ONLY = {"get_baggage_policy", "get_visa_requirements", "apply_promo_code"}


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(DEMO / "catalog.json")


@pytest.fixture(scope="module")
def logs(catalog: Catalog) -> dict[str, list[Event]]:
    return {org: load_experience(DEMO / f"{org}.jsonl", catalog) for org in ORGS}


@pytest.fixture(scope="module")
def testset(catalog: Catalog) -> list[experience.TestItem]:
    return load_testset(DEMO / "test.jsonl", catalog)


def _success_rate(events: list[Event], tool: str) -> float:
    calls = [e for e in events if e.tool == tool]
    return sum(e.success for e in calls) / len(calls)


def contradictions(logs: dict[str, list[Event]]) -> set[tuple[str, str]]:
    """``(query, tool)`` pairs that mostly succeed in one org and mostly fail in another."""
    outcomes: dict[tuple[str, str], dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for org, events in logs.items():
        for e in events:
            outcomes[(e.query.casefold(), e.tool)][org].append(e.success)
    found = set()
    for key, by_org in outcomes.items():
        verdicts = {sum(v) * 2 >= len(v) for v in by_org.values()}
        if len(verdicts) == 2:
            found.add(key)
    return found


def test_catalog_uses_all_three_shapes_and_collapses_the_alias(catalog: Catalog) -> None:
    raw = json.loads((DEMO / "catalog.json").read_text(encoding="utf-8"))
    shapes = ["openai" if "function" in e else "mcp" if "inputSchema" in e else "plain" for e in raw]
    assert shapes.count("plain") > shapes.count("openai") >= 2
    assert shapes.count("mcp") >= 2
    assert len(catalog) == len(raw) - 1
    assert 18 <= len(catalog) <= 24
    assert catalog.resolve("GetWeather") == catalog.resolve("get_weather") == "get_weather"
    assert catalog.get("get_weather").aliases == ("GetWeather",)
    assert all(doc.description and doc.parameters for doc in catalog.tools)


def test_experience_counts_and_fields(logs: dict[str, list[Event]]) -> None:
    for org, events in logs.items():
        assert 150 <= len(events) <= 250, org
        assert {e.org for e in events} == {org}
        failures = [e for e in events if not e.success]
        assert 0.08 <= len(failures) / len(events) <= 0.17, org
        assert any(e.gold and e.gold != e.tool for e in failures), f"{org}: no wrong-tool failure"
        assert any(e.gold is None for e in failures), f"{org}: no tool-error failure"
        assert all(e.gold == e.tool for e in events if e.success)
        assert sum(e.prev_tool is not None for e in events) >= 10, org
        stamps = [datetime.fromisoformat(str(e.ts).replace("Z", "+00:00")) for e in events]
        assert stamps == sorted(stamps), f"{org}: timestamps out of order"


def test_experience_is_non_iid_with_shared_tools(logs: dict[str, list[Event]]) -> None:
    used = {org: {e.tool for e in events if e.success} for org, events in logs.items()}
    for org, tools in used.items():
        others = set().union(*(t for o, t in used.items() if o != org))
        assert len(tools - others) >= 2, f"{org} has no tools of its own"
    shared = [tool for tool in set().union(*used.values()) if sum(tool in t for t in used.values()) >= 2]
    assert len(shared) >= 5


def test_raw_logs_use_the_alias_spelling() -> None:
    raw = (DEMO / "org_c.jsonl").read_text(encoding="utf-8")
    assert '"tool": "GetWeather"' in raw


def test_queries_carry_pii_for_masking(logs: dict[str, list[Event]]) -> None:
    queries = [e.query for events in logs.values() for e in events]
    assert sum(bool(re.search(r"[\w.]+@[\w.]+\.\w+", q)) for q in queries) >= 10
    assert sum(bool(re.search(r"\+\d{1,2} [\d ()-]{8,}", q)) for q in queries) >= 5
    assert sum(bool(re.search(r"#W\d{7}", q)) for q in queries) >= 50


def test_planted_contradictions(logs: dict[str, list[Event]]) -> None:
    found = contradictions(logs)
    assert len(found) >= 10
    assert {tool for _, tool in found} >= {"convert_currency", "translate_text", "reset_password"}
    crypto = {q for q, tool in found if tool == "convert_currency"}
    assert all(q in {e.query.casefold() for e in logs["org_b"] if e.success} for q in crypto)


def test_one_org_logs_much_lower_success_for_a_shared_tool(logs: dict[str, list[Event]]) -> None:
    assert _success_rate(logs["org_a"], "translate_text") < 0.5
    assert _success_rate(logs["org_b"], "translate_text") >= 0.9
    assert _success_rate(logs["org_c"], "translate_text") >= 0.9


def test_testset(logs: dict[str, list[Event]], testset: list[experience.TestItem]) -> None:
    assert 110 <= len(testset) <= 140
    seen = {t for events in logs.values() for e in events for t in (e.tool, e.gold, e.prev_tool) if t}
    assert not DOC_ONLY & seen
    assert sum(bool(DOC_ONLY & set(item.gold)) for item in testset) >= 18
    assert sum(len(item.gold) > 1 for item in testset) >= 3
    train = {e.query.casefold() for events in logs.values() for e in events}
    queries = [item.query.casefold() for item in testset]
    assert not train & set(queries)
    assert len(set(queries)) == len(queries)


def test_generator_reproduces_committed_files(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], check=True, capture_output=True)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (DEMO / name).read_bytes(), name
