"""Federated datasets: one catalog, one private experience log per organisation, test sets.

A dataset is named by the run config (``dataset``):

* ``demo``: the small embedded dataset shipped with the package (3 orgs);
* ``metatool``: the MetaTool benchmark read from ``SYNAPSE_DATA_DIR``, split
  per seed into training experience, a seen-tool and a held-out-tool test
  set, leak-filtered, and partitioned non-IID over the orgs;
* a folder in the project's generic formats: ``catalog.json`` (or
  ``.jsonl``), one ``org_*.jsonl`` experience log per organisation, and an
  optional ``test.jsonl``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from synapse_flwr.core.catalog import Catalog, load_catalog, with_examples_file
from synapse_flwr.core.errors import SynapseError, warn_once
from synapse_flwr.core.experience import (
    Event,
    TestItem,
    event_label,
    load_experience,
    load_testset,
)

if TYPE_CHECKING:  # imported where used, as the readers below import data.check
    from synapse_flwr.data.check import FolderReport

log = logging.getLogger(__name__)
#: Example requests shipped for the built-in benchmarks (``<name>.json``).
EXAMPLES_DIR = Path(__file__).parent / "examples"


@dataclass(frozen=True)
class FederatedDataset:
    """A catalog, per-org experience and test sets.

    Parameters
    ----------
    name : str
        Dataset name.
    catalog : Catalog
        The tools.
    orgs : dict of str to list of Event
        Each organisation's private experience.
    seen_test : list of TestItem
        Held-out queries of tools that have experience.
    heldout_test : list of TestItem
        Queries of tools with no experience anywhere (documentation only).
    info : dict
        Counts worth reporting (leak filter, garbage, split sizes).
    """

    name: str
    catalog: Catalog
    orgs: dict[str, list[Event]]
    seen_test: list[TestItem] = field(default_factory=list)
    heldout_test: list[TestItem] = field(default_factory=list)
    info: dict = field(default_factory=dict)

    @property
    def all_events(self) -> list[Event]:
        """Every org's experience pooled (the centralised arm)."""
        return [e for name in sorted(self.orgs) for e in self.orgs[name]]


def demo_dir() -> Path:
    """Folder of the embedded demo dataset."""
    return Path(str(resources.files("synapse_flwr.data") / "demo"))


def load_folder(path: Path, name: str | None = None, org: str | None = None,
                report: FolderReport | None = None) -> FederatedDataset:
    """Load a dataset folder in the generic formats, checked first and leak-filtered.

    Every file is validated before anything is loaded
    (:func:`~synapse_flwr.data.check.require_valid`). Training events that
    equal or nearly equal a test query are dropped
    (:func:`~synapse_flwr.data.protocol.leak_filter`); ``info`` records the
    leak filter's counts, that the org files were used as given, and the
    sha256 of every data file.

    Parameters
    ----------
    path : Path
        The folder.
    name : str or None
        Dataset name (default: the folder's name).
    org : str or None
        Read only this organisation's log (a simulated client's own file).
    report : FolderReport or None
        The folder's valid check, when the caller has made it (``synapse check-data``); else it is made here.

    Raises
    ------
    DataError
        Listing every problem of the folder, by file and line.
    """
    from synapse_flwr.data.check import catalog_file, org_files, require_valid
    from synapse_flwr.data.protocol import LeakReport, leak_filter

    report = report or require_valid(path, None if org is None else [org])
    catalog = load_catalog(catalog_file(path))
    logs = {o: p for o, p in org_files(path).items() if org is None or o == org}
    test = path / "test.jsonl"
    # require_valid has named every ignored field and cut query already
    items = load_testset(test, catalog, warn=False) if test.exists() else []
    orgs, leaks = {}, []
    for o, p in logs.items():
        orgs[o], leak = leak_filter(load_experience(p, catalog, warn=False), [i.query for i in items],
                                    catalog=catalog, source=str(p))
        leaks.append(leak)
        if leak.total and not leak.kept:  # the org would join the federation with nothing to teach
            warn_once(log, f"{p}: the leak filter removed all {leak.total} records of organisation {o!r} "
                           f"({leak.exact} equal to a test query, {leak.near} near duplicates): it joins with no "
                           "experience")
    leak = LeakReport(*(sum(getattr(r, f) for r in leaks) for f in ("total", "exact", "near", "garbage", "kept")))
    # a tool has experience when any record teaches it, a failed call naming it as gold included
    # (such a record adds to its prototype): only tools no record teaches are held out
    experienced = {label for evs in orgs.values() for e in evs if (label := event_label(e)) is not None}
    seen = [i for i in items if set(i.gold) & experienced]
    heldout = [i for i in items if not set(i.gold) & experienced]
    info = {"leak_filter": leak.__dict__, "orgs_as_given": True, "data_files": report.hashes,
            "skipped_records": report.skipped}
    return FederatedDataset(name or path.name, catalog, orgs, seen, heldout, info)


