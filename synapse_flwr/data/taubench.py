"""tau-bench retail: its 16-tool catalog, its tasks, and their steps as items and events.

:func:`load_taubench` reads the pinned files of ``taubench-retail/`` (see
:mod:`synapse_flwr.data.pins`). Every gold call of a task is one step
(:class:`StepItem`): the instruction, the previous gold call and the tool to
call next. The calls so far are never appended to the query (with them the
router picked an already-called tool on 430 of 469 later steps): the history
reaches the scorer through the transition prior only. A task is also one
private sequence record (:func:`task_records`); :func:`taubench_events` gives
the per-call events of the event-level (Flower) path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from synapse_flwr.core.catalog import Catalog, make_catalog, parse_tool
from synapse_flwr.core.errors import InputError
from synapse_flwr.core.experience import Event
from synapse_flwr.core.sequences import SequenceRecord
from synapse_flwr.data.pins import BENCHMARK_FOLDERS, read_json, resolve_dir, verify

log = logging.getLogger(__name__)

TAU_SPLITS = ("train", "test", "dev")
# The retail tools that change the database (tau-bench's write actions); the
# other tools read, compute or hand over. Steps are typed first / read / write.
WRITE_TOOLS = frozenset({
    "cancel_pending_order", "exchange_delivered_order_items", "modify_pending_order_address",
    "modify_pending_order_items", "modify_pending_order_payment", "modify_user_address",
    "return_delivered_order_items",
})


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
        The instruction (the same at every step of the task).
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

    @property
    def kind(self) -> str:
        """``first`` (step 0), ``write`` (a :data:`WRITE_TOOLS` call) or ``read``."""
        return "first" if self.step == 0 else "write" if self.gold in WRITE_TOOLS else "read"


def load_taubench(
    directory: str | Path | None = None, split: str = "train", check: bool = True
) -> tuple[Catalog, list[Task]]:
    """Load tau-bench retail: its 16-tool catalog and the tasks of one split.

    Parameters
    ----------
    directory : str, Path or None
        Data folder (holding ``taubench-retail/``); None uses
        :func:`~synapse_flwr.data.pins.data_dir`.
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
    root = resolve_dir(directory) / BENCHMARK_FOLDERS["taubench"]
    tasks_path = root / f"tasks_{split}.json"
    if check:
        verify(root.parent, ["taubench-retail/tools.json", f"taubench-retail/tasks_{split}.json"])
    tools_path = root / "tools.json"
    try:
        catalog = make_catalog(parse_tool(t) for t in read_json(tools_path))
    except (ValueError, AttributeError) as exc:
        raise InputError(tools_path, str(exc)) from None
    tasks = []
    for i, raw in enumerate(read_json(tasks_path), start=1):
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


def taubench_step_items(tasks: Iterable[Task]) -> list[StepItem]:
    """One item per gold call of every task.

    Parameters
    ----------
    tasks : iterable of Task
        Tasks (tasks with no gold calls contribute nothing).
    """
    return [
        StepItem(
            query=task.instruction,
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


def task_records(tasks: Iterable[Task]) -> list[SequenceRecord]:
    """One private sequence record per task: its instruction and gold calls.

    Parameters
    ----------
    tasks : iterable of Task
        Tasks (a task without calls gives a record without tools).
    """
    return [SequenceRecord(query=t.instruction, tools=t.actions) for t in tasks]
