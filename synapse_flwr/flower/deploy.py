"""Run the Flower app for real on this machine: a simulation, or a SuperLink with SuperNodes.

Two entry points, both pure orchestration of Flower's own command-line tools
(``flwr``, ``flower-superlink``, ``flower-supernode``) through ``subprocess``:

* :func:`run_simulation`: ``flwr run <app> local --stream`` under the Ray
  simulation engine, on a managed local SuperLink with its own ports and
  ``FLWR_HOME``;
* :func:`run_local_deployment`: one SuperLink and one SuperNode per
  organisation on ``127.0.0.1``, each SuperNode given its organisation's
  private experience file through ``--node-config``, exactly as separate hosts
  would be (see ``docs/deployment.md``).

Both judge a run by its outputs and its final status, never by the exit code
of ``flwr run`` (which is 0 even when the ServerApp fails), and both stop every
process they started, in a ``finally`` block, also on ``KeyboardInterrupt``.
Processes are recognised by a tag in their environment that all their
descendants inherit (SuperExec, ServerApp, ClientApp and Ray processes
included), so nothing else on the machine is touched.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import synapse_flwr
from synapse_flwr.core.errors import SynapseError
from synapse_flwr.data.pins import ENV_VAR, data_dir

log = logging.getLogger(__name__)

FLOWER_BINARIES = ("flwr", "flower-superlink", "flower-supernode", "flower-superexec")
DAEMONS = ("flower-superlink", "flower-supernode")
TAG_ENV = "SYNAPSE_FLWR_SESSION"  # marks every process a session starts (inherited)
HOST = "127.0.0.1"
FINISHED_OK = "finished:completed"
POLL_S = 2.0  # seconds between run-status polls
LOG_TAIL = 3000  # characters of a log quoted in an error


# ------------------------------------------------------------------ config and results


@dataclass(frozen=True)
class NodeSpec:
    """One organisation's SuperNode.

    Parameters
    ----------
    org : str
        Organisation name (``org`` in the node config).
    data_path : Path
        Its private experience log (JSONL), passed as ``data-path``.
    catalog_path : Path or None
        Its tool catalog (``catalog-path``); without it the ClientApp loads
        the catalog of the run config's ``dataset``.
    """

    org: str
    data_path: Path
    catalog_path: Path | None = None

    def node_config(self) -> str:
        """The ``--node-config`` value of this node (absolute paths)."""
        items = {"data-path": self.data_path, "org": self.org, "catalog-path": self.catalog_path}
        parts = []
        for key, value in items.items():
            if value is None:
                continue
            text = str(Path(value).resolve()) if isinstance(value, Path) else str(value)
            if '"' in text or "\n" in text:
                raise SynapseError(f"node {self.org!r}: {key} {text!r} may not contain quotes or newlines")
            parts.append(f'{key}="{text}"')
        return " ".join(parts)


@dataclass
class DeploymentConfig:
    """A local real deployment: one SuperLink and one SuperNode per organisation.

    Parameters
    ----------
    app_dir : Path
        The Flower app (folder with ``pyproject.toml``).
    nodes : int or sequence of NodeSpec
        Explicit SuperNodes, or a number: that many organisations of the run
        config's ``dataset`` (its own org logs when it has exactly that many,
        otherwise a non-IID re-partition written under ``flwr_home``).
    run_config : mapping
        Overrides of ``[tool.flwr.app.config]`` (``num-rounds``, ``policy``,
        ``epsilon``, ``output-dir``...). Relative ``output-dir`` and dataset
        folders are made absolute (the app runs from a copy under
        ``flwr_home``).
    flwr_home : Path or None
        Private ``FLWR_HOME`` (CLI config, installed app, logs); a new
        temporary folder when None.
    superlink_port : int or None
        SuperLink port (Fleet, Control and ServerAppIo APIs); a free one when
        None.
    node_ports : sequence of int or None
        One local Runtime API port per SuperNode; free ones when None.
    timeout : float
        Seconds the run may take once submitted.
    online_timeout : float
        Seconds for the SuperLink to start and every SuperNode to come online.
    """

    app_dir: Path
    nodes: int | Sequence[NodeSpec] = 3
    run_config: Mapping[str, Any] = field(default_factory=dict)
    flwr_home: Path | None = None
    superlink_port: int | None = None
    node_ports: Sequence[int] | None = None
    timeout: float = 900.0
    online_timeout: float = 60.0


@dataclass(frozen=True)
class DeploymentResult:
    """What a local deployment did.

    Parameters
    ----------
    run_id : str
        Flower run id.
    status : str
        Final status (``finished:completed`` on success).
    output_dir : Path
        Where ``global_round_<r>.json`` and ``metrics.json`` are.
    wall_s : float
        Seconds from the first process started to the last one stopped.
    run_s : float
        Seconds from submission to the run's end.
    log_path : Path
        The run's log (``flwr log``); SuperLink and SuperNode logs are next to it.
    node_ids : dict of str to int
        Flower node id of each organisation's SuperNode.
    peak_rss_bytes : int or None
        Peak of the summed resident memory of all started processes (sampled).
    """

    run_id: str
    status: str
    output_dir: Path
    wall_s: float
    run_s: float
    log_path: Path
    node_ids: dict[str, int]
    peak_rss_bytes: int | None = None


@dataclass(frozen=True)
class SimulationResult:
    """What a local simulation did.

    Parameters
    ----------
    run_id : str or None
        Flower run id (None if it could not be read back).
    status : str
        Final status (``finished:completed`` on success).
    output_dir : Path
        Where ``global_round_<r>.json`` and ``metrics.json`` are.
    wall_s : float
        Seconds from ``flwr run`` to the managed SuperLink stopped.
    log_path : Path
        The streamed run log.
    peak_rss_bytes : int or None
        Peak of the summed resident memory of all started processes (sampled).
    """

    run_id: str | None
    status: str
    output_dir: Path
    wall_s: float
    log_path: Path
    peak_rss_bytes: int | None = None


def parse_node(text: str, catalog_path: Path | None = None) -> NodeSpec:
    """A node from ``ORG=DATA_PATH`` (a CLI's ``--node a=/data/org_a.jsonl``).

    Raises
    ------
    SynapseError
        If the text has no ``=`` or an empty side.
    """
    org, sep, path = text.partition("=")
    if not sep or not org.strip() or not path.strip():
        raise SynapseError(f"node {text!r} must be ORG=DATA_PATH")
    return NodeSpec(org.strip(), Path(path.strip()).expanduser(), catalog_path)


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Run-config overrides from ``key=value`` items, values in TOML (``epsilon=inf``, ``policy="typed"``).

    A value that is not valid TOML is taken as a string (``dataset=demo``).

    Raises
    ------
    SynapseError
        If an item has no ``=``.
    """
    import tomllib

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SynapseError(f"run-config override {item!r} must be KEY=VALUE")
        try:
            out[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = value.strip()
    return out


# ------------------------------------------------------------------ environment


def flower_bin_dir() -> Path:
    """Folder of the running interpreter's scripts (the venv's ``bin``)."""
    return Path(sys.executable).parent


def flower_env(flwr_home: Path, tag: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for Flower processes: private home, no telemetry, no installs, tagged.

    Raises
    ------
    SynapseError
        If a Flower binary is not on the resulting ``PATH``.
    """
    path = os.pathsep.join([str(flower_bin_dir()), os.environ.get("PATH", "")])
    missing = [b for b in FLOWER_BINARIES if shutil.which(b, path=path) is None]
    if missing:
        raise SynapseError(
            f"Flower binaries not found on PATH: {', '.join(missing)}; install the package with "
            "its dependencies (flwr[simulation]) and put the virtual environment's bin on PATH"
        )
    env = dict(os.environ)
    env.update(
        PATH=path,
        FLWR_HOME=str(flwr_home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PYTHONUNBUFFERED="1",
        **{TAG_ENV: tag},
    )
    # Apps run from an installed copy under FLWR_HOME, where "../shared/data" means
    # nothing: resolve the data folder here, from the caller's point of view.
    try:
        env.setdefault(ENV_VAR, str(data_dir().resolve()))
    except SynapseError:
        pass  # no benchmark data: only the demo and dataset folders will work
    env.update(extra or {})
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def check_port(port: int, what: str) -> int:
    """Return ``port`` if it can be bound on 127.0.0.1.

    Raises
    ------
    SynapseError
        If it is busy.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            raise SynapseError(f"port {port} for the {what} is busy ({exc.strerror}); "
                               "choose another or leave it unset to pick a free one") from None
    return port


def pick_ports(requested: Sequence[int | None], what: Sequence[str]) -> list[int]:
    """Check the requested ports and fill the unset ones with distinct free ports.

    Raises
    ------
    SynapseError
        If a requested port is busy or two are equal.
    """
    given = [p for p in requested if p is not None]
    if len(set(given)) != len(given):
        raise SynapseError(f"ports must be distinct: {given}")
    ports = [check_port(p, w) if p is not None else None for p, w in zip(requested, what, strict=True)]
    taken = set(given)
    for i, port in enumerate(ports):
        while port is None or (requested[i] is None and port in taken):
            port = free_port()
        ports[i] = port
        taken.add(port)
    return [int(p) for p in ports]


def toml_value(value: Any) -> str:
    """One run-config value as TOML (str, bool, int, float incl. inf)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, (str, Path)):
        return json.dumps(str(value), ensure_ascii=False)
    raise SynapseError(f"run config value {value!r} must be a string, bool, int or float")


def absolute_run_config(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Run config with ``output-dir`` (default ``runs/latest``) and folder datasets absolute."""
    rc = dict(run_config)
    rc["output-dir"] = str(Path(str(rc.get("output-dir", "runs/latest"))).expanduser().resolve())
    dataset = rc.get("dataset")
    if isinstance(dataset, (str, Path)) and str(dataset) not in ("demo", "metatool"):
        if Path(dataset).expanduser().is_dir():
            rc["dataset"] = str(Path(dataset).expanduser().resolve())
    return rc


def write_run_config(path: Path, run_config: Mapping[str, Any]) -> Path:
    """Write run-config overrides as a TOML file for ``flwr run --run-config``."""
    lines = [f'"{key}" = {toml_value(value)}' for key, value in run_config.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def tail(path: Path, chars: int = LOG_TAIL) -> str:
    """The end of a log file, colour codes removed ('(empty)' if missing or empty)."""
    try:
        text = _ANSI.sub("", path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        text = ""
    return text[-chars:] if text.strip() else "(empty)"


# ------------------------------------------------------------------ processes


def _proc_ids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()] if os.path.isdir("/proc") else []


def tagged_processes(tag: str) -> list[int]:
    """Live processes (not zombies) whose environment carries ``TAG_ENV=tag`` (Linux)."""
    marker = f"{TAG_ENV}={tag}".encode()
    found = []
    for pid in _proc_ids():
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if marker not in fh.read().split(b"\0"):
                    continue
            if _state(pid) not in ("Z", "X", None):
                found.append(pid)
        except OSError:
            continue
    return found


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    if os.path.isdir("/proc"):
        return _state(pid) not in ("Z", "X", None)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ps_find(fragment: str) -> list[int]:
    """Pids whose command line contains ``fragment`` (via ``ps``, for systems without /proc)."""
    try:
        out = subprocess.run(["ps", "-axww", "-o", "pid=,command="], capture_output=True, text=True,
                             timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    pids = [int(line.split(None, 1)[0]) for line in out.splitlines()
            if fragment in line and line.split(None, 1)[0].isdigit()]
    return [pid for pid in pids if pid != os.getpid()]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class MemorySampler:
    """Samples the summed RSS of a session's tagged processes in a background thread."""

    def __init__(self, tag: str, interval: float = 0.5) -> None:
        self.tag = tag
        self.interval = interval
        self.peak: int | None = 0 if os.path.isdir("/proc") else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            total = sum(_rss(pid) for pid in tagged_processes(self.tag))
            self.peak = max(self.peak or 0, total)

    def __enter__(self) -> MemorySampler:
        if self.peak is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


class ProcessGroup:
    """The processes of one session: started here, stopped here, nothing left behind.

    Parameters
    ----------
    tag : str
        Value of :data:`TAG_ENV` in every started process's environment.
    env : dict
        Environment of the started processes.
    log_dir : Path
        Where each process's output goes (``<name>.log``).
    """

    def __init__(self, tag: str, env: dict[str, str], log_dir: Path) -> None:
        self.tag = tag
        self.env = env
        self.log_dir = log_dir
        self.started: list[tuple[str, subprocess.Popen]] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def log_path(self, name: str) -> Path:
        """The log file of process ``name``."""
        return self.log_dir / f"{name}.log"

    def start(self, name: str, cmd: Sequence[str], cwd: Path) -> subprocess.Popen:
        """Start ``cmd`` in its own session, output to ``<log_dir>/<name>.log``."""
        with open(self.log_path(name), "wb") as out:
            proc = subprocess.Popen(  # noqa: S603 - fixed Flower binaries, no shell
                list(cmd), env=self.env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self.started.append((name, proc))
        log.info("started %s (pid %d)", name, proc.pid)
        return proc

    def flwr(self, args: Sequence[str], cwd: Path, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run one ``flwr`` CLI command to completion."""
        try:
            return subprocess.run(  # noqa: S603
                ["flwr", *args], env=self.env, cwd=cwd, capture_output=True, text=True,
                timeout=timeout, stdin=subprocess.DEVNULL, check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise SynapseError(f"`flwr {' '.join(args)}` did not answer within {timeout:.0f}s") from exc

    def stop(self, grace: float = 15.0, linger: float = 20.0) -> list[int]:
        """Stop everything this group started; return the pids that had to be killed.

        SuperNodes first, then the SuperLink (SIGTERM, SIGKILL after
        ``grace`` seconds), then wait up to ``linger`` seconds for their
        descendants (SuperExec, app and Ray processes) to exit on their own,
        and terminate those that do not.
        """
        killed: list[int] = []
        for name, proc in reversed(self.started):
            if proc.poll() is None:
                log.debug("stopping %s (pid %d)", name, proc.pid)
                proc.send_signal(signal.SIGTERM)
        for name, proc in reversed(self.started):
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) ignored SIGTERM; killing it", name, proc.pid)
                proc.kill()
                proc.wait()
                killed.append(proc.pid)
        killed += self.stop_daemons(grace)
        killed += self.reap(linger)
        return killed

    def stop_daemons(self, grace: float = 15.0) -> list[int]:
        """SIGTERM tagged SuperLinks/SuperNodes started indirectly (``flwr run . local``).

        They never exit by themselves; their children do once they are gone.
        """
        if os.path.isdir("/proc"):
            daemons = [pid for pid in tagged_processes(self.tag)
                       if any(Path(a).name in DAEMONS for a in _cmdline(pid)[:2])]
        else:  # no /proc (macOS): find the managed SuperLink by its private log file
            daemons = _ps_find(f"--log-file {self.env['FLWR_HOME']}/local-superlink/superlink.log")
        for pid in daemons:
            log.debug("stopping %s (pid %d)", " ".join(_cmdline(pid)[:2]), pid)
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while (left := [p for p in daemons if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:
            log.warning("pid %d ignored SIGTERM; killing it", pid)
            _signal(pid, signal.SIGKILL)
        return left

    def reap(self, linger: float = 20.0) -> list[int]:
        """Wait for the tagged leftovers to exit; SIGTERM, then SIGKILL, the stubborn ones."""
        deadline = time.monotonic() + linger
        while (left := tagged_processes(self.tag)) and time.monotonic() < deadline:
            time.sleep(0.25)
        killed = []
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if not left:
                break
            log.warning("processes still running after teardown, sending %s: %s", sig.name,
                        ", ".join(f"{pid} ({' '.join(_cmdline(pid)[:2])})" for pid in left))
            for pid in left:
                _signal(pid, sig)
            killed += left
            deadline = time.monotonic() + wait
            while (left := tagged_processes(self.tag)) and time.monotonic() < deadline:
                time.sleep(0.1)
        if left:
            log.error("could not stop processes %s", left)
        return sorted(set(killed))


def _safe_stop(group: ProcessGroup, what: str) -> None:
    """Teardown that survives a second Ctrl-C (it restarts, then kills)."""
    for _ in range(3):
        try:
            t0 = time.monotonic()
            group.stop()
            log.info("%s stopped in %.1fs, no process left", what, time.monotonic() - t0)
            return
        except KeyboardInterrupt:
            log.warning("interrupted during teardown of %s; finishing teardown", what)
    for _, proc in group.started:
        _signal(proc.pid, signal.SIGKILL)
    for pid in tagged_processes(group.tag):
        _signal(pid, signal.SIGKILL)


# ------------------------------------------------------------------ outputs


def read_metrics(output_dir: Path) -> list[dict]:
    """Round records of ``<output_dir>/metrics.json`` ([] if absent or unreadable)."""
    try:
        return list(json.loads((output_dir / "metrics.json").read_text(encoding="utf-8"))["rounds"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def check_outputs(output_dir: Path, num_rounds: int) -> str | None:
    """Why the outputs of a run of ``num_rounds`` rounds are incomplete (None if complete)."""
    from synapse_flwr.core.wire import ArtifactError, load_artifact

    rounds = {r.get("round") for r in read_metrics(output_dir)}
    missing = [r for r in range(1, num_rounds + 1) if r not in rounds]
    if missing:
        return f"{output_dir / 'metrics.json'} lacks rounds {missing}"
    last = output_dir / f"global_round_{num_rounds}.json"
    try:
        load_artifact(last)
    except ArtifactError as exc:
        return f"{last} is not a valid compendium: {exc}"
    return None


def _num_rounds(app_dir: Path, run_config: Mapping[str, Any]) -> int:
    if "num-rounds" in run_config:
        return int(run_config["num-rounds"])
    import tomllib

    try:
        doc = tomllib.loads((app_dir / "pyproject.toml").read_text(encoding="utf-8"))
        return int(doc["tool"]["flwr"]["app"]["config"]["num-rounds"])
    except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError) as exc:
        raise SynapseError(f"cannot read num-rounds from {app_dir / 'pyproject.toml'}: {exc}") from None


def default_app_dir() -> Path:
    """This project's Flower app: the checkout holding the package, else the working folder."""
    root = Path(synapse_flwr.__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else Path.cwd()


def _app_dir(app_dir: Path) -> Path:
    app_dir = Path(app_dir).expanduser().resolve()
    if not (app_dir / "pyproject.toml").is_file():
        raise SynapseError(f"{app_dir} is not a Flower app (no pyproject.toml)")
    return app_dir


def stage_app(app_dir: Path, dest: Path) -> Path:
    """Copy the app's sources to ``dest`` for ``flwr run`` and return ``dest``.

    ``flwr`` builds the app bundle by walking the whole folder before
    filtering it, which takes seconds per run inside a checkout holding a
    virtual environment. The copy leaves out what the bundle would leave out
    anyway: hidden entries (``.venv``, ``.git``), caches, ``*.egg-info`` and
    the top-level folders ignored by the app's ``.gitignore`` (``runs/``...).
    """
    ignored = {".*", "__pycache__", "*.egg-info", "*.pyc", "*.pyo"}
    gitignore = app_dir / ".gitignore"
    if gitignore.is_file():
        for line in gitignore.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip().strip("/")
            if line and not line.startswith(("#", "!")) and "/" not in line:
                ignored.add(line)
    patterns = sorted(ignored)

    def ignore(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if any(fnmatch.fnmatch(n, pat) for pat in patterns)}

    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(app_dir, dest, ignore=ignore, symlinks=False)
    return dest


def _home(flwr_home: Path | None, prefix: str) -> Path:
    home = Path(flwr_home).expanduser().resolve() if flwr_home else Path(tempfile.mkdtemp(prefix=prefix))
    home.mkdir(parents=True, exist_ok=True)
    return home


def _progress(output_dir: Path, seen: int, num_rounds: int) -> int:
    """Log the rounds recorded since ``seen``; return the new count."""
    rounds = read_metrics(output_dir)
    for rec in rounds[seen:]:
        log.info("round %s/%d done: %d accepted, %d rejected, %s bytes per client, %s conflicts",
                 rec.get("round"), num_rounds, len(rec.get("accepted", [])),
                 len(rec.get("rejected", [])), rec.get("bytes_per_client"), rec.get("conflicts"))
    return max(seen, len(rounds))


# ------------------------------------------------------------------ simulation


def run_simulation(
    app_dir: Path,
    num_supernodes: int = 3,
    run_config: Mapping[str, Any] | None = None,
    flwr_home: Path | None = None,
    timeout: float = 900.0,
) -> SimulationResult:
    """Run the app under Flower's simulation engine on a private managed SuperLink.

    Runs ``flwr run <app_dir> local --federation-config num-supernodes=K
    --run-config <overrides.toml> --stream`` with its own ``FLWR_HOME`` and
    free ports for the managed SuperLink, then stops that SuperLink and
    everything it spawned.

    Parameters
    ----------
    app_dir : Path
        The Flower app.
    num_supernodes : int
        Simulated organisations (K).
    run_config : mapping or None
        Overrides of ``[tool.flwr.app.config]``; relative ``output-dir`` and
        dataset folders are made absolute.
    flwr_home : Path or None
        Private ``FLWR_HOME``; a new temporary folder when None.
    timeout : float
        Seconds the whole run may take.

    Raises
    ------
    SynapseError
        If Flower is missing, the ports are busy, the run times out, fails or
        leaves incomplete outputs (with the tail of its log).
    """
    app_dir = _app_dir(app_dir)
    rc = absolute_run_config(run_config or {})
    num_rounds = _num_rounds(app_dir, rc)
    output_dir = Path(rc["output-dir"])
    home = _home(flwr_home, "synapse-flwr-sim-")
    http_port, control_port = pick_ports([None, None], ["managed SuperLink", "Control API"])
    tag = uuid.uuid4().hex
    env = flower_env(home, tag, {
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
    })
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n', encoding="utf-8")
    overrides = write_run_config(home / "run_config.toml", rc)
    group = ProcessGroup(tag, env, home / "logs")
    app_dir = stage_app(app_dir, home / "app")
    cmd = ["flwr", "run", str(app_dir), "local", "--federation-config",
           f"num-supernodes={int(num_supernodes)}", "--run-config", str(overrides), "--stream"]
    log.info("simulation: K=%d, %d rounds, outputs in %s, FLWR_HOME %s", num_supernodes, num_rounds,
             output_dir, home)
    t0 = time.monotonic()
    run_id, status = None, "unknown"
    try:
        with MemorySampler(tag) as sampler:
            try:
                proc = group.start("simulation", cmd, cwd=app_dir)
                deadline = t0 + timeout
                seen = 0
                while proc.poll() is None:
                    if time.monotonic() > deadline:
                        raise SynapseError(f"simulation did not finish within {timeout:.0f}s; log tail:\n"
                                           f"{tail(group.log_path('simulation'))}")
                    seen = _progress(output_dir, seen, num_rounds)
                    time.sleep(1.0)
                _progress(output_dir, seen, num_rounds)
                run_id, status = _last_run(group, app_dir)
            finally:
                _safe_stop(group, "simulation")
    finally:
        wall = time.monotonic() - t0
    log_path = group.log_path("simulation")
    problem = None if status == FINISHED_OK else f"run {run_id} ended with status {status!r}"
    problem = problem or check_outputs(output_dir, num_rounds)
    if problem:
        raise SynapseError(f"simulation failed: {problem}; log tail ({log_path}):\n{tail(log_path)}")
    log.info("simulation run %s %s in %.1fs", run_id, status, wall)
    return SimulationResult(run_id, status, output_dir, round(wall, 3), log_path, sampler.peak)


def _last_run(group: ProcessGroup, cwd: Path) -> tuple[str | None, str]:
    """Id and status of the most recent run on the session's SuperLink."""
    res = group.flwr(["ls", "--format", "json"], cwd=cwd)
    try:
        runs = json.loads(res.stdout)["runs"]
    except (ValueError, KeyError, TypeError):
        return None, f"unknown (flwr ls: {(res.stdout + res.stderr)[-300:].strip()})"
    if not runs:
        return None, "no run"
    last = max(runs, key=lambda r: r.get("pending-at") or "")
    return str(last.get("run-id")), str(last.get("status"))


# ------------------------------------------------------------------ deployment


def nodes_from_dataset(dataset: str, n: int, out_dir: Path, seed: int = 42, alpha: float = 0.5) -> list[NodeSpec]:
    """One :class:`NodeSpec` per organisation of a dataset, split over ``n`` orgs.

    A dataset folder with exactly ``n`` ``org_*.jsonl`` logs (the demo has
    three) is used as is; otherwise its pooled experience is re-partitioned
    non-IID and written to ``out_dir/org_<i>.jsonl``. The catalog is the
    folder's, or written to ``out_dir/catalog.json``.
    """
    from synapse_flwr.core.experience import write_jsonl
    from synapse_flwr.core.files import write_atomic
    from synapse_flwr.data.federation import demo_dir, load_federated

    folder = demo_dir() if dataset == "demo" else Path(dataset)
    catalogs = [p for p in (folder / "catalog.json", folder / "catalog.jsonl") if p.is_file()]
    logs = sorted(folder.glob("org_*.jsonl")) if folder.is_dir() else []
    if len(logs) == n and catalogs:
        return [NodeSpec(p.stem.removeprefix("org_"), p.resolve(), catalogs[0].resolve()) for p in logs]
    ds = load_federated(dataset, n, seed, alpha)
    if catalogs:
        catalog_path = catalogs[0].resolve()
    else:
        catalog_path = out_dir / "catalog.json"
        docs = [{"name": d.name, "description": d.description, "aliases": list(d.aliases),
                 **({"parameters": dict(d.parameters)} if d.parameters else {})}
                for d in (ds.catalog.get(t) for t in ds.catalog.ids) if d is not None]
        write_atomic(catalog_path, json.dumps(docs, indent=1))
    specs = []
    for org in sorted(ds.orgs):
        path = out_dir / f"org_{org}.jsonl"
        write_atomic(path, write_jsonl(ds.orgs[org]))
        specs.append(NodeSpec(org, path.resolve(), catalog_path))
    return specs


def _node_status(group: ProcessGroup, cwd: Path) -> dict[str, str]:
    res = group.flwr(["supernode", "ls", "--format", "json"], cwd=cwd)
    try:
        return {str(n["node-id"]): str(n["status"]) for n in json.loads(res.stdout)["nodes"]}
    except (ValueError, KeyError, TypeError):
        return {}


_NODE_ID = re.compile(r"SuperNode ID: (\d+)")


def _wait_online(group: ProcessGroup, specs: Sequence[NodeSpec], cwd: Path, timeout: float) -> dict[str, int]:
    """Wait until every SuperNode is online; return org -> node id.

    A SuperNode logs its id once registered (cheap to watch); only then is
    the SuperLink asked (``flwr supernode ls``, a ~2 s command) whether all
    are online.
    """
    deadline = time.monotonic() + timeout
    names = [name for name, _ in group.started[1:]]
    ids: dict[str, int] = {}
    while True:
        for name, proc in group.started:
            if proc.poll() is not None:
                raise SynapseError(f"{name} exited with code {proc.returncode} before the run; "
                                   f"log tail ({group.log_path(name)}):\n{tail(group.log_path(name))}")
        for name, spec in zip(names, specs, strict=True):
            if spec.org not in ids and (match := _NODE_ID.search(tail(group.log_path(name), 100_000))):
                ids[spec.org] = int(match.group(1))
        online: set[str] = set()
        if len(ids) == len(specs):
            online = {nid for nid, st in _node_status(group, cwd).items() if st == "online"}
            if all(str(i) in online for i in ids.values()):
                return ids
        if time.monotonic() > deadline:
            late = [(n, s) for n, s in zip(names, specs, strict=True) if str(ids.get(s.org)) not in online]
            name, spec = late[0]
            raise SynapseError(
                f"{len(late)} of {len(specs)} SuperNodes not online after {timeout:.0f}s "
                f"(orgs {', '.join(s.org for _, s in late)}); log tail of org {spec.org!r} "
                f"({group.log_path(name)}):\n{tail(group.log_path(name))}"
            )
        time.sleep(0.5)


def run_local_deployment(cfg: DeploymentConfig) -> DeploymentResult:
    """Deploy the app for real on 127.0.0.1: SuperLink, SuperNodes, one run, teardown.

    Steps: start ``flower-superlink`` and one ``flower-supernode`` per
    organisation (``--node-config 'data-path="..." org="..."'``, plus
    ``catalog-path`` when given), wait until all are online, submit the run
    with ``flwr run <app> deploy``, log progress per round until the run
    finishes, save its log (``flwr log``), and stop every process started
    (also on error or Ctrl-C).

    Raises
    ------
    SynapseError
        If Flower is missing, a port is busy, a SuperNode does not come
        online in time (with its log tail), or the run fails or times out
        (with the tail of ``flwr log``).
    """
    app_dir = _app_dir(cfg.app_dir)
    rc = absolute_run_config(cfg.run_config)
    num_rounds = _num_rounds(app_dir, rc)
    output_dir = Path(rc["output-dir"])
    home = _home(cfg.flwr_home, "synapse-flwr-deploy-")
    if isinstance(cfg.nodes, int):
        if cfg.nodes < 1:
            raise SynapseError("a deployment needs at least one SuperNode")
        specs = nodes_from_dataset(str(rc.get("dataset", "demo")), cfg.nodes, home / "data",
                                   int(rc.get("seed", 42)), float(rc.get("alpha", 0.5)))
    else:
        specs = list(cfg.nodes)
    for spec in specs:
        if not Path(spec.data_path).is_file():
            raise SynapseError(f"experience file of org {spec.org!r} not found: {spec.data_path}")
    if len({s.org for s in specs}) != len(specs):
        raise SynapseError(f"organisation names must be distinct: {[s.org for s in specs]}")
    node_ports = list(cfg.node_ports) if cfg.node_ports is not None else [None] * len(specs)
    if len(node_ports) != len(specs):
        raise SynapseError(f"{len(node_ports)} node ports given for {len(specs)} SuperNodes")
    ports = pick_ports([cfg.superlink_port, *node_ports],
                       ["SuperLink", *(f"SuperNode of org {s.org!r}" for s in specs)])
    link_port, node_ports = ports[0], ports[1:]
    tag = uuid.uuid4().hex
    env = flower_env(home, tag)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "deploy"\n\n[superlink.deploy]\naddress = "{HOST}:{link_port}"\n'
        "insecure = true\n", encoding="utf-8")
    overrides = write_run_config(home / "run_config.toml", rc)
    group = ProcessGroup(tag, env, home / "logs")
    app_dir = stage_app(app_dir, home / "app")
    log.info("deployment: %d SuperNodes, %d rounds, SuperLink %s:%d, outputs in %s, FLWR_HOME %s",
             len(specs), num_rounds, HOST, link_port, output_dir, home)
    t0 = time.monotonic()
    run_id, status, run_s = "", "not submitted", 0.0
    log_path = group.log_path("run")
    try:
        with MemorySampler(tag) as sampler:
            try:
                group.start("superlink", ["flower-superlink", "--insecure",
                                          "--disable-runtime-dependency-installation",
                                          "--host", HOST, "--port", str(link_port)], cwd=home)
                for spec, port in zip(specs, node_ports, strict=True):
                    group.start(f"supernode_{spec.org}", [
                        "flower-supernode", "--insecure", "--superlink", f"{HOST}:{link_port}",
                        "--host", HOST, "--port", str(port), "--node-config", spec.node_config(),
                    ], cwd=home)
                node_ids = _wait_online(group, specs, home, cfg.online_timeout)
                log.info("%d SuperNodes online after %.1fs: %s", len(specs), time.monotonic() - t0,
                         ", ".join(f"{o}={i}" for o, i in node_ids.items()))
                run_id, status, run_s = _submit_and_wait(group, app_dir, overrides, home, output_dir,
                                                         num_rounds, cfg.timeout)
                try:
                    res = group.flwr(["log", run_id, "--show"], cwd=home)
                    log_path.write_text(res.stdout + res.stderr, encoding="utf-8")
                except SynapseError as exc:  # keep the run's status; say why the log is missing
                    log_path.write_text(f"could not fetch the run log: {exc}\n", encoding="utf-8")
            finally:
                _safe_stop(group, "deployment")
    finally:
        wall = time.monotonic() - t0
    problem = None if status == FINISHED_OK else f"run {run_id} ended with status {status!r}"
    problem = problem or check_outputs(output_dir, num_rounds)
    if problem:
        raise SynapseError(f"deployment failed: {problem}; `flwr log` tail ({log_path}):\n{tail(log_path)}")
    log.info("deployment run %s %s in %.1fs (total %.1fs)", run_id, status, run_s, wall)
    return DeploymentResult(run_id, status, output_dir, round(wall, 3), round(run_s, 3), log_path,
                            node_ids, sampler.peak)


def _submit_and_wait(
    group: ProcessGroup, app_dir: Path, overrides: Path, cwd: Path, output_dir: Path,
    num_rounds: int, timeout: float,
) -> tuple[str, str, float]:
    """Submit the run, poll its status until finished; return (run id, status, seconds)."""
    t0 = time.monotonic()
    res = group.flwr(["run", str(app_dir), "deploy", "--run-config", str(overrides), "--format", "json"],
                     cwd=cwd, timeout=120)
    try:
        run_id = str(json.loads(res.stdout)["run-id"])
    except (ValueError, KeyError, TypeError):
        raise SynapseError(f"`flwr run` did not submit the run (rc {res.returncode}):\n"
                           f"{(res.stdout + res.stderr)[-LOG_TAIL:]}") from None
    log.info("submitted run %s", run_id)
    status, seen, last = "", 0, ""
    while time.monotonic() - t0 < timeout:
        res = group.flwr(["ls", "--run-id", run_id, "--format", "json"], cwd=cwd)
        try:
            status = str(json.loads(res.stdout)["runs"][0]["status"])
        except (ValueError, KeyError, IndexError, TypeError):
            status = "unknown"
        if status != last:
            log.info("run %s: %s", run_id, status)
            last = status
        seen = _progress(output_dir, seen, num_rounds)
        if status.startswith("finished"):
            return run_id, status, time.monotonic() - t0
        time.sleep(POLL_S)  # each `flwr ls` costs ~1 CPU-second: do not poll hot
    group.flwr(["stop", run_id], cwd=cwd)
    return run_id, f"timed out after {timeout:.0f}s (last status {status!r})", time.monotonic() - t0


def processes_using_home(flwr_home: Path) -> list[int]:
    """Live processes whose ``FLWR_HOME`` is ``flwr_home`` (for tests and diagnostics, Linux)."""
    marker = f"FLWR_HOME={Path(flwr_home).resolve()}".encode()
    found = []
    for pid in _proc_ids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0") and _state(pid) not in ("Z", "X", None):
                    found.append(pid)
        except OSError:
            continue
    return [p for p in found if p != os.getpid()]
