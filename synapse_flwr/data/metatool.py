"""MetaTool: its catalog of 199 labelled tools and one labelled routing event per query.

:func:`load_metatool` reads the pinned files of ``metatool/`` (see
:mod:`synapse_flwr.data.pins`), drops garbage rows and says what it dropped
in a :class:`MetaToolReport`.
"""

from __future__ import annotations

import csv
import io
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from pydantic import ValidationError

from synapse_flwr.core.catalog import (
    Catalog,
    ToolDoc,
    alias_key,
    make_catalog,
    parse_tool,
)
from synapse_flwr.core.errors import InputError
from synapse_flwr.core.experience import Event
from synapse_flwr.core.phrases import is_text
from synapse_flwr.data.pins import (
    BENCHMARK_FOLDERS,
    HOW_TO_GET,
    read_json,
    resolve_dir,
    verify,
)

log = logging.getLogger(__name__)


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


def _extra_docs(path: Path) -> tuple[list[ToolDoc], int]:
    """Tool docs of the plugin manifests that parse, and the number of manifests."""
    manifests = read_json(path)
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


def _catalogs(root: Path, with_extra_tools: bool) -> tuple[Catalog, Catalog, int, int]:
    """The labelled tools, the catalog to route over, the extra tools added and the manifests skipped.

    The catalog is the labelled tools plus, with ``with_extra_tools``, the
    manifests that are not one of them.
    """
    des_path = root / "plugin_des.json"
    des = read_json(des_path)
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
    return base, catalog, extra, skipped


def _labelled_events(
    csv_path: Path, base: Catalog
) -> tuple[int, list[Event], int, Counter[str], set[str]]:
    """Rows read, one event per usable row, garbage queries, labels outside ``base`` and alias labels seen."""
    try:
        text = csv_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(csv_path, f"file not found; {HOW_TO_GET}") from None
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
        if not is_text(query):
            garbage += 1
            continue
        if base.get(tool_id).name != label:
            alias_labels.add(label)
        try:
            events.append(Event(query=query, tool=tool_id, success=True, gold=tool_id))
        except ValidationError:
            garbage += 1
    return rows, events, garbage, unknown, alias_labels


def load_metatool(
    directory: str | Path | None = None, with_extra_tools: bool = False, check: bool = True
) -> MetaTool:
    """Load MetaTool as a catalog and one labelled event per CSV row.

    Parameters
    ----------
    directory : str, Path or None
        Data folder (holding ``metatool/``); None uses
        :func:`~synapse_flwr.data.pins.data_dir`.
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
    root = resolve_dir(directory) / BENCHMARK_FOLDERS["metatool"]
    if check:
        files = ["plugin_des.json", "all_clean_data.csv"] + (
            ["plugin_info.json"] if with_extra_tools else []
        )
        verify(root.parent, [f"metatool/{f}" for f in files])
    base, catalog, extra, skipped = _catalogs(root, with_extra_tools)
    rows, events, garbage, unknown, alias_labels = _labelled_events(root / "all_clean_data.csv", base)
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
