"""Dropouts, crash and resume, and the privacy audit (issue 13).

The fast tests drive the strategy with hand-made Flower messages (ids set as
Flower's grid sets them when it pushes), the run recorder's checkpoint, the
canary scanner on positive and negative controls, and the membership-inference
attack on a few trials. The slow ones run the real app: a simulation where 40%
of the organisations fail mid-round, is killed after round 1 and resumed
(simulations/fault_audit.py), and a local deployment where a SuperNode is
SIGKILLed; every message the ClientApps send is searched for the planted
canaries.
"""

from __future__ import annotations

import base64
import gzip
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message, MetricRecord, RecordDict
from synapse_flwr.simulations import fault_audit
from synapse_flwr.simulations.privacy_audit import (
    CANARIES,
    audit_membership,
    best_threshold,
    dp_advantage_bound,
    find_canaries,
    gaussian_advantage,
    plant_canaries,
)
from synapse_flwr.strategies import make_strategy
from synapse_flwr.strategies.base import CompendiumStrategy, tool_union_problems
from synapse_flwr.strategies.records import from_record, to_record

from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.catalog import load_catalog
from synapse_flwr.core.embed import get_embedder
from synapse_flwr.core.experience import load_experience
from synapse_flwr.core.merge import clip_words, merge_robust, merge_typed
from synapse_flwr.core.noise_claims import noise_claim_problem
from synapse_flwr.core.prototypes import encode_prototype
from synapse_flwr.core.release import ReleaseState
from synapse_flwr.core.sanitize import instruction_like
from synapse_flwr.core.schema import (
    MAX_TEXT,
    MAX_TOOLS,
    Compendium,
    EmbeddingSpace,
    FusionSetting,
    FusionVotes,
    Issuer,
    PrivacyBlock,
    Scenario,
    ToolEntry,
    ToolStats,
    WhenNot,
)
from synapse_flwr.core.votes import SETTINGS
from synapse_flwr.core.wire import (
    MAX_WIRE_BYTES,
    canonical_json,
    decode,
    encode,
    wire_limit,
)
from synapse_flwr.data.federation import demo_dir
from synapse_flwr.flower.calibration import build_config, noise_bound, planned_releases
from synapse_flwr.flower.client_app import OrgData, org_release
from synapse_flwr.flower.config import RunConfig
from synapse_flwr.flower.server_app import RunRecorder, empty_global

SUPERLINK = 1  # the node id the SuperLink answers from for an unavailable node
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads Linux /proc")


class FakeGrid:
    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return self.nodes


@pytest.fixture(autouse=True)
def server_identity(monkeypatch):
    """Messages are made as the ServerApp makes them: its process knows its run and task."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 7), ("_task_id", 8), ("_node_id", SUPERLINK)):
        monkeypatch.setattr(TaskIdentity, name, value)


@pytest.fixture(scope="module")
def demo_artifacts():
    catalog = load_catalog(demo_dir() / "catalog.json")
    return {org: build_compendium(load_experience(demo_dir() / f"org_{org}.jsonl", catalog), catalog, org, round_=1,
                                  epsilon=math.inf, seed=0)
            for org in ("a", "b")}


def send(strategy, round_: int, nodes: list[int]) -> list[Message]:
    """configure_train, with message ids set as Flower's grid sets them on push."""
    msgs = list(strategy.configure_train(round_, to_record(empty_global()), ConfigRecord(), FakeGrid(nodes)))
    for i, m in enumerate(msgs):
        m.metadata.__dict__["_message_id"] = f"r{round_}-m{i}"
    return msgs


def reply(msg: Message, art) -> Message:
    return Message(RecordDict({"artifact": to_record(encode(art)), "metrics": MetricRecord({"events": 1})}),
                   reply_to=msg)


def superlink_error(msg: Message) -> Message:
    err = Message(Error(code=3, reason="node unavailable"), reply_to=msg)
    err.metadata.__dict__["_src_node_id"] = SUPERLINK
    return err


def test_dropped_nodes_are_named_by_their_own_id_and_org(demo_artifacts):
    strategy = make_strategy("typed", min_nodes=1)
    r1 = send(strategy, 1, [11, 12, 13])
    strategy.aggregate_train(1, [reply(r1[0], demo_artifacts["a"]), reply(r1[1], demo_artifacts["b"])])
    report = strategy.reports[1]
    assert report.accepted == [11, 12]
    assert [(x.node_id, x.org) for x in report.rejected] == [(13, None)]
    assert report.rejected[0].reason.startswith("no reply within the round timeout")

    r2 = send(strategy, 2, [11, 12])  # node 13 gone, node 12 answered for by the SuperLink
    arrays, _ = strategy.aggregate_train(2, [reply(r2[0], demo_artifacts["a"]), superlink_error(r2[1])])
    rejected = strategy.reports[2].rejected
    assert [(x.node_id, x.org) for x in rejected] == [(12, "b")]
    assert rejected[0].reason.startswith("client error 3")
    assert arrays is not None, "one valid artifact is enough at min_nodes=1"
    merged = {o for t in strategy.merge_fn([art for _, art in strategy.latest.values()]).tools
              for o in t.provenance.orgs}
    assert merged == {"a", "b"}, "org b's round-1 artifact is still merged"

    send(strategy, 3, [11])
    strategy.aggregate_train(3, [])
    assert [(x.node_id, x.org, x.reason) for x in strategy.reports[3].rejected] == [
        (11, "a", "no reply within the round timeout (run config round-timeout)"),
        (12, "b", "node no longer connected"),
    ]


