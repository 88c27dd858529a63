"""Privacy audit: planted canaries never leave a client, and a membership-inference attack.

Two checks of what an organisation sends.

Canaries. :func:`plant_canaries` appends events whose queries carry e-mail
addresses, phone numbers, payment-card numbers (each in many distinct
queries, so that only PII masking stops them) and rare made-up phrases (each
in one query, so that DP partition selection must stop them) to the raw
experience of every organisation of a dataset folder. The runs of
``simulations/fault_audit.py`` and ``tests/test_faults.py`` capture every
message a ClientApp sends (run config ``capture-dir``) and the server's
records; :func:`find_canaries` searches each file raw, in every gzip member
and in every base64 run (also inside the gzip members), case-insensitively,
with digit separators removed, for any piece of a canary. Those runs are
private with prototypes, which release no phrase (no text from a query at
all), so they show that nothing else a node sends (logs, refusals, conflict
texts) carries a query; masking and partition selection are each seen
stopping the canaries in builds that release phrases
(``tests/test_faults.py``, with masking switched off as the positive
control, and ``tests/test_builder.py``).

Membership inference (``main``). The attacker knows an organisation's whole
experience except whether one target record is in it, the mechanism and its
noise: the strongest attacker event-level DP is defined against. It sees the
organisation's artifact (``build_compendium``, the ClientApp's release, here
in the ``static`` embedding space) and scores the fields the target moves by
a known amount, weighted as the Gaussian likelihood ratio is: its tool's
``calls``, ``successes``, prototype ``count`` (each +1) and the prototype sum's
projection on the target's query embedding (+1 query, noise ``sigma / c``, so
weight ``c^2``). Over ``trials`` releases with and without the target (distinct
noise seeds), a threshold chosen on one half of the trials is applied to the
other half: the measured advantage is ``TPR - FPR`` there. It is compared
with the largest advantage any test can have against an
``(epsilon, delta)``-DP release (Kairouz, Oh, Viswanath, "The composition
theorem for differential privacy", ICML 2015: ``TPR <= e^eps FPR + delta`` and
``1 - FPR <= e^eps (1 - TPR) + delta``, hence
``TPR - FPR <= (e^eps - 1 + 2 delta) / (e^eps + 1)``) at the epsilon the
artifact reports, and with the advantage of the optimal test against the
Gaussian mechanism at its calibrated sigma, ``2 Phi(mu / 2) - 1`` with
``mu = |shift| / sigma``. An empirical epsilon lower bound (one-sided 95%
Clopper-Pearson intervals on the held-out half) is reported too.

Usage: ``python simulations/privacy_audit.py [--trials 2000] [--out docs/results/security]``
(writes ``privacy_audit/results.json``, ``tables.md`` and ``manifest.json`` via
:func:`synapse_flwr.eval.results.write_results`, and the ``mi_*`` keys of
``summary.json``, keeping the others).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import functools
import json
import logging
import math
import re
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from unittest.mock import patch

import numpy as np

from synapse_flwr.core import builder
from synapse_flwr.core.catalog import Catalog
from synapse_flwr.core.embed import Embedder, get_embedder
from synapse_flwr.core.experience import Event
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.pii import mask_pii
from synapse_flwr.core.prototypes import decode_prototype

log = logging.getLogger("privacy_audit")

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ canaries


@dataclass(frozen=True)
class Canary:
    """A secret planted in the raw experience.

    Parameters
    ----------
    name : str
        Its name in reports.
    text : str
        How it is written in the queries.
    needles : tuple of str
        Pieces whose presence anywhere in a payload counts as a leak
        (lower case; digits without separators).
    repeats : int
        Distinct queries of one organisation that carry it.
    """

    name: str
    text: str
    needles: tuple[str, ...]
    repeats: int


PII_REPEATS = 60  # above the partition-selection threshold at epsilon 4 (about 53): only masking stops them
CANARIES: tuple[Canary, ...] = (
    Canary("email-1", "marla.quillfeather@zentrix-canary.com", ("quillfeather", "zentrix-canary"), PII_REPEATS),
    Canary("email-2", "o.vandersnoot77@gmail.com", ("vandersnoot",), PII_REPEATS),
    Canary("phone-1", "+1 (415) 555-0187", ("4155550187",), PII_REPEATS),
    Canary("phone-2", "020 7946 0958", ("02079460958",), PII_REPEATS),
    Canary("card-1", "4539 1488 0343 6467", ("4539148803436467",), PII_REPEATS),
    Canary("card-2", "5555-5555-5555-4444", ("5555555555554444",), PII_REPEATS),
    Canary("phrase-1", "glimmerwick vexholm itinerary", ("glimmerwick", "vexholm"), 1),
    Canary("phrase-2", "the quorblat zindeltroff clause", ("quorblat", "zindeltroff"), 1),
    Canary("phrase-3", "sprocketfen marmalurge voucher", ("sprocketfen", "marmalurge"), 1),
)
_TEMPLATES = ("please use {c} for this request {i}", "{c} is where the confirmation goes, ref {i}",
              "regarding {c}: can you help with item {i}")


def plant_canaries(folder: Path) -> list[Canary]:
    """Append canary events to every ``org_*.jsonl`` of a dataset folder (its most used tool, success).

    Returns
    -------
    list of Canary
        What was planted, in every organisation.
    """
    for path in sorted(folder.glob("org_*.jsonl")):
        events = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        tool = Counter(e["tool"] for e in events).most_common(1)[0][0]
        org = events[0].get("org", path.stem.removeprefix("org_"))
        planted = [{"query": _TEMPLATES[i % len(_TEMPLATES)].format(c=c.text, i=i), "tool": tool, "success": True,
                    "gold": tool, "org": org} for c in CANARIES for i in range(c.repeats)]
        path.write_text("".join(json.dumps(e) + "\n" for e in events + planted), encoding="utf-8")
    return list(CANARIES)


_BASE64_RUN = re.compile(rb"[A-Za-z0-9+/]{16,}={0,2}")
_DIGIT_SEPARATOR = re.compile(rb"(?<=\d)[ \-().]+(?=\d)")
_MAX_INFLATED = 256 * 1024 * 1024


def _gzip_members(data: bytes) -> list[bytes]:
    out = []
    start = data.find(b"\x1f\x8b\x08")
    while start >= 0:
        try:
            out.append(zlib.decompressobj(wbits=31).decompress(data[start:], _MAX_INFLATED))
        except zlib.error:
            pass
        start = data.find(b"\x1f\x8b\x08", start + 1)
    return out


def _base64_runs(data: bytes) -> list[bytes]:
    out = []
    for match in _BASE64_RUN.finditer(data):
        run = match.group()
        try:
            out.append(base64.b64decode(run + b"=" * (-len(run) % 4)))
        except (binascii.Error, ValueError):
            continue
    return out


def payload_views(data: bytes) -> list[bytes]:
    """The payload raw, every gzip member in it, and every base64 run of both, lower-cased."""
    views = [data, *_gzip_members(data)]
    views += [decoded for view in list(views) for decoded in _base64_runs(view)]
    return [v.lower() for v in views]


def find_canaries(data: bytes, canaries: list[Canary]) -> set[str]:
    """Names of the canaries any piece of which is in ``data`` (see :func:`payload_views`)."""
    views = payload_views(data)
    views += [_DIGIT_SEPARATOR.sub(b"", v) for v in views]
    return {c.name for c in canaries if any(n.encode() in v for n in c.needles for v in views)}


def scan_files(paths: list[Path], canaries: list[Canary]) -> dict[str, list[str]]:
    """File -> canaries found in it (files without any are left out)."""
    found = {str(p): sorted(find_canaries(p.read_bytes(), canaries)) for p in paths}
    return {p: names for p, names in found.items() if names}


# ------------------------------------------------------------------ membership inference


def dp_advantage_bound(epsilon: float, delta: float) -> float:
    """Largest ``TPR - FPR`` of any test against an ``(epsilon, delta)``-DP release (Kairouz et al. 2015)."""
    return (math.expm1(epsilon) + 2 * delta) / (math.exp(epsilon) + 1)


def gaussian_advantage(mu: float) -> float:
    """``TPR - FPR`` of the optimal test between N(0, 1) and N(mu, 1): ``2 Phi(mu / 2) - 1``."""
    return 2 * NormalDist().cdf(mu / 2) - 1


def attack_score(artifact, target: Event, u: np.ndarray, weight: float) -> float:
    """The attacker's statistic: the target tool's fields, weighted as the likelihood ratio."""
    entry = next(t for t in artifact.tools if t.tool_id == target.tool)
    proj = float(decode_prototype(entry.prototype) @ u)
    return entry.stats.calls + entry.stats.successes + entry.prototype.count + weight**2 * proj


def pick_target(events: list[Event]) -> Event:
    """A plain successful record (no confusion, no transition): it moves exactly the scored fields."""
    return next(e for e in events if e.success and e.gold in (None, e.tool) and not e.prev_tool)


def mi_scores(events: list[Event], target: Event, catalog: Catalog, embedder: Embedder, trials: int,
              epsilon: float, delta: float) -> tuple[np.ndarray, np.ndarray, dict]:
    """Attack scores over ``trials`` releases with the target and ``trials`` without it.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray, dict)
        Scores in, scores out, and the privacy block of the releases.
    """
    without = list(events)
    without.remove(target)
    u = np.asarray(embedder.encode([mask_pii(target.query)])[0], np.float64)
    u /= np.linalg.norm(u)
    weight = builder.BuildConfig().prototype_weight

    def score(evs: list[Event], seed: int) -> tuple[float, object]:
        art = builder.build_compendium(evs, catalog, "audit", round_=1, epsilon=epsilon, delta=delta,
                                       seed=seed, embedder=embedder)
        return attack_score(art, target, u, weight), art.privacy

    scores_in, scores_out, privacy = [], [], None
    for t in range(trials):
        s, privacy = score(events, 2 * t)
        scores_in.append(s)
        scores_out.append(score(without, 2 * t + 1)[0])
        if (t + 1) % 250 == 0:
            log.info("membership inference: %d/%d trials", t + 1, trials)
    return np.array(scores_in), np.array(scores_out), privacy.model_dump()


def best_threshold(scores_in: np.ndarray, scores_out: np.ndarray) -> tuple[float, float]:
    """``(threshold, TPR - FPR)`` of the best test ``score >= threshold``."""
    candidates = np.unique(np.concatenate([scores_in, scores_out]))
    tpr = (scores_in[None, :] >= candidates[:, None]).mean(axis=1)
    fpr = (scores_out[None, :] >= candidates[:, None]).mean(axis=1)
    i = int(np.argmax(tpr - fpr))
    return float(candidates[i]), float(tpr[i] - fpr[i])


def epsilon_lower_bound(tp: int, n_in: int, fp: int, n_out: int, delta: float, confidence: float = 0.95) -> float:
    """Empirical epsilon implied by one test's counts, from one-sided Clopper-Pearson bounds (0 if none)."""
    from scipy.stats import beta

    alpha = 1 - confidence
    tpr_lo = beta.ppf(alpha, tp, n_in - tp + 1) if tp > 0 else 0.0
    fpr_hi = beta.ppf(1 - alpha, fp + 1, n_out - fp) if fp < n_out else 1.0
    tnr_lo = beta.ppf(alpha, n_out - fp, fp + 1) if fp < n_out else 0.0
    fnr_hi = beta.ppf(1 - alpha, n_in - tp + 1, tp) if tp > 0 else 1.0
    bounds = [0.0]
    if tpr_lo > delta and fpr_hi > 0:
        bounds.append(math.log((tpr_lo - delta) / fpr_hi))
    if tnr_lo > delta and fnr_hi > 0:
        bounds.append(math.log((tnr_lo - delta) / fnr_hi))
    return max(bounds)


