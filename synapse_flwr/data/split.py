"""Splitting one labelled log into organisation logs (``org_*.jsonl``).

``synapse split-orgs`` turns a dataset folder's ``train.jsonl`` (or any
experience log) into ``K`` organisation logs, IID (a seeded shuffle dealt
round-robin) or non-IID over tools (Dirichlet, as
:func:`~synapse_flwr.data.protocol.partition_noniid`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from synapse_flwr.core.catalog import load_catalog
from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.experience import Event, load_experience, write_jsonl
from synapse_flwr.core.files import write_atomic
from synapse_flwr.data.check import catalog_file, org_files
from synapse_flwr.data.protocol import partition_noniid

log = logging.getLogger(__name__)


def partition_iid(events: Sequence[Event], k: int, seed: int) -> list[list[Event]]:
    """Deal events to ``k`` organisations after a seeded shuffle (sizes differ by at most one).

    Returns
    -------
    list of list of Event
        ``k`` lists covering every event once, each event carrying
        ``org=f"org{i}"``, in input order within each list.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    owner = np.empty(len(events), dtype=np.int64)
    owner[np.random.default_rng(seed).permutation(len(events))] = np.arange(len(events)) % k
    parts: list[list[Event]] = [[] for _ in range(k)]
    for i, event in enumerate(events):
        parts[owner[i]].append(event.model_copy(update={"org": f"org{owner[i]}"}))
    return parts


def split_orgs(
    log_path: Path, k: int, alpha: float | None = None, seed: int = 0, out_dir: Path | None = None,
    overwrite: bool = False,
) -> dict[str, Path]:
    """Split a labelled log into ``k`` organisation logs ``org_org0.jsonl`` ...

    Parameters
    ----------
    log_path : Path
        The experience log (e.g. a folder's ``train.jsonl``); tool names are
        checked against the ``catalog.json`` beside it, when there is one.
    k : int
        Organisations.
    alpha : float or None
        Dirichlet concentration of a non-IID split over tools; None: IID.
    seed : int
        Shuffle / partition seed.
    out_dir : Path or None
        Where the logs go (default: beside ``log_path``).
    overwrite : bool
        Replace existing ``org_*.jsonl`` files.

    Returns
    -------
    dict of str to Path
        Organisation -> the log written.

    Raises
    ------
    SynapseError
        If the log is itself an org log of the output folder, org logs exist
        already (without ``overwrite``), the log is empty or an org would be empty.
    """
    out_dir = out_dir or log_path.parent
    existing = org_files(out_dir)
    if log_path.exists() and any(p.resolve() == log_path.resolve() for p in existing.values()):
        # it would be removed by --overwrite, or join the federation beside its own split as one more org
        raise SynapseError(f"{log_path} is named like an organisation's log (org_*.jsonl) in the folder the split "
                           "goes to: rename it (e.g. train.jsonl) or pass --out another folder")
    if existing and not overwrite:
        raise SynapseError(f"{out_dir} already has {len(existing)} org_*.jsonl logs ("
                           f"{', '.join(sorted(p.name for p in existing.values()))}); pass --overwrite to remove "
                           "them and write this split")
    cat_path = catalog_file(log_path.parent)
    events = load_experience(log_path, load_catalog(cat_path) if cat_path else None)
    if not events:
        raise SynapseError(f"{log_path} holds no events: nothing to split")
    parts = partition_iid(events, k, seed) if alpha is None else partition_noniid(events, k, alpha, seed)
    empty = [i for i, part in enumerate(parts) if not part]
    if empty:
        fix = f"use --orgs {len(events)} or fewer" if alpha is None else "use fewer --orgs or a larger --alpha"
        raise SynapseError(f"{log_path}: {len(events)} events leave {len(empty)} of {k} orgs empty; {fix}")
    for path in existing.values():
        path.unlink()
    if existing:  # a log left behind would join the federation as one more organisation
        log.info("removed the folder's earlier logs: %s", ", ".join(sorted(p.name for p in existing.values())))
    written = {}
    for i, part in enumerate(parts):
        written[f"org{i}"] = write_atomic(out_dir / f"org_org{i}.jsonl", write_jsonl(part))
    log.info("split %s (%d events) into %d orgs (%s): %s", log_path, len(events), k,
             "IID" if alpha is None else f"Dirichlet alpha {alpha}", [len(p) for p in parts])
    return written