def test_checkpoint_restores_every_org_and_new_nodes_may_claim_them(tmp_path, demo_artifacts):
    recorder = RunRecorder(tmp_path, {})
    recorder.record(1, demo_artifacts["a"], {"accepted": [11]}, {}, demo_artifacts)
    round_, _, orgs = RunRecorder(tmp_path, {}).resume_point()
    assert round_ == 1
    assert {o: canonical_json(a) for o, a in orgs.items()} == {
        o: canonical_json(a) for o, a in demo_artifacts.items()}
    strategy = make_strategy("typed", min_nodes=1)
    strategy.restore(orgs)
    (msg,) = send(strategy, 1, [99])  # after a restart org a's node has a new id
    strategy.aggregate_train(1, [reply(msg, demo_artifacts["a"])])
    assert strategy.reports[1].accepted == [99]
    (tmp_path / "orgs_round_1.json").write_text("{")  # a torn checkpoint: no resume from it
    assert RunRecorder(tmp_path, {}).resume_point()[0] == 0


def test_a_corrupt_metrics_file_is_named_when_the_server_app_resumes(tmp_path):
    """Regression: the ServerApp failed with a bare JSONDecodeError on a corrupt metrics.json."""
    from synapse_flwr.core.errors import SynapseError
    from synapse_flwr.flower.config import RecordedRunError

    assert RunRecorder(tmp_path, {}).rounds == []  # no metrics.json: a new run
    metrics = tmp_path / "metrics.json"
    for text, problem in (("{", "JSONDecodeError"), ("[]", 'a list of "rounds"'),
                          ('{"rounds": [{"round": "1"}]}', 'rounds[0] is not a round record'),
                          ('{"rounds": [], "run_config": 3}', '"run_config" must be an object')):
        metrics.write_text(text)
        with pytest.raises(RecordedRunError) as caught:
            RunRecorder(tmp_path, {})
        message = str(caught.value)
        assert message.startswith(f"{metrics} cannot be read") and problem in message, message
        assert isinstance(caught.value, SynapseError) and "set another output-dir" in message
    metrics.write_text('{"rounds": [{"round": 1}]}')  # an older file without run_config still resumes
    assert RunRecorder(tmp_path, {}).rounds == [{"round": 1}]


def test_fault_injection_names_orgs_without_the_blanks_around_them():
    """Regression: run config fail-orgs "a, b" never failed org b (it looked for " b")."""
    from synapse_flwr.flower.client_app import fails_now
    from synapse_flwr.flower.config import RunConfig

    cfg = RunConfig.from_mapping({"fail-round": 2, "fail-orgs": "a, b ,  c"})
    assert all(fails_now(cfg, org, 2) for org in ("a", "b", "c"))
    assert not fails_now(cfg, "b", 1) and not fails_now(cfg, "d", 2) and not fails_now(cfg, "", 2)


def test_canary_scanner_finds_hidden_copies_and_nothing_in_clean_bytes():
    email, card = CANARIES[0], next(c for c in CANARIES if c.name == "card-1")
    clean = gzip.compress(b'{"text": "weather in rome <PHONE> <EMAIL>", "n": 415.5, "m": 5550187}')
    assert find_canaries(clean, list(CANARIES)) == set()
    hidden = {
        "raw": f"x {email.text} y".encode(),
        "gzip": b"header" + gzip.compress(email.text.upper().encode()) + b"trailer",
        "base64": base64.b64encode(f"... {email.text} ...".encode()),
        "base64 in gzip": gzip.compress(b"data=" + base64.b64encode(f"ref {email.text} ok".encode())),
    }
    for how, payload in hidden.items():
        assert find_canaries(payload, list(CANARIES)) == {email.name}, how
    assert find_canaries(card.text.replace(" ", "-").encode(), list(CANARIES)) == {card.name}
    assert find_canaries(b"call 415.555.0187", list(CANARIES)) == {"phone-1"}


def test_planting_adds_every_canary_to_every_org(tmp_path):
    for org in ("a", "b"):
        (tmp_path / f"org_{org}.jsonl").write_text('{"query": "q", "tool": "t", "success": true}\n')
    planted = plant_canaries(tmp_path)
    for org in ("a", "b"):
        text = (tmp_path / f"org_{org}.jsonl").read_text()
        assert all(c.text in text for c in planted)
        assert find_canaries(text.encode(), planted) == {c.name for c in planted}


def test_advantage_bounds():
    assert dp_advantage_bound(0.0, 0.0) == 0.0
    assert dp_advantage_bound(4.0, 1e-5) == pytest.approx((math.exp(4) - 1 + 2e-5) / (math.exp(4) + 1))
    assert gaussian_advantage(0.0) == 0.0 and gaussian_advantage(1.0) == pytest.approx(0.3829, abs=1e-4)
    rng = random.Random(0)
    same = [rng.gauss(0, 1) for _ in range(4000)]
    import numpy as np

    _, adv_none = best_threshold(np.array(same[:2000]), np.array(same[2000:]))
    _, adv_far = best_threshold(np.array(same[:2000]) + 10, np.array(same[2000:]))
    assert adv_none < 0.06 and adv_far == 1.0


@pytest.mark.slow
def test_membership_attack_runs_on_real_releases():
    res = audit_membership(trials=20)
    assert res["privacy"]["epsilon"] == res["reported_epsilon"] <= 4.0
    assert res["mi_bound"] == pytest.approx(dp_advantage_bound(res["reported_epsilon"], 1e-5), abs=1e-4)
    # 10 held-out trials per arm: far from the bound, near the Gaussian optimum (about 0.3)
    assert -0.5 < res["mi_advantage"] < res["mi_bound"]
    assert 0.2 < res["gaussian_optimal_advantage"] < 0.4
    assert res["noise_as_claimed"] and res["advantage_within_gaussian"]


