"""Pinned benchmark files: where the data folder is, and checking or fetching its files.

The files live in one data folder (see :func:`data_dir`)::

    metatool/        all_clean_data.csv, plugin_des.json, plugin_info.json,
                     multi_tool_query_golden.json, LICENSE
    taubench-retail/ tools.json, tasks_{train,test,dev}.json, wiki.md, LICENSE

Every file is pinned to an upstream commit and a sha256 (:data:`PINNED`);
:func:`verify` and :func:`verified_hashes` check them. MetaTool files are byte
copies of upstream. tau-bench keeps its tasks and tool schemas in Python
modules; :func:`download` converts them to JSON by reading the modules' syntax
tree (never running them, :func:`tasks_module_to_json`,
:func:`tool_modules_to_json`) and then checks the result against the same
sha256 pins, so a conversion that drifts is refused.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from synapse_flwr.core.errors import InputError, SynapseError
from synapse_flwr.core.files import write_atomic

log = logging.getLogger(__name__)

ENV_VAR = "SYNAPSE_DATA_DIR"
# each benchmark's subfolder of the data folder (the loaders read it, the launchers check it first)
BENCHMARK_FOLDERS = {"metatool": "metatool", "taubench": "taubench-retail"}

METATOOL_REPO = "HowieHwong/MetaTool"
METATOOL_COMMIT = "35e81bb7576826e980c80fed8f8c0a2b4a1e6fbb"
TAUBENCH_REPO = "sierra-research/tau-bench"
TAUBENCH_COMMIT = "59a200c6d575d595120f1cb70fea53cef0632f6b"
_RETAIL = "tau_bench/envs/retail"

# The retail tools that tools.json holds; upstream keeps one module per tool,
# named after it.
TAU_RETAIL_TOOLS = (
    "calculate",
    "cancel_pending_order",
    "exchange_delivered_order_items",
    "find_user_id_by_email",
    "find_user_id_by_name_zip",
    "get_order_details",
    "get_product_details",
    "get_user_details",
    "list_all_product_types",
    "modify_pending_order_address",
    "modify_pending_order_items",
    "modify_pending_order_payment",
    "modify_user_address",
    "return_delivered_order_items",
    "think",
    "transfer_to_human_agents",
)

_RAW_URL = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"


@dataclass(frozen=True)
class PinnedFile:
    """One data file, its upstream source and its pinned content hash.

    Parameters
    ----------
    path : str
        Path inside the data folder.
    repo : str
        Upstream GitHub repository (``owner/name``).
    commit : str
        Upstream commit the file is taken from.
    sources : tuple of str
        Upstream paths the file is made from (one for a byte copy).
    sha256 : str
        Hex digest of the file as stored in the data folder.
    convert : {"tasks", "tools"} or None
        How the upstream Python sources become the stored JSON; None for a
        byte copy.
    """

    path: str
    repo: str
    commit: str
    sources: tuple[str, ...]
    sha256: str
    convert: Literal["tasks", "tools"] | None = None

    def urls(self) -> list[str]:
        """Raw download URLs of the sources at the pinned commit."""
        return [_RAW_URL.format(repo=self.repo, commit=self.commit, path=p) for p in self.sources]


def _metatool(path: str, source: str, sha256: str) -> PinnedFile:
    """Pin of a MetaTool file copied byte for byte."""
    return PinnedFile(f"metatool/{path}", METATOOL_REPO, METATOOL_COMMIT, (source,), sha256)


def _tau(
    path: str,
    sources: tuple[str, ...],
    sha256: str,
    convert: Literal["tasks", "tools"] | None = None,
) -> PinnedFile:
    """Pin of a tau-bench retail file, copied or converted from its sources."""
    return PinnedFile(
        f"taubench-retail/{path}", TAUBENCH_REPO, TAUBENCH_COMMIT, sources, sha256, convert
    )


# sha256 values are the pins: copied from the data folder's SHA256SUMS.
PINNED: tuple[PinnedFile, ...] = (
    _metatool(
        "LICENSE", "LICENSE", "7d3e10ed82f071f6f96ff6bf660826472ca1045d546cdd2ccb3ffda2103588f7"
    ),
    _metatool(
        "all_clean_data.csv",
        "dataset/data/all_clean_data.csv",
        "cf2eb0474396677530931def51012da4e88f9f34f655332f04177b2054101baf",
    ),
    _metatool(
        "multi_tool_query_golden.json",
        "dataset/data/multi_tool_query_golden.json",
        "ef37d10a8cb5b41435d6ea3ae29819afdb8d6db0852268830e5ee77259507f51",
    ),
    _metatool(
        "plugin_des.json",
        "dataset/plugin_des.json",
        "c446ade5acfb8e16c477124250665021e63b11bf6cb232db04fc9ba6bed0389a",
    ),
    _metatool(
        "plugin_info.json",
        "dataset/plugin_info.json",
        "864bf25bd5494feca861acb98f69d260f212d9c098a2dc68b4b2ee357d6fb2f5",
    ),
    _tau(
        "LICENSE", ("LICENSE",), "243d23d45b80122b5ac575586ccef352fdc9c45e6d7d2605449aca8a17478b42"
    ),
    _tau(
        "tasks_dev.json",
        (f"{_RETAIL}/tasks_dev.py",),
        "dedc13f145b86d192696844bced18d207e29238f904f579b32d0220272e4e6e6",
        "tasks",
    ),
    _tau(
        "tasks_test.json",
        (f"{_RETAIL}/tasks_test.py",),
        "7d7418a9c51dc8335ae16a0e1ae22ce77f8b3f2e70f0232840a3135fa1744e88",
        "tasks",
    ),
    _tau(
        "tasks_train.json",
        (f"{_RETAIL}/tasks_train.py",),
        "67a34752ea38588d6d71ec190d18e5800ca213acd86f2abe07673539dbea39fb",
        "tasks",
    ),
    _tau(
        "tools.json",
        tuple(f"{_RETAIL}/tools/{name}.py" for name in TAU_RETAIL_TOOLS),
        "833272a8817f6fa3eb54fc3694e0ce16e9685c72bf4ecc2b35639bd564acd235",
        "tools",
    ),
    _tau(
        "wiki.md",
        (f"{_RETAIL}/wiki.md",),
        "d539fd2a46a8b8dd2e934ff9ed92f43e9f6b56bc7a718db8d2803ba8ad8f6bf7",
    ),
)

HOW_TO_GET = (
    f"set {ENV_VAR} to a folder holding metatool/ and taubench-retail/ "
    "(e.g. a copy of the workplace's shared/data), or on a machine with internet run "
    "`python -c \"from synapse_flwr.data.pins import download; download('DEST')\"` "
    f"and set {ENV_VAR}=DEST"
)


# --------------------------------------------------------------------------- location


def data_dir() -> Path:
    """Locate the benchmark data folder.

    Looks at the environment variable ``SYNAPSE_DATA_DIR``, then
    ``../shared/data`` relative to the current directory, then the same
    relative to the repository root.

    Returns
    -------
    Path
        The data folder.

    Raises
    ------
    SynapseError
        If ``SYNAPSE_DATA_DIR`` names no folder, or no candidate exists; the
        message says how to set it or download the data.
    """
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise SynapseError(f"{ENV_VAR}={env!r} is not a folder; {HOW_TO_GET}")
        return path
    repo_root = Path(__file__).resolve().parents[2]
    for base in (Path.cwd(), repo_root):
        candidate = base / ".." / "shared" / "data"
        if candidate.is_dir():
            return candidate.resolve()
    raise SynapseError(f"benchmark data not found; {HOW_TO_GET}")


def resolve_dir(directory: str | Path | None) -> Path:
    """The given data folder, or :func:`data_dir` when None."""
    return Path(directory) if directory is not None else data_dir()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def verify(directory: str | Path | None = None, paths: Iterable[str] | None = None) -> list[str]:
    """Check the sha256 of the pinned files present in the data folder.

    Parameters
    ----------
    directory : str, Path or None
        Data folder; None uses :func:`data_dir`.
    paths : iterable of str or None
        Check only these pinned paths (e.g. ``"metatool/plugin_des.json"``);
        None checks every pinned file. Absent files are skipped.

    Returns
    -------
    list of str
        The paths that were present and matched.

    Raises
    ------
    SynapseError
        On the first file whose content does not match its pin, or when
        ``paths`` names a file that is not pinned.
    """
    root = resolve_dir(directory)
    pins = {p.path: p for p in PINNED}
    wanted = list(pins) if paths is None else list(paths)
    unknown = [p for p in wanted if p not in pins]
    if unknown:
        raise SynapseError(f"not pinned data files: {unknown}; pinned: {sorted(pins)}")
    checked = []
    for rel in wanted:
        file = root / rel
        if not file.is_file():
            log.debug("verify: %s absent, skipped", file)
            continue
        digest = _sha256(file.read_bytes())
        if digest != pins[rel].sha256:
            pin = pins[rel]
            raise SynapseError(
                f"{file}: sha256 {digest} does not match the pin {pin.sha256} "
                f"({pin.repo} @ {pin.commit}); the file is corrupt or modified. "
                f"Restore it from the shared data copy or re-run download()"
            )
        checked.append(rel)
    return checked


def read_json(path: Path) -> Any:
    """Parse a JSON file of the data folder, reporting a missing or malformed one by path."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(path, f"file not found; {HOW_TO_GET}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(path, f"cannot read JSON: {exc}") from None


