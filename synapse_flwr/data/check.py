"""Checking a dataset folder before any work: every file, field and tool id.

A dataset folder in the generic formats (docs/formats.md) holds
``catalog.json`` (or ``.jsonl``), an optional alias table ``aliases.json``,
one ``org_*.jsonl`` experience log per organisation and an optional
``test.jsonl``. :func:`check_folder` reads all of it and names every problem
by file, line and field, with the fix where one is known; it reads every line
of every file (a problem does not hide the next one), up to
``max_per_file`` problems per file. :func:`require_valid` raises them all as
one :class:`DataError`.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from synapse_flwr.core.catalog import (
    ALIASES_FILE,
    EXAMPLES_FILE,
    AliasError,
    Catalog,
    ToolCollision,
    entry_notes,
    make_catalog,
    parse_tool,
    read_aliases,
    read_examples,
    size_problem,
    warn_undocumented,
    with_examples,
    without_repeats,
)
from synapse_flwr.core.errors import InputError, SynapseError, log_once, warn_once
from synapse_flwr.core.experience import (
    NO_WORDS,
    Event,
    TestItem,
    first_error,
    known_fields,
    warn_ignored,
)
from synapse_flwr.core.files import (
    document_items,
    json_kind,
    jsonl_lines,
    loads_records,
    read_problem,
    read_text,
)
from synapse_flwr.core.schema import org_id_problem

log = logging.getLogger(__name__)

CATALOG_FILES = ("catalog.json", "catalog.jsonl")
TEST_FILE = "test.jsonl"
ORG_GLOB = "org_*.jsonl"
#: For a folder missing a required file: where a run names its dataset instead.
DATASET_OPTION = ('or point the run at the folder that holds the dataset: dataset = "FOLDER" in an experiment '
                  "config, --set dataset=FOLDER for synapse simulate")
#: Each kind of record: keys one of which marks it, keys none of which it has, and the file it goes in.
#: A record that fails in its own file but has another kind's marks is named as that kind.
_OTHER_KIND: dict[str, tuple[frozenset[str], frozenset[str], str]] = {
    "a catalog entry": (frozenset({"name", "function", "inputSchema", "input_schema"}), frozenset({"query"}),
                        "tools go in catalog.json"),
    "an experience event": (frozenset({"tool", "success"}), frozenset({"name", "function"}),
                            "events go in org_<name>.jsonl"),
    "a test item": (frozenset({"gold"}), frozenset({"tool", "success", "name", "function"}),
                    "test items go in test.jsonl"),
}


@dataclass(frozen=True)
class Problem:
    """One problem of a dataset folder.

    Parameters
    ----------
    path : str
        The file (or folder).
    message : str
        What is wrong.
    line : int or None
        1-based line (in a JSON document an :class:`~synapse_flwr.core.files.ItemLine`), when known.
    field : str or None
        Dotted field, when known.
    hint : str or None
        How to fix it, when known.
    """

    path: str
    message: str
    line: int | None = None
    field: str | None = None
    hint: str | None = None

    def __str__(self) -> str:
        where = self.path + (f":{self.line}" if self.line is not None else "")
        what = f" field '{self.field}':" if self.field else ""
        return f"{where}:{what} {self.message}" + (f" ({self.hint})" if self.hint else "")


@dataclass(frozen=True)
class FolderReport:
    """What :func:`check_folder` found.

    Parameters
    ----------
    folder : Path
        The dataset folder.
    problems : tuple of Problem
        Every problem found (empty: the folder is valid).
    tools : int
        Tools of the catalog.
    orgs : dict of str to int
        Organisation -> events of its log.
    test : int
        Test items.
    hashes : dict of str to str
        File name -> sha256 of every data file read.
    skipped : dict of str to int
        File name -> records every reader skips: their query holds no letter or digit (:data:`NO_WORDS`).
    """

    folder: Path
    problems: tuple[Problem, ...] = ()
    tools: int = 0
    orgs: dict[str, int] = field(default_factory=dict)
    test: int = 0
    hashes: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    def summary(self) -> str:
        """One line: what the folder holds."""
        orgs = ", ".join(f"{o} {n}" for o, n in self.orgs.items())
        return f"{self.folder}: {self.tools} tools, {len(self.orgs)} orgs ({orgs}), {self.test} test items"


class DataError(SynapseError):
    """A dataset folder has problems; the message lists each of them.

    Parameters
    ----------
    report : FolderReport
        The failed check.
    """

    def __init__(self, report: FolderReport) -> None:
        self.report = report
        lines = [f"dataset folder {report.folder} has {len(report.problems)} problem(s):"]
        #: The problems alone: what ``synapse check-data`` itself prints.
        self.listing = "\n".join([*lines, *(f"  {p}" for p in report.problems)])
        super().__init__(f"{self.listing}\n  (check it with: synapse check-data {report.folder})")


def catalog_file(folder: Path) -> Path | None:
    """The folder's catalog file, or None.

    Parameters
    ----------
    folder : Path
        A dataset folder.

    Returns
    -------
    Path or None

    Raises
    ------
    InputError
        If the folder holds more than one (which one is meant is unclear).
    """
    found = [folder / n for n in CATALOG_FILES if (folder / n).exists()]
    if len(found) > 1:
        raise InputError(folder, f"both {found[0].name} and {found[1].name}: keep one catalog and remove the other")
    return found[0] if found else None


def org_files(folder: Path) -> dict[str, Path]:
    """Organisation name -> its experience log (``org_<name>.jsonl``), sorted by name."""
    return {p.stem.removeprefix("org_"): p for p in sorted(folder.glob(ORG_GLOB))}


def file_hashes(folder: Path) -> dict[str, str]:
    """File name -> sha256 of every data file of the folder (catalog, aliases, examples, logs, test set)."""
    names = [*CATALOG_FILES, ALIASES_FILE, EXAMPLES_FILE, TEST_FILE, *(p.name for p in org_files(folder).values())]
    return {n: hashlib.sha256((folder / n).read_bytes()).hexdigest()
            for n in sorted(set(names)) if (folder / n).is_file()}


def _other_kind(record: Mapping, kind: str) -> str | None:
    """A hint for a record of a ``kind`` file that bears another kind's keys (:data:`_OTHER_KIND`), or None."""
    if kind == "a test item" and "tool" in record and not {"gold", "success"} & record.keys():
        # a converted benchmark's test row naming its answer `tool`, not an event without its outcome
        return "a test item names its acceptable tools in 'gold': rename 'tool' to 'gold'"
    tools = record.get("tools")
    if (kind != "a catalog entry" and "query" not in record and isinstance(tools, list) and tools
            and all(isinstance(t, Mapping) and _OTHER_KIND["a catalog entry"][0] & t.keys() for t in tools)):
        # a catalog's {"tools": [...]} saved as a log or test set (one line): a record there since records may
        # carry a `tools` field of their own
        return 'this looks like a catalog ({"tools": [...]}); tools go in catalog.json'
    return next((f"this looks like {other}; {where}" for other, (marks, unlike, where) in _OTHER_KIND.items()
                 if other != kind and marks & record.keys() and not unlike & record.keys()), None)