@pytest.mark.slow
def test_membership_audit_fails_a_release_with_a_third_of_its_noise_missing(monkeypatch):
    """Regression (privacy review): with a quarter of the noise the audit passed, its only check the (epsilon,
    delta) bound on the advantage, which a true epsilon near 22 meets at a reported 4."""
    from synapse_flwr.core import builder

    counts, prototypes = builder.noise_counts, builder.noise_prototypes
    monkeypatch.setattr(builder, "noise_counts", lambda c, sigma, rng: counts(c, sigma / 1.5, rng))
    monkeypatch.setattr(builder, "noise_prototypes", lambda s, c, w, sigma, rng: prototypes(s, c, w, sigma / 1.5, rng))
    res = audit_membership(trials=20)
    assert res["privacy"]["epsilon"] <= 4.0 and not res["noise_as_claimed"]


@pytest.mark.slow
def test_dropouts_crash_and_resume_simulation(tmp_path):
    """40% of orgs fail in round 2; a run killed after round 1 resumes to the same bytes; no canary leaves."""
    res = fault_audit.dropouts_and_resume(tmp_path, rounds=2)
    assert res["rounds_completed"] == 2
    assert res["accepted_per_round"] == [5, 3]
    assert res["dropped_orgs_named"] == sorted(fault_audit.FAILING)
    merged = res["merged_into_round_2"]
    assert sorted(merged) == [f"org{i}" for i in range(5)], "nothing merged is lost"
    assert all(merged[o] == (1 if o in fault_audit.FAILING else 2) for o in merged)
    assert res["killed_pids"] and res["rounds_on_disk_after_crash"] == [1] and res["resumed"]
    assert res["resume_identical"] and res["release_caches_identical"]
    assert res["captured_messages"] >= 5 * 2 * 2
    assert res["canaries_leaked"] == {}
    # beside the artifact a reply reports only functions of the release: no count of the org's records
    assert res["reply_metrics"] == ["bytes-full", "bytes-sent", "epsilon"]


@pytest.mark.slow
def test_killed_supernode_deployment(tmp_path):
    res = fault_audit.killed_supernode(tmp_path, rounds=2, round_timeout=60.0)
    assert res["status"] == "finished:completed" and res["rounds_completed"] == 2
    assert res["killed_pids"] == 1 and res["killed_node_named"]
    assert res["superexec_outlived_node_s"] is not None, "stopped within a minute, not at teardown"
    assert res["round_wall_s"][1] < res["round_timeout_s"] + 15, "the dead node is bounded by the round timeout"
    assert res["merged_into_final"][res["killed_org"]] == 1, "its round-1 artifact is still merged"
    assert res["canaries_leaked"] == {}


def test_a_dead_supernodes_superexec_is_stopped(tmp_path):
    """What a killed process started with ``--parent-pid`` (a SuperNode's SuperExec) is stopped at once."""
    import os
    import signal
    import subprocess
    import sys

    from synapse_flwr.flower.processes import TAG_ENV, ProcessGroup

    group = ProcessGroup("test-orphans", {**os.environ, TAG_ENV: "test-orphans"}, tmp_path)
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    node = group.start("supernode_a", sleep, cwd=tmp_path)
    other = group.start("supernode_b", sleep, cwd=tmp_path)
    orphan = subprocess.Popen([*sleep, "--parent-pid", str(node.pid)], env=group.env)
    bystander = subprocess.Popen([*sleep, "--parent-pid", str(other.pid)], env=group.env)
    try:
        assert group.stop_orphans() == []
        node.send_signal(signal.SIGKILL)
        node.wait()
        assert group.stop_orphans() == ["supernode_a"]
        assert orphan.wait(timeout=10) == -signal.SIGTERM
        assert bystander.poll() is None and group.stop_orphans() == []
    finally:
        for proc in (orphan, bystander):
            proc.kill()
            proc.wait()
        group.stop(grace=5, linger=1)


# A tagged parent that starts a child and sleeps; the child runs argv[1] with the pid file argv[2].
SPAWNER = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', *sys.argv[1:]]); time.sleep(60)"
# Writes its pid (atomically) once its title is set, as Ray's DashboardAgent sets its own.
FAKE_AGENT = ("import os, sys, time\n"
              "from ray._raylet import setproctitle\n"
              "setproctitle('ray::FakeAgent')\n"
              "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\n"
              "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
              "time.sleep(60)\n")
# Starts a grandchild without the session's tag (as if wiped), writes its pid.
UNTAGGED_CHILD = ("import os, subprocess, sys, time\n"
                  "env = {k: v for k, v in os.environ.items() if k != 'SYNAPSE_FLWR_SESSION'}\n"
                  "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env=env)\n"
                  "open(sys.argv[1] + '.tmp', 'w').write(str(child.pid))\n"
                  "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
                  "time.sleep(60)\n")


def wait_for_pid(path: Path, timeout: float = 30.0) -> int:
    """The pid a test process wrote to ``path``."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no pid written to {path}"
        time.sleep(0.05)
    return int(path.read_text())


def running(pid: int) -> bool:
    """Whether ``pid`` runs (not a zombie), read from /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def kill_if(pid: int, title: str) -> None:
    """SIGKILL ``pid`` if it still runs under ``title`` (a test's leftover, not a reused pid)."""
    import signal

    if running(pid) and Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode() == title:
        os.kill(pid, signal.SIGKILL)


