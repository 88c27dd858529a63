"""Real benchmark data: MetaTool and tau-bench retail, pinned, verified and split.

The files live in one data folder (see :func:`data_dir`)::

    metatool/        all_clean_data.csv, plugin_des.json, plugin_info.json,
                     multi_tool_query_golden.json, LICENSE
    taubench-retail/ tools.json, tasks_{train,test,dev}.json, wiki.md, LICENSE

Every file is pinned to an upstream commit and a sha256 (:data:`PINNED`).
MetaTool files are byte copies of upstream. tau-bench keeps its tasks and tool
schemas in Python modules; :func:`download` converts them to JSON by reading
the modules' syntax tree (never running them) and then checks the result
against the same sha256 pins, so a conversion that drifts is refused.

Beyond loading, this module builds the evaluation protocol: seen-tool and
held-out-tool test sets (:func:`make_splits`), a train/test leak filter
(:func:`leak_filter`) and a non-IID partition of experience across
organisations (:func:`partition_noniid`).
"""

from __future__ import annotations

import ast
import csv
import hashlib
import io
import json
import logging
import os
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import scipy.sparse as sp
from pydantic import ValidationError

from synapse_flwr.core.catalog import (
    Catalog,
    ToolDoc,
    alias_key,
    make_catalog,
    parse_tool,
)
from synapse_flwr.core.errors import InputError, SynapseError
from synapse_flwr.core.experience import Event, TestItem
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.phrases import normalize_text, tokens

log = logging.getLogger(__name__)

ENV_VAR = "SYNAPSE_DATA_DIR"

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

TAU_SPLITS = ("train", "test", "dev")

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

