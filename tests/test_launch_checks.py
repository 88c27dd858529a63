"""The Flower launchers refuse a user's mistake before any process starts, and leave no temporary home behind.

Fast: no test here starts a Flower process. Where a run must get as far as
starting one, the first start is replaced by an error ("stop here").
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from synapse_flwr import cli
from synapse_flwr.core.catalog import load_catalog
from synapse_flwr.core.errors import InputError, SynapseError
from synapse_flwr.core.signing import (
    SERVER,
    add_to_registry,
    new_signer,
    save_private_key,
)
from synapse_flwr.data.federation import demo_dir
from synapse_flwr.flower import deploy, launch
from synapse_flwr.flower.config import RunConfig, RunConfigError
from synapse_flwr.flower.deploy import (
    DeploymentConfig,
    NodeSpec,
    check_nodes,
    deployment_refusal,
    run_local_deployment,
    with_node_catalog,
)
from synapse_flwr.flower.launch import (
    absolute_run_config,
    check_dataset,
    check_keys,
    check_output_dir,
    check_resume,
    run_log_dir,
    run_simulation,
)
from synapse_flwr.flower.server_app import federation_catalog

APP_DIR = Path(__file__).resolve().parent.parent
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
CATALOG = [{"name": "city_weather_v2", "description": "Weather forecast for a city."},
           {"name": "hotel_room_booker", "description": "Book a hotel room."}]


def invoke(*args: object):
    """The CLI in this process (its exception, not a log line, is what a test looks at)."""
    return CliRunner().invoke(cli.app, [str(a) for a in args], env=ENV)


@pytest.fixture
def tmp_root(tmp_path, monkeypatch) -> Path:
    """``tempfile``'s folder for this test only: where a launcher's temporary FLWR_HOME would go."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture
def org_data(tmp_path) -> dict[str, Path]:
    """A catalog of two tools, a log valid against it, one naming an unknown tool on line 2."""
    folder = tmp_path / "orgs"
    folder.mkdir()
    (folder / "catalog.json").write_text(json.dumps(CATALOG))
    good = [{"query": "weather in rome", "tool": "city_weather_v2", "success": True},
            {"query": "a room in paris", "tool": "hotel_room_booker", "success": True}]
    (folder / "org_a.jsonl").write_text("".join(json.dumps(e) + "\n" for e in good))
    bad = [good[0], {"query": "pay my rent", "tool": "internal_payroll", "success": True}]
    (tmp_path / "org_bad.jsonl").write_text("".join(json.dumps(e) + "\n" for e in bad))  # the folder stays valid
    return {"catalog": folder / "catalog.json", "good": folder / "org_a.jsonl", "bad": tmp_path / "org_bad.jsonl"}


def started_nothing(tmp_root: Path, *paths: Path) -> None:
    """No temporary home was created (so nothing was staged or started), nor any of ``paths``."""
    assert list(tmp_root.iterdir()) == []
    for path in paths:
        assert not path.exists(), path


# ------------------------------------------------------------------ 1. keys-file


def keys(folder: Path, server_key: bool = True) -> Path:
    """A registry written as `synapse keygen` writes it; the server's private key beside it unless not asked."""
    for owner in ("a", SERVER):
        signer = new_signer(owner)
        add_to_registry(folder / "keys.json", signer)
        if owner != SERVER or server_key:
            save_private_key(folder / f"{owner}.key", signer)
    return folder / "keys.json"


def test_a_relative_keys_file_is_read_from_the_callers_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_run_config({"keys-file": "keys/keys.json"})["keys-file"] == str(tmp_path / "keys" / "keys.json")
    assert absolute_run_config({"keys-file": ""})["keys-file"] == ""  # the demo key set stays the demo key set