@needs_proc
def test_a_ray_agent_whose_title_wiped_its_tag_is_found_and_stopped(tmp_path):
    """Regression: Ray's agents call setproctitle, which wipes /proc/<pid>/environ (the tag); teardown left them
    running after their parent was stopped. They are found as descendants, remembered, and stopped."""
    import signal

    pytest.importorskip("ray._raylet")
    from synapse_flwr.flower.processes import TAG_ENV, ProcessGroup, tagged_processes

    tag = "test-agents"
    # setproctitle wipes the environment up to the first variable the process rewrote (Ray's import rewrites
    # RAY_CLIENT_MODE), so the tag goes first to be wiped, as it is in Ray's agents
    group = ProcessGroup(tag, {TAG_ENV: tag, **os.environ}, tmp_path)
    parent = group.start("raylet", [sys.executable, "-c", SPAWNER, FAKE_AGENT, str(tmp_path / "agent.pid")],
                         cwd=tmp_path)
    agent = wait_for_pid(tmp_path / "agent.pid")
    try:
        marker = f"{TAG_ENV}={tag}".encode()
        assert marker in Path(f"/proc/{parent.pid}/environ").read_bytes().split(b"\0")
        assert marker not in Path(f"/proc/{agent}/environ").read_bytes().split(b"\0"), "the title wiped the tag"
        assert tagged_processes(tag) == sorted([parent.pid, agent])
        killed = group.stop(grace=5, linger=1)
        assert parent.returncode == -signal.SIGTERM, "the parent went on SIGTERM, its agent reparented"
        assert agent in killed and not running(agent)
        assert group.members() == [] and tagged_processes(tag) == []
    finally:
        kill_if(agent, "ray::FakeAgent")
        group.stop(grace=5, linger=1)


@needs_proc
def test_a_member_is_remembered_after_its_parent_died_until_its_pid_is_reused(tmp_path, monkeypatch):
    """An untagged child is a member while its parent runs and stays one once reparented; a pid now naming a
    process started later (another start time) is not."""
    import signal

    from synapse_flwr.flower import processes
    from synapse_flwr.flower.processes import TAG_ENV, ProcessGroup, tagged_processes

    tag = "test-remembered"
    group = ProcessGroup(tag, {**os.environ, TAG_ENV: tag}, tmp_path)
    parent = group.start("parent", [sys.executable, "-c", UNTAGGED_CHILD, str(tmp_path / "child.pid")],
                         cwd=tmp_path)
    child = wait_for_pid(tmp_path / "child.pid")
    try:
        assert group.members() == sorted([parent.pid, child])
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert tagged_processes(tag) == [], "reparented and untagged: no scan finds it"
        assert group.members() == [child]
        started = processes._start_time(child)
        monkeypatch.setattr(processes, "_start_time", lambda pid: started + 1 if pid == child else None)
        assert group.members() == []
    finally:
        monkeypatch.undo()
        kill_if(child, sys.executable)
        group.stop(grace=5, linger=1)


def test_children_that_start_ray_get_single_threaded_blas(monkeypatch):
    """A spawned child sees OPENBLAS_NUM_THREADS=1 (Ray forks from it); the caller's environment is restored."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    from synapse_flwr.flower.processes import single_threaded_blas

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    with single_threaded_blas(), ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        seen = pool.submit(os.getenv, "OPENBLAS_NUM_THREADS").result()
    assert seen == "1" and "OPENBLAS_NUM_THREADS" not in os.environ
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")  # a user's own choice stands
    with single_threaded_blas():
        assert os.environ["OPENBLAS_NUM_THREADS"] == "4"
    assert os.environ["OPENBLAS_NUM_THREADS"] == "4"


def test_a_simulated_client_error_is_rejected_with_the_apps_own_message():
    """Regression: under the simulation engine the rejection reason was the whole Ray task error
    (colour codes, actor repr, two tracebacks); the ClientApp's own message is what an operator needs."""
    import traceback

    from flwr.clientapp.client_app import ClientAppException
    from ray.exceptions import RayTaskError
    from synapse_flwr.strategies.base import (
        MAX_REASON_CHARS,
        client_error_reason,
        verify_reply,
    )

    own = "fault injection: org b fails in round 2 (run config fail-orgs)"
    try:
        try:
            raise RuntimeError(own)
        except RuntimeError as ex:
            raise ClientAppException(str(ex)) from ex  # as flwr's ray_actor does
    except ClientAppException as exc:
        err = RayTaskError("ClientAppActor.run", traceback.format_exc(), exc, proctitle="ray::ClientAppActor.run()",
                           pid=1, ip="127.0.0.1", actor_id="a1", actor_repr="<ClientAppActor>").as_instanceof_cause()
    reason = str(type(err)) + ":<'" + str(err) + "'>"  # flwr's vce_api reports it so
    assert "\n" in reason and "\x1b[" in reason and "Traceback" not in own
    msg = Message(Error(code=2, reason=reason), reply_to=Message(RecordDict(), dst_node_id=7, message_type="train"))
    art, _, size, why = verify_reply(msg, 10_000)
    assert art is None and size == 0 and why == f"client error 2: {own}"
    # a reason Flower did not wrap stays as it came, on one line and bounded
    assert client_error_reason(3, "node unavailable") == "client error 3: node unavailable"
    assert len(client_error_reason(1, "x\n" * 1000)) == MAX_REASON_CHARS


# --------------------------------------------------------------------------- what the merge cannot take

S1, S2 = EmbeddingSpace(model="m1", dim=4), EmbeddingSpace(model="m2", dim=4)


