"""Supervise a group of local processes: start, tag, sample, stop, leave nothing behind.

A :class:`ProcessGroup` starts commands in their own sessions with their output
in per-process log files, and marks each with a tag in its environment
(:data:`TAG_ENV`) that every descendant inherits, so a teardown finds and stops
exactly what the group started, directly or not (Flower's SuperExec,
ServerApp, ClientApp and Ray processes included), and nothing else on the
machine; a descendant whose tag ``setproctitle`` wiped (Ray's agents) is
found through its parent and remembered (:meth:`ProcessGroup.members`).
:class:`MemorySampler` follows the summed resident memory of the tagged
processes; :func:`safe_stop` is a teardown that survives a second Ctrl-C,
and :func:`interrupt_on_sigterm` makes a SIGTERM one. Ports
(:func:`pick_ports`), log tails (:func:`tail`) and
:func:`single_threaded_blas` for children that start Ray are the other
helpers a launcher needs.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from synapse_flwr.core.errors import SynapseError

log = logging.getLogger(__name__)

TAG_ENV = "SYNAPSE_FLWR_SESSION"  # marks every process a session starts (inherited)
DAEMONS = ("flower-superlink", "flower-supernode")  # never exit by themselves
HOST = "127.0.0.1"
LOG_TAIL = 3000  # characters of a log quoted in an error


# ------------------------------------------------------------------ ports and logs


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now.

    Returns
    -------
    int
        A port the OS just handed out (it may be taken again before use).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def bind_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on ``host:port`` right now (None when it could).

    Parameters
    ----------
    host : str
        Address to listen on (a name or an IP address).
    port : int
        TCP port.

    Returns
    -------
    str or None
        The reason (unresolvable address, port busy, not allowed), or None.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"{host!r} does not resolve: {exc.strerror or exc}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # Servers set SO_REUSEADDR: a port left in TIME_WAIT is free to them, a listening one is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def check_port(port: int, what: str) -> int:
    """Return ``port`` if it can be bound on 127.0.0.1.

    Parameters
    ----------
    port : int
        The port to check.
    what : str
        What it is for (named in the error).

    Returns
    -------
    int
        ``port``.

    Raises
    ------
    SynapseError
        If it is busy.
    """
    if problem := bind_problem(HOST, port):
        raise SynapseError(f"port {port} for the {what} is busy ({problem}); "
                           "choose another or leave it unset to pick a free one")
    return port


def pick_ports(requested: Sequence[int | None], what: Sequence[str]) -> list[int]:
    """Check the requested ports and fill the unset ones with distinct free ports.

    Parameters
    ----------
    requested : sequence of int or None
        Ports asked for; None picks a free one.
    what : sequence of str
        What each port is for (named in errors), one per requested port.

    Returns
    -------
    list of int
        Distinct ports, in the order requested.

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


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Processes started inside this context run numpy's OpenBLAS on one thread (unless the user chose).

    Ray forks its own processes from the interpreter that starts it. Once
    numpy has run threaded BLAS there, OpenBLAS's fork handler can deadlock
    joining its worker threads (OpenMathLib/OpenBLAS#5520): a 3,000-tool
    folder's fedavg_dp run hung so, before its first round, with no error.
    Only the environment that children inherit changes; this process's BLAS
    is already loaded.
    """
    before = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)


def tail(path: Path, chars: int = LOG_TAIL) -> str:
    """The end of a log file, colour codes removed ('(empty)' if missing or empty).

    Parameters
    ----------
    path : Path
        The log file.
    chars : int
        Characters to keep from its end.

    Returns
    -------
    str
        The last ``chars`` characters, or ``(empty)``.
    """
    try:
        text = _ANSI.sub("", path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        text = ""
    return text[-chars:] if text.strip() else "(empty)"


# ------------------------------------------------------------------ processes


def _proc_ids() -> list[int]:
    """Pids listed in ``/proc`` ([] without it)."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit()] if os.path.isdir("/proc") else []


def tagged_processes(tag: str) -> list[int]:
    """Live processes (not zombies) of a session: tagged with ``TAG_ENV=tag``, and their descendants (Linux).

    A process that calls ``setproctitle`` (Ray's DashboardAgent,
    RuntimeEnvAgent, workers) overwrites the memory ``/proc/<pid>/environ``
    reads, so its tag is gone; it is still found as long as its parent is:
    every live descendant of a tagged process belongs to the session.

    Parameters
    ----------
    tag : str
        The session's tag.

    Returns
    -------
    list of int
        Their pids, sorted, this process excluded ([] without ``/proc``).
    """
    marker = f"{TAG_ENV}={tag}".encode()
    children = _children_map()
    tagged = [pid for kids in children.values() for pid in kids if marker in _environ(pid)]
    return sorted(_descendants(tagged, children) - {os.getpid()})


def _environ(pid: int) -> list[bytes]:
    """The ``NAME=value`` entries of ``/proc/<pid>/environ`` ([] if gone or not ours)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return fh.read().split(b"\0")
    except OSError:
        return []


def _children_map() -> dict[int, list[int]]:
    """Live processes (not zombies) by parent pid ({} without ``/proc``)."""
    children: dict[int, list[int]] = {}
    for pid in _proc_ids():
        fields = _stat(pid)
        if fields is None or fields[0] in ("Z", "X"):
            continue
        children.setdefault(int(fields[1]), []).append(pid)
    return children


def _descendants(roots: Sequence[int], children: dict[int, list[int]]) -> set[int]:
    """``roots`` and every process below them in the tree ``children`` (from :func:`_children_map`).

    Parameters
    ----------
    roots : sequence of int
        Pids to start from.
    children : dict
        Child pids by parent pid.

    Returns
    -------
    set of int
        The roots and all their descendants.
    """
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:  # a pid can only be seen twice through a race with pid reuse
            found.add(pid)
            todo += children.get(pid, [])
    return found


def _stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name: state, ppid, ... (None if gone).

    The command name is in parentheses and may hold spaces or ``)``, so the
    fields are split after its last ``)``; field ``n`` of proc(5) is item ``n - 3``.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def _state(pid: int) -> str | None:
    """Process state letter from ``/proc/<pid>/stat`` (None if gone)."""
    fields = _stat(pid)
    return fields[0] if fields else None


def _start_time(pid: int) -> int | None:
    """Start time in clock ticks after boot (``stat`` field 22) of a live process (None if gone or a zombie).

    With the pid it names one process: a pid reused later has a later start time.
    """
    fields = _stat(pid)
    return int(fields[19]) if fields and fields[0] not in ("Z", "X") else None


def _rss(pid: int) -> int:
    """Resident memory in bytes (0 if gone)."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def cmdline(pid: int) -> list[str]:
    """Command line arguments ([] if gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


def started_by(pids: Sequence[int], parent: int) -> list[int]:
    """Those of ``pids`` started with ``--parent-pid <parent>`` (Flower's SuperExec of a SuperNode)."""
    found = []
    for pid in pids:
        args = cmdline(pid)
        if "--parent-pid" in args[:-1] and args[args.index("--parent-pid") + 1] == str(parent):
            found.append(pid)
    return found


def _alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
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


def interrupt_on_sigterm() -> None:
    """Make SIGTERM (a scheduler's kill, ``timeout``, ``pkill``) stop this process as Ctrl-C does.

    Python's default SIGTERM ends the process without running ``finally``
    blocks, so the SuperLink and ``flwr run`` a launch started outlived it;
    raised as ``KeyboardInterrupt``, the launch's teardown
    (:func:`safe_stop`) runs. Call from the main thread.
    """
    signal.signal(signal.SIGTERM, _raise_interrupt)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def send_signal_to(pid: int, sig: int) -> None:
    """Send ``sig``, ignoring processes that are gone or not ours."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class MemorySampler:
    """Samples the summed RSS of a session's tagged processes in a background thread.

    Use as a context manager; ``peak`` holds the largest sum seen (None
    where there is no ``/proc`` to read).

    Parameters
    ----------
    tag : str
        The session's tag (:data:`TAG_ENV`).
    interval : float
        Seconds between samples.
    """

    def __init__(self, tag: str, interval: float = 0.5) -> None:
        self.tag = tag
        self.interval = interval
        self.peak: int | None = 0 if os.path.isdir("/proc") else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        """Sample until stopped."""
        while not self._stop.wait(self.interval):
            total = sum(_rss(pid) for pid in tagged_processes(self.tag))
            self.peak = max(self.peak or 0, total)

    def __enter__(self) -> Self:
        """Start sampling (where ``/proc`` exists)."""
        if self.peak is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop sampling; ``peak`` keeps its value."""
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
        self._reaped: set[int] = set()  # started processes found dead, their leftovers stopped
        self._seen: set[tuple[int, int]] = set()  # (pid, start time) of every member seen
        log_dir.mkdir(parents=True, exist_ok=True)

    def log_path(self, name: str) -> Path:
        """The log file of process ``name``.

        Parameters
        ----------
        name : str
            The name the process was started under.

        Returns
        -------
        Path
            ``<log_dir>/<name>.log``.
        """
        return self.log_dir / f"{name}.log"

    def start(self, name: str, cmd: Sequence[str], cwd: Path) -> subprocess.Popen:
        """Start ``cmd`` in its own session, output to ``<log_dir>/<name>.log``.

        Parameters
        ----------
        name : str
            Name of the process (its log file, log messages).
        cmd : sequence of str
            The command, no shell.
        cwd : Path
            Its working folder.

        Returns
        -------
        subprocess.Popen
            The started process (also kept in ``started``).
        """
        with open(self.log_path(name), "wb") as out:
            proc = subprocess.Popen(
                list(cmd), env=self.env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self.started.append((name, proc))
        log.info("started %s (pid %d)", name, proc.pid)
        return proc

    def flwr(self, args: Sequence[str], cwd: Path, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run one ``flwr`` CLI command to completion.

        Parameters
        ----------
        args : sequence of str
            Arguments after ``flwr``.
        cwd : Path
            Working folder.
        timeout : float
            Seconds it may take.

        Returns
        -------
        subprocess.CompletedProcess
            Its exit code and captured output (text).

        Raises
        ------
        SynapseError
            If it does not finish within ``timeout``.
        """
        try:
            return subprocess.run(
                ["flwr", *args], env=self.env, cwd=cwd, capture_output=True, text=True,
                timeout=timeout, stdin=subprocess.DEVNULL, check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise SynapseError(f"`flwr {' '.join(args)}` did not answer within {timeout:.0f}s") from exc

    def members(self) -> list[int]:
        """The session's live processes: those tagged now, and those seen before that still run.

        A process whose tag was wiped (``setproctitle``) is found through its
        parent only; once the parent is gone it is reparented to init and no
        scan finds it again, so every member seen is remembered by pid and
        start time (a pid reused by a later process is not a member).

        Returns
        -------
        list of int
            Pids of the members still running, sorted ([] without ``/proc``).
        """
        for pid in tagged_processes(self.tag):
            if (started := _start_time(pid)) is not None:
                self._seen.add((pid, started))
        self._seen = {(pid, started) for pid, started in self._seen if _start_time(pid) == started}
        return sorted(pid for pid, _ in self._seen)

    def stop_orphans(self) -> list[str]:
        """SIGTERM what a started process that died left behind; the names of the dead.

        A SuperNode killed from outside leaves its SuperExec (started with
        ``--parent-pid <its pid>``) retrying a connection to it until teardown;
        it is stopped as soon as its SuperNode is found dead (once).

        Returns
        -------
        list of str
            Names of the processes found dead since the last call.
        """
        dead = [(n, p) for n, p in self.started if p.poll() is not None and p.pid not in self._reaped]
        for name, proc in dead:
            self._reaped.add(proc.pid)
            children = started_by(self.members(), proc.pid)
            log.warning("%s (pid %d) exited with code %s; stopping what it started: %s", name, proc.pid,
                        proc.returncode, children or "nothing")
            for pid in children:
                send_signal_to(pid, signal.SIGTERM)
        return [n for n, _ in dead]

    def stop(self, grace: float = 15.0, linger: float = 20.0) -> list[int]:
        """Stop everything this group started; return the pids that had to be killed.

        The members are taken first (:meth:`members`): a stopped parent's
        untagged children (Ray's agents) are found by no later scan. Then
        SuperNodes, then the SuperLink (SIGTERM, SIGKILL after ``grace``
        seconds), then wait up to ``linger`` seconds for their descendants
        (SuperExec, app and Ray processes) to exit on their own, and
        terminate those that do not.

        Parameters
        ----------
        grace : float
            Seconds a process gets between SIGTERM and SIGKILL.
        linger : float
            Seconds the descendants get to exit on their own.

        Returns
        -------
        list of int
            Pids that had to be killed.
        """
        killed: list[int] = []
        self.members()  # before any SIGTERM: an untagged child of a stopped parent is found by no later scan
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

        Parameters
        ----------
        grace : float
            Seconds between SIGTERM and SIGKILL.

        Returns
        -------
        list of int
            Pids that had to be killed.
        """
        if os.path.isdir("/proc"):
            daemons = [pid for pid in self.members()
                       if any(Path(a).name in DAEMONS for a in cmdline(pid)[:2])]
        else:  # no /proc (macOS): find the managed SuperLink by its private log file
            daemons = _ps_find(f"--log-file {self.env['FLWR_HOME']}/local-superlink/superlink.log")
        for pid in daemons:
            log.debug("stopping %s (pid %d)", " ".join(cmdline(pid)[:2]), pid)
            send_signal_to(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while (left := [p for p in daemons if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:
            log.warning("pid %d ignored SIGTERM; killing it", pid)
            send_signal_to(pid, signal.SIGKILL)
        return left

    def reap(self, linger: float = 20.0) -> list[int]:
        """Wait for the members left (:meth:`members`) to exit; SIGTERM, then SIGKILL, the stubborn ones.

        Parameters
        ----------
        linger : float
            Seconds the leftovers get to exit on their own.

        Returns
        -------
        list of int
            Pids that were signalled.
        """
        deadline = time.monotonic() + linger
        while (left := self.members()) and time.monotonic() < deadline:
            time.sleep(0.25)
        killed = []
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if not left:
                break
            log.warning("processes still running after teardown, sending %s: %s", sig.name,
                        ", ".join(f"{pid} ({' '.join(cmdline(pid)[:2])})" for pid in left))
            for pid in left:
                send_signal_to(pid, sig)
            killed += left
            deadline = time.monotonic() + wait
            while (left := self.members()) and time.monotonic() < deadline:
                time.sleep(0.1)
        if left:
            log.error("could not stop processes %s", left)
        return sorted(set(killed))


def safe_stop(group: ProcessGroup, what: str) -> None:
    """Teardown that survives a second Ctrl-C (it restarts, then kills).

    Parameters
    ----------
    group : ProcessGroup
        The processes to stop.
    what : str
        What they are (in log messages: ``"<what> stopped in ..."``).
    """
    for _ in range(3):
        try:
            t0 = time.monotonic()
            group.stop()
            log.info("%s stopped in %.1fs, no process left", what, time.monotonic() - t0)
            return
        except KeyboardInterrupt:
            log.warning("interrupted during teardown of %s; finishing teardown", what)
    for _, proc in group.started:
        send_signal_to(proc.pid, signal.SIGKILL)
    for pid in group.members():
        send_signal_to(pid, signal.SIGKILL)


def processes_using_home(flwr_home: Path) -> list[int]:
    """Live processes whose ``FLWR_HOME`` is ``flwr_home`` (for tests and diagnostics, Linux).

    Parameters
    ----------
    flwr_home : Path
        A Flower home folder.

    Returns
    -------
    list of int
        Their pids, this process excluded.
    """
    marker = f"FLWR_HOME={Path(flwr_home).resolve()}".encode()
    return [pid for pid in _proc_ids()
            if pid != os.getpid() and marker in _environ(pid) and _alive(pid)]
