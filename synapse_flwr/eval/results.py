"""Committed results: a results file next to a manifest that lets a reader regenerate it."""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import subprocess
import sys
import time
import tomllib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from synapse_flwr.core.files import write_atomic

#: What a results folder's numbers depend on; a run rewrites tracked files under
#: ``docs/results`` itself, which must not mark its own stamp dirty.
CODE_PATHS = ("synapse_flwr", "strategies", "simulations", "configs", "pyproject.toml")


def code_commit(repo: Path | None = None) -> str:
    """The git commit of the code (``+dirty`` when :data:`CODE_PATHS` have changes), or ``unknown``.

    A new file under them that git does not ignore counts as a change: a
    script not yet committed is code the commit does not hold.
    """
    cwd = repo or Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *CODE_PATHS],
            cwd=cwd, capture_output=True, text=True, check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def experiment_parser(doc: str) -> argparse.ArgumentParser:
    """Command line of an experiment driver: one positional TOML config.

    Parameters
    ----------
    doc : str
        The driver's module docstring (its first line becomes the description).
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("config", type=Path, help="experiment TOML (see configs/)")
    return parser


def load_experiment(config: Path) -> dict[str, Any]:
    """Set up progress logging and read the ``[experiment]`` table of a TOML config."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return tomllib.loads(config.read_text())["experiment"]


def _jsonable(value: Any) -> Any:
    """Replace non-finite floats (not valid JSON) by their names."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_results(
    out_dir: Path, results: dict[str, Any], config: dict[str, Any], data: dict[str, str], command: str
) -> None:
    """Write ``results.json`` and ``manifest.json`` (config, command, commit, data sha256).

    Parameters
    ----------
    out_dir : Path
        Destination folder.
    results : dict
        The measurements.
    config : dict
        The experiment config as loaded (TOML).
    data : dict
        Data file -> sha256 of the inputs that were read.
    command : str
        The command that regenerates the folder.
    """
    results, config = _jsonable(results), _jsonable(config)
    write_atomic(out_dir / "results.json", json.dumps(results, indent=2, sort_keys=True) + "\n")
    manifest = {
        "command": command,
        "config": config,
        "code_commit": code_commit(),
        "data_sha256": data,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_atomic(out_dir / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def update_summary(path: Path, values: dict[str, Any]) -> dict[str, Any]:
    """Set ``values`` in a shared ``summary.json`` (created if missing), keeping every other key.

    Several benchmarks write their own keys into one summary; each reads the
    file and replaces only its keys, so none overwrites another's.
    """
    summary = json.loads(path.read_text()) if path.exists() else {}
    summary.update(_jsonable(values))
    write_atomic(path, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


def group_rows(rows: Sequence[dict], *keys: str) -> dict[tuple, list[dict]]:
    """A lab's rows grouped by the values of ``keys`` (one table line per group), in first-seen order."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in keys)].append(r)
    return dict(groups)


def mean_of(rows: Sequence[dict], split: str, arm: str | None = None) -> float:
    """Mean of ``row[arm][split]`` (``row[split]`` without ``arm``) over a group's rows (its noise draws)."""
    return math.fsum((r[arm] if arm else r)[split] for r in rows) / len(rows)


def paired(first: Sequence[dict], second: Sequence[dict], key: str = "seen") -> str:
    """``first - second`` of ``key``, row by row (same noise draws), and their mean, for a lab's notes."""
    diffs = [a[key] - b[key] for a, b in zip(first, second, strict=True)]
    return f"{', '.join(f'{d:+.4f}' for d in diffs)} (mean {sum(diffs) / len(diffs):+.4f})"


def run_lab(
    doc: str,
    script: str,
    one_run: Callable[[dict, dict, Any], list[dict]],
    tables: Callable[[list[dict], dict], str],
    datasets: Callable[[dict], Iterable[str]] | None = None,
) -> None:
    """A lab over its config's ``[[experiment.runs]]``: rows, then results, manifest and ``tables.md``.

    Parameters
    ----------
    doc : str
        The driver's module docstring (its command line's description).
    script : str
        The driver's file name under ``simulations/`` (for the manifest's command).
    one_run : callable
        ``(run, cfg, embedder) -> rows`` for one run of the config.
    tables : callable
        ``(rows, cfg) -> markdown``.
    datasets : callable or None
        ``cfg -> names`` of the pinned datasets the lab reads (their sha256 go in the manifest);
        None: the ``dataset`` of every run.
    """
    from synapse_flwr.core.embed import get_embedder
    from synapse_flwr.data.pins import verified_hashes

    args = experiment_parser(doc).parse_args()
    cfg = load_experiment(args.config)
    emb = get_embedder(cfg["embedder"])
    rows = [row for run in cfg["runs"] for row in one_run(run, cfg, emb)]
    out = Path(cfg["output"])
    names = datasets(cfg) if datasets else (run["dataset"] for run in cfg["runs"])
    write_results(out, {"rows": rows}, cfg, verified_hashes(sorted(set(names))),
                  f"python simulations/{script} {args.config}")
    write_atomic(out / "tables.md", tables(rows, cfg))
