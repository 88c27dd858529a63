"""Integration tests: the Flower app under simulation and as a real local deployment.

Each test starts real Flower processes (a managed SuperLink with the Ray
simulation engine, or a SuperLink with SuperNodes) with its own FLWR_HOME
under ``tmp_path`` and free ports, and checks that none of them outlives it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.schema import Compendium
from synapse_flwr.core.signing import (
    SERVER,
    add_to_registry,
    new_signer,
    save_private_key,
)
from synapse_flwr.core.wire import load_artifact
from synapse_flwr.data.federation import demo_dir
from synapse_flwr.flower import launch
from synapse_flwr.flower.config import RunConfig, RunConfigError
from synapse_flwr.flower.deploy import (
    DeploymentConfig,
    NodeSpec,
    nodes_from_dataset,
    run_local_deployment,
)
from synapse_flwr.flower.launch import read_metrics, run_simulation
from synapse_flwr.flower.processes import cmdline, processes_using_home

APP_DIR = Path(__file__).resolve().parent.parent
INF = math.inf

CATALOG = [
    {"name": "get_weather", "description": "Weather forecast for a city."},
    {"type": "function", "function": {"name": "book_hotel", "description": "Book a hotel room.",
                                      "parameters": {"type": "object"}}},
    {"name": "convert_currency", "description": "Convert money.", "inputSchema": {"type": "object"}},
]
TEMPLATES = {
    "get_weather": ["weather forecast for berlin", "is it sunny in rome today", "will it rain in paris"],
    "book_hotel": ["book a hotel room in paris", "hotel booking near the airport",
                   "reserve a hotel in rome for two nights"],
    "convert_currency": ["convert 5 usd to eur", "exchange rate dollar to yen", "convert money to pounds"],
}


def small_dataset(folder: Path, seed: int = 0) -> Path:
    """Three orgs in the generic formats, with a planted cross-org contradiction.

    Orgs ``a`` and ``c`` route crypto price questions to ``convert_currency``
    successfully; org ``b`` logs the same calls as failures.
    """
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "catalog.json").write_text(json.dumps(CATALOG))
    for org in ("a", "b", "c"):
        events = []
        for i in range(40):
            tool = rng.choice(sorted(TEMPLATES))
            query = f"{rng.choice(TEMPLATES[tool])} {i}"
            events.append({"query": query, "tool": tool, "success": True, "gold": tool, "org": org})
        for i in range(6):
            events.append({"query": f"crypto prices bitcoin now {i}", "tool": "convert_currency",
                           "success": org != "b", "org": org})
        (folder / f"org_{org}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return folder


def dataset(tmp_path: Path) -> str:
    """The embedded demo when it is there, else a small folder dataset."""
    if (demo_dir() / "catalog.json").is_file() and len(list(demo_dir().glob("org_*.jsonl"))) == 3:
        return "demo"
    return str(small_dataset(tmp_path / "dataset"))


def ray_titled() -> set[int]:
    """Live processes titled ``ray::...`` (Ray's agents and workers, whose title wiped their environment)."""
    if not os.path.isdir("/proc"):
        return set()
    return {int(p) for p in os.listdir("/proc") if p.isdigit() and cmdline(int(p))[:1]
            and cmdline(int(p))[0].startswith("ray::")}


@pytest.fixture(autouse=True)
def no_ray_process_left():
    """No Ray process a test started outlives it: FLWR_HOME cannot find those whose title wiped their environment."""
    before = ray_titled()
    yield
    deadline = time.monotonic() + 10
    while (left := ray_titled() - before) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not left, f"left running: {[' '.join(cmdline(p)) for p in sorted(left)]}"


def assert_nothing_left(home: Path) -> None:
    """No process started with this FLWR_HOME is alive (SuperLink, SuperNodes, apps, Ray)."""
    assert processes_using_home(home) == []


def assert_global(path: Path) -> Compendium:
    """The file is a valid global compendium with tools, scenarios and conflicts."""
    art = load_artifact(path)
    assert isinstance(art, Compendium)
    assert art.kind == "global"
    assert art.tools
    assert any(t.when for t in art.tools)
    assert art.conflicts, "the planted cross-org contradictions must show up as conflicts"
    return art


@pytest.mark.slow
def test_simulation(tmp_path):
    home, out = tmp_path / "flwr", tmp_path / "out"
    rc = {"dataset": dataset(tmp_path), "num-rounds": 2, "epsilon": INF, "output-dir": str(out)}
    try:
        res = run_simulation(APP_DIR, num_supernodes=3, run_config=rc, flwr_home=home, timeout=300)
    finally:
        assert_nothing_left(home)
    assert res.status == "finished:completed"
    assert res.peak_rss_bytes  # the sampler saw the started processes
    rounds = read_metrics(out)
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert len(r["accepted"]) == 3 and r["rejected"] == [] and r["merged"]
        assert r["bytes_per_client"] > 0
    assert_global(out / "global_round_2.json")


@pytest.mark.slow
def test_delta_on_the_wire(tmp_path):
    """With privacy on, round 2 sends deltas, far smaller, and the final global is byte-identical to full sends."""
    globals_, sent = {}, {}
    for delta in (True, False):
        home, out = tmp_path / f"flwr-{delta}", tmp_path / f"out-{delta}"
        rc = {"dataset": dataset(tmp_path), "num-rounds": 2, "epsilon": 4.0, "embedder": "static", "noise": "seeded",
              "evaluate": False, "wire-delta": delta, "output-dir": str(out)}
        try:
            run_simulation(APP_DIR, num_supernodes=3, run_config=rc, flwr_home=home, timeout=300)
        finally:
            assert_nothing_left(home)
        rounds = read_metrics(out)
        assert [r["deltas_in"] for r in rounds] == ([0, 3] if delta else [0, 0])
        sent[delta] = [r["bytes_per_client"] for r in rounds]
        globals_[delta] = (out / "global_round_2.json").read_bytes()
    assert sent[True][0] == sent[False][0]
    assert all(d * 5 < f for d, f in zip(sent[True][1:], sent[False][1:])), sent
    assert globals_[True] == globals_[False]


@pytest.mark.slow
def test_rejected_artifact(tmp_path):
    """A SuperNode whose experience file is malformed is rejected; the round completes."""
    home, out = tmp_path / "flwr", tmp_path / "out"
    ds = dataset(tmp_path)
    good = nodes_from_dataset(ds, 3, tmp_path / "nodes")[:2]
    bad_file = tmp_path / "bad.jsonl"
    bad_file.write_text('{"query": "weather in rome", "tool": "get_weather", "success": true}\n{not json\n')
    bad = NodeSpec("broken", bad_file, good[0].catalog_path)
    rc = {"dataset": ds, "num-rounds": 1, "min-nodes": 2, "epsilon": INF, "output-dir": str(out)}
    with pytest.raises(SynapseError, match=r"bad\.jsonl:2: invalid JSON.*org 'broken'"):  # the launcher's own check
        run_local_deployment(DeploymentConfig(APP_DIR, [*good, bad], rc, flwr_home=home, timeout=300))
    # unchecked, as on separate hosts: the server rejects the broken organisation and merges the others
    cfg = DeploymentConfig(APP_DIR, [*good, bad], rc, flwr_home=home, timeout=300, check_data=False)
    try:
        res = run_local_deployment(cfg)
    finally:
        assert_nothing_left(home)
    (record,) = read_metrics(out)
    assert sorted(record["accepted"]) == sorted(res.node_ids[s.org] for s in good)
    (rejection,) = record["rejected"]
    assert rejection["node_id"] == res.node_ids["broken"]
    assert rejection["round"] == 1
    assert rejection["reason"].startswith("client error")
    assert f"rejected reply from node {res.node_ids['broken']}" in res.log_path.read_text()
    # one round is enough for votes: the round's vote phase asks the two merged nodes only
    assert sorted(record["votes_accepted"]) == sorted(record["accepted"]) and record["votes_rejected"] == []
    assert record["merged"]
    load_artifact(out / "global_round_1.json")


@pytest.mark.slow
def test_deployment(tmp_path):
    home, out = tmp_path / "flwr", tmp_path / "out"
    rc = {"dataset": dataset(tmp_path), "num-rounds": 2, "epsilon": INF, "output-dir": str(out)}
    try:
        res = run_local_deployment(DeploymentConfig(APP_DIR, 3, rc, flwr_home=home, timeout=300))
    finally:
        assert_nothing_left(home)
    assert res.status == "finished:completed"
    assert len(set(res.node_ids.values())) == 3
    rounds = read_metrics(out)
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert sorted(r["accepted"]) == sorted(res.node_ids.values())
        assert r["rejected"] == []
    # round 1's vote phase asks every node; in round 2 no org released anything new, so none is asked
    assert sorted(rounds[0]["votes_accepted"]) == sorted(res.node_ids.values()) and rounds[1]["votes_accepted"] == []
    assert_global(out / "global_round_2.json")
    print("deployment metrics:", json.dumps(rounds))


@pytest.mark.slow
def test_resume(tmp_path):
    """A second run with more rounds into the same output dir runs only the missing round."""
    out = tmp_path / "out"
    ds = dataset(tmp_path)
    rc = {"dataset": ds, "epsilon": INF, "output-dir": str(out)}
    home1, home2 = tmp_path / "flwr1", tmp_path / "flwr2"
    try:
        run_simulation(APP_DIR, 2, {**rc, "num-rounds": 1}, flwr_home=home1, timeout=300)
    finally:
        assert_nothing_left(home1)
    (first,) = read_metrics(out)
    global_1 = (out / "global_round_1.json").read_bytes()
    try:
        res = run_simulation(APP_DIR, 2, {**rc, "num-rounds": 2}, flwr_home=home2, timeout=300)
    finally:
        assert_nothing_left(home2)
    rounds = read_metrics(out)
    assert [r["round"] for r in rounds] == [1, 2]
    assert rounds[0] == first
    assert (out / "global_round_1.json").read_bytes() == global_1
    assert len(rounds[1]["accepted"]) == 2
    assert rounds[1]["deltas_in"] == 0  # a new server holds no base: the clients send full artifacts
    assert "resuming after round 1" in res.log_path.read_text()
    load_artifact(out / "global_round_2.json")


@pytest.mark.slow
def test_failed_run_reports_the_log(tmp_path, monkeypatch):
    """A ServerApp that fails ends the run as failed: the error quotes `flwr log`, kept beside the outputs,
    and the temporary FLWR_HOME is gone."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    homes = []
    make_home = launch._home
    monkeypatch.setattr(launch, "_home", lambda *a: homes.append(make_home(*a)) or homes[-1])
    out = tmp_path / "out"
    out.mkdir()
    # valid run config, but the ServerApp cannot write round 1's global: a folder holds its name (an unreadable
    # metrics.json, used here before, is now refused by the launcher before anything starts)
    (out / "global_round_1.json").mkdir()
    rc = {"dataset": dataset(tmp_path), "num-rounds": 1, "min-nodes": 1, "output-dir": str(out)}
    try:
        with pytest.raises(SynapseError, match="finished:failed") as err:
            run_local_deployment(DeploymentConfig(APP_DIR, 1, rc, timeout=120))
    finally:
        for home in homes:
            assert_nothing_left(home)
    assert "global_round_1.json" in str(err.value)
    (home,) = homes
    assert home.parent == tmp_path / "tmp" and list(home.parent.iterdir()) == []
    (run_log,) = out.glob("logs/deployment-*/run.log")
    assert str(run_log) in str(err.value)
    assert "global_round_1.json" in run_log.read_text()


def test_a_bad_run_config_fails_before_any_process_starts(tmp_path):
    rc = {"dataset": "demo", "policy": "no-such-policy", "output-dir": str(tmp_path / "out")}
    with pytest.raises(RunConfigError, match="'policy' must be one of"):
        run_simulation(APP_DIR, 2, rc, flwr_home=tmp_path / "flwr")
    assert not (tmp_path / "flwr" / "logs").exists()


@pytest.mark.slow
def test_node_not_online(tmp_path):
    home = tmp_path / "flwr"
    rc = {"dataset": dataset(tmp_path), "output-dir": str(tmp_path / "out")}
    try:
        with pytest.raises(SynapseError, match="not online after 0s") as err:
            run_local_deployment(DeploymentConfig(APP_DIR, 2, rc, flwr_home=home, online_timeout=0.1))
    finally:
        assert_nothing_left(home)
    assert "log tail of org" in str(err.value)


def interrupt_run(launch_call: str, sig: int, started: str, home: Path) -> str:
    """Run ``launch_call`` in a child Python, send it ``sig`` once ``started`` is logged; its remaining output."""
    script = (
        "import logging, signal, sys; from pathlib import Path\n"
        "from synapse_flwr.flower.deploy import DeploymentConfig, run_local_deployment\n"
        "from synapse_flwr.flower.launch import run_simulation\n"
        "from synapse_flwr.flower.processes import interrupt_on_sigterm\n"
        # as in a terminal: a suite started in the background (`cmd &`) hands its children
        # SIGINT ignored, and Python then never raises KeyboardInterrupt
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "interrupt_on_sigterm()\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
        f"{launch_call}\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if started in line:
                break
        time.sleep(2)
        assert processes_using_home(home), "the run should be going on"
        proc.send_signal(sig)
        return proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_tears_down(tmp_path, sig):
    """Ctrl-C, or a SIGTERM (a scheduler's kill), in the middle of a run stops every process the deployment started."""
    home, out = tmp_path / "flwr", tmp_path / "out"
    rc = {"dataset": dataset(tmp_path), "num-rounds": 5, "output-dir": str(out)}
    rest = interrupt_run(f"run_local_deployment(DeploymentConfig(Path({str(APP_DIR)!r}), 2, {rc!r}, "
                         f"Path({str(home)!r})))", sig, "submitted run", home)
    assert "KeyboardInterrupt" in rest
    assert "deployment stopped" in rest
    assert_nothing_left(home)


@pytest.mark.slow
def test_a_sigterm_mid_simulation_leaves_no_ray_process(tmp_path):
    """A scheduler's kill in round 2 of a simulation stops Ray's agents too (their title wipes the session's tag)."""
    home, out = tmp_path / "flwr", tmp_path / "out"
    rc = {"dataset": dataset(tmp_path), "num-rounds": 50, "output-dir": str(out)}
    rest = interrupt_run(f"run_simulation(Path({str(APP_DIR)!r}), num_supernodes=2, run_config={rc!r}, "
                         f"flwr_home=Path({str(home)!r}))",
                         signal.SIGTERM, "round 1/", home)
    assert "KeyboardInterrupt" in rest
    assert_nothing_left(home)  # and the autouse fixture: no `ray::` process left


def test_the_cli_stops_on_sigterm_as_on_ctrl_c(monkeypatch):
    from synapse_flwr import cli

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(cli, "app", lambda: time.sleep(5))
    try:
        with pytest.raises(KeyboardInterrupt, match="signal 15"):
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
            cli.main()
    finally:
        signal.signal(signal.SIGTERM, before)


def test_errors_before_starting_anything(tmp_path, monkeypatch):
    data = tmp_path / "org.jsonl"
    data.write_text("")
    node = NodeSpec("a", data)
    with pytest.raises(SynapseError, match="not a Flower app"):
        run_local_deployment(DeploymentConfig(tmp_path, [node]))
    with pytest.raises(SynapseError, match="experience file of org 'b' not found"):
        run_local_deployment(DeploymentConfig(APP_DIR, [node, NodeSpec("b", tmp_path / "nope.jsonl")]))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        with pytest.raises(SynapseError, match=f"port {port} for the SuperLink is busy"):
            run_local_deployment(DeploymentConfig(APP_DIR, [node], {"min-nodes": 1}, flwr_home=tmp_path / "h",
                                                  superlink_port=port))
    monkeypatch.setattr(launch, "flower_bin_dir", lambda: tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SynapseError, match="Flower binaries not found on PATH: flwr, flower-superlink"):
        run_simulation(APP_DIR, 2, {"output-dir": str(tmp_path / "out")}, flwr_home=tmp_path / "h2")


@pytest.mark.slow
def test_deployment_with_registered_keys(tmp_path):
    """A keys file: registered orgs are merged, an org whose key nobody registered is rejected by signature."""
    home, out, keys = tmp_path / "flwr", tmp_path / "out", tmp_path / "keys"
    ds = dataset(tmp_path)
    nodes = nodes_from_dataset(ds, 3, tmp_path / "nodes")
    signers = [new_signer(owner) for owner in (nodes[0].org, nodes[1].org, SERVER)]
    for signer in signers:
        save_private_key(keys / f"{signer.owner}.key", signer)
        add_to_registry(keys / "keys.json", signer)
    save_private_key(keys / f"{nodes[2].org}.key", new_signer(nodes[2].org))  # never registered
    rc = {"dataset": ds, "num-rounds": 1, "min-nodes": 2, "epsilon": INF, "output-dir": str(out),
          "keys-file": str(keys / "keys.json")}
    try:
        # unchecked, as on separate hosts: the launcher refuses an unregistered key before starting
        # (test_launch_checks), the server must too
        res = run_local_deployment(DeploymentConfig(APP_DIR, nodes, rc, flwr_home=home, timeout=300,
                                                    check_data=False))
    finally:
        assert_nothing_left(home)
    (record,) = read_metrics(out)
    assert sorted(record["accepted"]) == sorted(res.node_ids[n.org] for n in nodes[:2])
    (rejection,) = record["rejected"]
    assert rejection["node_id"] == res.node_ids[nodes[2].org]
    assert rejection["reason"].startswith("rejected signature: signature.key_id")
    log_text = res.log_path.read_text()
    for signer in signers:
        assert signer.private_pem().splitlines()[1].decode() not in log_text


def test_the_capture_mod_keeps_what_a_client_sends_only_where_the_run_config_asks(tmp_path):
    """The privacy audit's mod: off by default; on, the exact bytes of each reply, or the error Flower sends."""
    from flwr.app import ConfigRecord, Context, Message, Metadata, RecordDict
    from flwr.common.serde import message_to_proto

    from synapse_flwr.flower.capture import capture_mod, flower_error_reason

    metadata = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=3, reply_to_message_id="", group_id="",
                        created_at=0.0, ttl=60.0, message_type="train")  # as the SuperLink fills it in
    msg = Message(content=RecordDict({"config": ConfigRecord({"server-round": 2})}), metadata=metadata)

    def context(run_config: dict) -> Context:
        return Context(run_id=1, node_id=3, node_config={}, state=RecordDict(), run_config=run_config)

    assert capture_mod(msg, context({}), lambda m, c: m) is msg and not list(tmp_path.iterdir())
    capture_mod(msg, context({"capture-dir": str(tmp_path)}), lambda m, c: m)
    (sent,) = tmp_path.glob("node3_round2_*.msg")
    assert sent.read_bytes() == message_to_proto(msg).SerializeToString()

    def fail(m, c):
        raise RuntimeError("no experience")

    with pytest.raises(RuntimeError):
        capture_mod(msg, context({"capture-dir": str(tmp_path)}), fail)
    (error,) = tmp_path.glob("node3_round2_*.err")
    assert error.read_text() == flower_error_reason(RuntimeError("no experience"))
    with pytest.raises(RunConfigError, match="capture-dri"):  # a misspelt key is named, not ignored
        capture_mod(msg, context({"capture-dri": str(tmp_path)}), lambda m, c: m)


def test_a_client_that_cannot_load_its_experience_tells_the_server_which_field_never_what_or_where(tmp_path):
    from synapse_flwr.core.catalog import ToolDoc, make_catalog
    from synapse_flwr.core.errors import InputError
    from synapse_flwr.core.experience import load_experience
    from synapse_flwr.flower.client_app import load_failure_reason

    log = tmp_path / "secret_org.jsonl"
    log.write_text('{"query": "weather in rome", "tool": "get_weather", "success": true}\n'
                   '{"query": "wire 5000 to account 1234 for my divorce lawyer", "tool": "internal_payroll_tool", '
                   '"success": true}\n')
    catalog = make_catalog([ToolDoc("get_weather", "get_weather", "Weather.")])
    with pytest.raises(InputError) as caught:
        load_experience(log, catalog)
    assert "internal_payroll_tool" in str(caught.value)  # the org's own log names it
    reason = load_failure_reason(caught.value)
    assert reason.startswith("invalid local experience data (field 'tool')")
    # nor the line, which moves by one with each record before it
    for private in ("internal_payroll_tool", "divorce", "secret_org", str(tmp_path), "line", "2"):
        assert private not in reason


def test_an_unexpected_client_failure_reaches_the_server_as_its_type_only(caplog):
    from synapse_flwr.flower.client_app import ReasonForServer, server_safe

    def leaks(msg, context):
        raise KeyError("wire 5000 to account 1234 for my divorce lawyer")

    with caplog.at_level(logging.ERROR), pytest.raises(ReasonForServer) as caught:
        server_safe(leaks)(None, None)
    assert str(caught.value) == "the ClientApp failed (KeyError); the organisation's log has the details"
    assert "divorce lawyer" in caplog.text  # the organisation's own log keeps it

    def refused(msg, context):
        raise ReasonForServer("global rejected: bad signature")

    with pytest.raises(ReasonForServer, match="^global rejected: bad signature$"):
        server_safe(refused)(None, None)
    with pytest.raises(RunConfigError, match="capture-dri"):  # the operator's own settings are named
        server_safe(lambda m, c: RunConfig.from_mapping({"capture-dri": "x"}))(None, None)
