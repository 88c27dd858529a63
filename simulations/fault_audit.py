"""Faults, crash and resume, and the canary capture, measured on real Flower runs.

Three runs of the app on the demo experience re-partitioned over five
organisations, each with the canaries of ``simulations/privacy_audit.py``
planted in every organisation's raw experience and every message the
ClientApps send captured (run config ``capture-dir``):

1. Dropouts (simulation): two of five organisations (40%) raise mid-round in
   round 2 after releasing (run config ``fail-round`` / ``fail-orgs``). The
   run must complete, the round report must name them (node id and org), and
   the round's global must still hold what they contributed before.
2. Crash and resume (simulation): the same run is killed (SIGKILL, every
   process of its Flower home) once round 1 is recorded, then started again
   into the same output folder; its final global must be byte-identical to the
   uninterrupted run 1's, and every organisation's release cache too (nothing
   released twice, no privacy re-spent).
3. A SuperNode killed (local deployment, the demo's three organisations: five
   SuperNodes' first ClientApps take over a minute on two cores): one's is
   SIGKILLed once round 1 is recorded; the run must complete with the rest,
   the report must name the node and org, and round 2 must end within the round
   timeout.

Each run's captured client messages and the server's outputs (metrics,
globals, per-org checkpoints) are searched for the canaries, and the metrics
the captured replies report beside their artifacts are listed: none may
count the organisation's records (``client_app.reply_metrics``).

Usage: ``python simulations/fault_audit.py [--rounds 3] [--out docs/results/security]`` (writes
``faults/results.json``, ``tables.md``, ``manifest.json`` and the ``dropout_rounds_completed``,
``resume_identical``, ``canaries_planted`` and ``canaries_leaked`` keys of ``summary.json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

from synapse_flwr.simulations.privacy_audit import CANARIES, plant_canaries, scan_files

from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.files import write_atomic
from synapse_flwr.flower.deploy import (
    DeploymentConfig,
    nodes_from_dataset,
    run_local_deployment,
)
from synapse_flwr.flower.launch import read_metrics, run_simulation
from synapse_flwr.flower.processes import (
    cmdline,
    processes_using_home,
    send_signal_to,
    started_by,
)

log = logging.getLogger("fault_audit")

REPO = Path(__file__).resolve().parent.parent
ORGS = 5
FAILING = ("org1", "org3")  # 40% of five
# how long they hang in round 2 of the run that is killed: far beyond the kill, far below the round timeout
CRASH_HANG_S = 120.0
# seeded noise: a resumed run must be byte-identical to the uninterrupted one
BASE = {"dataset": "demo", "embedder": "static", "evaluate": False, "min-nodes": 2, "noise": "seeded"}


def audit_dataset(folder: Path, orgs: int = ORGS) -> Path:
    """The demo over ``orgs`` organisations (re-partitioned unless 3), canaries planted in each, as a folder."""
    from synapse_flwr.data.federation import demo_dir

    folder.mkdir(parents=True, exist_ok=True)
    for spec in nodes_from_dataset("demo", orgs, folder):
        if spec.data_path.parent != folder.resolve():  # the demo's own files: plant in copies
            shutil.copy(spec.data_path, folder / f"org_{spec.org}.jsonl")
    for name in ("catalog.json", "aliases.json"):
        if (demo_dir() / name).is_file():
            shutil.copy(demo_dir() / name, folder / name)
    plant_canaries(folder)
    return folder


def _merged_orgs(out: Path, round_: int) -> dict[str, int]:
    """The artifacts round ``round_``'s global was merged from: org -> the round it sent its artifact in."""
    orgs = json.loads((out / f"orgs_round_{round_}.json").read_text())["orgs"]
    return {org: art["issuer"]["round"] for org, art in sorted(orgs.items())}


def _ledger(path: Path) -> dict:
    """A file of an org's release-cache folder (a cache, the last artifact sent), without the Flower run a
    cache was last written in: each run has its own id."""
    body = json.loads(path.read_bytes())
    body.pop("run", None)
    return body


def _leaks(*folders: Path) -> dict[str, list[str]]:
    files = [p for f in folders if f.is_dir() for p in sorted(f.rglob("*")) if p.is_file()]
    if not files:
        raise SynapseError(f"nothing captured under {', '.join(map(str, folders))}")
    return scan_files(files, list(CANARIES))


def reply_metric_names(capture: Path) -> list[str]:
    """The metric names the captured client replies report (each ``.msg`` a serialised Flower message)."""
    from flwr.common.serde import message_from_proto
    from flwr.proto.message_pb2 import Message as ProtoMessage

    names: set[str] = set()
    for path in sorted(capture.glob("*.msg")):
        proto = ProtoMessage()
        proto.ParseFromString(path.read_bytes())
        for record in message_from_proto(proto).content.metric_records.values():
            names |= set(record)
    return sorted(names)