# The measured SD of the attack statistic over its calibrated SD, where the release is as claimed: 1.033 in the
# committed audit (docs/results/security/privacy_audit, 2,000 trials); a release with two thirds of its noise falls
# below the band (tests/test_faults.py)
NOISE_SD_RATIO = (0.85, 1.35)


def audit_membership(trials: int, epsilon: float = 4.0, delta: float = 1e-5) -> dict:
    """Run the attack on the demo's org ``a``; the figures of ``privacy_audit.json``.

    Two checks can fail: ``noise_as_claimed`` (the attack statistic's SD over
    the releases is within :data:`NOISE_SD_RATIO` of the SD the artifact's
    sigma implies) and ``advantage_within_gaussian`` (the held-out advantage is
    at most the optimal test's against the claimed Gaussian release, plus
    three standard errors). The (epsilon, delta) bound, ``mi_bound``, is
    reported too, but is too loose to catch a release short of its noise.
    """
    from synapse_flwr.data.federation import load_dataset

    ds = load_dataset("demo", 42)
    events = ds.orgs["a"]
    target = pick_target(events)
    # calibration is a pure function of its parameters: computed once, not once per trial
    with patch.object(builder, "calibrate", functools.cache(builder.calibrate)), \
            patch.object(builder, "epsilon_spent", functools.cache(builder.epsilon_spent)):
        s_in, s_out, privacy = mi_scores(events, target, ds.catalog, get_embedder("static"), trials, epsilon, delta)
    half = trials // 2
    threshold, adv_fit = best_threshold(s_in[:half], s_out[:half])
    tp, fp = int((s_in[half:] >= threshold).sum()), int((s_out[half:] >= threshold).sum())
    n = trials - half
    weight = privacy["prototype_weight"]
    shift = math.sqrt(3 + weight**2)  # calls, successes, prototype count (+1 each) and c * u
    reported = privacy["epsilon"]
    optimal = gaussian_advantage(shift / privacy["sigma"])
    # the noise the scored fields carry, against what the artifact's sigma says they carry (the attack statistic
    # sums them at unit SD each, prototype at c): far more sensitive than the (epsilon, delta) bound on the
    # advantage, which a release with a quarter of its noise (a true epsilon near 22 at 4) still met
    sd_ratio = math.sqrt((s_in.var(ddof=1) + s_out.var(ddof=1)) / 2) / (privacy["sigma"] * shift)
    margin = 3 * math.sqrt((tp / n) * (1 - tp / n) / n + (fp / n) * (1 - fp / n) / n + 1 / n)
    return {
        "dataset": "demo", "org": "a", "events": len(events), "target_tool": target.tool, "trials_per_arm": trials,
        "privacy": privacy, "threshold": threshold, "advantage_fit_half": round(adv_fit, 4),
        "tpr": tp / n, "fpr": fp / n, "mi_advantage": round(tp / n - fp / n, 4),
        "mi_advantage_in_sample": round(best_threshold(s_in, s_out)[1], 4),
        "mi_bound": round(dp_advantage_bound(reported, delta), 4),
        "bound_formula": "(e^eps - 1 + 2 delta) / (e^eps + 1) at the reported epsilon",
        "gaussian_optimal_advantage": round(optimal, 4),
        "score_sd_ratio": round(sd_ratio, 4),
        "noise_as_claimed": bool(NOISE_SD_RATIO[0] <= sd_ratio <= NOISE_SD_RATIO[1]),
        "advantage_within_gaussian": bool(tp / n - fp / n <= optimal + margin),
        "advantage_margin_3se": round(margin, 4),
        "gaussian_sensitivity_advantage": round(gaussian_advantage(privacy["clip"] / privacy["sigma"]), 4),
        "empirical_epsilon_lower_bound": round(epsilon_lower_bound(tp, n, fp, n, delta), 4),
        "reported_epsilon": reported, "delta": delta,
    }