def org_art(org: str, tools=("t",), space: EmbeddingSpace | None = None, round_: int = 1) -> Compendium:
    """An org artifact of ``tools``, each with a prototype in ``space`` when one is given."""
    proto = encode_prototype(np.array([1.0, 0.0, 0.0, 0.0]), 5, 0.0, 0.0) if space else None
    return Compendium(issuer=Issuer(org=org, round=round_), embedding=space, tools=[
        ToolEntry(tool_id=t, stats=ToolStats(calls=5, successes=5), prototype=proto) for t in tools])


def test_a_round_that_merged_nothing_says_its_global_was_kept_with_that_global_s_epsilon():
    """Regression (deployment rehearsal): such a round read 'epsilon -' (privacy off) beside the previous global."""
    from synapse_flwr.flower.server_app import make_evaluate_fn

    strategy = make_strategy("typed", min_nodes=1)
    private = org_art("a").model_copy(update={"privacy": PrivacyBlock(
        mechanism="gaussian", clip=1.0, sigma=1.0, noise_multiplier=1.0, epsilon=3.5, epsilon_target=4.0,
        delta=1e-5)})
    arrays, _ = strategy.aggregate_train(1, [reply(send(strategy, 1, [10])[0], private)])
    strategy.aggregate_train(2, [])  # nobody answered: nothing merged, the round-1 global kept
    summaries = {}

    class Recorder:
        def record(self, rnd, global_, summary, scores, latest):
            summaries[rnd] = summary

    evaluate = make_evaluate_fn(strategy, Recorder(), 0, None)
    evaluate(1, arrays)
    evaluate(2, arrays)
    assert (summaries[1]["global"], summaries[2]["global"]) == ("new", "kept")
    assert summaries[1]["epsilon"] == summaries[2]["epsilon"] == 3.5


def in_order(msgs: list[Message], arts: list, order: int) -> list[Message]:
    replies = [reply(m, a) for m, a in zip(msgs, arts)]
    return replies if order == 0 else replies[::-1]


@pytest.mark.parametrize("order", [0, 1])
@pytest.mark.parametrize("policy", ["typed", "robust", "support-weighted"])
def test_an_artifact_in_another_embedding_space_is_refused_whatever_the_arrival_order(policy, order):
    """Regression: two orgs in different spaces made every policy's merge raise, crashing the server."""
    strategy = make_strategy(policy, min_nodes=1)
    msgs = send(strategy, 1, [10, 11])
    arrays, _ = strategy.aggregate_train(1, in_order(msgs, [org_art("a", space=S1), org_art("b", space=S2)], order))
    report = strategy.reports[1]
    assert arrays is not None and report.merged and report.accepted == [10]  # a tie goes to the sorted first
    (why,) = report.rejected
    assert why.node_id == 11 and why.reason.startswith("embedding space m2 (4 dims, l2) differs from the federation's "
                                                       "m1 (4 dims, l2) (the majority of this round's artifacts)")
    # alone the next round, b is refused again: a's artifact in m1 is merged with it
    msgs = send(strategy, 2, [10, 11])
    strategy.aggregate_train(2, [reply(msgs[1], org_art("b", space=S2, round_=2))])
    assert "(that of the artifacts already merged)" in strategy.reports[2].rejected[-1].reason
    assert set(strategy.latest) == {"a"}


def test_votes_on_an_organisation_s_own_settings_are_refused():
    """Regression (security audit): votes sum over the most common list of settings, so an org's own list,
    winning a tie, replaced the honest votes with its own (the router then followed a prior of 10)."""
    own = [FusionSetting(prototype=0.0, prior=0.0), FusionSetting(prototype=0.0, prior=10.0)]
    skewed = FusionVotes(settings=own, correct=[0.0, 5.0], records=5.0, sd=0.0)
    honest = FusionVotes(settings=list(SETTINGS), correct=[5.0] * len(SETTINGS), records=5.0, sd=0.0)
    strategy = make_strategy("robust", min_nodes=1)
    msgs = send(strategy, 1, [10, 11])
    arts = [org_art(o, space=S1).model_copy(update={"votes": v}) for o, v in (("a", honest), ("b", skewed))]
    strategy.aggregate_train(1, [reply(m, a) for m, a in zip(msgs, arts)])
    report = strategy.reports[1]
    assert report.accepted == [10] and [r.node_id for r in report.rejected] == [11]
    assert report.rejected[0].reason.startswith("votes.settings: 2 settings other than the federation's")


def test_the_runs_embedding_space_decides_when_the_strategy_knows_it():
    strategy = make_strategy("typed", min_nodes=1, embedding=S2)
    msgs = send(strategy, 1, [10, 11])
    strategy.aggregate_train(1, [reply(msgs[0], org_art("a", space=S1)), reply(msgs[1], org_art("b", space=S2))])
    report = strategy.reports[1]
    assert report.accepted == [11] and "(the run's)" in report.rejected[0].reason


def test_an_artifact_that_would_push_the_tool_union_over_the_limit_is_refused():
    """Regression: 20,000 made-up tool ids plus another org's one tool made the merge raise."""
    made_up, real = org_art("a", tools=[f"x{i:05d}" for i in range(MAX_TOOLS)]), org_art("b", tools=["real.tool"])
    strategy = make_strategy("typed", min_nodes=1)
    msgs = send(strategy, 1, [10, 11])
    arrays, _ = strategy.aggregate_train(1, [reply(msgs[0], made_up), reply(msgs[1], real)])
    report = strategy.reports[1]
    why = (f"its {MAX_TOOLS} tools would bring the merged tool union to {MAX_TOOLS + 1} distinct tools, "
           f"over the schema's limit of {MAX_TOOLS}")
    assert arrays is not None and report.accepted == [11]
    assert [(x.node_id, x.reason) for x in report.rejected] == [(10, why)]
    # the same artifact is refused whichever arrives first
    assert tool_union_problems({}, [(11, real), (10, made_up)]) == {10: why}