def _kill_when(out: Path, round_: int, pick, stop: threading.Event, killed: list[int], after=None) -> None:
    """Once ``round_`` is in ``out/metrics.json``, SIGKILL the processes ``pick`` returns, then call ``after``."""
    while not stop.is_set():
        try:
            done = any(r["round"] >= round_ for r in read_metrics(out))
        except (SynapseError, ValueError, KeyError):
            done = False
        if done:
            for pid in pick():
                send_signal_to(pid, signal.SIGKILL)
                killed.append(pid)
            if after is not None:
                after(killed)
            return
        time.sleep(0.2)


def _while_killing(run, out: Path, round_: int, pick, after=None) -> list[int]:
    """Run ``run()`` while a watcher kills ``pick()`` after ``round_`` (then calls ``after``); the pids killed."""
    stop, killed = threading.Event(), []
    watcher = threading.Thread(target=_kill_when, args=(out, round_, pick, stop, killed, after), daemon=True)
    watcher.start()
    try:
        run()
    finally:
        stop.set()
        watcher.join()
    return killed


def dropouts_and_resume(work: Path, rounds: int = 2, replay: bool = False) -> dict:
    """Runs 1 and 2 of the module docstring (``replay``: each round's global feeds the next); their figures."""
    data = audit_dataset(work / "data")
    rc = {**BASE, "dataset": str(data), "num-rounds": rounds, "replay": replay, "fail-round": 2,
          "fail-orgs": ",".join(FAILING), "capture-dir": str(work / "capture")}
    ref = work / "reference"
    t0 = time.monotonic()
    run_simulation(REPO, ORGS, {**rc, "output-dir": str(ref)}, flwr_home=work / "home-ref", timeout=900)
    ref_s = time.monotonic() - t0
    records = read_metrics(ref)
    crashed, home = work / "crashed", work / "home-crash"

    def crash() -> None:
        try:  # the failing orgs hang in round 2, so round 2 cannot be recorded before the kill
            run_simulation(REPO, ORGS, {**rc, "output-dir": str(crashed), "fail-delay": CRASH_HANG_S}, flwr_home=home,
                           timeout=900)
        except SynapseError as exc:  # the run was killed: expected
            log.info("killed run ended: %s", str(exc).splitlines()[0])

    killed = _while_killing(crash, crashed, 1, lambda: processes_using_home(home))
    before = [r["round"] for r in read_metrics(crashed)]
    res = run_simulation(REPO, ORGS, {**rc, "output-dir": str(crashed)}, flwr_home=work / "home-resume", timeout=900)
    final = f"global_round_{rounds}.json"
    caches = sorted(p.name for p in (ref / "release-cache").glob("*.json"))
    dropped = [{"round": r["round"], "node_id": x["node_id"], "org": x["org"], "reason": x["reason"][:200]}
               for r in records for x in r["rejected"]]
    return {
        "rounds": rounds, "replay": replay, "orgs": ORGS, "failing_orgs": list(FAILING), "fail_round": 2,
        "rounds_completed": len(records), "reference_wall_s": round(ref_s, 1),
        "accepted_per_round": [len(r["accepted"]) for r in records],
        "dropped": dropped, "dropped_orgs_named": sorted({d["org"] for d in dropped if d["org"]}),
        "merged_into_round_2": _merged_orgs(ref, 2),
        "killed_pids": len(killed), "rounds_on_disk_after_crash": before,
        "resumed": "resuming after round" in res.log_path.read_text(),
        "resume_identical": (ref / final).read_bytes() == (crashed / final).read_bytes(),
        "release_caches_identical": bool(caches) and all(
            _ledger(ref / "release-cache" / n) == _ledger(crashed / "release-cache" / n) for n in caches),
        "canaries_leaked": _leaks(work / "capture", ref, crashed),
        "reply_metrics": reply_metric_names(work / "capture"),
        "captured_messages": len(list((work / "capture").iterdir())),
    }


