"""Run the Flower app for real on this machine: a simulation, or a SuperLink with SuperNodes.

Two entry points, both pure orchestration of Flower's own command-line tools
(``flwr``, ``flower-superlink``, ``flower-supernode``) through ``subprocess``:

* :func:`run_simulation`: ``flwr run <app> local --stream`` under the Ray
  simulation engine, on a managed local SuperLink with its own ports and
  ``FLWR_HOME``;
* :func:`~synapse_flwr.flower.deploy.run_local_deployment`
  (:mod:`synapse_flwr.flower.deploy`): one SuperLink and one SuperNode per
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

import errno
import fcntl
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import synapse_flwr
from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.files import write_atomic, write_problem
from synapse_flwr.data.federation import KNOWN_DATASETS
from synapse_flwr.data.pins import BENCHMARK_FOLDERS, ENV_VAR, data_dir
from synapse_flwr.flower.config import (
    RunConfig,
    RunConfigError,
    check_overrides,
    recorded_run,
    resume_conflict,
)
from synapse_flwr.flower.processes import (
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
FEDERATION_FILE = "federation.json"  # in output-dir: how many organisations its rounds are from
LOCK_FILE = ".synapse.lock"  # in output-dir: held by the launcher whose run writes there
#: Seconds without a finished round after which the launcher says the run is still going (a first round over
#: thousands of tools embeds for minutes with nothing else to show).
STILL_RUNNING_S = 120.0


# ------------------------------------------------------------------ config and results


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
        The streamed run log (in ``<output_dir>/logs/``, with the SuperLink's).
    peak_rss_bytes : int or None
        Peak of the summed resident memory of all started processes (sampled).
    """

    run_id: str | None
    status: str
    output_dir: Path
    wall_s: float
    log_path: Path
    peak_rss_bytes: int | None = None


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
    """Run config with ``output-dir`` (default ``runs/latest``), other paths and folder datasets absolute.

    The app runs from a staged copy under ``FLWR_HOME``, so relative paths
    are resolved here, from the caller's working folder.

    Parameters
    ----------
    run_config : mapping
        Overrides of ``[tool.flwr.app.config]``.

    Returns
    -------
    dict
        A validated copy with absolute ``output-dir``, ``release-cache``, ``capture-dir``,
        ``keys-file``, ``catalog`` and, when a folder, ``dataset``.

    Raises
    ------
    RunConfigError
        For an unknown key, a wrong type or a value out of range.
    """
    rc = check_overrides(run_config)  # a bad key or value fails here, before any process starts
    rc["output-dir"] = str(Path(RunConfig.from_mapping(rc).output_dir).expanduser().resolve())
    for key in ("release-cache", "capture-dir", "keys-file", "catalog"):
        if rc.get(key):
            rc[key] = str(Path(str(rc[key])).expanduser().resolve())
    dataset = rc.get("dataset")
    if (isinstance(dataset, (str, Path)) and str(dataset) not in KNOWN_DATASETS
            and Path(dataset).expanduser().is_dir()):
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
    # Apps run in Flower's own processes, whose working folder is not the caller's, so a
    # relative "../shared/data" would mean something else there: resolve it here.
    try:
        env[ENV_VAR] = str(data_dir().resolve())  # the user's own value too (it may be relative)
    except SynapseError:
        pass  # no benchmark data: only the demo and dataset folders will work (check_dataset said so)
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