def test_the_tool_union_counts_each_orgs_latest_artifact_once():
    held = {"a": org_art("a", tools=["x", "y"])}
    # a replaces its artifact (x, y -> x, y, z); b's w would make four: fewest new tools first, ties by org
    arrived = [(11, org_art("b", tools=["w"])), (10, org_art("a", tools=["x", "y", "z"]))]
    assert tool_union_problems(held, arrived, limit=3) == {
        11: "its 1 tools would bring the merged tool union to 4 distinct tools, over the schema's limit of 3"}
    assert tool_union_problems(held, [(10, org_art("a", tools=["u", "v", "w"]))], limit=3) == {}


def test_tools_outside_the_catalog_are_refused_when_the_strategy_knows_it():
    strategy = make_strategy("typed", min_nodes=1, catalog=["real.tool", "other.tool"])
    msgs = send(strategy, 1, [10, 11])
    strategy.aggregate_train(1, [reply(msgs[0], org_art("a", tools=["real.tool", "x1", "x2", "x3", "x4"])),
                                 reply(msgs[1], org_art("b", tools=["real.tool"]))])
    report = strategy.reports[1]
    assert report.accepted == [11]
    assert report.rejected[0].reason == ("4 tool ids not in the federation's catalog of 2 tools: "
                                         "'x1', 'x2', 'x3' (+1 more) (run config catalog names the federation's "
                                         "catalog file)")


def test_a_round_whose_every_artifact_has_other_tools_says_how_to_name_the_catalog(caplog):
    """Review: a deployment whose organisations read their own catalog while the server reads the dataset's
    refused every artifact every round, with only the per-artifact reasons to go by."""
    strategy = make_strategy("typed", min_nodes=1, catalog=["real.tool"])
    msgs = send(strategy, 1, [10, 11])
    strategy.aggregate_train(1, [reply(m, org_art(o, tools=["own.tool"])) for m, o in zip(msgs, "ab")])
    assert "round 1: every artifact was refused for tools outside the federation's catalog of 1 tools: if the " \
           "organisations read a catalog of their own (node config catalog-path), name that file in the run " \
           "config's catalog" in caplog.text
    caplog.clear()
    msgs = send(strategy, 2, [10, 11])
    strategy.aggregate_train(2, [reply(msgs[0], org_art("a", tools=["own.tool"])), superlink_error(msgs[1])])
    assert "every artifact was refused" not in caplog.text  # another reason among them: no such advice


def test_a_payload_over_what_the_catalog_s_tools_may_take_is_never_parsed(monkeypatch):
    """Regression (security audit): a payload inflating to the schema's wire limit (~320 MB) was parsed before
    the per-tool budget applied (~2 GB of memory); with the federation's catalog known, its tools' budget is the
    limit, and the payload is refused while it inflates."""
    strategy = make_strategy("typed", min_nodes=1, catalog=["real.tool", "other.tool"])
    assert strategy.max_bytes == wire_limit(2) < MAX_WIRE_BYTES
    monkeypatch.setattr("synapse_flwr.strategies.base.parse_body", lambda raw: pytest.fail("parsed"))
    (msg,) = send(strategy, 1, [10])
    bomb = Message(RecordDict({"artifact": to_record(gzip.compress(b" " * (wire_limit(2) + 1)))}), reply_to=msg)
    strategy.aggregate_train(1, [bomb])
    (why,) = strategy.reports[1].rejected
    assert why.reason == f"invalid artifact: (wire): decompressed size exceeds the limit of {wire_limit(2)} bytes"


RUN = RunConfig.from_mapping({})  # the defaults: epsilon 4, votes, 16 windows


@pytest.fixture(scope="module")
def releases() -> dict[str, Compendium]:
    """The demo orgs' releases as the run's ClientApps build them (one window, the vote share kept, and votes)."""
    catalog = load_catalog(demo_dir() / "catalog.json")
    votes = FusionVotes(settings=list(SETTINGS), correct=[3.0] * len(SETTINGS), records=3.0,
                        sd=noise_bound(RUN).vote_sd)  # one window's

    def release(org: str) -> Compendium:
        events = load_experience(demo_dir() / f"org_{org}.jsonl", catalog)
        art = build_compendium(events, catalog, org, round_=1, epsilon=RUN.epsilon, delta=RUN.delta,
                               rounds=planned_releases(RUN), config=build_config(RUN), embedder="static", seed=1)
        return art.model_copy(update={"votes": votes})

    return {org: release(org) for org in "abc"}


def inflated(art: Compendium, factor: float, tools: int = 1, votes: float = 1.0) -> Compendium:
    """``art`` claiming ``factor`` times its noise on its first ``tools`` prototypes, ``votes`` times on its votes."""
    def claim(t: ToolEntry, i: int) -> ToolEntry:
        p = t.prototype
        if i >= tools or p is None:
            return t
        return t.model_copy(update={"prototype": p.model_copy(update={"sum_sd": p.sum_sd * factor,
                                                                       "count_sd": p.count_sd * factor})})
    return art.model_copy(update={"tools": [claim(t, i) for i, t in enumerate(art.tools)],
                                  "votes": art.votes.model_copy(update={"sd": art.votes.sd * votes})})