def split_summary(ds: FederatedDataset) -> str:
    """What an experiment on a loaded folder will score: the test splits and what the leak filter left out.

    ``synapse check-data`` prints it, so that a test set on tools no log
    teaches (an empty seen split), or an organisation the leak filter
    empties, is known before an experiment runs.

    Parameters
    ----------
    ds : FederatedDataset
        A folder as :func:`load_folder` returns it.
    """
    leak = ds.info["leak_filter"]
    taught = len(experienced_tools(ds.catalog, ds.all_events))
    dropped = leak["exact"] + leak["near"]
    return (f"test: {len(ds.seen_test):,} queries on tools with experience (seen), {len(ds.heldout_test):,} on "
            f"tools without (held-out); {taught:,} of {len(ds.catalog):,} tools have experience; leak filter: "
            f"{dropped:,} of {leak['total']:,} training events left out ({leak['exact']:,} equal to a test query, "
            f"{leak['near']:,} near duplicates)")


def repartition(ds: FederatedDataset, num_orgs: int, alpha: float, seed: int) -> FederatedDataset:
    """Pool the experience and split it over ``num_orgs`` orgs, non-IID (Dirichlet over tools)."""
    from synapse_flwr.data.protocol import partition_noniid

    parts = partition_noniid(ds.all_events, num_orgs, alpha, seed)
    orgs = {f"org{i}": part for i, part in enumerate(parts)}
    info = {**ds.info, "orgs_as_given": False}
    return FederatedDataset(ds.name, ds.catalog, orgs, ds.seen_test, ds.heldout_test, info)


def metatool_dataset(seed: int, heldout_frac: float = 0.2, test_frac: float = 0.2) -> FederatedDataset:
    """MetaTool split for one seed: leak-filtered training experience (one pool) and two test sets."""
    from synapse_flwr.data.metatool import load_metatool
    from synapse_flwr.data.protocol import make_splits

    mt = load_metatool()
    mt = mt._replace(catalog=packaged_examples("metatool", mt.catalog))
    splits = make_splits(mt.catalog, mt.events, seed, heldout_frac=heldout_frac, test_frac=test_frac)
    info = {"load": mt.report.__dict__, "leak_filter": splits.leak.__dict__,
            "heldout_tools": list(splits.heldout_tools)}
    return FederatedDataset("metatool", mt.catalog, {"all": splits.train}, splits.seen_test,
                            splits.heldout_test, info)


def packaged_examples(name: str, catalog: Catalog) -> Catalog:
    """A built-in benchmark's catalog with the example requests this package ships for it, if any.

    ``synapse_flwr/data/examples/<name>.json`` is written by ``synapse examples
    <name> --out ...`` (public text from the catalog alone, see
    :mod:`synapse_flwr.core.examples`); a dataset folder keeps its own
    ``examples.json`` beside its catalog instead.
    """
    return with_examples_file(catalog, EXAMPLES_DIR / f"{name}.json")


def experienced_tools(catalog: Catalog, events: Sequence[Event]) -> list[str]:
    """Ids of the tools some event teaches (:func:`event_label`), in catalog order.

    The tools a contradiction may wrongly credit: one drawn among every
    catalog tool would give a held-out tool (scored as a tool without
    experience) successful calls.

    Parameters
    ----------
    catalog : Catalog
        The tools; labels resolve through it.
    events : sequence of Event
        The experience (every organisation's, pooled).

    Returns
    -------
    list of str
        Tool ids with at least one labelled event.
    """
    taught = {label for e in events if (label := event_label(e, catalog)) is not None}
    return [tool_id for tool_id in catalog.ids if tool_id in taught]


def own_orgs(name: str) -> int:
    """Organisations a dataset comes with (its ``org_*.jsonl`` logs), 0 for pooled experience.

    Pooled experience is a benchmark's (MetaTool, tau-bench) or a folder's
    single log: one organisation is no federation, so it is split. Reads
    file names only, so a config can default to them before any data is loaded.
    """
    from synapse_flwr.data.check import org_files

    folder = demo_dir() if name == "demo" else Path(name)
    logs = len(org_files(folder)) if name not in ("metatool", "taubench") and folder.is_dir() else 0
    return logs if logs > 1 else 0


#: Dataset names :func:`load_dataset` knows; any other ``dataset`` is a folder.
KNOWN_DATASETS = ("demo", "metatool", "taubench")


