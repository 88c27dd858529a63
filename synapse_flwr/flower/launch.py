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

Both go through one :class:`Launch`: a private ``FLWR_HOME``, a tagged
environment, a staged copy of the app and a run-config file; progress logged
per round; every process stopped in a ``finally`` block, also on
``KeyboardInterrupt`` (see :mod:`synapse_flwr.flower.processes`); and the run
judged by its outputs and its final status, never by the exit code of ``flwr
run`` (which is 0 even when the ServerApp fails).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import synapse_flwr
from synapse_flwr.core.errors import SynapseError
from synapse_flwr.data.pins import ENV_VAR, data_dir
from synapse_flwr.flower.config import RunConfig, check_overrides, resume_conflict
from synapse_flwr.flower.processes import (
    HOST,
    LOG_TAIL,
    TAG_ENV,
    MemorySampler,
    ProcessGroup,
    pick_ports,
    safe_stop,
    tail,
)

log = logging.getLogger(__name__)

FLOWER_BINARIES = ("flwr", "flower-superlink", "flower-supernode", "flower-superexec")
FINISHED_OK = "finished:completed"
POLL_S = 2.0  # seconds between run-status polls


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
        """The ``--node-config`` value of this node (absolute paths).

        Returns
        -------
        str
            ``data-path="..." org="..."`` (and ``catalog-path="..."`` when set).

        Raises
        ------
        SynapseError
            If a value holds a quote or a newline.
        """
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

    Parameters
    ----------
    text : str
        ``ORG=DATA_PATH``.
    catalog_path : Path or None
        The node's tool catalog.

    Returns
    -------
    NodeSpec
        The node (``~`` in the path expanded).

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

    Parameters
    ----------
    items : sequence of str
        ``KEY=VALUE`` items (a CLI's repeated ``--set``).

    Returns
    -------
    dict
        Key -> parsed value, later items winning.

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


# ------------------------------------------------------------------ run config


def toml_value(value: Any) -> str:
    """One run-config value as TOML (str, bool, int, float incl. inf).

    Parameters
    ----------
    value : str, Path, bool, int or float
        The value.

    Returns
    -------
    str
        Its TOML literal.

    Raises
    ------
    SynapseError
        For any other type.
    """
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
    """Run config with ``output-dir`` (default ``runs/latest``) and folder datasets absolute.

    The app runs from a staged copy under ``FLWR_HOME``, so relative paths
    are resolved here, from the caller's working folder.

    Parameters
    ----------
    run_config : mapping
        Overrides of ``[tool.flwr.app.config]``.

    Returns
    -------
    dict
        A validated copy with absolute ``output-dir``, ``release-cache``, ``capture-dir`` and,
        when a folder, ``dataset``.

    Raises
    ------
    RunConfigError
        For an unknown key, a wrong type or a value out of range.
    """
    rc = check_overrides(run_config)  # a bad key or value fails here, before any process starts
    rc["output-dir"] = str(Path(str(rc.get("output-dir", "runs/latest"))).expanduser().resolve())
    for key in ("release-cache", "capture-dir"):
        if rc.get(key):
            rc[key] = str(Path(str(rc[key])).expanduser().resolve())
    dataset = rc.get("dataset")
    if isinstance(dataset, (str, Path)) and str(dataset) not in ("demo", "metatool"):
        if Path(dataset).expanduser().is_dir():
            rc["dataset"] = str(Path(dataset).expanduser().resolve())
    return rc


def write_run_config(path: Path, run_config: Mapping[str, Any]) -> Path:
    """Write run-config overrides as a TOML file for ``flwr run --run-config``.

    Parameters
    ----------
    path : Path
        The file (its folder is created).
    run_config : mapping
        Key -> value (see :func:`toml_value`).

    Returns
    -------
    Path
        ``path``.
    """
    lines = [f'"{key}" = {toml_value(value)}' for key, value in run_config.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------ environment and app


def flower_bin_dir() -> Path:
    """Folder of the running interpreter's scripts (the venv's ``bin``).

    Returns
    -------
    Path
        Where ``flwr`` and the Flower daemons are installed next to Python.
    """
    return Path(sys.executable).parent


def flower_env(flwr_home: Path, tag: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for Flower processes: private home, no telemetry, no installs, tagged.

    Parameters
    ----------
    flwr_home : Path
        Their ``FLWR_HOME``.
    tag : str
        Value of :data:`~synapse_flwr.flower.processes.TAG_ENV`.
    extra : mapping of str to str or None
        More variables, set last.

    Returns
    -------
    dict of str to str
        This process's environment with those settings, the interpreter's
        ``bin`` first on ``PATH`` and the benchmark data folder absolute.

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


def effective_run_config(app_dir: Path, run_config: Mapping[str, Any]) -> dict[str, Any]:
    """The whole run config a run gets: the app's ``[tool.flwr.app.config]`` under the overrides.

    Raises
    ------
    SynapseError
        If the app's ``pyproject.toml`` has no readable app config.
    """
    import tomllib

    try:
        doc = tomllib.loads((app_dir / "pyproject.toml").read_text(encoding="utf-8"))
        return RunConfig.from_mapping({**doc["tool"]["flwr"]["app"]["config"], **run_config}).to_mapping()
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError) as exc:
        raise SynapseError(f"cannot read the app config of {app_dir / 'pyproject.toml'}: {exc}") from None


def check_resume(output_dir: Path, run_config: Mapping[str, Any]) -> None:
    """Fail before anything starts if ``output_dir`` holds rounds of a run with other settings.

    Raises
    ------
    SynapseError
        With the settings that differ (:func:`~synapse_flwr.flower.config.resume_conflict`).
    """
    try:
        recorded = json.loads((output_dir / "metrics.json").read_text(encoding="utf-8"))["run_config"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # nothing to resume, or the ServerApp's resume point reports the unreadable folder
    reason = resume_conflict(output_dir, recorded, run_config)
    if reason:
        raise SynapseError(reason)


def default_app_dir() -> Path:
    """This project's Flower app: the checkout holding the package, else the working folder.

    Returns
    -------
    Path
        A folder to pass as ``app_dir``.
    """
    root = Path(synapse_flwr.__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else Path.cwd()


def _app_dir(app_dir: Path) -> Path:
    """``app_dir`` absolute, checked to hold a ``pyproject.toml``."""
    app_dir = Path(app_dir).expanduser().resolve()
    if not (app_dir / "pyproject.toml").is_file():
        raise SynapseError(f"{app_dir} is not a Flower app (no pyproject.toml): pass --app-dir the folder that "
                           "holds the app's pyproject.toml (the synapse-flwr checkout)")
    return app_dir


def stage_app(app_dir: Path, dest: Path) -> Path:
    """Copy the app's sources to ``dest`` for ``flwr run`` and return ``dest``.

    ``flwr`` builds the app bundle by walking the whole folder before
    filtering it, which takes seconds per run inside a checkout holding a
    virtual environment. The copy leaves out what the bundle would leave out
    anyway: hidden entries (``.venv``, ``.git``), caches, ``*.egg-info`` and
    the top-level folders ignored by the app's ``.gitignore`` (``runs/``...).

    Parameters
    ----------
    app_dir : Path
        The Flower app.
    dest : Path
        The copy (replaced if it exists).

    Returns
    -------
    Path
        ``dest``.
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
        """Names of ``folder`` left out of the copy."""
        return {n for n in names if any(fnmatch.fnmatch(n, pat) for pat in patterns)}

    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(app_dir, dest, ignore=ignore, symlinks=False)
    return dest


def _home(flwr_home: Path | None, prefix: str) -> Path:
    """``flwr_home`` absolute and created, or a new temporary folder named ``<prefix>...``."""
    home = Path(flwr_home).expanduser().resolve() if flwr_home else Path(tempfile.mkdtemp(prefix=prefix))
    home.mkdir(parents=True, exist_ok=True)
    return home


# ------------------------------------------------------------------ outputs


def read_metrics(output_dir: Path) -> list[dict]:
    """Round records of ``<output_dir>/metrics.json`` ([] if absent or unreadable).

    Parameters
    ----------
    output_dir : Path
        A run's ``output-dir``.

    Returns
    -------
    list of dict
        One record per completed round, in order.
    """
    try:
        return list(json.loads((output_dir / "metrics.json").read_text(encoding="utf-8"))["rounds"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def check_dataset(run_config: Mapping[str, Any]) -> None:
    """Check the dataset folder a run config names before any process starts (other datasets: nothing).

    Raises
    ------
    DataError
        Listing every problem of the folder, by file and line.
    """
    from synapse_flwr.data.check import require_valid

    dataset = str(run_config.get("dataset", ""))
    if dataset and Path(dataset).is_dir():
        require_valid(Path(dataset))


def nothing_merged(output_dir: Path) -> str | None:
    """Why a completed run still failed: no round merged any artifact (None if one did).

    Parameters
    ----------
    output_dir : Path
        The run's ``output-dir``.
    """
    rounds = read_metrics(output_dir)
    if not rounds or any(r.get("accepted") for r in rounds):
        return None
    reasons = sorted({str(x.get("reason", x)) if isinstance(x, dict) else str(x)
                      for r in rounds for x in r.get("rejected", [])})
    return (f"no organisation's artifact was merged in any of its {len(rounds)} rounds; rejections: "
            + ("; ".join(reasons[:3]) or "none recorded"))


def check_outputs(output_dir: Path, num_rounds: int) -> str | None:
    """Why the outputs of a run of ``num_rounds`` rounds are incomplete (None if complete).

    Parameters
    ----------
    output_dir : Path
        The run's ``output-dir``.
    num_rounds : int
        Rounds it should hold.

    Returns
    -------
    str or None
        The first problem found: rounds missing from ``metrics.json``, or a
        last global that is not a valid compendium.
    """
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


# ------------------------------------------------------------------ one launch


class Launch:
    """The setup and teardown both launchers share: one private Flower world per run.

    Creating it resolves the app and the run config (absolute ``output-dir``
    and dataset folders, the number of rounds) and creates the private
    ``FLWR_HOME``; :meth:`stage` writes the tagged environment, the Flower CLI
    config naming the SuperLink, the run-config overrides and a copy of the
    app; :meth:`running` samples memory while the processes run and stops all
    of them on the way out; :meth:`check` judges the run by its status and
    outputs.

    Parameters
    ----------
    what : str
        ``"simulation"`` or ``"deployment"``: named in logs and errors.
    app_dir : Path
        The Flower app (folder with ``pyproject.toml``).
    run_config : mapping
        Overrides of ``[tool.flwr.app.config]``.
    flwr_home : Path or None
        Private ``FLWR_HOME``; a new temporary folder when None.
    home_prefix : str
        Name prefix of that temporary folder.

    Raises
    ------
    SynapseError
        If ``app_dir`` is not a Flower app or its number of rounds is unreadable.
    """

    def __init__(
        self, what: str, app_dir: Path, run_config: Mapping[str, Any], flwr_home: Path | None, home_prefix: str,
    ) -> None:
        self.what = what
        self.source = _app_dir(app_dir)
        self.run_config = absolute_run_config(run_config)
        check_dataset(self.run_config)
        effective = effective_run_config(self.source, self.run_config)
        self.num_rounds = int(effective["num-rounds"])
        self.output_dir = Path(self.run_config["output-dir"])
        check_resume(self.output_dir, effective)
        self.home = _home(flwr_home, home_prefix)
        self.app_dir = self.source  # the staged copy once staged
        self.overrides = self.home / "run_config.toml"
        self._group: ProcessGroup | None = None
        self.t0 = 0.0
        self.wall_s = 0.0
        self.peak_rss_bytes: int | None = None

    def stage(self, superlink: str, address: str, insecure: bool = False,
              extra_env: Mapping[str, str] | None = None) -> ProcessGroup:
        """Prepare everything the processes need; start nothing.

        Parameters
        ----------
        superlink : str
            Name of the SuperLink connection in the Flower CLI config
            (``local`` or ``deploy``), its default.
        address : str
            Its address (``:local:`` for a managed local SuperLink).
        insecure : bool
            Whether the connection is without TLS.
        extra_env : mapping of str to str or None
            More environment of the started processes.

        Returns
        -------
        ProcessGroup
            The (empty) group the run's processes are started in.

        Raises
        ------
        SynapseError
            If a Flower binary is missing.
        """
        tag = uuid.uuid4().hex
        env = flower_env(self.home, tag, extra_env)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{superlink}"\n\n[superlink.{superlink}]\naddress = "{address}"\n'
            + ("insecure = true\n" if insecure else ""), encoding="utf-8")
        write_run_config(self.overrides, self.run_config)
        self._group = ProcessGroup(tag, env, self.home / "logs")
        self.app_dir = stage_app(self.source, self.home / "app")
        return self._group

    @property
    def group(self) -> ProcessGroup:
        """The processes of the run.

        Raises
        ------
        RuntimeError
            If :meth:`stage` did not run first.
        """
        if self._group is None:
            raise RuntimeError("Launch.stage() must come before starting processes")
        return self._group

    @contextmanager
    def running(self) -> Iterator[ProcessGroup]:
        """Context of the run: memory sampled, every process stopped on the way out (also on Ctrl-C).

        Yields
        ------
        ProcessGroup
            The staged group; ``t0`` is set on entry, ``wall_s`` and
            ``peak_rss_bytes`` on exit.
        """
        group = self.group
        self.t0 = time.monotonic()
        try:
            with MemorySampler(group.tag) as sampler:
                try:
                    yield group
                finally:
                    safe_stop(group, self.what)
            self.peak_rss_bytes = sampler.peak
        finally:
            self.wall_s = time.monotonic() - self.t0

    def progress(self, seen: int) -> int:
        """Log the rounds recorded since ``seen``; return the new count.

        Parameters
        ----------
        seen : int
            Rounds already logged.

        Returns
        -------
        int
            Rounds logged now.
        """
        rounds = read_metrics(self.output_dir)
        for rec in rounds[seen:]:
            log.info("round %s/%d done: %d accepted, %d rejected, %s bytes per client, %s conflicts",
                     rec.get("round"), self.num_rounds, len(rec.get("accepted", [])),
                     len(rec.get("rejected", [])), rec.get("bytes_per_client"), rec.get("conflicts"))
        return max(seen, len(rounds))

    def check(self, run_id: str | None, status: str, log_path: Path, log_name: str) -> None:
        """Judge the run by its final status and its outputs.

        Parameters
        ----------
        run_id : str or None
            The Flower run id.
        status : str
            Its final status.
        log_path : Path
            The run's log (its tail is quoted on failure).
        log_name : str
            What that log is, in the error (``log``, ```flwr log```).

        Raises
        ------
        SynapseError
            If the run did not complete or left incomplete outputs.
        """
        problem = None if status == FINISHED_OK else f"run {run_id} ended with status {status!r}"
        problem = problem or check_outputs(self.output_dir, self.num_rounds) or nothing_merged(self.output_dir)
        if problem:
            raise SynapseError(f"{self.what} failed: {problem}; {log_name} tail ({log_path}):\n{tail(log_path)}")


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

    Returns
    -------
    SimulationResult
        Run id, final status, outputs, wall time, log and peak memory.
    """
    launch = Launch("simulation", app_dir, run_config or {}, flwr_home, "synapse-flwr-sim-")
    http_port, control_port = pick_ports([None, None], ["managed SuperLink", "Control API"])
    group = launch.stage("local", ":local:", extra_env={
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
    })
    cmd = ["flwr", "run", str(launch.app_dir), "local", "--federation-config",
           f"num-supernodes={int(num_supernodes)}", "--run-config", str(launch.overrides), "--stream"]
    log.info("simulation: K=%d, %d rounds, outputs in %s, FLWR_HOME %s", num_supernodes, launch.num_rounds,
             launch.output_dir, launch.home)
    log_path = group.log_path("simulation")
    with launch.running():
        _start_managed_superlink(launch, group, http_port, control_port)
        _follow(launch, group.start("simulation", cmd, cwd=launch.app_dir), log_path, timeout)
        run_id, status = _last_run(group, launch.app_dir)
    launch.check(run_id, status, log_path, "log")
    log.info("simulation run %s %s in %.1fs", run_id, status, launch.wall_s)
    return SimulationResult(run_id, status, launch.output_dir, round(launch.wall_s, 3), log_path,
                            launch.peak_rss_bytes)


# `flwr run . local` gives the managed SuperLink it starts a fixed 15 s, which a loaded machine misses
# (importing Flower alone took 23 s at a load of 15 on 2 cores); started here first, it is reused
MANAGED_SUPERLINK_START_S = 180.0


def _start_managed_superlink(launch: Launch, group: ProcessGroup, http_port: int, control_port: int) -> None:
    """Start the managed SuperLink exactly as ``flwr run . local`` would, and wait until it is healthy.

    Raises
    ------
    SynapseError
        If it exits or is not healthy within :data:`MANAGED_SUPERLINK_START_S` (with its log's tail).
    """
    folder = launch.home / "local-superlink"
    folder.mkdir(parents=True, exist_ok=True)
    cmd = ["flower-superlink", "--insecure", "--simulation", "--isolation", "subprocess",
           "--control-api-address", f"127.0.0.1:{control_port}", "--host", "127.0.0.1", "--port", str(http_port),
           "--log-file", str(folder / "superlink.log"), "--log-rotation-interval-hours", "24",
           "--log-rotation-backup-count", "7", "--database", str(folder / "state.db")]
    proc = group.start("managed-superlink", cmd, cwd=launch.home)
    deadline = time.monotonic() + MANAGED_SUPERLINK_START_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=0.5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    tail = group.log_path("managed-superlink").read_text(errors="replace")[-2000:]
    raise SynapseError(f"the managed SuperLink did not become healthy within {MANAGED_SUPERLINK_START_S:.0f}s "
                       f"(exit code {proc.poll()}); its log:\n{tail}")


def _follow(launch: Launch, proc: subprocess.Popen, log_path: Path, timeout: float) -> None:
    """Wait for the streaming ``flwr run`` to end, logging rounds as they are recorded.

    Parameters
    ----------
    launch : Launch
        The running launch (its start time and outputs).
    proc : subprocess.Popen
        The ``flwr run ... --stream`` process.
    log_path : Path
        Its log (quoted on timeout).
    timeout : float
        Seconds from the launch's start.

    Raises
    ------
    SynapseError
        If it does not end in time.
    """
    deadline = launch.t0 + timeout
    seen = 0
    while proc.poll() is None:
        if time.monotonic() > deadline:
            raise SynapseError(f"simulation did not finish within {timeout:.0f}s; log tail:\n{tail(log_path)}")
        seen = launch.progress(seen)
        time.sleep(1.0)
    launch.progress(seen)


def _last_run(group: ProcessGroup, cwd: Path) -> tuple[str | None, str]:
    """Id and status of the most recent run on the session's SuperLink.

    Parameters
    ----------
    group : ProcessGroup
        The session (its environment names the SuperLink).
    cwd : Path
        Working folder of ``flwr ls``.

    Returns
    -------
    tuple of (str or None, str)
        Run id (None if unreadable) and status (or why it is unknown).
    """
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

    Parameters
    ----------
    dataset : str
        ``demo``, ``metatool``, ``taubench`` or a dataset folder.
    n : int
        Organisations.
    out_dir : Path
        Where re-partitioned logs and the catalog are written.
    seed : int
        Seed of the re-partition.
    alpha : float
        Dirichlet concentration of the re-partition (non-IID skew).

    Returns
    -------
    list of NodeSpec
        One per organisation, sorted by name, with absolute paths.
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
    """Node id -> status, from ``flwr supernode ls`` ({} if unreadable)."""
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

    Parameters
    ----------
    group : ProcessGroup
        The SuperLink first, then one SuperNode per spec, in order.
    specs : sequence of NodeSpec
        The nodes.
    cwd : Path
        Working folder of the ``flwr`` commands.
    timeout : float
        Seconds to wait.

    Returns
    -------
    dict of str to int
        Flower node id of each organisation.

    Raises
    ------
    SynapseError
        If a process exits, or a SuperNode is not online in time (with its log tail).
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


def _node_specs(nodes: int | Sequence[NodeSpec], run_config: Mapping[str, Any], data_dir: Path) -> list[NodeSpec]:
    """The SuperNodes of a deployment, checked: existing files, distinct organisations.

    Parameters
    ----------
    nodes : int or sequence of NodeSpec
        Explicit nodes, or a number of organisations of the run config's
        ``dataset`` (see :func:`nodes_from_dataset`).
    run_config : mapping
        The absolute run config (``dataset``, ``seed``, ``alpha``).
    data_dir : Path
        Where re-partitioned organisation logs are written.

    Returns
    -------
    list of NodeSpec
        One per SuperNode.

    Raises
    ------
    SynapseError
        If there are no nodes, an experience file is missing or two
        organisations share a name.
    """
    if isinstance(nodes, int):
        if nodes < 1:
            raise SynapseError("a deployment needs at least one SuperNode")
        cfg = RunConfig.from_mapping(run_config)
        specs = nodes_from_dataset(cfg.dataset, nodes, data_dir, cfg.seed, cfg.alpha)
    else:
        specs = list(nodes)
    for spec in specs:
        if not Path(spec.data_path).is_file():
            raise SynapseError(f"experience file of org {spec.org!r} not found: {spec.data_path}")
    if len({s.org for s in specs}) != len(specs):
        raise SynapseError(f"organisation names must be distinct: {[s.org for s in specs]}")
    return specs


def _deployment_ports(cfg: DeploymentConfig, specs: Sequence[NodeSpec]) -> tuple[int, list[int]]:
    """SuperLink port and one SuperNode port per node: the configured ones checked, the rest free.

    Parameters
    ----------
    cfg : DeploymentConfig
        Its ``superlink_port`` and ``node_ports``.
    specs : sequence of NodeSpec
        The nodes.

    Returns
    -------
    tuple of (int, list of int)
        The SuperLink port and the SuperNode ports.

    Raises
    ------
    SynapseError
        If the number of node ports is wrong, or a port is busy or repeated.
    """
    node_ports = list(cfg.node_ports) if cfg.node_ports is not None else [None] * len(specs)
    if len(node_ports) != len(specs):
        raise SynapseError(f"{len(node_ports)} node ports given for {len(specs)} SuperNodes")
    ports = pick_ports([cfg.superlink_port, *node_ports],
                       ["SuperLink", *(f"SuperNode of org {s.org!r}" for s in specs)])
    return ports[0], ports[1:]


def _start_federation(
    launch: Launch, specs: Sequence[NodeSpec], link_port: int, node_ports: Sequence[int], online_timeout: float,
) -> dict[str, int]:
    """Start the SuperLink and one SuperNode per organisation; wait until all are online.

    Parameters
    ----------
    launch : Launch
        The running launch.
    specs : sequence of NodeSpec
        The organisations' nodes.
    link_port : int
        SuperLink port.
    node_ports : sequence of int
        One local port per SuperNode.
    online_timeout : float
        Seconds for every SuperNode to come online.

    Returns
    -------
    dict of str to int
        Flower node id of each organisation.

    Raises
    ------
    SynapseError
        If a process exits early or a SuperNode is not online in time.
    """
    group, home = launch.group, launch.home
    group.start("superlink", ["flower-superlink", "--insecure", "--disable-runtime-dependency-installation",
                              "--host", HOST, "--port", str(link_port)], cwd=home)
    for spec, port in zip(specs, node_ports, strict=True):
        group.start(f"supernode_{spec.org}", [
            "flower-supernode", "--insecure", "--superlink", f"{HOST}:{link_port}",
            "--host", HOST, "--port", str(port), "--node-config", spec.node_config(),
        ], cwd=home)
    node_ids = _wait_online(group, specs, home, online_timeout)
    log.info("%d SuperNodes online after %.1fs: %s", len(specs), time.monotonic() - launch.t0,
             ", ".join(f"{o}={i}" for o, i in node_ids.items()))
    return node_ids


def run_local_deployment(cfg: DeploymentConfig) -> DeploymentResult:
    """Deploy the app for real on 127.0.0.1: SuperLink, SuperNodes, one run, teardown.

    Steps: start ``flower-superlink`` and one ``flower-supernode`` per
    organisation (``--node-config 'data-path="..." org="..."'``, plus
    ``catalog-path`` when given), wait until all are online, submit the run
    with ``flwr run <app> deploy``, log progress per round until the run
    finishes, save its log (``flwr log``), and stop every process started
    (also on error or Ctrl-C).

    Parameters
    ----------
    cfg : DeploymentConfig
        The app, nodes, run config, home, ports and timeouts.

    Returns
    -------
    DeploymentResult
        Run id, final status, outputs, timings, log, node ids and peak memory.

    Raises
    ------
    SynapseError
        If Flower is missing, a port is busy, a SuperNode does not come
        online in time (with its log tail), or the run fails or times out
        (with the tail of ``flwr log``).
    """
    launch = Launch("deployment", cfg.app_dir, cfg.run_config, cfg.flwr_home, "synapse-flwr-deploy-")
    specs = _node_specs(cfg.nodes, launch.run_config, launch.home / "data")
    link_port, node_ports = _deployment_ports(cfg, specs)
    group = launch.stage("deploy", f"{HOST}:{link_port}", insecure=True)
    log.info("deployment: %d SuperNodes, %d rounds, SuperLink %s:%d, outputs in %s, FLWR_HOME %s",
             len(specs), launch.num_rounds, HOST, link_port, launch.output_dir, launch.home)
    log_path = group.log_path("run")
    with launch.running():
        node_ids = _start_federation(launch, specs, link_port, node_ports, cfg.online_timeout)
        run_id, status, run_s = _submit_and_wait(launch, cfg.timeout)
        _save_run_log(group, run_id, log_path, launch.home)
    launch.check(run_id, status, log_path, "`flwr log`")
    log.info("deployment run %s %s in %.1fs (total %.1fs)", run_id, status, run_s, launch.wall_s)
    return DeploymentResult(run_id, status, launch.output_dir, round(launch.wall_s, 3), round(run_s, 3),
                            log_path, node_ids, launch.peak_rss_bytes)


def _save_run_log(group: ProcessGroup, run_id: str, log_path: Path, cwd: Path) -> None:
    """Write the run's log (``flwr log``) to ``log_path``, or why it could not be fetched.

    Parameters
    ----------
    group : ProcessGroup
        The deployment's processes (their environment).
    run_id : str
        The run.
    log_path : Path
        Where the log goes.
    cwd : Path
        Working folder of the ``flwr`` command.
    """
    try:
        res = group.flwr(["log", run_id, "--show"], cwd=cwd)
        log_path.write_text(res.stdout + res.stderr, encoding="utf-8")
    except SynapseError as exc:  # keep the run's status; say why the log is missing
        log_path.write_text(f"could not fetch the run log: {exc}\n", encoding="utf-8")


def _submit_and_wait(launch: Launch, timeout: float) -> tuple[str, str, float]:
    """Submit the run, poll its status until finished; return (run id, status, seconds).

    Parameters
    ----------
    launch : Launch
        The running deployment (staged app, overrides, outputs).
    timeout : float
        Seconds the run may take once submitted; then it is stopped.

    Returns
    -------
    tuple of (str, str, float)
        Run id, final status (or why it timed out) and seconds since submission.

    Raises
    ------
    SynapseError
        If ``flwr run`` did not submit the run.
    """
    group, cwd = launch.group, launch.home
    t0 = time.monotonic()
    res = group.flwr(["run", str(launch.app_dir), "deploy", "--run-config", str(launch.overrides),
                      "--format", "json"], cwd=cwd, timeout=120)
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
        seen = launch.progress(seen)
        group.stop_orphans()  # a SuperNode killed mid-run: its SuperExec would retry until teardown
        if status.startswith("finished"):
            return run_id, status, time.monotonic() - t0
        time.sleep(POLL_S)  # each `flwr ls` costs ~1 CPU-second: do not poll hot
    group.flwr(["stop", run_id], cwd=cwd)
    return run_id, f"timed out after {timeout:.0f}s (last status {status!r})", time.monotonic() - t0