def killed_supernode(work: Path, rounds: int = 2, round_timeout: float = 90.0, orgs: int = 3) -> dict:
    """Run 3 of the module docstring, on the demo's own ``orgs`` organisations; its figures."""
    data = audit_dataset(work / "data", orgs)
    nodes = nodes_from_dataset(str(data), orgs, work / "nodes")
    victim = nodes[1]
    out, home = work / "out", work / "home"
    rc = {**BASE, "dataset": str(data), "num-rounds": rounds, "round-timeout": round_timeout,
          "output-dir": str(out), "capture-dir": str(work / "capture")}
    result = {}

    def deploy() -> None:
        result["res"] = run_local_deployment(DeploymentConfig(REPO, nodes, rc, flwr_home=home, timeout=600))

    def victim_node() -> list[int]:
        return [p for p in processes_using_home(home)
                if any(a.endswith("flower-supernode") for a in cmdline(p)[:2])
                and f'org="{victim.org}"' in " ".join(cmdline(p))]

    def orphan_lifetime(killed: list[int], limit: float = 60.0) -> None:
        # how long the dead SuperNode's SuperExec (``--parent-pid``) outlives it
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit:
            if not any(started_by(processes_using_home(home), pid) for pid in killed):
                result["orphan_s"] = round(time.monotonic() - t0, 1)
                return
            time.sleep(0.5)

    killed = _while_killing(deploy, out, 1, victim_node, orphan_lifetime)
    res, records = result["res"], read_metrics(out)
    later = records[1:]
    named = [x for r in later for x in r["rejected"] if x["node_id"] == res.node_ids[victim.org]]
    return {
        "rounds": rounds, "orgs": orgs, "killed_org": victim.org, "killed_pids": len(killed),
        "status": res.status, "rounds_completed": len(records),
        "superexec_outlived_node_s": result.get("orphan_s"),  # None: still there after 60 s
        "round_wall_s": [round(r["wall_s"] - (records[i - 1]["wall_s"] if i else 0.0), 3)
                         for i, r in enumerate(records)],
        "round_timeout_s": round_timeout,
        "killed_node_named": bool(named) and all(x["org"] == victim.org for x in named),
        "rejections_after_kill": [{"round": r["round"], "node_id": x["node_id"], "org": x["org"],
                                   "reason": x["reason"][:200]} for r in later for x in r["rejected"]],
        "merged_into_final": _merged_orgs(out, rounds),
        "canaries_leaked": _leaks(work / "capture", out),
        "captured_messages": len(list((work / "capture").iterdir())),
        "reply_metrics": reply_metric_names(work / "capture"),
    }


def table(res: dict) -> str:
    """Markdown summary of the three runs."""
    d, k = res["dropouts_and_resume"], res["killed_supernode"]
    rows = [
        ("simulation: rounds completed with 2 of 5 orgs failing in round 2", f"{d['rounds_completed']} of {d['rounds']}"),
        ("accepted per round", d["accepted_per_round"]),
        ("dropped orgs named in the report", ", ".join(d["dropped_orgs_named"])),
        ("artifacts merged into round 2's global, org: round sent (nothing merged lost)",
         ", ".join(f"{o}: {r}" for o, r in d["merged_into_round_2"].items())),
        ("crash after round 1, resume: final global byte-identical", d["resume_identical"]),
        ("release caches identical (no privacy re-spent)", d["release_caches_identical"]),
        ("deployment: SuperNode of the killed org", k["killed_org"]),
        ("deployment: status, rounds completed", f"{k['status']}, {k['rounds_completed']} of {k['rounds']}"),
        ("deployment: round wall times (s) / round timeout", f"{k['round_wall_s']} / {k['round_timeout_s']}"),
        ("deployment: killed node named by node id and org", k["killed_node_named"]),
        ("deployment: artifacts merged into the final global, org: round sent",
         ", ".join(f"{o}: {r}" for o, r in k["merged_into_final"].items())),
        ("deployment: seconds the dead node's SuperExec outlived it", k["superexec_outlived_node_s"]),
        ("canaries planted (per org) / leaked (files)", f"{len(CANARIES)} / "
         f"{len(d['canaries_leaked']) + len(k['canaries_leaked'])}"),
        ("client messages searched (simulations / deployment)", f"{d['captured_messages']} / {k['captured_messages']}"),
        ("metrics a reply reports beside its artifact (simulations / deployment)",
         f"{', '.join(d['reply_metrics'])} / {', '.join(k['reply_metrics'])}"),
    ]
    return "\n".join(["| check | outcome |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]) + "\n"


def main() -> None:
    """Run both audits; a SIGTERM stops them as Ctrl-C does (Flower processes torn down)."""
    from synapse_flwr.data.check import file_hashes
    from synapse_flwr.data.federation import demo_dir
    from synapse_flwr.eval.results import update_summary, write_results
    from synapse_flwr.flower.processes import interrupt_on_sigterm

    interrupt_on_sigterm()

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "docs/results/security")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix="fault-audit-") as tmp:
        res = {"dropouts_and_resume": dropouts_and_resume(Path(tmp) / "sim", args.rounds, replay=True),
               "killed_supernode": killed_supernode(Path(tmp) / "deploy", args.rounds)}
    d, k = res["dropouts_and_resume"], res["killed_supernode"]
    folder = args.out / "faults"
    write_results(folder, res, {"rounds": args.rounds, "orgs": ORGS, "failing": list(FAILING), **BASE},
                  file_hashes(demo_dir()), f"python simulations/fault_audit.py --rounds {args.rounds}")
    write_atomic(folder / "tables.md", "# Dropouts, crash and resume, canaries\n\n" + table(res))
    leaked = set().union(*d["canaries_leaked"].values(), *k["canaries_leaked"].values())
    update_summary(args.out / "summary.json", {
        "dropout_rounds_completed": d["rounds_completed"],
        "resume_identical": int(d["resume_identical"] and d["release_caches_identical"]),
        "canaries_planted": len(CANARIES),
        "canaries_leaked": len(leaked),
    })
    log.info("%s", table(res))


if __name__ == "__main__":
    main()