def check_resume(output_dir: Path, run_config: Mapping[str, Any], nodes: int) -> None:
    """Fail before anything starts if ``output_dir`` holds rounds of a run with other settings or nodes.

    A federation of another size is another set of organisations: resumed in
    one output folder, its globals would merge both, and its release caches
    (one ledger per organisation) would release the same records twice.

    Raises
    ------
    SynapseError
        With the settings that differ (:func:`~synapse_flwr.flower.config.resume_conflict`), the
        node counts, or naming an unreadable ``metrics.json``
        (:func:`~synapse_flwr.flower.config.recorded_run`), which would stop the ServerApp once every
        process had started.
    """
    recorded = recorded_run(output_dir / "metrics.json")
    if recorded is None:
        return  # nothing to resume
    reason = resume_conflict(output_dir, recorded[1], run_config)
    if reason:
        raise SynapseError(reason)
    done = max((int(r.get("round", 0)) for r in recorded[0]), default=0)
    if done >= int(run_config.get("num-rounds", 0)) > 0:  # a SuperLink and every node started to do nothing
        more = "" if run_config.get("replay") else f"--set num-rounds={done + 1} or more continues it, "
        raise SynapseError(f"{output_dir} holds all {done} rounds this run asks for (num-rounds "
                           f"{run_config['num-rounds']}): nothing to do; {more}--set output-dir=PATH starts another "
                           "run")
    try:
        before = json.loads((output_dir / FEDERATION_FILE).read_text(encoding="utf-8"))["nodes"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # a run before the record (or from a bare `flwr run`): its size is not known
    if before != nodes:
        raise SynapseError(f"{output_dir} holds {len(recorded[0])} rounds of a federation of {before} organisations; "
                           f"this run has {nodes}: resumed there, it would merge both federations and release "
                           f"records twice; give another output-dir (--set output-dir=PATH), or run {before} nodes")


# what :meth:`Launch.stage` writes into a FLWR_HOME's config.toml: a home holding another is an operator's
_LAUNCHER_CONFIG = re.compile(r'\[superlink\]\ndefault = "(\w+)"\n\n\[superlink\.\1\]\naddress = "[^"\n]*"\n'
                              r'(?:insecure = true\n)?')


def launcher_config(path: Path) -> bool:
    """Whether the Flower config at ``path`` is one a launcher wrote (never raises)."""
    try:
        return _LAUNCHER_CONFIG.fullmatch(path.read_text(encoding="utf-8")) is not None
    except (OSError, UnicodeDecodeError):
        return False


def check_nodes_wanted(run_config: Mapping[str, Any], nodes: int) -> None:
    """Fail before anything starts if the run waits for more nodes than take part (``min-nodes``).

    Every round would wait for them, then merge nothing, and the run would
    end with the empty global it started from.
    """
    wanted = int(run_config["min-nodes"])
    if 0 < nodes < wanted:  # (no node at all is the node check's to name)
        raise SynapseError(f"run config 'min-nodes' {wanted}: only {nodes} organisation{'s' * (nodes != 1)} take "
                           f"part, so no round would merge; set --set min-nodes={nodes} (or fewer), or run "
                           f"{wanted} nodes or more")


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
    anyway: hidden entries (``.venv``, ``.git``; not ``.gitignore``, which the
    app's ``fab-exclude`` names), caches, ``*.egg-info`` and the top-level
    folders ignored by the app's ``.gitignore`` (``runs/``...).

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
    kept = {".gitignore"}  # named by the app's fab-exclude (pyproject.toml): Flower refuses a pattern matching nothing
    gitignore = app_dir / ".gitignore"
    if gitignore.is_file():
        for line in gitignore.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip().strip("/")
            if line and not line.startswith(("#", "!")) and "/" not in line:
                ignored.add(line)
    patterns = sorted(ignored)

    def ignore(folder: str, names: list[str]) -> set[str]:
        """Names of ``folder`` left out of the copy."""
        return {n for n in names if n not in kept and any(fnmatch.fnmatch(n, pat) for pat in patterns)}

    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(app_dir, dest, ignore=ignore, symlinks=False)
    return dest


def run_log_dir(output_dir: Path, what: str) -> Path:
    """Create and return a new log folder for one run, ``<output_dir>/logs/<what>-<YYYYmmdd-HHMMSS>``.

    Beside the run's outputs rather than in its ``FLWR_HOME``, which may be
    temporary; one folder per run, so a resumed run keeps the logs of the one
    it resumes.

    Parameters
    ----------
    output_dir : Path
        The run's ``output-dir`` (created if needed).
    what : str
        ``"simulation"`` or ``"deployment"``.

    Returns
    -------
    Path
        The new, empty folder.

    Raises
    ------
    SynapseError
        If it cannot be created (naming ``output-dir``).
    """
    stem = f"{what}-{time.strftime('%Y%m%d-%H%M%S')}"
    logs = output_dir / "logs"
    for n in range(1, 1000):
        folder = logs / (stem if n == 1 else f"{stem}-{n}")
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            continue  # two runs started in the same second
        except OSError as exc:
            raise SynapseError(f"run config 'output-dir' {str(output_dir)!r}: cannot create its log folder "
                               f"{folder} ({exc.strerror or exc})") from None
    raise SynapseError(f"{logs} holds too many runs started at {stem}: remove some")


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
    """Check the dataset and the catalog a run config names before any process starts.

    A known name (:data:`KNOWN_DATASETS`) passes as is; anything else must be
    a dataset folder, checked file by file. A ``catalog`` must load.

    Parameters
    ----------
    run_config : mapping
        The absolute run config (its ``dataset``, none: the app's default; its ``catalog``).

    Raises
    ------
    RunConfigError
        If ``dataset`` is neither a known name nor a folder, or ``catalog`` does not load.
    DataError
        Listing every problem of the folder, by file and line.
    """
    from synapse_flwr.data.check import require_valid

    if catalog := str(run_config.get("catalog", "")):  # the server's: every artifact's tools must be from it
        from synapse_flwr.core.catalog import load_catalog, size_problem

        try:
            too_large = size_problem(load_catalog(catalog))
        except SynapseError as exc:
            raise RunConfigError(f"run config 'catalog' {catalog!r}: {exc}") from None
        if too_large:
            raise RunConfigError(f"run config 'catalog' {catalog!r}: {too_large}")
    dataset = str(run_config.get("dataset", ""))
    if dataset in BENCHMARK_FOLDERS:  # the benchmark data, before the processes that would read it start
        try:
            folder = data_dir() / BENCHMARK_FOLDERS[dataset]
        except SynapseError as exc:
            raise RunConfigError(f"run config 'dataset' {dataset!r}: {exc}") from None
        if not folder.is_dir():
            raise RunConfigError(f"run config 'dataset' {dataset!r}: {folder} is not a folder; the benchmark data "
                                 f"folder ({ENV_VAR}) holds no {BENCHMARK_FOLDERS[dataset]}/")
    if not dataset or dataset in KNOWN_DATASETS:
        return
    if not Path(dataset).is_dir():
        what = "a file, not a folder" if Path(dataset).exists() else "no such folder"
        raise RunConfigError(f"run config 'dataset' {dataset!r}: not a known dataset ({', '.join(KNOWN_DATASETS)}) "
                             f"and {what}; name one of those or a dataset folder (--set dataset=FOLDER)")
    require_valid(Path(dataset))


def check_folders(run_config: Mapping[str, Any]) -> None:
    """Refuse, before any process starts, a ``release-cache`` or ``capture-dir`` that cannot be written.

    Each ClientApp writes there every round: one that cannot would fail every
    round, and the run would only end saying that nothing was merged.
    """
    for key in ("release-cache", "capture-dir"):
        if (folder := str(run_config.get(key, ""))) and (problem := write_problem(folder, folder=True)):
            raise RunConfigError(f"run config {key!r} {folder!r} {problem}; set another (--set {key}=PATH)")


def check_output_dir(output_dir: str | Path) -> None:
    """Refuse, before any process starts, an ``output-dir`` that is a file, lies under one, or cannot be written.

    Parameters
    ----------
    output_dir : str or Path
        The run config's absolute ``output-dir``.

    Raises
    ------
    RunConfigError
        Naming what is in the way.
    """
    if problem := write_problem(output_dir, folder=True):
        raise RunConfigError(f"run config 'output-dir' {str(output_dir)!r} {problem}; the server writes its "
                             "globals and metrics.json into a folder: set another (--set output-dir=PATH)")


def check_keys(run_config: Mapping[str, Any]) -> None:
    """Load the keys the ServerApp will sign and verify with, before any process starts.

    With ``sign`` on and a ``keys-file``, the ServerApp reads that registry and
    the server's private key beside it (``server.key``) as its first work, with
    the same loaders as here (:mod:`synapse_flwr.flower.keys`); a run that
    would fail there is refused now. An empty ``keys-file`` (the demo key set)
    needs no file.

    Parameters
    ----------
    run_config : mapping
        The whole, absolute run config (``sign``, ``keys-file``).

    Raises
    ------
    RunConfigError
        Naming ``keys-file``, its value and what is wrong.
    """
    from synapse_flwr.core.signing import SERVER, KeyFileError
    from synapse_flwr.flower.keys import registry_for, signer_for

    cfg = RunConfig.from_mapping(run_config)
    if not cfg.sign or not cfg.keys_file:
        return
    if not Path(cfg.keys_file).is_file():
        raise RunConfigError(f"run config 'keys-file' {cfg.keys_file!r}: no such file; name the keys.json "
                             "written by `synapse keygen`, or --set keys-file='' for the demo key set")
    try:
        registry_for(cfg)
        signer_for(cfg, SERVER)
    except KeyFileError as exc:
        raise RunConfigError(f"run config 'keys-file' {cfg.keys_file!r}: {exc}") from None


def nothing_merged(output_dir: Path) -> str | None:
    """Why a completed run still failed: no round merged any artifact (None if one did).

    Parameters
    ----------
    output_dir : Path
        The run's ``output-dir``.
    """
    rounds = read_metrics(output_dir)
    # a round can accept artifacts and still merge nothing (fewer than min-nodes of them)
    if not rounds or any(r.get("merged", bool(r.get("accepted"))) for r in rounds):
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


@contextmanager
def output_lock(output_dir: Path) -> Iterator[None]:
    """Hold ``<output_dir>/.synapse.lock`` while a run writes there; refuse a folder another launcher holds.

    Two launchers in one output folder would both release every
    organisation's records (each sees no rounds yet) and interleave their
    globals. The lock is the kernel's (``flock``): it ends with its process,
    so a killed run leaves nothing to clean up, and the file is kept
    (removing it would let a third launcher lock a new file beside a held one).

    Parameters
    ----------
    output_dir : Path
        The run's ``output-dir`` (created if needed).

    Raises
    ------
    SynapseError
        If another process holds the lock (naming its pid), or the lock file
        cannot be created.
    """
    path = output_dir / LOCK_FILE
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        handle = path.open("a+", encoding="utf-8")
    except OSError as e:
        raise SynapseError(f"run config 'output-dir' {str(output_dir)!r}: cannot create its lock file "
                           f"({e.strerror or e}); set another (--set output-dir=PATH)") from e
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise SynapseError(f"{output_dir} is the output folder of a run still going (launcher pid {holder}): "
                               "two runs there would both release every organisation's records; wait for it to "
                               "end, or give another output-dir (--set output-dir=PATH)") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


# ------------------------------------------------------------------ one launch


class Launch:
    """The setup and teardown both launchers share: one private Flower world per run.

    Creating it checks everything a user can get wrong before any process
    starts and creates nothing: the app, the run config (absolute
    ``output-dir``, key and dataset paths), the dataset, the output folder,
    the keys and the rounds already on disk. :meth:`opened` creates the
    private ``FLWR_HOME`` (a temporary one is removed when the run ends);
    :meth:`stage` writes the tagged environment, the Flower CLI config naming
    the SuperLink, the run-config overrides and a copy of the app;
    :meth:`running` samples memory while the processes run and stops all of
    them on the way out; :meth:`check` judges the run by its status and
    outputs. The processes' logs go to ``<output-dir>/logs/<what>-<time>``, so
    they outlive a temporary home.

    Parameters
    ----------
    what : str
        ``"simulation"`` or ``"deployment"``: named in logs and errors.
    app_dir : Path
        The Flower app (folder with ``pyproject.toml``).
    run_config : mapping
        Overrides of ``[tool.flwr.app.config]``.
    flwr_home : Path or None
        Private ``FLWR_HOME``, kept after the run; a new temporary folder,
        removed after the run, when None.
    home_prefix : str
        Name prefix of that temporary folder.
    nodes : int
        The organisations (SuperNodes) that take part.

    Raises
    ------
    SynapseError
        If ``app_dir`` is not a Flower app, its number of rounds is
        unreadable, the run config names a dataset, output folder or keys
        file the run would fail on (:class:`~synapse_flwr.flower.config.RunConfigError`,
        or the dataset folder's ``DataError``), or would resume a federation
        of another size; or if ``flwr_home`` holds a Flower config of its own.
        (Whether ``min-nodes`` can be met: :func:`check_nodes_wanted`, after
        the launcher's own checks of its nodes.)
    """

    def __init__(
        self, what: str, app_dir: Path, run_config: Mapping[str, Any], flwr_home: Path | None, home_prefix: str,
        nodes: int,
    ) -> None:
        self.what = what
        self.source = _app_dir(app_dir)
        self.run_config = absolute_run_config(run_config)
        check_dataset(self.run_config)
        effective = effective_run_config(self.source, self.run_config)
        self.effective_config = effective  # the app's config under the overrides: what the run gets
        self.num_rounds = int(effective["num-rounds"])
        self.output_dir = Path(self.run_config["output-dir"])
        self.nodes = int(nodes)
        check_output_dir(self.output_dir)
        check_folders(self.run_config)
        check_keys(effective)
        check_resume(self.output_dir, effective, self.nodes)
        self.flwr_home = Path(flwr_home).expanduser().resolve() if flwr_home else None
        if self.flwr_home and self.flwr_home.exists() and not self.flwr_home.is_dir():
            raise SynapseError(f"--flwr-home {self.flwr_home} is a file; name a folder (or leave it out)")
        if self.flwr_home and (self.flwr_home / "config.toml").is_file() and not launcher_config(
                self.flwr_home / "config.toml"):
            # the run writes its own connection there: an operator's ~/.flwr would lose theirs
            raise SynapseError(f"--flwr-home {self.flwr_home} holds a Flower config.toml of its own, which the run "
                               "would overwrite; name an empty folder for the run (or leave it out)")
        self.home_prefix = home_prefix
        self._home: Path | None = None
        self.app_dir = self.source  # the staged copy once staged
        self.log_dir = self.output_dir / "logs"  # the run's own subfolder once staged
        self._group: ProcessGroup | None = None
        self.t0 = 0.0
        self.wall_s = 0.0
        self._heard = 0.0  # when :meth:`progress` last said something
        self.peak_rss_bytes: int | None = None

    @property
    def home(self) -> Path:
        """The run's ``FLWR_HOME``.

        Raises
        ------
        RuntimeError
            Outside :meth:`opened`.
        """
        if self._home is None:
            raise RuntimeError("Launch.opened() must come first: it creates FLWR_HOME")
        return self._home

    @property
    def overrides(self) -> Path:
        """The run-config file ``flwr run`` gets (in the home)."""
        return self.home / "run_config.toml"

    @contextmanager
    def opened(self) -> Iterator[Path]:
        """Context of the private ``FLWR_HOME``: created on entry, removed on exit when temporary.

        The output folder is locked for the context (:func:`output_lock`: a
        second launcher there is refused) and its rounds checked again under
        the lock. Enter it only once every check passed, so that a refused run leaves
        nothing behind; a temporary home (app copies, SuperLink state, tens of
        MB) is removed once the run ended, whichever way. A home given as
        ``flwr_home`` is kept.

        Yields
        ------
        Path
            The home.
        """
        with output_lock(self.output_dir):
            # a run that ended while this one was checked may have left rounds the first check did not see
            check_resume(self.output_dir, self.effective_config, self.nodes)
            self._home = _home(self.flwr_home, self.home_prefix)
            try:
                yield self._home
            finally:
                if self.flwr_home is None:
                    shutil.rmtree(self._home, ignore_errors=True)
                    log.debug("removed the temporary FLWR_HOME %s", self._home)

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
            If a Flower binary is missing, or the log folder cannot be created.
        RuntimeError
            Outside :meth:`opened`.
        """
        tag = uuid.uuid4().hex
        env = flower_env(self.home, tag, extra_env)
        write_atomic(self.output_dir / FEDERATION_FILE, json.dumps({"nodes": self.nodes}) + "\n")
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{superlink}"\n\n[superlink.{superlink}]\naddress = "{address}"\n'
            + ("insecure = true\n" if insecure else ""), encoding="utf-8")
        write_run_config(self.overrides, self.run_config)
        self.log_dir = run_log_dir(self.output_dir, self.what)
        self._group = ProcessGroup(tag, env, self.log_dir)
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

    def log_start(self, what: str) -> None:
        """Log what the run is about to start, where its outputs and logs go, and which home it uses.

        Parameters
        ----------
        what : str
            The launcher's own part (``K=3``, the SuperLink's address...).
        """
        home = f"{self.home} (kept)" if self.flwr_home else f"{self.home} (temporary: removed after the run)"
        log.info("%s: %s, %d rounds, outputs in %s, logs in %s, FLWR_HOME %s", self.what, what, self.num_rounds,
                 self.output_dir, self.log_dir, home)

    def progress(self, seen: int) -> int:
        """Log the rounds recorded since ``seen`` (or, after :data:`STILL_RUNNING_S` without one, that the run
        is still going); return the new count.

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
            log.info("round %s/%d done: %d accepted, %d rejected, %s bytes per client, %s conflicts, %d voted",
                     rec.get("round"), self.num_rounds, len(rec.get("accepted", [])),
                     len(rec.get("rejected", [])), rec.get("bytes_per_client"), rec.get("conflicts"),
                     len(rec.get("votes_accepted", [])))
        now = time.monotonic()
        if len(rounds) > seen or not self._heard:
            self._heard = now
        elif now - self._heard >= STILL_RUNNING_S:
            log.info("%s: round %d/%d still running, %.0f min into the run (logs in %s)", self.what,
                     min(seen + 1, self.num_rounds), self.num_rounds, (now - self.t0) / 60, self.log_dir)
            self._heard = now
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
        Private ``FLWR_HOME``, kept after the run; a new temporary folder,
        removed after the run, when None.
    timeout : float
        Seconds the whole run may take.

    Raises
    ------
    SynapseError
        Before any process starts: if ``num_supernodes`` is below 1, the app,
        the run config, its dataset, output folder or keys are unusable (see
        :class:`Launch`), Flower is missing or the ports are busy. Later: if
        the run times out, fails or leaves incomplete outputs (with the tail
        of its log).

    Returns
    -------
    SimulationResult
        Run id, final status, outputs, wall time, log and peak memory.
    """
    if int(num_supernodes) < 1:
        raise SynapseError(f"a simulation needs at least one SuperNode, got {num_supernodes}")
    launch = Launch("simulation", app_dir, run_config or {}, flwr_home, "synapse-flwr-sim-", int(num_supernodes))
    check_nodes_wanted(launch.effective_config, launch.nodes)
    http_port, control_port = pick_ports([None, None], ["managed SuperLink", "Control API"])
    with launch.opened():
        group = launch.stage("local", ":local:", extra_env={
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
            "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
        })
        cmd = ["flwr", "run", str(launch.app_dir), "local", "--federation-config",
               f"num-supernodes={int(num_supernodes)}", "--run-config", str(launch.overrides), "--stream"]
        launch.log_start(f"K={num_supernodes}")
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