@lru_cache(maxsize=4)
def load_dataset(name: str, seed: int = 42) -> FederatedDataset:
    """Load a dataset by name as it comes (cached per process: Ray workers reuse it).

    Parameters
    ----------
    name : str
        ``demo``, ``metatool``, ``taubench`` or a dataset folder.
    seed : int
        Split seed (MetaTool).

    Raises
    ------
    SynapseError
        For an unknown name or missing data.
    """
    if name == "demo":
        return load_folder(demo_dir(), "demo")
    if name == "metatool":
        return metatool_dataset(seed)
    if name == "taubench":
        from synapse_flwr.data.taubench import load_taubench, taubench_events

        catalog, train = load_taubench(split="train")
        return FederatedDataset("taubench", packaged_examples("taubench", catalog), {"all": taubench_events(train)})
    if Path(name).is_dir():
        return load_folder(Path(name))
    # a file of the folder (its catalog.json) is named as such, not as a path that does not exist
    found = (f"{Path(name).resolve()} is a file: name the folder that holds it, {Path(name).resolve().parent}"
             if Path(name).is_file() else f"no folder {Path(name).resolve()}")
    raise SynapseError(f"unknown dataset {name!r}: use {', '.join(map(repr, KNOWN_DATASETS))} or a dataset folder "
                       f"({found})")


@lru_cache(maxsize=4)
def load_federated(
    name: str, num_orgs: int, seed: int = 42, alpha: float = 0.5, inject: float = 0.0
) -> FederatedDataset:
    """A dataset's experience over ``num_orgs`` organisations.

    A dataset that already has ``num_orgs`` orgs (the demo has three) keeps
    them; otherwise the pooled experience is re-partitioned non-IID. With
    ``inject`` > 0 a share of every org's events is corrupted
    (:func:`~synapse_flwr.data.inject.inject_contradictions`; a wrong tool is
    one with experience, :func:`experienced_tools`, so the held-out test
    tools stay without any), and
    ``info["injection"]`` records what was injected.

    Parameters
    ----------
    name : str
        ``demo``, ``metatool`` or a dataset folder.
    num_orgs : int
        Organisations.
    seed : int
        Split and partition seed.
    alpha : float
        Dirichlet concentration of the non-IID partition (small: skewed).
    inject : float
        Share of each org's events to corrupt (contradiction injection).
    """
    ds = load_dataset(name, seed)
    if len(ds.orgs) != num_orgs:
        if len(ds.orgs) > 1:
            log.warning("dataset %s has %d organisations; %d asked for: their pooled experience is re-partitioned "
                        "(Dirichlet alpha %g)", name, len(ds.orgs), num_orgs, alpha)
        elif ds.orgs and ds.info.get("orgs_as_given"):  # a folder with one log: pooled, like MetaTool
            # a warning: the tables' organisations are then not the folder's (it was said at INFO only)
            warn_once(log, f"dataset {name} has one organisation log: one organisation is no federation, so its "
                           f"experience is split into {num_orgs} organisations (Dirichlet alpha {alpha:g}; `orgs` in "
                           "an experiment config chooses how many)")
        ds = repartition(ds, num_orgs, alpha, seed)
    if inject:
        from synapse_flwr.data.inject import inject_contradictions

        tools = experienced_tools(ds.catalog, ds.all_events)
        if len(tools) < 2:
            raise SynapseError(f"dataset {name}: contradiction injection credits events to another tool with "
                               f"experience and needs two such tools, found {len(tools)}; drop the non-zero rates")
        orgs, injection = inject_contradictions(ds.orgs, inject, seed, tools)
        ds = FederatedDataset(ds.name, ds.catalog, orgs, ds.seen_test, ds.heldout_test,
                              {**ds.info, "injection": injection})
        log.info("injected contradictions at %.0f%%: %s (sha256 %s)", 100 * inject, injection.counts,
                 injection.sha256[:12])
    log.info("dataset %s: %d tools, %d orgs, %d events", name, len(ds.catalog), len(ds.orgs),
             len(ds.all_events))
    return ds


@lru_cache(maxsize=8)
def load_partition(
    name: str, num_orgs: int, partition: int, seed: int = 42, alpha: float = 0.5, inject: float = 0.0
) -> tuple[str, FederatedDataset]:
    """One simulated organisation's data: ``(org, dataset holding that org only)``.

    A dataset folder with exactly ``num_orgs`` org files (and no injection)
    is read for that org's own file only, so one broken org file fails that
    organisation alone; anything else goes through :func:`load_federated`.
    Cached per process, like :func:`load_dataset`: a Ray actor serves its
    organisations every round and phase, and reading a 3,000-tool folder's
    catalog, one log and its 9,000 test queries (checked and leak-filtered)
    took about 1.5 s a call. Callers must not modify the result.

    Parameters
    ----------
    name, num_orgs, seed, alpha, inject
        As for :func:`load_federated`.
    partition : int
        The simulated node's partition id (0-based; orgs in name order).
    """
    from synapse_flwr.data.check import org_files

    files = sorted(org_files(Path(name))) if name not in KNOWN_DATASETS else []
    if len(files) == num_orgs and not inject:
        org = files[partition]
        return org, load_folder(Path(name), org=org)
    ds = load_federated(name, num_orgs, seed, alpha, inject)
    org = sorted(ds.orgs)[partition]
    return org, ds
