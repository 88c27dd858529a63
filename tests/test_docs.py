"""Committed docs stay in step with the code."""

import json
from pathlib import Path

from synapse_flwr.core.schema import json_schema

ROOT = Path(__file__).resolve().parent.parent


def test_committed_json_schema_is_current():
    committed = json.loads((ROOT / "docs" / "compendium.schema.json").read_text())
    assert committed == json_schema(), "regenerate with: synapse schema -o docs/compendium.schema.json"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert ".venv/bin/python -m pytest" in readme and ".venv/bin/python -m pytest" in ci