def test_the_keys_the_server_loads_are_checked_first(tmp_path):
    good = keys(tmp_path / "good")
    check_keys({"keys-file": str(good)})
    check_keys({"keys-file": ""})  # demo keys: no file
    check_keys({"keys-file": str(tmp_path / "nope.json"), "sign": False})  # signing off: never read
    with pytest.raises(RunConfigError, match=r"'keys-file' '.*nope\.json': no such file"):
        check_keys({"keys-file": str(tmp_path / "nope.json")})
    (tmp_path / "garbage.json").write_text("{not json")
    with pytest.raises(RunConfigError, match="'keys-file' .*garbage.json: cannot read it as JSON"):
        check_keys({"keys-file": str(tmp_path / "garbage.json")})
    (tmp_path / "other.json").write_text(json.dumps({"keys": []}))
    with pytest.raises(RunConfigError, match="'keys-file' .*other.json: expected"):
        check_keys({"keys-file": str(tmp_path / "other.json")})
    no_server_key = keys(tmp_path / "no-server-key", server_key=False)
    with pytest.raises(RunConfigError, match=r"'keys-file' .*private key .*server\.key: cannot load it"):
        check_keys({"keys-file": str(no_server_key)})


@pytest.mark.parametrize("command", ["simulate", "deploy-local"])
def test_the_cli_refuses_a_missing_keys_file_before_starting_anything(tmp_path, tmp_root, monkeypatch, command):
    """Regression: deploy-local started a SuperLink and 3 SuperNodes, then the ServerApp failed with a traceback."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    res = invoke(command, "--set", "keys-file=nope.json", "--set", f"output-dir={json.dumps(str(out))}")
    assert isinstance(res.exception, RunConfigError), res.exception
    assert f"'keys-file' {str(tmp_path / 'nope.json')!r}: no such file" in str(res.exception)
    started_nothing(tmp_root, out)


# ------------------------------------------------------------------ 2. dataset and output-dir


def test_a_dataset_that_is_neither_known_nor_a_folder_is_refused(tmp_path):
    check_dataset({"dataset": "demo"})
    check_dataset({})
    with pytest.raises(RunConfigError, match=r"'dataset' 'nope': not a known dataset \(demo, metatool, taubench\) "
                                             "and no such folder"):
        check_dataset({"dataset": "nope"})
    (tmp_path / "data.jsonl").write_text("")
    with pytest.raises(RunConfigError, match="a file, not a folder"):
        check_dataset({"dataset": str(tmp_path / "data.jsonl")})


def test_the_server_s_catalog_must_load_before_anything_starts(tmp_path):
    """The ServerApp refuses tools outside run config catalog; a file it could not load would fail every round."""
    good = demo_dir() / "catalog.json"
    check_dataset({"catalog": str(good)})
    assert absolute_run_config({"catalog": "catalog.json"})["catalog"] == str(Path("catalog.json").resolve())
    with pytest.raises(RunConfigError, match=r"run config 'catalog' '.*nope\.json': .*file not found"):
        check_dataset({"catalog": str(tmp_path / "nope.json")})
    cfg = RunConfig.from_mapping({"catalog": str(good), "dataset": "metatool"})
    assert federation_catalog(cfg).ids == load_catalog(good).ids  # named, it wins over the dataset's
    with pytest.raises(RuntimeError, match=r"the catalog .*nope\.json is invalid \(see the ServerApp log above\)"):
        federation_catalog(RunConfig.from_mapping({"catalog": str(tmp_path / "nope.json")}))


def test_a_deployment_whose_nodes_share_a_catalog_names_it_for_the_server(tmp_path, org_data):
    one = [NodeSpec(o, org_data["good"], org_data["catalog"]) for o in "ab"]
    assert with_node_catalog({}, one)["catalog"] == str(org_data["catalog"].resolve())
    assert with_node_catalog({"catalog": "/x.json"}, one) == {"catalog": "/x.json"}  # the operator's wins
    copy = tmp_path / "copy.json"
    copy.write_bytes(org_data["catalog"].read_bytes())
    assert with_node_catalog({}, [*one, NodeSpec("c", org_data["good"], copy)])["catalog"] == str(
        org_data["catalog"].resolve())  # copies of one catalog: the same tools
    other = tmp_path / "other.json"
    other.write_text(json.dumps([{"name": "x", "description": "another tool"}]))
    for nodes in ([one[0], NodeSpec("b", org_data["good"], other)],  # two catalogs: the server cannot take both
                  [one[0], NodeSpec("b", org_data["good"])],  # b reads the dataset's
                  [NodeSpec("a", org_data["good"], tmp_path / "nope.json")],  # named by check_nodes, as --catalog
                  3):
        assert "catalog" not in with_node_catalog({}, nodes)


def test_an_output_dir_that_is_a_file_is_refused(tmp_path):
    check_output_dir(tmp_path / "new" / "out")  # created later, by the run
    (tmp_path / "a-file").write_text("")
    with pytest.raises(RunConfigError, match=r"'output-dir' '.*a-file' is a file"):
        check_output_dir(tmp_path / "a-file")
    with pytest.raises(RunConfigError, match=r"cannot be written: .*a-file is a file, not a folder"):
        check_output_dir(tmp_path / "a-file" / "out")


@pytest.mark.parametrize("command", ["simulate", "deploy-local"])
def test_the_cli_refuses_a_bad_dataset_or_output_dir_before_starting_anything(tmp_path, tmp_root, command):
    out = tmp_path / "out"
    res = invoke(command, "--set", "dataset=nope", "--set", f"output-dir={json.dumps(str(out))}")
    assert isinstance(res.exception, RunConfigError) and "not a known dataset" in str(res.exception)
    (tmp_path / "a-file").write_text("")
    res = invoke(command, "--set", f"output-dir={json.dumps(str(tmp_path / 'a-file'))}")
    assert isinstance(res.exception, RunConfigError) and "'output-dir'" in str(res.exception)
    started_nothing(tmp_root, out)


def test_the_python_launchers_check_the_same(tmp_path):
    rc = {"dataset": "nope", "output-dir": str(tmp_path / "out")}
    with pytest.raises(RunConfigError, match="not a known dataset"):
        run_simulation(APP_DIR, 2, rc, flwr_home=tmp_path / "h1")
    with pytest.raises(RunConfigError, match="not a known dataset"):
        run_local_deployment(DeploymentConfig(APP_DIR, 2, rc, flwr_home=tmp_path / "h2"))
    assert not (tmp_path / "h1").exists() and not (tmp_path / "h2").exists()
    (tmp_path / "h3").write_text("")
    with pytest.raises(SynapseError, match="--flwr-home .*h3 is a file"):
        run_simulation(APP_DIR, 2, {"output-dir": str(tmp_path / "out")}, flwr_home=tmp_path / "h3")


def test_a_corrupt_metrics_file_in_the_output_dir_is_refused_before_starting_anything(tmp_path, tmp_root):
    """Regression: it passed the resume check, and the ServerApp then failed with a bare JSONDecodeError."""
    out = tmp_path / "out"
    check_resume(out, {}, 3)  # nothing there: nothing to resume
    out.mkdir()
    (out / "metrics.json").write_text('{"rounds": [{"round": 1}], "run_config": {"epsilon": 4.0}}')
    check_resume(out, {"epsilon": 4.0}, 3)
    with pytest.raises(SynapseError, match="holds rounds of a run with other settings"):
        check_resume(out, {"epsilon": 8.0}, 3)
    # regression: a federation of another size resumed there, merging both and releasing records twice
    (out / "federation.json").write_text('{"nodes": 1}')
    check_resume(out, {"epsilon": 4.0}, 1)
    with pytest.raises(SynapseError, match="holds 1 rounds of a federation of 1 organisations; this run has 3"):
        check_resume(out, {"epsilon": 4.0}, 3)
    # regression (deployment rehearsal): every process started to resume a run with no round left to do
    check_resume(out, {"epsilon": 4.0, "num-rounds": 2}, 1)
    with pytest.raises(SynapseError, match="holds all 1 rounds this run asks for .*nothing to do; --set num-rounds=2"):
        check_resume(out, {"epsilon": 4.0, "num-rounds": 1}, 1)
    (out / "metrics.json").write_text('{"rounds": [')  # a torn write, a hand edit
    with pytest.raises(SynapseError, match=rf"^{out / 'metrics.json'} cannot be read .*JSONDecodeError"):
        check_resume(out, {}, 3)
    for command in ("simulate", "deploy-local"):
        res = invoke(command, "--set", f"output-dir={json.dumps(str(out))}")
        assert isinstance(res.exception, SynapseError), res.exception
        assert "metrics.json cannot be read" in str(res.exception)
    started_nothing(tmp_root, out / "logs")


# ------------------------------------------------------------------ 3. --node


def test_node_org_ids_follow_the_artifacts_rule(org_data):
    check_nodes([NodeSpec("a", org_data["good"], org_data["catalog"])], {})
    for org, words in (("bad org", "use 1-"), ("server", "is reserved"), ("global", "is reserved")):
        with pytest.raises(SynapseError, match=f"node {org!r} .*organisation id .*{words}"):
            check_nodes([NodeSpec(org, org_data["good"], org_data["catalog"])], {})


def test_a_node_that_could_not_sign_is_refused_before_anything_starts(tmp_path, org_data):
    """Regression (deployment rehearsal): a node without its key, or with a key the registry does not list, was
    rejected in every round while the run reported success."""
    from synapse_flwr.core.signing import add_to_registry, new_signer, save_private_key
    from synapse_flwr.flower.deploy import check_node_keys

    keys = tmp_path / "keys"
    for owner in ("a", "server"):
        signer = new_signer(owner)
        save_private_key(keys / f"{owner}.key", signer)
        add_to_registry(keys / "keys.json", signer)
    config = {"sign": True, "keys-file": str(keys / "keys.json")}
    check_node_keys([NodeSpec("a", org_data["good"], org_data["catalog"])], config)
    with pytest.raises(SynapseError, match="node 'b' cannot sign: .*b.key.*synapse keygen b"):
        check_node_keys([NodeSpec("b", org_data["good"], org_data["catalog"])], config)
    save_private_key(keys / "a.key", new_signer("a"))  # another keygen's key: not the registered one
    with pytest.raises(SynapseError, match="node 'a' cannot sign: its key .* is not in the registry"):
        check_node_keys([NodeSpec("a", org_data["good"], org_data["catalog"])], config)
    check_node_keys([NodeSpec("b", org_data["good"], org_data["catalog"])], {**config, "sign": False})


def test_two_organisations_reading_one_log_are_refused(tmp_path, org_data):
    """Regression (deployment rehearsal): each released the same records, so every record was released twice
    while the summary printed one budget."""
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(org_data["good"].read_bytes())
    for other in (org_data["good"], copy):  # the same file, or a copy of it
        with pytest.raises(SynapseError, match="organisations 'a' and 'b' read the same experience"):
            check_nodes([NodeSpec("a", org_data["good"], org_data["catalog"]),
                         NodeSpec("b", other, org_data["catalog"])], {})
    empty_a, empty_b = tmp_path / "ea.jsonl", tmp_path / "eb.jsonl"
    empty_a.touch()
    empty_b.touch()  # two empty logs release nothing twice
    check_nodes([NodeSpec("a", empty_a, org_data["catalog"]), NodeSpec("b", empty_b, org_data["catalog"])], {})


def test_a_nodes_catalog_and_log_must_load(tmp_path, org_data):
    with pytest.raises(InputError, match=r"nope\.json: file not found \(org 'a'"):
        check_nodes([NodeSpec("a", org_data["good"], tmp_path / "nope.json")], {})
    with pytest.raises(InputError) as err:
        check_nodes([NodeSpec("a", org_data["good"], org_data["catalog"]),
                     NodeSpec("b", org_data["bad"], org_data["catalog"])], {})
    assert str(err.value).startswith(f"{org_data['bad']}:2: field 'tool': tool 'internal_payroll'")
    assert f"org 'b': its log checked against the catalog {org_data['catalog']}" in str(err.value)
    # as on separate hosts: handed over unchecked (the server rejects the org), names and files still checked
    check_nodes([NodeSpec("b", org_data["bad"], tmp_path / "nope.json")], {}, check_data=False)
    with pytest.raises(SynapseError, match="experience file of org 'b' not found"):
        check_nodes([NodeSpec("b", tmp_path / "absent.jsonl")], {}, check_data=False)


def test_a_catalog_no_compendium_can_carry_is_refused_before_nodes_or_server_start(org_data, monkeypatch):
    """Every node's first build would fail: the node check and the server's catalog check say so first."""
    monkeypatch.setattr("synapse_flwr.core.catalog.MAX_TOOLS", 1)
    with pytest.raises(SynapseError, match=r"catalog\.json: the catalog holds \d+ tools, a compendium at most 1: "
                                           r"split it into catalogs of at most 1 tools \(one federation each\)$"):
        check_nodes([NodeSpec("a", org_data["good"], org_data["catalog"])], {})
    with pytest.raises(RunConfigError, match=r"run config 'catalog' .*: the catalog holds \d+ tools, a compendium"):
        check_dataset({"catalog": str(org_data["catalog"])})


def test_without_a_catalog_a_nodes_log_must_load_against_the_datasets(org_data):
    """The ClientApp then loads the run config dataset's catalog: the demo's knows no city_weather_v2."""
    with pytest.raises(InputError, match=r"org_a\.jsonl:1: .*the catalog of dataset 'demo' \(no --catalog\)"):
        check_nodes([NodeSpec("a", org_data["good"])], {"dataset": "demo"})
    check_nodes([NodeSpec("a", org_data["good"])], {"dataset": str(org_data["catalog"].parent)})


def test_the_cli_checks_its_nodes_before_starting_anything(tmp_path, tmp_root, org_data):
    out = f"output-dir={json.dumps(str(tmp_path / 'out'))}"
    res = invoke("deploy-local", "--node", f"server={org_data['good']}", "--catalog", org_data["catalog"], "--set", out)
    assert isinstance(res.exception, SynapseError) and "is reserved" in str(res.exception)
    res = invoke("deploy-local", "--node", f"a={org_data['good']}", "--catalog", tmp_path / "nope.json", "--set", out)
    assert isinstance(res.exception, InputError) and "nope.json: file not found" in str(res.exception)
    res = invoke("deploy-local", "--node", f"a={org_data['good']}", "--node", f"b={org_data['bad']}",
                 "--catalog", org_data["catalog"], "--set", out)
    assert isinstance(res.exception, InputError) and f"{org_data['bad']}:2:" in str(res.exception)
    res = invoke("deploy-local", "--node", f"a={org_data['good']}", "--set", out)  # the demo's catalog
    assert isinstance(res.exception, InputError) and "dataset 'demo'" in str(res.exception)
    res = invoke("deploy-local", "--nodes", "0", "--set", out)
    assert res.exit_code != 0 and "--nodes" in (str(res.exception) + res.output)  # here or by typer's min=1
    started_nothing(tmp_root, tmp_path / "out")


def test_deploy_local_refuses_an_inject_it_would_ignore(tmp_path, tmp_root, org_data):
    """Regression: deploy-local accepted run config inject > 0 and ran on the nodes' files unchanged."""
    assert deployment_refusal({"inject": 0.0}) is None and deployment_refusal({}) is None
    assert deployment_refusal({"inject": 0.25}).startswith("run config inject 0.25 is applied by `synapse simulate`")
    out = tmp_path / "out"
    nodes = [NodeSpec("a", org_data["good"], org_data["catalog"])]
    with pytest.raises(SynapseError, match="run config inject 0.5 is applied by `synapse simulate` only"):
        run_local_deployment(DeploymentConfig(APP_DIR, nodes, {"output-dir": str(out), "inject": 0.5}))
    res = invoke("deploy-local", "--nodes", "2", "--set", "inject=0.2", "--set", f"output-dir={json.dumps(str(out))}")
    assert isinstance(res.exception, SynapseError) and "inject 0.2" in str(res.exception)
    started_nothing(tmp_root, out)