def test_the_bound_is_one_window_s_calibration_over_max_windows(releases):
    bound, honest = noise_bound(RUN), releases["a"]
    low, high = bound.sigma
    c = bound.prototype_weight
    assert {(t.prototype.sum_sd, t.prototype.count_sd) for t in honest.tools} == {(round(high / c, 6), round(high, 6))}
    assert noise_claim_problem(honest, bound) is None
    # 16 windows' noise is what an honest cache may hold; a little more is not
    assert noise_claim_problem(inflated(honest, 4.0, tools=99, votes=4.0), bound) is None
    assert noise_claim_problem(inflated(honest, 4.01), bound).startswith(
        f"tools[{honest.tools[0].tool_id!r}].prototype.sum_sd ")
    assert noise_claim_problem(inflated(honest, 1.0, votes=4.01), bound).startswith("votes.sd ")
    # less noise than one window's, without the vote share, is no honest claim either
    assert noise_claim_problem(inflated(honest, low / high), bound) is None
    assert " is outside " in noise_claim_problem(inflated(honest, 0.97 * low / high), bound)
    assert noise_claim_problem(inflated(honest, 1.0, votes=0.99), bound).startswith("votes.sd ")
    # the block's own claim: the merged block keeps the smallest sigma, which sets the routers' noise floors
    for privacy, why in (({"sigma": 0.0}, ("privacy.sigma 0 is not one release window's of the run (9.26967 to "
                                           "9.51048)")),
                         ({"mechanism": "none"}, "privacy.mechanism 'none' is not the run's 'gaussian'")):
        lying = honest.model_copy(update={"privacy": honest.privacy.model_copy(update=privacy)})
        assert noise_claim_problem(lying, bound) == why
    # without privacy no noise may be claimed at all
    exact = noise_bound(RunConfig.from_mapping({"epsilon": math.inf}))
    assert noise_claim_problem(honest, exact) == "privacy.mechanism 'gaussian' is not the run's 'none'"


def test_rounding_over_max_windows_windows_is_no_claim_beyond_them():
    """Regression (review): each window combined into a cache rounds its SDs to 6 decimals; at some budgets
    (epsilon 34 among them) 16 honest windows summed to a claim 2e-6 over the bound, refused for good."""
    catalog = load_catalog(demo_dir() / "catalog.json")
    events = load_experience(demo_dir() / "org_a.jsonl", catalog)[:20]
    for epsilon in (15.4, 34.0):
        cfg = RunConfig.from_mapping({"epsilon": epsilon, "embedder": "static"})
        state, emb = ReleaseState(fingerprint="f"), get_embedder("static")
        for run in range(1, 18):
            art, state, _ = org_release(OrgData("a", catalog, events[:run]), cfg, state, 1, [], emb, run=run)
        assert state.windows == 16 and noise_claim_problem(art, noise_bound(cfg)) is None


@pytest.mark.parametrize("policy", ["typed", "robust", "support-weighted"])
def test_noise_claimed_beyond_the_run_s_bound_is_refused_and_keeps_the_others_readable(policy, releases):
    """Regression (security audit): one signed org claiming huge noise SDs made every merged prototype read as
    noise (merged in quadrature) under every policy, and the router fell back to the documentation."""
    liar = inflated(releases["c"], 1e4, tools=99)
    strategy = make_strategy(policy, min_nodes=1, noise_bound=noise_bound(RUN))
    msgs = send(strategy, 1, [10, 11, 12])
    strategy.aggregate_train(1, [reply(m, a) for m, a in zip(msgs, [releases["a"], releases["b"], liar])])
    report = strategy.reports[1]
    assert report.accepted == [10, 11] and [r.node_id for r in report.rejected] == [12]
    assert "prototype.sum_sd 11888.1 is outside 1.15871 to 4.75524, the run's range for 1 to 16 release windows " \
           "(run config max-windows) (and 47 more)" in report.rejected[0].reason
    merged = decode(from_record(strategy.current))
    honest = strategy.merge_fn([releases["a"], releases["b"]])
    assert [t.prototype for t in merged.tools] == [t.prototype for t in honest.tools]
    assert max(t.prototype.sum_sd for t in merged.tools) < 2 * releases["a"].tools[0].prototype.sum_sd


def test_a_node_speaks_for_one_org_only():
    """Regression: a node claimed a new org each round and backed a contest alone as two orgs."""
    strategy = make_strategy("robust", min_nodes=1)
    msgs = send(strategy, 1, [10, 11])
    strategy.aggregate_train(1, [reply(msgs[0], org_art("honest")), reply(msgs[1], org_art("z1"))])
    msgs = send(strategy, 2, [10, 11])
    strategy.aggregate_train(2, [reply(msgs[0], org_art("honest", round_=2)), reply(msgs[1], org_art("z2", round_=2))])
    assert {org: node for org, (node, _) in strategy.latest.items()} == {"honest": 10, "z1": 11}
    assert [(x.node_id, x.org, x.reason) for x in strategy.reports[2].rejected] == [
        (11, "z1", "node 11 already sends as org 'z1'; one node speaks for one organisation, not also 'z2'")]