def table(res: dict) -> str:
    """The Markdown summary of the audit."""
    rows = [
        ("releases per arm (with / without the target)", res["trials_per_arm"]),
        ("reported epsilon (delta)", f"{res['reported_epsilon']} ({res['delta']:g})"),
        ("noise sigma", res["privacy"]["sigma"]),
        ("measured advantage TPR - FPR (held-out half)", res["mi_advantage"]),
        ("measured advantage, best threshold in sample", res["mi_advantage_in_sample"]),
        ("optimal test vs this Gaussian release, shift of the scored fields", res["gaussian_optimal_advantage"]),
        ("optimal test vs this Gaussian release, full sensitivity", res["gaussian_sensitivity_advantage"]),
        ("bound implied by (epsilon, delta): (e^eps - 1 + 2 delta) / (e^eps + 1)", res["mi_bound"]),
        ("empirical epsilon lower bound (95%, held-out half)", res["empirical_epsilon_lower_bound"]),
        ("attack statistic's SD over the SD the claimed sigma implies", res["score_sd_ratio"]),
        (f"noise as claimed (that ratio within {NOISE_SD_RATIO})", res["noise_as_claimed"]),
        ("advantage within the optimal test's + 3 SE", f"{res['advantage_within_gaussian']} "
                                                       f"(+{res['advantage_margin_3se']})"),
    ]
    return "\n".join(["| quantity | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]) + "\n"


def main() -> None:
    from synapse_flwr.eval.results import update_summary, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000, help="releases per arm")
    parser.add_argument("--out", type=Path, default=REPO / "docs/results/security")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from synapse_flwr.data.check import file_hashes
    from synapse_flwr.data.federation import demo_dir

    res = audit_membership(args.trials)
    folder = args.out / "privacy_audit"
    write_atomic(folder / "tables.md", "# Membership inference on one organisation's artifact\n\n" + table(res))
    write_results(folder, {"membership_inference": res}, {"trials": args.trials, "epsilon": 4.0, "delta": 1e-5},
                  file_hashes(demo_dir()), f"python simulations/privacy_audit.py --trials {args.trials}")
    update_summary(args.out / "summary.json", {"mi_advantage": res["mi_advantage"], "mi_bound": res["mi_bound"],
                                               "noise_as_claimed": res["noise_as_claimed"],
                                               "advantage_within_gaussian": res["advantage_within_gaussian"]})
    log.info("%s", table(res))
    if not (res["noise_as_claimed"] and res["advantage_within_gaussian"]):
        raise SystemExit("privacy audit FAILED: the releases carry less noise than their artifact claims")


if __name__ == "__main__":
    main()