# ------------------------------------------------------------------ 4. the temporary home


def stop_at_first_start(*args, **kwargs):
    raise SynapseError("stop here")


def test_a_deployment_removes_its_temporary_home_and_keeps_its_logs(tmp_path, tmp_root, org_data, monkeypatch):
    monkeypatch.setattr(deploy, "_start_federation", stop_at_first_start)
    out = tmp_path / "out"
    copy = tmp_path / "org_b.jsonl"
    copy.write_text(org_data["good"].read_text() + json.dumps({"query": "rain in oslo", "tool": "city_weather_v2",
                                                               "success": True}) + "\n")
    nodes = [NodeSpec("a", org_data["good"], org_data["catalog"]), NodeSpec("b", copy, org_data["catalog"])]
    with pytest.raises(SynapseError, match="stop here"):  # every check passed: it got as far as starting
        run_local_deployment(DeploymentConfig(APP_DIR, nodes, {"output-dir": str(out)}))
    assert list(tmp_root.iterdir()) == []
    with pytest.raises(SynapseError, match="a deployment needs at least one SuperNode, got --nodes 0"):
        run_local_deployment(DeploymentConfig(APP_DIR, 0, {"output-dir": str(out)}))
    assert list(tmp_root.iterdir()) == []
    (logs,) = out.glob("logs/deployment-*")
    assert logs.is_dir()