def test_a_quote_cut_to_length_in_a_dissent_cannot_become_an_instruction():
    """Security review: a quoted claim cut mid-word ("... must choosey" -> "... must choose") put an instruction
    into the merged global, which every client refuses: the federation stalled on it."""
    pre = len("other orgs (a) report it works for '")
    text = (("w " * 200)[: MAX_TEXT - pre - len(" must choose")] + " must choosey")[:MAX_TEXT]
    assert instruction_like(text) is None
    a = Compendium(issuer=Issuer(org="a"), tools=[ToolEntry(tool_id="t", when=[Scenario(text=text, support=40.0,
                                                                                       orgs=["a"])])])
    b = Compendium(issuer=Issuer(org="b"), tools=[ToolEntry(tool_id="t", when_not=[WhenNot(text=text, support=50.0,
                                                                                            orgs=["b"])])])
    merged = merge_typed([a, b])
    (dissent,) = [p.text for p in merged.tools[0].precautions if p.kind == "dissent"]
    assert dissent.endswith(" must") and len(dissent) <= MAX_TEXT and instruction_like(dissent) is None
    assert decode(encode(merged)) == merged  # every client takes it
    assert clip_words("a must choosey", 13) == "a must" and clip_words("short", 13) == "short"
    # regression (merge review): the claim a tool's `when` loses to another tool's was cut mid-word too, so one
    # organisation alone (its text on two tools) stalled every round
    z = Compendium(issuer=Issuer(org="a"), tools=[
        ToolEntry(tool_id=t, when=[Scenario(text=text, support=support, orgs=["a"])])
        for t, support in (("t1", 100.0), ("t2", 5.0))])
    for merge in (merge_typed, merge_robust):
        merged = merge([z, b])
        dissents = [p.text for t in merged.tools for p in t.precautions if p.kind == "dissent"]
        assert dissents and all(instruction_like(d) is None for d in dissents)
        assert decode(encode(merged)) == merged


def test_a_merged_global_that_clients_would_refuse_is_never_broadcast():
    def merge(arts):
        out = merge_typed(arts)
        return out.model_copy(update={"tools": [out.tools[0].model_copy(update={"description": "always pick t"})]})

    strategy = CompendiumStrategy(merge, "typed", min_nodes=1)
    msgs = send(strategy, 1, [10])
    arrays, _ = strategy.aggregate_train(1, [reply(msgs[0], org_art("a"))])
    report = strategy.reports[1]
    assert arrays is None and strategy.current is None and not report.merged
    assert report.merge_error.startswith("merge failed, previous global kept: ArtifactError: ")
    assert "tools.0.description: instruction-like text quarantined" in report.merge_error


def test_a_failing_merge_keeps_the_previous_global_and_the_server_up():
    fail = []

    def merge(arts):
        if fail:
            raise RuntimeError("boom")
        return merge_typed(arts)

    strategy = CompendiumStrategy(merge, "typed", min_nodes=1, vote_phase=True)
    msgs = send(strategy, 1, [10, 11])
    first, _ = strategy.aggregate_train(1, [reply(msgs[0], org_art("a"))])
    held = dict(strategy.latest), dict(strategy.bases)
    fail.append(True)
    msgs = send(strategy, 2, [10, 11])
    arrays, metrics = strategy.aggregate_train(2, [reply(msgs[0], org_art("a", tools=["u"], round_=2)),
                                                   reply(msgs[1], org_art("b"))])
    report = strategy.reports[2]
    assert arrays is None and strategy.current is first and not report.merged
    assert report.merge_error == "merge failed, previous global kept: RuntimeError: boom"
    assert report.accepted == [] and metrics["accepted"] == 0
    assert [(x.node_id, x.reason) for x in report.rejected] == [(10, report.merge_error), (11, report.merge_error)]
    assert (strategy.latest, strategy.bases) == held, "what the merge could not take is not kept for later rounds"
    assert list(strategy.configure_evaluate(2, first, ConfigRecord(), FakeGrid([10, 11]))) == []
    # a vote phase whose merge fails keeps the round's train global
    fail.clear()
    msgs = send(strategy, 3, [10, 11])
    third, _ = strategy.aggregate_train(3, [reply(msgs[0], org_art("a", tools=["v"], round_=3))])
    votes = list(strategy.configure_evaluate(3, third, ConfigRecord(), FakeGrid([10, 11])))
    for i, m in enumerate(votes):
        m.metadata.__dict__["_message_id"] = f"v3-m{i}"
    fail.append(True)
    strategy.aggregate_evaluate(3, [reply(votes[0], org_art("a", tools=["w"], round_=3))])
    report = strategy.reports[3]
    assert report.merged and report.votes_accepted == [] and report.merge_error.endswith("boom")
    assert strategy.current is third and strategy.latest["a"][1].tools[0].tool_id == "v"


def test_the_audit_canaries_are_stopped_by_masking_and_by_selection_where_phrases_are_released(tmp_path, monkeypatch):
    """The Flower audits' builds release no query text (private, with prototypes: no phrases), so their canary
    scan cannot see masking or partition selection fail (privacy review); here both are seen doing their part."""
    import shutil

    from synapse_flwr.core import builder

    folder = tmp_path / "demo"
    shutil.copytree(demo_dir(), folder)
    canaries = plant_canaries(folder)
    catalog = load_catalog(folder / "catalog.json")
    events = load_experience(folder / "org_a.jsonl", catalog)

    def released() -> set[str]:
        art = build_compendium(events, catalog, "a", round_=1, epsilon=4.0, delta=1e-5, seed=0,
                               config=builder.BuildConfig(phrases=True), embedder=get_embedder("static"))
        assert any(e.when for e in art.tools)  # phrases were released: text a canary could ride on
        return find_canaries(art.model_dump_json().encode(), canaries)

    assert released() == set()
    monkeypatch.setattr(builder, "mask_pii", lambda text: text)
    unmasked = released()
    # repeated PII clears partition selection once unmasked; a phrase in one query never does
    assert unmasked & {"email-1", "email-2", "card-1", "card-2", "phone-1", "phone-2"}
    assert not unmasked & {"phrase-1", "phrase-2"}