_RECORD_SUFFIX = re.compile(r"\.(?:nd)?jsonl?(?:\.gz)?$|\.txt$")


def _warn_misnamed(folder: Path) -> None:
    """Warn about files named almost like a folder's logs, which are not read (``org_a.json``, ``orgA.jsonl``,
    ``org_a.ndjson``, ``org_a.JSONL``, ``test.jsonl.gz``), and logs in a subfolder (``orgs/org_a.jsonl``)."""
    read = {TEST_FILE, *CATALOG_FILES, *(p.name for p in folder.glob(ORG_GLOB))}
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.name not in read):
        name = path.name.lower()
        if (name.startswith("org_") and name.endswith(".jsonl.gz")) or not _RECORD_SUFFIX.search(name):
            continue  # a problem of its own (check_folder); not a record file (org_chart.png, testing_notes.md)
        if name.endswith(".json") and (name.startswith("org_") or name == "test.json"):
            warn_once(log, f"{path}: not read; a dataset folder's logs are JSONL, named {path.stem}.jsonl")
        elif path.suffix == ".jsonl":
            warn_once(log, f"{path}: not read; an organisation's log is named org_<id>.jsonl, the test set "
                           f"{TEST_FILE} (a log to split into organisations: synapse split-orgs {path} --orgs 5)")
        elif name.startswith(("org_", "test")):
            warn_once(log, f"{path}: not read; an organisation's log is named org_<id>.jsonl and the test set "
                           f"{TEST_FILE}, in lower case, uncompressed")
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        if nested := sorted([*sub.glob(ORG_GLOB), *sub.glob(TEST_FILE)]):
            warn_once(log, f"{sub}: holds {', '.join(p.name for p in nested[:3])}{', ...' if len(nested) > 3 else ''}"
                           ", not read; a dataset folder's logs and test set sit in the folder itself")


def _bad_org_ids(logs: Mapping[str, Path], orgs: Sequence[str] | None) -> list[Problem]:
    """A problem for every log whose name (``org_<id>.jsonl``) is not an organisation id the schema accepts."""
    return [Problem(str(p), f"organisation id {o!r} (the file name after org_) is not valid: {problem}",
                    hint="rename the file")
            for o, p in logs.items() if (orgs is None or o in orgs) and (problem := org_id_problem(o))]