def test_a_simulation_removes_its_temporary_home_but_keeps_a_given_one(tmp_path, tmp_root, monkeypatch):
    monkeypatch.setattr(launch, "_start_managed_superlink", stop_at_first_start)
    out = tmp_path / "out"
    for _ in range(2):  # the second run's logs do not replace the first's
        with pytest.raises(SynapseError, match="stop here"):
            run_simulation(APP_DIR, 2, {"output-dir": str(out)})
    assert list(tmp_root.iterdir()) == []
    assert len(list(out.glob("logs/simulation-*"))) == 2
    with pytest.raises(SynapseError, match="stop here"):
        run_simulation(APP_DIR, 2, {"output-dir": str(out)}, flwr_home=tmp_path / "home")
    assert (tmp_path / "home" / "config.toml").is_file()  # asked for: kept


def test_run_log_dirs_are_distinct(tmp_path):
    first, second = run_log_dir(tmp_path, "simulation"), run_log_dir(tmp_path, "simulation")
    assert first != second and first.is_dir() and second.is_dir() and first.parent == tmp_path / "logs"
    (tmp_path / "file").write_text("")
    with pytest.raises(SynapseError, match="'output-dir' .*file.*: cannot create its log folder"):
        run_log_dir(tmp_path / "file", "simulation")


