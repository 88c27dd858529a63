"""The typed run config: one declaration per key, equal to pyproject's, clear errors."""

import math
import os
import subprocess
import sys
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from synapse_flwr.core.merge import POLICIES
from synapse_flwr.flower.config import (
    KEYS,
    RESUMABLE,
    RunConfig,
    RunConfigError,
    check_overrides,
    resume_conflict,
)

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_defaults_are_the_declared_defaults():
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert doc["tool"]["flwr"]["app"]["config"] == {k.name: k.default for k in KEYS}


def test_every_key_is_a_field_in_order():
    assert [f.name for f in fields(RunConfig)] == [k.field for k in KEYS]


def test_defaults_and_overrides_parse():
    cfg = RunConfig.from_mapping({})
    assert cfg.epsilon == 4.0 and cfg.delta == 1e-5 and cfg.policy in POLICIES and cfg.private
    cfg = RunConfig.from_mapping({"epsilon": math.inf, "num-rounds": 2, "alpha": 1})
    assert not cfg.private and cfg.num_rounds == 2 and cfg.alpha == 1.0
    assert RunConfig.from_mapping(cfg.to_mapping()) == cfg


def test_a_run_resumes_only_rounds_of_its_own_settings():
    recorded = RunConfig.from_mapping({"num-rounds": 2}).to_mapping()
    # more rounds, another timeout or no evaluation: the same run, continued
    again = {**recorded, "num-rounds": 5, "round-timeout": 60.0, "evaluate": False, "fusion-votes": False}
    assert resume_conflict("out", recorded, again) is None
    assert RESUMABLE <= set(recorded)
    # anything that shaped the artifacts on disk is another run
    reason = resume_conflict("out", recorded, {**recorded, "epsilon": 8.0, "embedder": "static"})
    assert "out" in reason and "epsilon 4.0 -> 8.0" in reason and "embedder 'minilm' -> 'static'" in reason
    assert "output-dir" in reason
    # a key an older metrics.json did not record is not compared
    assert resume_conflict("out", {k: v for k, v in recorded.items() if k != "seed"}, {**recorded, "seed": 1}) is None
    # the default release caches' folder named outright is the same folder (refused, and told to remove it)
    assert recorded["release-cache"] == ""
    assert resume_conflict("out", recorded, {**recorded, "release-cache": "out/release-cache"}) is None
    # under replay every window is calibrated for num-rounds releases: another count is another run
    replay = {**recorded, "replay": True}
    assert "num-rounds 2 -> 3" in resume_conflict("out", replay, {**replay, "num-rounds": 3})
    moved = resume_conflict("out", recorded, {**recorded, "release-cache": "elsewhere"})
    assert "release-cache" in moved and "keeping the release caches" in moved and "remove" not in moved


@pytest.mark.parametrize(
    ("values", "named", "says"),
    [
        ({"epsilom": 4.0}, "epsilom", "unknown"),
        ({"epsilon": "4"}, "epsilon", "expected float"),
        ({"epsilon": 0.0}, "epsilon", "must be in (0.0"),
        ({"epsilon": math.nan}, "epsilon", "must be in"),
        ({"num-rounds": 0}, "num-rounds", "must be in [1"),
        ({"num-rounds": 2.5}, "num-rounds", "expected int"),
        ({"num-rounds": True}, "num-rounds", "expected int"),
        ({"policy": "fedavg"}, "policy", "must be one of typed"),
        ({"replay": "yes"}, "replay", "expected bool"),
        ({"inject": 1.5}, "inject", "must be in [0.0, 1.0]"),
        ({"embedder": "tfidf"}, "embedder", "must be one of"),
        ({"evaluate": 1}, "evaluate", "expected bool"),
        ({"delta": 0.5}, "delta", "must be in (0.0, 0.1]"),
    ],
)
def test_bad_values_name_the_key(values, named, says):
    with pytest.raises(RunConfigError) as err:
        RunConfig.from_mapping(values)
    assert repr(named) in str(err.value) and says in str(err.value)
    with pytest.raises(RunConfigError):
        check_overrides(values)


def test_strategies_and_simulations_are_not_top_level_modules(tmp_path):
    code = (
        "import importlib.util as u, synapse_flwr.strategies, synapse_flwr.simulations.experiment;"
        "print(u.find_spec('strategies'), u.find_spec('simulations'))"
    )
    # a fresh interpreter outside the checkout, with no inherited search path (Ray sets PYTHONPATH)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["None", "None"], out.stdout + out.stderr


def test_every_entry_point_defaults_to_the_documented_budget():
    """The run config, `synapse build`, `synapse experiment` and the docs' tables share one budget."""
    import inspect
    import re

    from synapse_flwr.simulations.experiment_config import ExperimentConfig

    from synapse_flwr.cli import build
    from synapse_flwr.core.privacy import DEFAULT_DELTA, DEFAULT_EPSILON

    assert (DEFAULT_EPSILON, DEFAULT_DELTA) == (4.0, 1e-5)
    run = RunConfig.from_mapping({})
    exp = ExperimentConfig(name="x", dataset="demo")
    params = inspect.signature(build).parameters
    for eps, delta in ((run.epsilon, run.delta), (exp.epsilon, exp.delta),
                       (params["epsilon"].default, params["delta"].default)):
        assert (eps, delta) == (DEFAULT_EPSILON, DEFAULT_DELTA)
    deployment = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    assert re.search(r"^\| `epsilon` \| `(\S+)` \|", deployment, re.MULTILINE).group(1) == f"{DEFAULT_EPSILON:g}.0"
    experiments = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    assert re.search(r"^\| `federated_private` \| .*\((\S+) by default", experiments, re.MULTILINE).group(1) == \
        f"{DEFAULT_EPSILON:g}"


def test_a_clientapp_process_logs_its_info_lines_to_the_node_s_log():
    """Regression (deployment rehearsal): a flwr-clientapp process set up Flower's logger only, so the per-round
    counts ('... released now ...') never reached the SuperNode's log; a process with logging set up is left alone."""
    import subprocess
    import sys

    code = ("import logging; from synapse_flwr.flower.client_app import log_to_node; {setup}log_to_node(); "
            "logging.getLogger('synapse_flwr.flower.client_app').info('acme round 1: 3 released now')")
    bare = subprocess.run([sys.executable, "-c", code.format(setup="")], capture_output=True, text=True, check=True)
    assert "INFO synapse_flwr.flower.client_app: acme round 1: 3 released now" in bare.stderr
    configured = subprocess.run([sys.executable, "-c", code.format(setup="logging.basicConfig(level=logging.ERROR); ")],
                                capture_output=True, text=True, check=True)
    assert "released now" not in configured.stderr