_HOW_TO_GET = (
    f"set {ENV_VAR} to a folder holding metatool/ and taubench-retail/ "
    "(e.g. a copy of the workplace's shared/data), or on a machine with internet run "
    "`python -c \"from synapse_flwr.data.datasets import download; download('DEST')\"` "
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
            raise SynapseError(f"{ENV_VAR}={env!r} is not a folder; {_HOW_TO_GET}")
        return path
    repo_root = Path(__file__).resolve().parents[2]
    for base in (Path.cwd(), repo_root):
        candidate = base / ".." / "shared" / "data"
        if candidate.is_dir():
            return candidate.resolve()
    raise SynapseError(f"benchmark data not found; {_HOW_TO_GET}")


def _dir(directory: str | Path | None) -> Path:
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
    root = _dir(directory)
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


# --------------------------------------------------------------------------- download


def _fetch(url: str, timeout: float) -> bytes:
    """Download one URL (the single network call of this module)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except (urllib.error.URLError, OSError) as exc:
        raise SynapseError(
            f"cannot download {url}: {exc}; without internet, {_HOW_TO_GET}"
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


# --------------------------------------------------------------------------- MetaTool


@dataclass(frozen=True)
class MetaToolReport:
    """What loading MetaTool kept and dropped.

    Parameters
    ----------
    rows : int
        CSV rows read.
    kept : int
        Events returned.
    garbage_query : int
        Rows dropped for an empty, non-text or over-long query.
    unknown_label : int
        Rows dropped because the label resolves to no catalog tool.
    alias_labels : int
        Distinct labels that resolve only up to case or punctuation.
    extra_tools : int
        Unlabelled tools added from ``plugin_info.json``.
    skipped_manifests : int
        Manifests not added (duplicates of a catalog tool, or unusable name).
    """

    rows: int
    kept: int
    garbage_query: int
    unknown_label: int
    alias_labels: int
    extra_tools: int
    skipped_manifests: int


class MetaTool(NamedTuple):
    """MetaTool as loaded: catalog, labelled events and the load report."""

    catalog: Catalog
    events: list[Event]
    report: MetaToolReport


def _read_json(path: Path) -> Any:
    """Parse a JSON file, reporting a missing or malformed one by path."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(path, f"file not found; {_HOW_TO_GET}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(path, f"cannot read JSON: {exc}") from None


def _is_text(query: object) -> bool:
    """A query worth keeping: a string with at least one word containing a letter."""
    return isinstance(query, str) and any(any(c.isalpha() for c in t) for t in tokens(query))


def _extra_docs(path: Path) -> tuple[list[ToolDoc], int]:
    """Tool docs of the plugin manifests that parse, and the number of manifests."""
    manifests = _read_json(path)
    if not isinstance(manifests, list):
        raise InputError(path, "expected a JSON list of plugin manifests")
    docs = []
    for i, m in enumerate(manifests, start=1):
        try:
            docs.append(
                parse_tool(
                    {
                        "name": m.get("name_for_model"),
                        "description": m.get("description_for_model", ""),
                    }
                )
            )
        except (ValueError, AttributeError) as exc:
            log.warning("%s:%d: manifest skipped: %s", path, i, exc)
    return docs, len(manifests)


def load_metatool(
    directory: str | Path | None = None, with_extra_tools: bool = False, check: bool = True
) -> MetaTool:
    """Load MetaTool as a catalog and one labelled event per CSV row.

    Parameters
    ----------
    directory : str, Path or None
        Data folder (holding ``metatool/``); None uses :func:`data_dir`.
    with_extra_tools : bool
        Also add the ``plugin_info.json`` manifests (``name_for_model``,
        ``description_for_model``) as unlabelled tools; those that collapse
        into one of the 199 labelled tools are skipped.
    check : bool
        Verify the files' sha256 pins first.

    Returns
    -------
    MetaTool
        ``(catalog, events, report)``. Events have ``success=True`` and
        ``tool == gold ==`` the label's catalog id. Rows with an empty or
        non-text query, or a label outside the catalog, are dropped and
        counted in the report.
    """
    root = _dir(directory) / "metatool"
    if check:
        files = ["plugin_des.json", "all_clean_data.csv"] + (
            ["plugin_info.json"] if with_extra_tools else []
        )
        verify(root.parent, [f"metatool/{f}" for f in files])
    des_path = root / "plugin_des.json"
    des = _read_json(des_path)
    if not isinstance(des, dict):
        raise InputError(des_path, "expected a JSON object of tool name -> description")
    base = make_catalog(
        parse_tool({"name": name, "description": text}) for name, text in des.items()
    )
    catalog, extra, skipped = base, 0, 0
    if with_extra_tools:
        docs, n_manifests = _extra_docs(root / "plugin_info.json")
        # Manifests of a labelled tool (or repeated ones) are skipped, so the
        # labelled spelling and its one-line description stay.
        fresh: dict[str, ToolDoc] = {}
        for doc in docs:
            if base.resolve(doc.tool_id) is None:
                fresh.setdefault(alias_key(doc.tool_id), doc)
        catalog = make_catalog([*base.tools, *fresh.values()])
        extra, skipped = len(fresh), n_manifests - len(fresh)

    csv_path = root / "all_clean_data.csv"
    try:
        text = csv_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(csv_path, f"file not found; {_HOW_TO_GET}") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if not {"Query", "Tool"} <= set(reader.fieldnames or ()):
        raise InputError(
            csv_path, f"expected columns Query,Tool, found {reader.fieldnames}", line=1
        )
    events: list[Event] = []
    rows = garbage = 0
    unknown: Counter[str] = Counter()
    alias_labels: set[str] = set()
    for row in reader:
        rows += 1
        query, label = row.get("Query"), row.get("Tool") or ""
        tool_id = base.resolve(label) if label.strip() else None
        if tool_id is None:
            unknown[label] += 1
            continue
        if not _is_text(query):
            garbage += 1
            continue
        if base.get(tool_id).name != label:
            alias_labels.add(label)
        try:
            events.append(Event(query=query, tool=tool_id, success=True, gold=tool_id))
        except ValidationError:
            garbage += 1
    if unknown:
        log.warning(
            "metatool: %d rows with labels outside the catalog dropped: %s",
            sum(unknown.values()),
            unknown.most_common(5),
        )
    report = MetaToolReport(
        rows=rows,
        kept=len(events),
        garbage_query=garbage,
        unknown_label=sum(unknown.values()),
        alias_labels=len(alias_labels),
        extra_tools=extra,
        skipped_manifests=skipped,
    )
    log.info("metatool: %s", report)
    return MetaTool(catalog, events, report)


# --------------------------------------------------------------------------- tau-bench


@dataclass(frozen=True)
class Task:
    """One tau-bench task.

    Parameters
    ----------
    task_id : int
        Index within its split.
    user_id : str
        The simulated user.
    instruction : str
        The user's instruction.
    actions : tuple of str
        Catalog ids of the gold tool calls, in order.
    """

    task_id: int
    user_id: str
    instruction: str
    actions: tuple[str, ...]


@dataclass(frozen=True)
class StepItem:
    """One step of a task: which tool comes next, given the calls so far.

    Parameters
    ----------
    query : str
        The instruction, plus ``previous calls: a, b`` after the first step.
    prev_tool : str or None
        The previous gold call, None at the first step.
    gold : str
        The gold tool of this step.
    task_id : int
        The task.
    step : int
        0-based index of the call within the task.
    """

    query: str
    prev_tool: str | None
    gold: str
    task_id: int
    step: int


def load_taubench(
    directory: str | Path | None = None, split: str = "train", check: bool = True
) -> tuple[Catalog, list[Task]]:
    """Load tau-bench retail: its 16-tool catalog and the tasks of one split.

    Parameters
    ----------
    directory : str, Path or None
        Data folder (holding ``taubench-retail/``); None uses :func:`data_dir`.
    split : {"train", "test", "dev"}
        Which tasks.
    check : bool
        Verify the files' sha256 pins first.

    Returns
    -------
    (Catalog, list of Task)

    Raises
    ------
    ValueError
        For an unknown split.
    InputError
        If a gold action names a tool outside the catalog.
    """
    if split not in TAU_SPLITS:
        raise ValueError(f"split must be one of {TAU_SPLITS}, not {split!r}")
    root = _dir(directory) / "taubench-retail"
    tasks_path = root / f"tasks_{split}.json"
    if check:
        verify(root.parent, ["taubench-retail/tools.json", f"taubench-retail/tasks_{split}.json"])
    tools_path = root / "tools.json"
    try:
        catalog = make_catalog(parse_tool(t) for t in _read_json(tools_path))
    except (ValueError, AttributeError) as exc:
        raise InputError(tools_path, str(exc)) from None
    tasks = []
    for i, raw in enumerate(_read_json(tasks_path), start=1):
        ids = []
        for j, action in enumerate(raw.get("actions", [])):
            tool_id = catalog.resolve(action.get("name", ""))
            if tool_id is None:
                raise InputError(
                    tasks_path,
                    f"tool {action.get('name')!r} is not in the catalog",
                    line=i,
                    field=f"actions.{j}.name",
                )
            ids.append(tool_id)
        tasks.append(
            Task(
                int(raw.get("task_id", i - 1)),
                str(raw.get("user_id", "")),
                raw["instruction"],
                tuple(ids),
            )
        )
    log.info(
        "taubench %s: %d tasks, %d gold calls",
        split,
        len(tasks),
        sum(len(t.actions) for t in tasks),
    )
    return catalog, tasks


def step_query(instruction: str, previous: Sequence[str]) -> str:
    """The query of one step: the instruction plus the gold calls made so far.

    Parameters
    ----------
    instruction : str
        The task instruction.
    previous : sequence of str
        Tool ids already called, in order.
    """
    return f"{instruction}\nprevious calls: {', '.join(previous)}" if previous else instruction


def taubench_step_items(tasks: Iterable[Task]) -> list[StepItem]:
    """One item per gold call of every task.

    Parameters
    ----------
    tasks : iterable of Task
        Tasks (tasks with no gold calls contribute nothing).
    """
    return [
        StepItem(
            query=step_query(task.instruction, task.actions[:i]),
            prev_tool=task.actions[i - 1] if i else None,
            gold=tool,
            task_id=task.task_id,
            step=i,
        )
        for task in tasks
        for i, tool in enumerate(task.actions)
    ]


def taubench_events(tasks: Iterable[Task]) -> list[Event]:
    """Successful routing events, one per gold call, for building compendia.

    Parameters
    ----------
    tasks : iterable of Task
        Usually the train split.
    """
    return [
        Event(query=s.query, tool=s.gold, success=True, gold=s.gold, prev_tool=s.prev_tool)
        for s in taubench_step_items(tasks)
    ]


# --------------------------------------------------------------------------- leak filter


@dataclass(frozen=True)
class LeakReport:
    """What :func:`leak_filter` dropped.

    Parameters
    ----------
    total : int
        Training events in.
    exact : int
        Dropped: same normalised text as a test query.
    near : int
        Dropped: shingle Jaccard with a test query at or above the threshold.
    garbage : int
        Dropped: empty or non-text query, or label outside the catalog.
    kept : int
        Events out.
    """

    total: int
    exact: int
    near: int
    garbage: int
    kept: int


# The l of the l-prefix filter: a candidate pair must share this many shingles
# of the two prefixes. Larger l means longer prefixes (a costlier sparse
# product) but far fewer candidates to verify; 8 is the sweet spot on MetaTool.
_PREFIX_SHARED = 8
# Candidate pairs verified per batch, bounding the memory of the expansion.
_VERIFY_BATCH = 50_000
# Training rows per sparse product, bounding the memory of its result.
_PRODUCT_ROWS = 2048


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + c)`` over the starts and counts."""
    ends = np.cumsum(counts)
    total = int(ends[-1]) if len(ends) else 0
    return np.arange(total) - np.repeat(ends - counts, counts) + np.repeat(starts, counts)


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values (a plain sort: faster here than ``np.unique``)."""
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))]