def test_a_long_round_is_reported_as_still_running(tmp_path, monkeypatch, caplog):
    run = launch.Launch("simulation", APP_DIR, {"output-dir": str(tmp_path / "out")}, None, "synapse-flwr-sim-", 3)
    clock, rounds = [1000.0], []
    monkeypatch.setattr(launch.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(launch, "read_metrics", lambda _: rounds)
    run.t0 = 1000.0
    said = []

    def step(at: float, seen: int) -> int:
        clock[0] = at
        caplog.clear()
        with caplog.at_level("INFO", logger=launch.log.name):
            seen = run.progress(seen)
        said.append([r.getMessage() for r in caplog.records])
        return seen

    seen = step(1001.0, 0)
    seen = step(1001.0 + launch.STILL_RUNNING_S - 1, seen)
    seen = step(1001.0 + launch.STILL_RUNNING_S, seen)
    assert said[:2] == [[], []] and len(said[2]) == 1
    assert said[2][0].startswith("simulation: round 1/") and "still running, 2 min into the run" in said[2][0]
    rounds.append({"round": 1, "accepted": ["a"], "rejected": [], "bytes_per_client": 10, "conflicts": 0})
    seen = step(1001.0 + launch.STILL_RUNNING_S + 30, seen)  # a finished round resets the silence
    seen = step(1001.0 + 2 * launch.STILL_RUNNING_S + 29, seen)
    assert seen == 1 and said[3] and "round 1/" in said[3][0] and " done:" in said[3][0] and said[4] == []


def test_a_run_waiting_for_more_nodes_than_take_part_is_refused_before_anything_starts(tmp_path, tmp_root):
    """Regression: `synapse simulate --nodes 1` (min-nodes 2) waited 300 s a round, merged nothing and reported
    success with the empty global it started from."""
    out = tmp_path / "out"
    for command, nodes in (("simulate", ["--nodes", "1"]), ("deploy-local", ["--nodes", "1"])):
        res = invoke(command, *nodes, "--set", f"output-dir={json.dumps(str(out))}")
        assert isinstance(res.exception, SynapseError), res.exception
        assert "'min-nodes' 2: only 1 organisation take part" in str(res.exception)
        assert "--set min-nodes=1" in str(res.exception)
    started_nothing(tmp_root, out / "logs")


def test_a_flower_home_with_its_own_config_is_not_overwritten(tmp_path, tmp_root):
    """Regression: --flwr-home ~/.flwr replaced the operator's config.toml (their SuperLink connections)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[superlink.prod]\naddress = "prod:9093"\n')
    res = invoke("simulate", "--flwr-home", str(home), "--set", f"output-dir={json.dumps(str(tmp_path / 'out'))}")
    assert isinstance(res.exception, SynapseError) and "holds a Flower config.toml of its own" in str(res.exception)
    assert "prod:9093" in (home / "config.toml").read_text()
    started_nothing(tmp_root, tmp_path / "out" / "logs")
    # a home the launchers made holds their own config: not refused
    from synapse_flwr.flower.launch import launcher_config

    (home / "config.toml").write_text('[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n')
    assert launcher_config(home / "config.toml")


def test_benchmark_data_and_a_relative_data_dir_are_checked_and_resolved_before_any_process(tmp_path, monkeypatch):
    """Regression: a relative SYNAPSE_DATA_DIR reached Flower's processes unchanged (another working folder),
    and a named benchmark was first looked for there, after SuperLink and Ray had started."""
    from synapse_flwr.data.pins import ENV_VAR
    from synapse_flwr.flower.config import RunConfigError
    from synapse_flwr.flower.launch import check_dataset, flower_env

    data = tmp_path / "data"
    (data / "metatool").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV_VAR, "data")
    assert flower_env(tmp_path / "home", "t")[ENV_VAR] == str(data)
    check_dataset({"dataset": "metatool"})
    with pytest.raises(RunConfigError, match="'dataset' 'taubench': .*holds no taubench-retail/"):
        check_dataset({"dataset": "taubench"})
    monkeypatch.setenv(ENV_VAR, "nowhere")
    with pytest.raises(RunConfigError, match="'dataset' 'metatool': SYNAPSE_DATA_DIR='nowhere' is not a folder"):
        check_dataset({"dataset": "metatool"})


def test_a_release_cache_no_client_could_write_is_refused_before_anything_starts(tmp_path, tmp_root):
    """Regression: every ClientApp failed every round on it, and the run ended saying nothing was merged."""
    (tmp_path / "file").write_text("")
    res = invoke("simulate", "--set", f"output-dir={json.dumps(str(tmp_path / 'out'))}",
                 "--set", f"release-cache={json.dumps(str(tmp_path / 'file' / 'cache'))}")
    assert isinstance(res.exception, SynapseError), res.exception
    assert "run config 'release-cache'" in str(res.exception)
    started_nothing(tmp_root, tmp_path / "out" / "logs")


def test_a_second_launcher_in_a_held_output_folder_is_refused(tmp_path):
    """Regression: two launchers in one output folder both saw no rounds and both released every record."""
    out = tmp_path / "out"
    first = launch.Launch("simulation", APP_DIR, {"output-dir": str(out)}, tmp_path / "h1", "synapse-flwr-sim-", 1)
    second = launch.Launch("simulation", APP_DIR, {"output-dir": str(out)}, tmp_path / "h2", "synapse-flwr-sim-", 1)
    with first.opened():
        assert (out / launch.LOCK_FILE).read_text().strip() == str(os.getpid())
        with pytest.raises(SynapseError, match=rf"{out} is the output folder of a run still going \(launcher pid "
                                               rf"{os.getpid()}\).*--set output-dir=PATH"), second.opened():
            pass
        assert not (tmp_path / "h2").exists()  # refused before its home was made
        # the first run ends having written every round this config asks for
        rounds = [{"round": r} for r in range(1, first.num_rounds + 1)]
        (out / "metrics.json").write_text(json.dumps({"rounds": rounds, "run_config": {}}))
    # released with the run; the second launcher checked before those rounds existed and now finds them
    with pytest.raises(SynapseError, match="nothing to do"), second.opened():
        pass
    with launch.output_lock(tmp_path / "other"):
        pass


@pytest.mark.parametrize("staged", [False, True])
def test_the_app_bundle_leaves_the_committed_results_out(tmp_path, staged):
    """Regression (docs review): `flwr run .` bundled docs/results, 8 of Flower's 10 MB; the bundle is built from
    the checkout (the Quickstart) and from the launchers' staged copy, and Flower refuses a fab-exclude pattern
    that matches nothing in either."""
    import subprocess
    import zipfile

    app = launch.stage_app(APP_DIR, tmp_path / "app") if staged else APP_DIR
    out = tmp_path / "fab"
    out.mkdir()
    res = subprocess.run([str(Path(sys.executable).parent / "flwr"), "build", "--app", str(app)], cwd=out,
                         capture_output=True, text=True, timeout=120, check=False)
    fabs = list(out.glob("*.fab"))
    assert res.returncode == 0 and len(fabs) == 1, res.stdout + res.stderr
    names = zipfile.ZipFile(fabs[0]).namelist()
    assert "synapse_flwr/flower/server_app.py" in names and not any(n.startswith("docs/results/") for n in names)
    assert fabs[0].stat().st_size < 5 * 1024 * 1024