def _scan(path: Path, catalog: bool = False) -> Iterator[tuple[int | None, dict | None, Problem | None]]:
    """Every record of a file as ``(line, record, None)``, every unreadable one as a problem (``catalog``:
    :func:`~synapse_flwr.core.files.document_items`)."""
    try:
        text = read_text(path)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        yield None, None, Problem(str(path), read_problem(exc))
        return
    try:
        items = document_items(path, text, catalog)
    except InputError as exc:  # one document: one parse, one problem at most
        yield exc.line, None, Problem(str(path), exc.message, exc.line)
        return
    if items is not None:  # already parsed: not read a second time
        for line, obj in items:
            if not isinstance(obj, dict):
                yield line, None, Problem(str(path), f"not a JSON object (found {json_kind(obj)})", line)
                return
            yield line, obj, None
        return
    for line, raw in enumerate(jsonl_lines(text), start=1):
        if not raw.strip():
            continue
        try:
            obj = loads_records(raw)
        except (ValueError, RecursionError) as exc:
            yield line, None, Problem(str(path), f"invalid JSON: {exc}", line)
            continue
        if isinstance(obj, dict):
            yield line, obj, None
        else:
            yield line, None, Problem(str(path), f"not a JSON object (found {json_kind(obj)})", line)


def _check_catalog(path: Path, aliases: Mapping[str, str]) -> tuple[Catalog | None, list[Problem], Counter[str]]:
    """The catalog at ``path`` with the alias table ``aliases``, its problems (each collision named) and the keys
    of its entries that are not read, with their counts, and the descriptions cut (:func:`entry_notes`)."""
    problems, docs, lines, unread = [], [], {}, Counter[str]()
    for line, obj, problem in _scan(path, catalog=True):
        if problem:
            problems.append(problem)
            continue
        try:
            doc = parse_tool(obj)
        except ValueError as exc:
            field_name, _, message = str(exc).partition(": ")
            problems.append(Problem(str(path), message, line, field_name, _other_kind(obj, "a catalog entry")))
            continue
        docs.append(doc)
        lines[id(doc)] = line
        unread.update(entry_notes(obj))
    if problems:
        return None, problems, unread
    if not docs:
        return None, [Problem(str(path), "catalog holds no tools",
                              hint='add one {"name", "description"} object per tool')], unread
    docs = without_repeats(docs, path)
    while True:  # every collision, one at a time
        try:
            return make_catalog(docs, aliases, path.parent / ALIASES_FILE), problems, unread
        except AliasError as exc:
            return None, [*problems, *(Problem(exc.path, p) for p in exc.problems)], unread
        except ToolCollision as exc:
            problems.append(Problem(str(path), f"{exc} (the first at line {lines[id(exc.first)]})",
                                    lines[id(exc.second)], "name"))
            docs = [d for d in docs if d is not exc.second]
            if len(problems) > 50:
                return None, problems, unread


def _unknown(path: Path, line: int, field_name: str, name: str, catalog: Catalog) -> Problem:
    close = difflib.get_close_matches(name, catalog.ids, n=1)
    hint = f"did you mean {close[0]!r}?" if close else "add the tool to the catalog"
    return Problem(str(path), f"tool {name!r} is not in the catalog", line, field_name, hint)


def _record_problems(path: Path, raw: dict, line: int, catalog: Catalog | None, test: bool) -> list[Problem]:
    """Problems of one event (``test=False``) or test item (``test=True``) as given.

    The record is read as :func:`known_fields` reads it; a record that fails
    but has another kind's keys is named as that kind (:func:`_other_kind`).
    Its tool names are checked against ``catalog`` (None: an unreadable
    catalog, so the rest of the record is checked alone).
    """
    model, kind = (TestItem, "a test item") if test else (Event, "an experience event")
    try:
        record = model.model_validate(known_fields(raw, model)[0])
    except ValidationError as exc:
        where, message = first_error(exc)
        return [Problem(str(path), message, line, where, _other_kind(raw, kind))]
    if catalog is None:
        return []
    names = (
        [("gold", g) for g in record.gold] if test
        else [(f, n) for f in ("tool", "gold", "prev_tool") if (n := getattr(record, f))]
    )
    return [_unknown(path, line, f, n, catalog) for f, n in names if catalog.resolve(n) is None]


def _check_records(path: Path, catalog: Catalog | None, test: bool, max_problems: int
                   ) -> tuple[int, list[Problem], int]:
    """Records of a log or test set that every reader reads, their problems, and the records readers skip."""
    records, problems, ignored = 0, [], Counter[str]()
    for line, obj, problem in _scan(path):
        notes = known_fields(obj, TestItem if test else Event)[1] if obj is not None else []
        ignored.update(notes)
        if NO_WORDS in notes:  # skipped by every reader, named by warn_ignored
            continue
        found = [problem] if problem else _record_problems(path, obj, line, catalog, test)
        records += obj is not None and not found
        problems += found
        if len(problems) >= max_problems:
            problems.append(Problem(str(path), f"stopped after {max_problems} problems"))
            break
    warn_ignored(path, ignored)
    if not records and not problems and test:
        problems.append(Problem(str(path), "holds no records"))
    elif not records and not problems:  # as an organisation the leak filter emptied (federation.load_folder)
        warn_once(log, f"{path}: holds no records; its organisation joins with no experience")
    return records, problems, ignored[NO_WORDS]