def verified_hashes(datasets: Iterable[str], directory: str | Path | None = None) -> dict[str, str]:
    """sha256 of every pinned file of these datasets (``metatool``, ``taubench-retail``), verified.

    For a results manifest: the files present in the data folder, each
    checked against its pin (a mismatch raises :class:`SynapseError`).
    """
    wanted = set(datasets)
    pins = {p.path: p.sha256 for p in PINNED if p.path.split("/")[0] in wanted}
    return {path: pins[path] for path in verify(directory, pins)} if pins else {}


# --------------------------------------------------------------------------- download


def _fetch(url: str, timeout: float) -> bytes:
    """Download one URL (the single network call of this module)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except (urllib.error.URLError, OSError) as exc:
        raise SynapseError(
            f"cannot download {url}: {exc}; without internet, {HOW_TO_GET}"
        ) from None


# Upstream builds tasks with these constructors; their keyword arguments are
# read as dict entries instead of calling anything.
_RECORD_CALLS = frozenset({"Task", "Action"})


def _literal(node: ast.AST, where: str) -> Any:
    """Evaluate a literal expression, reading ``Task(...)``/``Action(...)`` as dicts.

    Parameters
    ----------
    node : ast.AST
        Expression node.
    where : str
        Source name for error messages.
    """
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _RECORD_CALLS
        and not node.args
        and all(k.arg for k in node.keywords)
    ):
        return {k.arg: _literal(k.value, where) for k in node.keywords}
    if isinstance(node, ast.List):
        return [_literal(e, where) for e in node.elts]
    if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        return {
            _literal(k, where): _literal(v, where)
            for k, v in zip(node.keys, node.values, strict=True)
        }
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError) as exc:
        raise SynapseError(
            f"{where}:{getattr(node, 'lineno', '?')}: not a literal ({exc}); "
            f"the JSON conversion must be supplied (copy it from the shared data folder)"
        ) from None


def _parse(source: str, where: str) -> ast.Module:
    """Parse (never run) an upstream Python module."""
    try:
        return ast.parse(source, filename=where)
    except SyntaxError as exc:
        raise SynapseError(f"{where}: not valid Python ({exc.msg}, line {exc.lineno})") from None


def tasks_module_to_json(source: str, where: str = "tasks module") -> str:
    """Convert an upstream tau-bench ``tasks_*.py`` to the stored JSON, without running it.

    Parameters
    ----------
    source : str
        Python source holding one module-level ``TASKS... = [Task(...), ...]``.
    where : str
        Source name for error messages.

    Returns
    -------
    str
        JSON list of ``{task_id, user_id, instruction, actions: [{name, kwargs}],
        outputs}`` in the stored layout (``indent=1``); ``task_id`` is the index.

    Raises
    ------
    SynapseError
        If the module does not have that shape.
    """
    tree = _parse(source, where)
    lists = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.List)
        and any(isinstance(t, ast.Name) and t.id.upper().startswith("TASKS") for t in node.targets)
    ]
    if len(lists) != 1:
        raise SynapseError(f"{where}: expected one module-level TASKS list, found {len(lists)}")
    tasks = []
    for i, node in enumerate(lists[0].elts):
        task = _literal(node, where)
        if not isinstance(task, dict) or not {"user_id", "instruction"} <= task.keys():
            raise SynapseError(f"{where}: task {i} lacks user_id or instruction")
        tasks.append(
            {
                "task_id": i,
                "user_id": task["user_id"],
                "instruction": task["instruction"],
                "actions": [
                    {"name": a["name"], "kwargs": a.get("kwargs", {})}
                    for a in task.get("actions", [])
                ],
                "outputs": task.get("outputs", []),
            }
        )
    return json.dumps(tasks, indent=1)


def _get_info(source: str, where: str) -> dict[str, Any]:
    """The literal schema returned by a tool module's ``get_info()``."""
    for node in ast.walk(_parse(source, where)):
        if isinstance(node, ast.FunctionDef) and node.name == "get_info":
            returns = [s for s in node.body if isinstance(s, ast.Return) and s.value is not None]
            if len(returns) == 1:
                info = _literal(returns[0].value, where)
                if isinstance(info, dict) and isinstance(info.get("function"), dict):
                    return info
    raise SynapseError(f"{where}: no get_info() returning a function schema literal")


