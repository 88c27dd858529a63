"""The hostile corpus and the signature cases, measured: rejections, time and peak memory per case.

Runs every case of ``tests/hostile/corpus.py`` through the edge decoder
(wall time without tracing, then peak traced memory with ``tracemalloc``),
every case of ``tests/hostile/signatures.py`` through the strategy's or the
client's signature check, and writes ``docs/results/security/hostile.json``
(per case) and the keys of ``docs/results/security/summary.json`` that these
measurements fill (other keys already there are kept).

Usage (from a checkout: the corpus lives under ``tests/``):
``python simulations/hostile_bench.py [--out docs/results/security]``
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import tracemalloc
from pathlib import Path

from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.wire import ArtifactError, decode

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from hostile.corpus import Case, cases
from hostile.signatures import all_cases

log = logging.getLogger("hostile_bench")


def measure(case: Case) -> dict:
    """Whether ``case`` is rejected naming its field, the seconds it took and the peak traced bytes."""
    t0 = time.perf_counter()
    try:
        decode(case.data)
        errors: list[str] = []
    except ArtifactError as exc:
        errors = exc.errors
    seconds = time.perf_counter() - t0
    tracemalloc.start()
    try:
        try:
            decode(case.data)
        except ArtifactError:
            pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    named = any(line.startswith(case.field) for line in errors)
    return {"name": case.name, "bytes": len(case.data), "rejected": bool(errors), "names_field": named,
            "field": case.field, "reason": errors[0] if errors else None, "seconds": round(seconds, 4),
            "peak_bytes": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs/results/security")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = [measure(c) for c in cases()]
    sigs = [{"name": c.name, "reason": (reason := c.check()), "rejected": reason is not None
             and c.expect in reason} for c in all_cases()]
    worst_t = max(rows, key=lambda r: r["seconds"])
    worst_m = max(rows, key=lambda r: r["peak_bytes"])
    hostile = {
        "cases": rows, "signature_cases": sigs,
        "worst_seconds": {"case": worst_t["name"], "seconds": worst_t["seconds"]},
        "worst_peak_bytes": {"case": worst_m["name"], "peak_bytes": worst_m["peak_bytes"]},
    }
    write_atomic(args.out / "hostile.json", json.dumps(hostile, indent=2) + "\n")
    summary_path = args.out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary.update({
        "hostile_tried": len(rows),
        "hostile_rejected": sum(r["rejected"] and r["names_field"] for r in rows),
        "hostile_worst_validate_s": worst_t["seconds"],
        "signature_cases_tried": len(sigs),
        "signature_cases_rejected": sum(s["rejected"] for s in sigs),
    })
    write_atomic(summary_path, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    log.info("hostile: %d/%d rejected naming the field; slowest %s %.3f s; peak %s %.1f MB",
             summary["hostile_rejected"], len(rows), worst_t["name"], worst_t["seconds"],
             worst_m["name"], worst_m["peak_bytes"] / 1e6)
    log.info("signatures: %d/%d rejected with the expected reason",
             summary["signature_cases_rejected"], len(sigs))


if __name__ == "__main__":
    main()
