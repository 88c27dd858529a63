"""Shared test setup: make the hypothesis strategies importable, keep tests offline."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


@pytest.fixture(autouse=True)
def _fresh_llm_breakers():
    """Each test starts with no model's failed calls counted (a test that fails calls on purpose would pause
    the model for the next tests)."""
    from synapse_flwr.core.llm import reset_breakers

    reset_breakers()
    yield