def _no_orgs(folder: Path) -> Problem:
    train = folder / "train.jsonl"
    hint = (f"split it into organisation logs: synapse split-orgs {train} --orgs 5" if train.exists()
            else f"add one org_<name>.jsonl experience log per organisation, {DATASET_OPTION}")
    found = "train.jsonl found, but no" if train.exists() else "no"
    return Problem(str(folder), f"{found} org_*.jsonl experience logs", hint=hint)


def check_folder(folder: str | Path, orgs: Sequence[str] | None = None, max_per_file: int = 20) -> FolderReport:
    """Validate a dataset folder: catalog, alias table, experience logs, test set.

    Parameters
    ----------
    folder : str or Path
        The dataset folder.
    orgs : sequence of str or None
        Check only these organisations' logs (a simulated client reads its own).
    max_per_file : int
        Problems reported per file before the check of that file stops.

    Returns
    -------
    FolderReport
        The problems (each with file, line, field and a hint) and the counts.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return FolderReport(folder, (Problem(str(folder), "dataset folder does not exist"),))
    _warn_misnamed(folder)
    try:
        path = catalog_file(folder)
    except InputError as exc:
        return FolderReport(folder, (Problem(exc.path, exc.message),))
    if path is None:
        hint = f'add a JSON list of {{"name", "description"}} tools, {DATASET_OPTION}'
        return FolderReport(folder, (Problem(str(folder), "no catalog.json or catalog.jsonl", hint=hint),))
    problems: list[Problem] = []
    try:
        aliases = read_aliases(folder)
    except InputError as exc:  # told, and the other files are still checked (without aliases)
        problems, aliases = [Problem(exc.path, exc.message)], {}
    catalog, found, unread = _check_catalog(path, aliases)
    problems += found
    if catalog is not None and (too_large := size_problem(catalog)):
        return FolderReport(folder, (*problems, Problem(str(path), too_large)))
    logs = org_files(folder)
    problems += _bad_org_ids(logs, orgs)
    # a folder's logs are plain JSONL (docs/formats.md): a compressed one would be left out unsaid
    problems += [Problem(str(p), "compressed organisation logs are not read", hint=f"gunzip {p}")
                 for p in sorted(folder.glob(ORG_GLOB + ".gz"))]
    if not logs:
        problems.append(_no_orgs(folder))
    try:  # the examples, logs and test set are checked even without a readable catalog (their tools then are not)
        examples = read_examples(folder / EXAMPLES_FILE)
        if catalog is not None:
            warn_undocumented(with_examples(catalog, examples, folder / EXAMPLES_FILE), path, unread)
    except InputError as exc:
        problems.append(Problem(exc.path, exc.message))
    unknown_orgs = sorted(set(orgs or ()) - set(logs))
    problems += [Problem(str(folder / f"org_{o}.jsonl"), "file not found") for o in unknown_orgs]
    counts, skipped = {}, {}
    for org, log_path in logs.items():
        if orgs is None or org in orgs:
            counts[org], found, skipped[log_path.name] = _check_records(log_path, catalog, False, max_per_file)
            problems += found
            if not counts[org] and not found:  # valid, and nothing to teach: under privacy its artifact is noise alone
                warn_once(log, f"{log_path}: holds no record; organisation {org!r} joins with no experience")
    if orgs is None and counts and not any(counts.values()) and not problems:  # a node checks its own log alone
        problems.append(Problem(str(folder), "no organisation log holds a record", hint="nothing to federate"))
    test = 0
    if (folder / TEST_FILE).exists():
        test, found, skipped[TEST_FILE] = _check_records(folder / TEST_FILE, catalog, True, max_per_file)
        problems += found
    if catalog is None:
        return FolderReport(folder, tuple(problems))
    return FolderReport(folder, tuple(problems), len(catalog), counts, test, file_hashes(folder),
                        {name: n for name, n in skipped.items() if n})


def require_valid(folder: str | Path, orgs: Sequence[str] | None = None) -> FolderReport:
    """:func:`check_folder`, raising every problem at once.

    Raises
    ------
    DataError
        Listing each problem with its file, line and fix.
    """
    report = check_folder(folder, orgs)
    if not report.ok:
        raise DataError(report)
    log_once(log, f"checked {report.summary()}")
    return report