def _dense_ids(codes: np.ndarray) -> tuple[np.ndarray, int]:
    """Map codes to ids ``0..n-1`` in sorted code order; returns the ids and n."""
    order = np.argsort(codes)
    ordered = codes[order]
    ids = np.empty(len(codes), dtype=np.int64)
    ids[order] = np.cumsum(np.concatenate(([False], ordered[1:] != ordered[:-1])))
    return ids, int(ids[order[-1]]) + 1 if len(codes) else 0


def _shingle_codes(keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Row and code of every character 3-gram of every text (vectorised).

    A text shorter than 3 characters is padded with NUL, so it is one shingle.
    """
    padded = [k.ljust(3, "\0") for k in keys]
    lens = np.fromiter(map(len, padded), dtype=np.int64, count=len(padded))
    points = np.frombuffer("".join(padded).encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    # Code points are below 2**21, so three of them pack into one uint64.
    codes = (points[:-2] << np.uint64(42)) | (points[1:-1] << np.uint64(21)) | points[2:]
    n = lens - 2
    rows = np.repeat(np.arange(len(keys)), n)
    return rows, codes[_ranges(np.cumsum(lens) - lens, n)]


def _prefix_matrix(
    rows: np.ndarray,
    ids: np.ndarray,
    size: np.ndarray,
    rank: np.ndarray,
    threshold: float,
    vocab: int,
) -> tuple[sp.csr_matrix, np.ndarray]:
    """Sparse matrix of each set's l-prefix (rarest shingles first) and its required share.

    A partner that passes the size filter overlaps a set of size n in at least
    ``alpha = ceil(t * n)`` shingles; the l-prefix lemma then guarantees
    ``min(l, alpha)`` shared shingles within the first ``n - alpha + min(l, alpha)``.
    """
    # The epsilon keeps t*n that is an integer in exact arithmetic from rounding up.
    alpha = np.ceil(threshold * size - 1e-9).astype(np.int64)
    need = np.minimum(_PREFIX_SHARED, alpha)
    order = np.lexsort((rank[ids], rows))
    rows_s, ids_s = rows[order], ids[order]
    position = np.arange(len(rows_s)) - (np.cumsum(size) - size)[rows_s]
    keep = position < (size - alpha + need)[rows_s]
    matrix = sp.csr_matrix(
        (np.ones(int(keep.sum()), dtype=np.int32), (rows_s[keep], ids_s[keep])),
        shape=(len(size), vocab),
    )
    return matrix, need


def near_duplicates(keys: Sequence[str], reference: Sequence[str], threshold: float) -> np.ndarray:
    """Whether each text has a reference text with shingle Jaccard >= threshold.

    Exact: candidates come from the l-prefix filter (sets ordered rarest
    shingle first must share ``min(l, ceil(t*n))`` shingles of their prefixes,
    computed as one sparse product per block of rows), pass a size filter,
    and are then verified by their full shingle overlap.

    Parameters
    ----------
    keys : sequence of str
        Normalised texts to test.
    reference : sequence of str
        Normalised texts to compare against.
    threshold : float
        Character 3-gram Jaccard similarity in (0, 1].

    Returns
    -------
    numpy.ndarray of bool
        One flag per text of ``keys``.
    """
    found = np.zeros(len(keys), dtype=bool)
    if not keys or not reference:
        return found
    rows_a, codes_a = _shingle_codes(keys)
    rows_b, codes_b = _shingle_codes(reference)
    inverse, vocab = _dense_ids(np.concatenate([codes_a, codes_b]))
    # Distinct (row, shingle) keys, sorted by row then shingle.
    pairs_a = _sorted_unique(rows_a * vocab + inverse[: len(codes_a)])
    pairs_b = _sorted_unique(rows_b * vocab + inverse[len(codes_a) :])
    rows_a, ids_a = np.divmod(pairs_a, vocab)
    rows_b, ids_b = np.divmod(pairs_b, vocab)
    size_a = np.bincount(rows_a, minlength=len(keys))
    size_b = np.bincount(rows_b, minlength=len(reference))
    start_a = np.cumsum(size_a) - size_a
    freq = np.bincount(ids_a, minlength=vocab) + np.bincount(ids_b, minlength=vocab)
    rank = np.empty(vocab, dtype=np.int64)
    rank[np.lexsort((np.arange(vocab), freq))] = np.arange(vocab)
    prefix_a, need_a = _prefix_matrix(rows_a, ids_a, size_a, rank, threshold, vocab)
    prefix_b, need_b = _prefix_matrix(rows_b, ids_b, size_b, rank, threshold, vocab)
    prefix_bt = prefix_b.T.tocsr()
    for lo in range(0, len(keys), _PRODUCT_ROWS):
        shared = (prefix_a[lo : lo + _PRODUCT_ROWS] @ prefix_bt).tocoo()
        i, j = shared.row.astype(np.int64) + lo, shared.col.astype(np.int64)
        na, nb = size_a[i], size_b[j]
        ok = (shared.data >= np.minimum(need_a[i], need_b[j])) & (
            threshold * np.maximum(na, nb) <= np.minimum(na, nb) + 1e-9
        )
        i, j = i[ok & ~found[i]], j[ok & ~found[i]]
        for b in range(0, len(i), _VERIFY_BATCH):
            bi, bj = i[b : b + _VERIFY_BATCH], j[b : b + _VERIFY_BATCH]
            # Look every shingle of the candidate up among the reference's (row, shingle) keys.
            owner = np.repeat(np.arange(len(bi)), size_a[bi])
            probe = bj[owner] * vocab + ids_a[_ranges(start_a[bi], size_a[bi])]
            at = np.minimum(np.searchsorted(pairs_b, probe), len(pairs_b) - 1)
            inter = np.bincount(owner, weights=pairs_b[at] == probe, minlength=len(bi))
            union = size_a[bi] + size_b[bj] - inter
            found[bi[inter >= threshold * union - 1e-9]] = True
    return found


def _label(event: Event) -> str | None:
    """The right tool of an event, when it is known."""
    return event.gold or (event.tool if event.success else None)


def leak_filter(
    train: Sequence[Event],
    test_queries: Sequence[str],
    jaccard: float = 0.8,
    catalog: Catalog | None = None,
) -> tuple[list[Event], LeakReport]:
    """Drop training events that leak test queries, and garbage.

    Parameters
    ----------
    train : sequence of Event
        Training events.
    test_queries : sequence of str
        Every test query (all test sets together).
    jaccard : float
        Character 3-gram shingle Jaccard at which a training query counts as a
        near duplicate of a test query.
    catalog : Catalog or None
        When given, events whose tool or gold is not in it are garbage.

    Returns
    -------
    (list of Event, LeakReport)
        Kept events in input order, and the counts.
    """
    if not 0 < jaccard <= 1:
        raise ValueError(f"jaccard must be in (0, 1], not {jaccard}")
    test_keys = [k for k in (normalize_text(q) for q in test_queries) if k]
    exact_keys = set(test_keys)
    garbage = exact = 0
    candidates: list[tuple[Event, str]] = []
    for event in train:
        known = catalog is None or all(
            catalog.resolve(name) is not None for name in (event.tool, event.gold) if name
        )
        if not known or not _is_text(event.query):
            garbage += 1
        elif (key := normalize_text(event.query)) in exact_keys:
            exact += 1
        else:
            candidates.append((event, key))
    near_flags = near_duplicates([k for _, k in candidates], test_keys, jaccard)
    kept = [event for (event, _), near in zip(candidates, near_flags, strict=True) if not near]
    report = LeakReport(
        total=len(train), exact=exact, near=int(near_flags.sum()), garbage=garbage, kept=len(kept)
    )
    log.info("leak filter: %s", report)
    return kept, report


# --------------------------------------------------------------------------- splits


@dataclass(frozen=True)
class Splits:
    """Train events and the two test sets of the evaluation protocol.

    Parameters
    ----------
    train : list of Event
        Experience of the seen tools, leak-filtered.
    seen_test : list of TestItem
        Held-out queries of tools that have training experience.
    heldout_test : list of TestItem
        Queries of the held-out tools, which have no experience at all.
    heldout_tools : tuple of str
        Ids of the held-out tools, sorted.
    leak : LeakReport
        What the leak filter removed from train.
    """

    train: list[Event]
    seen_test: list[TestItem]
    heldout_test: list[TestItem]
    heldout_tools: tuple[str, ...]
    leak: LeakReport


def _test_items(events: Iterable[tuple[Event, str]]) -> list[TestItem]:
    """Test items, one per distinct normalised query, all its labels acceptable."""
    by_key: dict[str, tuple[str, list[str]]] = {}
    for event, label in events:
        query, golds = by_key.setdefault(normalize_text(event.query), (event.query, []))
        if label not in golds:
            golds.append(label)
    return [TestItem(query=q, gold=tuple(g)) for q, g in by_key.values()]


def make_splits(
    catalog: Catalog,
    events: Sequence[Event],
    seed: int,
    heldout_frac: float = 0.2,
    test_per_tool: int | None = None,
    test_frac: float = 0.2,
    jaccard: float = 0.8,
) -> Splits:
    """Split labelled events into train, seen-tool test and held-out-tool test.

    A fraction of the labelled tools is held out: all their events (or at most
    ``test_per_tool`` of each, sampled) form the held-out test set, and they
    appear in no training event in any role (tool, gold or prev_tool). Of every
    other tool a fraction of events (at least one when it has two or more, and
    at most ``test_per_tool``) forms the seen-tool test set. The rest is
    training, leak-filtered against both test sets. Test items with the same
    normalised query are merged, all their labels acceptable.

    Parameters
    ----------
    catalog : Catalog
        Resolves labels; events whose label is not in it are garbage.
    events : sequence of Event
        Labelled events (``gold``, or ``tool`` of a successful event).
    seed : int
        Seed of the numpy Generator; equal seeds give equal splits.
    heldout_frac : float
        Fraction of labelled tools held out (rounded to the nearest count).
    test_per_tool : int or None
        Cap on test items per tool in either test set; None for no cap.
    test_frac : float
        Fraction of each seen tool's events held out for testing.
    jaccard : float
        Near-duplicate threshold of the leak filter.

    Returns
    -------
    Splits
    """
    if not 0 <= heldout_frac < 1 or not 0 <= test_frac < 1:
        raise ValueError("heldout_frac and test_frac must be in [0, 1)")
    rng = np.random.default_rng(seed)
    by_tool: dict[str, list[Event]] = defaultdict(list)
    unlabelled: list[Event] = []
    for event in events:
        label = _label(event)
        tool_id = catalog.resolve(label) if label else None
        if tool_id is None:
            unlabelled.append(event)
        else:
            by_tool[tool_id].append(event)
    tools = sorted(by_tool)
    n_heldout = round(heldout_frac * len(tools))
    heldout = (
        tuple(sorted(rng.choice(tools, size=n_heldout, replace=False).tolist()))
        if n_heldout
        else ()
    )
    heldout_set = set(heldout)

    seen_pairs: list[tuple[Event, str]] = []
    heldout_pairs: list[tuple[Event, str]] = []
    train: list[Event] = []
    for tool_id in tools:
        group = by_tool[tool_id]
        order = rng.permutation(len(group))
        if tool_id in heldout_set:
            take = len(group) if test_per_tool is None else min(test_per_tool, len(group))
            heldout_pairs.extend((group[i], tool_id) for i in order[:take])
            continue
        n = len(group)
        n_test = 0 if test_frac == 0 or n < 2 else min(n - 1, max(1, round(test_frac * n)))
        if test_per_tool is not None:
            n_test = min(n_test, test_per_tool)
        seen_pairs.extend((group[i], tool_id) for i in order[:n_test])
        train.extend(group[i] for i in sorted(order[n_test:]))

    # Unlabelled events still count as experience; the leak filter drops the
    # ones whose tools are unknown.
    pool = [
        e
        for e in [*train, *unlabelled]
        if not {catalog.resolve(n) for n in (e.tool, e.gold, e.prev_tool) if n} & heldout_set
    ]
    seen_test, heldout_test = _test_items(seen_pairs), _test_items(heldout_pairs)
    kept, leak = leak_filter(pool, [t.query for t in (*seen_test, *heldout_test)], jaccard, catalog)
    log.info(
        "splits(seed=%d): %d held-out tools, train %d, seen test %d, held-out test %d",
        seed,
        len(heldout),
        len(kept),
        len(seen_test),
        len(heldout_test),
    )
    return Splits(kept, seen_test, heldout_test, heldout, leak)


def partition_noniid(events: Sequence[Event], k: int, alpha: float, seed: int) -> list[list[Event]]:
    """Split events across ``k`` organisations, non-IID over tools.

    For every tool (label: ``gold``, else ``tool``) its events are shuffled and
    cut into ``k`` shares with proportions drawn from ``Dirichlet(alpha)``;
    small ``alpha`` concentrates each tool in few organisations.

    Parameters
    ----------
    events : sequence of Event
        Events to distribute.
    k : int
        Number of organisations (``org0`` .. ``org{k-1}``).
    alpha : float
        Dirichlet concentration (> 0).
    seed : int
        Seed of the numpy Generator; equal seeds give equal partitions.

    Returns
    -------
    list of list of Event
        ``k`` lists covering every event exactly once, each event carrying
        ``org=f"org{i}"``, in input order within each list.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    if alpha <= 0:
        raise ValueError(f"alpha must be positive, not {alpha}")
    rng = np.random.default_rng(seed)
    by_tool: dict[str, list[int]] = defaultdict(list)
    for i, event in enumerate(events):
        by_tool[event.gold or event.tool].append(i)
    owner = np.empty(len(events), dtype=np.int64)
    for tool in sorted(by_tool):
        idx = np.asarray(by_tool[tool])[rng.permutation(len(by_tool[tool]))]
        shares = rng.dirichlet(np.full(k, alpha))
        cuts = np.floor(np.cumsum(shares)[:-1] * len(idx)).astype(np.int64)
        for org, part in enumerate(np.split(idx, cuts)):
            owner[part] = org
    parts: list[list[Event]] = [[] for _ in range(k)]
    for i, event in enumerate(events):
        parts[owner[i]].append(event.model_copy(update={"org": f"org{owner[i]}"}))
    return parts


def verified_hashes(datasets: Iterable[str], directory: str | Path | None = None) -> dict[str, str]:
    """sha256 of every pinned file of these datasets (``metatool``, ``taubench-retail``), verified.

    For a results manifest: the files present in the data folder, each
    checked against its pin (a mismatch raises :class:`SynapseError`).
    """
    wanted = set(datasets)
    pins = {p.path: p.sha256 for p in PINNED if p.path.split("/")[0] in wanted}
    return {path: pins[path] for path in verify(directory, pins)} if pins else {}