def tool_modules_to_json(sources: Sequence[str], names: Sequence[str] | None = None) -> str:
    """Convert upstream tau-bench tool modules to the stored ``tools.json``, without running them.

    Parameters
    ----------
    sources : sequence of str
        Python source of each tool module; each has a ``get_info()`` that
        returns a literal OpenAI function schema.
    names : sequence of str or None
        Source names for error messages (same length as ``sources``).

    Returns
    -------
    str
        JSON list of the schemas sorted by function name (``indent=1``).
    """
    names = names or [f"tool module {i}" for i in range(len(sources))]
    tools = [_get_info(src, name) for src, name in zip(sources, names, strict=True)]
    tools.sort(key=lambda t: t["function"]["name"])
    return json.dumps(tools, indent=1)


def download(dest: str | Path, timeout: float = 60.0) -> list[Path]:
    """Fetch every pinned file from upstream at its pinned commit and check it.

    Files already present with the right hash are kept. tau-bench's Python
    sources are converted to JSON (syntax tree only, nothing is executed) and
    the result must match the same pin.

    Parameters
    ----------
    dest : str or Path
        Data folder to fill.
    timeout : float
        Seconds per HTTP request.

    Returns
    -------
    list of Path
        The files written.

    Raises
    ------
    SynapseError
        On a network failure or any content that does not match its pin
        (nothing is written for that file).
    """
    root = Path(dest)
    written = []
    for pin in PINNED:
        target = root / pin.path
        if target.is_file() and _sha256(target.read_bytes()) == pin.sha256:
            continue
        raw = [_fetch(url, timeout) for url in pin.urls()]
        if pin.convert == "tasks":
            data = tasks_module_to_json(raw[0].decode("utf-8"), pin.sources[0]).encode("utf-8")
        elif pin.convert == "tools":
            data = tool_modules_to_json([r.decode("utf-8") for r in raw], pin.sources).encode(
                "utf-8"
            )
        else:
            data = raw[0]
        digest = _sha256(data)
        if digest != pin.sha256:
            hint = (
                "the JSON conversion of the upstream Python did not reproduce the stored file; "
                "supply the converted JSON (copy it from the shared data folder)"
                if pin.convert
                else "upstream content differs from the pin"
            )
            raise SynapseError(f"{pin.path}: sha256 {digest} != pin {pin.sha256}: {hint}")
        written.append(write_atomic(target, data))
        log.info("downloaded %s (%d bytes)", target, len(data))
    return written
