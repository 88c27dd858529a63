"""Differential privacy for the count releases of one organisation.

Model (event-level DP at each organisation)
-------------------------------------------
One event (one routing record) touches at most ``max_contributions`` counters
of the released artifact, each by +1 (see :func:`bound_contributions`), so the
L2 sensitivity of the count vector is ``sqrt(max_contributions)``. Each round
the organisation releases its whole noised count vector with the Gaussian
mechanism, ``sigma = z * sqrt(max_contributions)``; the ``rounds`` planned
releases compose and are accounted exactly: one Gaussian release of
sensitivity 1 and noise ``z`` is ``1/z``-GDP, ``R`` of them compose to
``sqrt(R)/z``-GDP, and ``mu``-GDP is exactly the set of ``(epsilon, delta)``
pairs with ``delta = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2)``
(Dong, Roth & Su, "Gaussian differential privacy", JRSS-B 2022; Balle & Wang,
"Improving the Gaussian mechanism", ICML 2018). opacus' RDP accountant bounds
the same releases from above (about 7% more noise at epsilon 4) and its PRV
accountant agrees with the exact curve to within its discretisation; the
tests check both.

Counters whose key is not public (free-text phrases, tool pairs) are released
with DP partition selection by Gaussian thresholding (Google's DP partition
selection; Desfontaines et al., "Differentially private partition selection",
PoPETs 2022; Gopi et al., "Differentially Private Set Union", ICML 2020): a key
is released only if its noised count of distinct supporting events is at least
``tau``. A key supported only by the one differing event (true count 1) then
leaks with probability ``P(1 + N(0, sigma^2) >= tau)``; that event has at most
``max_contributions`` such keys per release and ``rounds`` releases, so with
``tau = 1 + sigma * Phi^{-1}(1 - delta_selection / (rounds * max_contributions))``
the union bound caps the total extra failure probability at
``delta_selection``. Outside that failure event the output is post-processing
of the Gaussian releases, so the whole schedule is
``(epsilon, delta_accounting + delta_selection)``-DP with
``delta_accounting = delta_split * delta`` and
``delta_selection = (1 - delta_split) * delta``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Any, TypeVar

import numpy as np

from synapse_flwr.core.prototypes import prototype_sensitivity

logger = logging.getLogger(__name__)

#: The default budget per record over the whole run (docs/privacy.md): the run
#: config, ``synapse build`` and ``synapse experiment`` all start from it.
DEFAULT_EPSILON = 4.0
DEFAULT_DELTA = 1e-5
#: The largest delta a federation or a build accepts (a delta near 1 is no guarantee at all).
MAX_DELTA = 0.1

H = TypeVar("H", bound=Hashable)
K = TypeVar("K")

_RELATIVE_EPSILON_TOLERANCE = 0.01
# opacus' default RDP orders stop at 63, too low for the large-sigma probes of
# its noise search (it warns); higher orders can only tighten the bound.
_EXTRA_ALPHAS = [80, 96, 128, 192, 256, 512, 1024]
# GDP parameters mu = sqrt(R)/z the exact calibration searches
_MU_RANGE = (1e-6, 1e3)


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


@dataclass(frozen=True)
class PrivacyParams:
    """Privacy budget and contribution bound of one organisation.

    Parameters
    ----------
    epsilon : float
        Target epsilon over all ``rounds`` releases; ``math.inf`` turns privacy
        off (exact counts, keys kept from ``min_support`` supporting events).
    delta : float
        Target total delta, ``0 < delta < 1``.
    rounds : int
        Number of releases (federation rounds) the budget must cover, ``>= 1``.
    max_contributions : int
        L0 bound: the most counters one event may touch in one release
        (each by +1), ``>= 1``.
    delta_split : float, default 0.5
        Share of ``delta`` given to the Gaussian accounting; the rest,
        ``(1 - delta_split) * delta``, pays for partition selection.
        ``0 < delta_split < 1``.
    min_support : int, default 1
        Release threshold on exact counts when ``epsilon`` is infinite, ``>= 1``.
    prototype_weight : float, default 0.0
        ``c``: one event also adds ``c * u`` (``u`` a unit query embedding)
        and +1 (its count) to one tool's query prototype in the same release
        (:mod:`synapse_flwr.core.prototypes`), so the L2 sensitivity is
        ``sqrt(max_contributions + 1 + c^2)``; 0 (no prototypes) or
        ``1 <= c <= 100``.
    prototypes_per_record : int, default 1
        Multiplier of one record's squared prototype contribution ``1 + c^2``:
        the distinct tools' prototypes a sequence record adds to
        (:mod:`synapse_flwr.core.sequences`, one per distinct tool it calls),
        or ``E^2`` when ``E`` events of one record (an event and its replayed
        outcomes) add to one tool's prototype.
    sequence_counters : int, default 0
        Squared L2 norm one sequence record's start and transition counts are
        clipped to (:mod:`synapse_flwr.core.sequences`), each count weighted by
        ``sequence_weight``; 0 without sequences.
    sequence_weight : float, default 0.0
        ``w``: the weight of those counters in the release, so they add
        ``w^2 * sequence_counters`` to the squared L2 sensitivity and, divided
        by ``w``, carry noise ``sigma / w``; 0 or ``1 <= w <= 100``.
    vote_share : float, default 0.0
        Share of the budget (of the squared GDP ``mu``) kept for one more
        release per record, the fusion vote (:mod:`synapse_flwr.core.votes`):
        the counters and prototypes get ``1 - vote_share`` of it. 0 (no vote)
        or ``0 < vote_share <= 0.5``.

    Raises
    ------
    ValueError
        If any field is out of range.
    """

    epsilon: float
    delta: float
    rounds: int
    max_contributions: int
    delta_split: float = 0.5
    min_support: int = 1
    prototype_weight: float = 0.0
    prototypes_per_record: int = 1
    sequence_counters: int = 0
    sequence_weight: float = 0.0
    vote_share: float = 0.0

    def __post_init__(self) -> None:
        if math.isnan(self.epsilon) or self.epsilon <= 0:
            raise ValueError(
                "epsilon must be > 0 (inf turns privacy off: 'inf' on a command line, math.inf in Python), "
                f"got {self.epsilon!r}"
            )
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must satisfy 0 < delta < 1, got {self.delta!r}")
        if not _is_int(self.rounds) or self.rounds < 1:
            raise ValueError(f"rounds must be an integer >= 1, got {self.rounds!r}")
        if not _is_int(self.max_contributions) or self.max_contributions < 1:
            raise ValueError(
                f"max_contributions must be an integer >= 1 (counters one event may touch), "
                f"got {self.max_contributions!r}"
            )
        if not 0 < self.delta_split < 1:
            raise ValueError(
                f"delta_split must satisfy 0 < delta_split < 1 (share of delta for the "
                f"Gaussian accounting), got {self.delta_split!r}"
            )
        if not _is_int(self.min_support) or self.min_support < 1:
            raise ValueError(f"min_support must be an integer >= 1, got {self.min_support!r}")
        c = self.prototype_weight
        if not (c == 0 or 1 <= c <= 100):  # also rejects NaN
            raise ValueError(
                f"prototype_weight must be 0 (no prototypes) or 1 <= prototype_weight <= 100, got {c!r}"
            )
        if not _is_int(self.prototypes_per_record) or self.prototypes_per_record < 1:
            raise ValueError(f"prototypes_per_record must be an integer >= 1, got {self.prototypes_per_record!r}")
        if not _is_int(self.sequence_counters) or self.sequence_counters < 0:
            raise ValueError(f"sequence_counters must be an integer >= 0, got {self.sequence_counters!r}")
        w = self.sequence_weight
        if not (w == 0 or 1 <= w <= 100) or (self.sequence_counters > 0) != (w > 0):
            raise ValueError(
                f"sequence_weight must be 1 <= sequence_weight <= 100 with sequence counters and 0 without, "
                f"got {w!r} for {self.sequence_counters} counters"
            )
        if not 0 <= self.vote_share <= 0.5:  # also rejects NaN
            raise ValueError(f"vote_share must be 0 (no fusion vote) or in (0, 0.5], got {self.vote_share!r}")

    @property
    def l2_sensitivity(self) -> float:
        """L2 norm of one record's contribution: counters, weighted prototype vectors, weighted sequence counters."""
        base = prototype_sensitivity(self.max_contributions, self.prototype_weight, self.prototypes_per_record)
        return math.sqrt(base * base + self.sequence_weight**2 * self.sequence_counters)

    @property
    def private(self) -> bool:
        """Whether a formal DP guarantee is requested (finite epsilon)."""
        return math.isfinite(self.epsilon)


@dataclass(frozen=True)
class Calibration:
    """Noise and threshold that meet a :class:`PrivacyParams` budget.

    Parameters
    ----------
    noise_multiplier : float
        ``z``: noise standard deviation per unit of L2 sensitivity (0 when off).
    sigma : float
        Standard deviation of the noise on every count, ``z * params.l2_sensitivity``
        (``z * sqrt(max_contributions)`` without prototypes).
    threshold : float
        ``tau``: noised counts below it are not released by partition selection.
    delta_accounting : float
        Delta at which the Gaussian releases are accounted.
    delta_selection : float
        Delta spent by partition selection over all planned rounds.
    vote_multiplier : float
        Noise SD per unit of L2 sensitivity of the fusion vote (0 without one).
    """

    noise_multiplier: float
    sigma: float
    threshold: float
    delta_accounting: float
    delta_selection: float
    vote_multiplier: float = 0.0


def _opacus():
    """opacus' RDP noise search and orders, imported on first use (opacus pulls in torch; only DP-SGD needs it)."""
    from types import SimpleNamespace

    from opacus.accountants import RDPAccountant
    from opacus.accountants.utils import get_noise_multiplier

    return SimpleNamespace(
        get_noise_multiplier=get_noise_multiplier,
        alphas=[*RDPAccountant.DEFAULT_ALPHAS, *_EXTRA_ALPHAS],
    )


def rdp_alphas() -> list[float]:
    """RDP orders of every calibration and epsilon report: opacus' defaults and higher ones.

    Returns
    -------
    list of float
        A new list (opacus pulls in torch: imported on first call).
    """
    return list(_opacus().alphas)


def noise_multiplier_for(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """Smallest Gaussian noise multiplier meeting ``(epsilon, delta)`` after ``steps`` sampled steps.

    Opacus' RDP accountant searches ``z`` (up to a 1% relative tolerance on
    epsilon) for ``steps`` Gaussian releases, each on a Poisson sample at rate
    ``sample_rate`` (``< 1``: DP-SGD, the ``fedavg_dp`` baseline; the
    builder's full-data releases use the exact :func:`gaussian_noise_multiplier`).

    Parameters
    ----------
    epsilon : float
        Target epsilon, finite and ``> 0``.
    delta : float
        Target delta, ``0 < delta < 1``.
    sample_rate : float
        Poisson sampling rate of each step, ``0 < sample_rate <= 1``.
    steps : int
        Releases the budget must cover, ``>= 1``.

    Returns
    -------
    float
        ``z``: noise standard deviation per unit of L2 sensitivity.

    Raises
    ------
    ValueError
        If opacus finds no noise meeting the budget (its message).
    """
    return float(_opacus().get_noise_multiplier(
        target_epsilon=epsilon,
        target_delta=delta,
        sample_rate=sample_rate,
        steps=steps,
        accountant="rdp",
        epsilon_tolerance=_RELATIVE_EPSILON_TOLERANCE * epsilon,
        alphas=_opacus().alphas,
    ))


def gaussian_delta(mu: float, epsilon: float) -> float:
    """Exact ``delta`` at ``epsilon`` of a ``mu``-GDP mechanism (a Gaussian release, ``mu = 1/z``).

    ``Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2)``, the second
    term in log space so that large ``epsilon`` does not overflow.
    """
    from scipy.stats import norm

    if mu <= 0:
        return 0.0
    a = norm.cdf(-epsilon / mu + mu / 2)
    b = math.exp(epsilon + norm.logcdf(-epsilon / mu - mu / 2))
    return max(float(a - b), 0.0)


def gaussian_epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    """Exact epsilon at ``delta`` of ``releases`` Gaussian releases with noise multiplier ``z``.

    Parameters
    ----------
    noise_multiplier : float
        ``z > 0``: noise SD per unit of L2 sensitivity.
    releases : int
        Releases composed, ``>= 1`` (together ``sqrt(releases)/z``-GDP).
    delta : float
        ``0 < delta < 1``.

    Returns
    -------
    float
        The smallest ``epsilon >= 0`` with ``gaussian_delta(mu, epsilon) <= delta``.
    """
    from scipy.optimize import brentq

    mu = math.sqrt(releases) / noise_multiplier
    if gaussian_delta(mu, 0.0) <= delta:
        return 0.0
    high = 1.0
    while gaussian_delta(mu, high) > delta:
        high *= 2
    return float(brentq(lambda e: gaussian_delta(mu, e) - delta, 0.0, high, xtol=1e-12, rtol=1e-12))


def gaussian_noise_multiplier(epsilon: float, delta: float, releases: int) -> float:
    """Smallest noise multiplier ``z`` whose ``releases`` Gaussian releases are exactly ``(epsilon, delta)``-DP.

    Parameters
    ----------
    epsilon, delta : float
        The budget: ``epsilon`` finite and ``> 0``, ``0 < delta < 1``.
    releases : int
        Gaussian releases a record may take part in (``>= 1``), composed exactly.

    Returns
    -------
    float
        ``z``, rounded up so that :func:`gaussian_epsilon` never exceeds ``epsilon``.

    Raises
    ------
    ValueError
        If ``epsilon`` or ``delta`` is out of range, or no ``z`` in the
        searched range meets them.
    """
    from scipy.optimize import brentq

    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    root = math.sqrt(releases)
    # delta(mu) grows with mu = sqrt(R)/z: solve in mu, then keep the safe side
    low, high = _MU_RANGE
    if gaussian_delta(low, epsilon) > delta:
        raise ValueError(f"epsilon {epsilon:g} at delta {delta:g} needs a noise multiplier above {root / low:.3g}; "
                         "choose a larger epsilon")
    if gaussian_delta(high, epsilon) <= delta:
        raise ValueError(f"epsilon {epsilon:g} at delta {delta:g} allows almost no noise (z below {root / high:.3g}); "
                         "choose a smaller epsilon, or inf to turn privacy off")
    mu = brentq(lambda m: gaussian_delta(m, epsilon) - delta, low, high, xtol=1e-14, rtol=1e-14)
    # a relative 1e-9 more noise than the root: the reported epsilon stays below the target
    z = root / mu * (1 + 1e-9)
    while gaussian_delta(root / z, epsilon) > delta:
        z *= 1 + 1e-9
    return z


@lru_cache(maxsize=64)  # a pure function of frozen params; the noise search solves numerically
def calibrate(params: PrivacyParams) -> Calibration:
    """Calibrate the Gaussian noise and the partition-selection threshold.

    Parameters
    ----------
    params : PrivacyParams
        Budget, planned rounds and contribution bound.

    Returns
    -------
    Calibration
        ``z`` is the smallest noise multiplier whose exact epsilon
        (:func:`gaussian_epsilon`) after ``params.rounds`` releases at
        ``delta_accounting`` is at most ``params.epsilon``; ``tau`` as in the
        module docstring. With ``epsilon = inf``: ``sigma = 0`` and
        ``tau = min_support``.

    Raises
    ------
    ValueError
        If the budget needs more noise than opacus searches (epsilon too small).
    """
    delta_accounting = params.delta_split * params.delta
    delta_selection = params.delta - delta_accounting
    if not params.private:
        return Calibration(0.0, 0.0, float(params.min_support), delta_accounting, delta_selection)
    try:
        z_all = gaussian_noise_multiplier(params.epsilon, delta_accounting, params.rounds)
    except ValueError as exc:
        raise ValueError(f"cannot calibrate noise for {params.rounds} release(s) per record: {exc}") from exc
    # GDP composes in squares: the releases keep (1 - share) mu^2, the vote share * mu^2
    share = params.vote_share
    z = z_all / math.sqrt(1 - share)
    vote_z = z_all / math.sqrt(share * params.rounds) if share else 0.0
    sigma = z * params.l2_sensitivity
    per_key_delta = delta_selection / (params.rounds * params.max_contributions)
    # Phi^-1(1 - p) as -Phi^-1(p): exact for a tiny p, where 1 - p rounds to 1
    threshold = 1.0 - sigma * NormalDist().inv_cdf(per_key_delta)
    logger.debug("calibrated %s: z=%.4f sigma=%.4f tau=%.4f", params, z, sigma, threshold)
    return Calibration(z, sigma, threshold, delta_accounting, delta_selection, vote_z)


def epsilon_spent(params: PrivacyParams, cal: Calibration, rounds_done: int, voted: bool = False) -> float:
    """Exact epsilon of the Gaussian releases made so far (:func:`gaussian_epsilon`).

    Parameters
    ----------
    params : PrivacyParams
        The budget ``cal`` was calibrated for.
    cal : Calibration
        Output of ``calibrate(params)``.
    rounds_done : int
        Releases made so far, ``>= 0``. More than ``params.rounds`` is reported
        honestly but logged as a warning: partition selection then exceeds its
        delta budget.
    voted : bool, default False
        Whether the record's fusion vote was released too (composed with the
        releases at ``cal.vote_multiplier``).

    Returns
    -------
    float
        Epsilon at ``cal.delta_accounting`` (the full guarantee adds
        ``cal.delta_selection`` to delta); 0.0 before any release, ``math.inf``
        when privacy is off.

    Raises
    ------
    ValueError
        If ``rounds_done`` is negative or not an integer.
    """
    if not _is_int(rounds_done) or rounds_done < 0:
        raise ValueError(f"rounds_done must be an integer >= 0, got {rounds_done!r}")
    if rounds_done == 0:
        return 0.0
    if not params.private or cal.noise_multiplier <= 0:
        return math.inf
    if rounds_done > params.rounds:
        logger.warning(
            "%d releases exceed the %d planned: the partition-selection delta is exceeded",
            rounds_done,
            params.rounds,
        )
    if not voted:
        return gaussian_epsilon(cal.noise_multiplier, rounds_done, cal.delta_accounting)
    if cal.vote_multiplier <= 0:
        raise ValueError("a fusion vote was released but the budget reserved no share for one (vote_share 0)")
    mu_squared = rounds_done / cal.noise_multiplier**2 + 1 / cal.vote_multiplier**2
    return gaussian_epsilon(1 / math.sqrt(mu_squared), 1, cal.delta_accounting)


def noise_counts(counts: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Gaussian mechanism on a count vector, clamped at 0.

    Parameters
    ----------
    counts : numpy.ndarray
        True counts (any shape).
    sigma : float
        Noise standard deviation, ``>= 0`` (0 returns the counts unchanged).
    rng : numpy.random.Generator
        Source of noise.

    Returns
    -------
    numpy.ndarray
        float64 array of ``max(counts + N(0, sigma^2), 0)``; the clamp is
        post-processing and costs no privacy.

    Raises
    ------
    ValueError
        If ``sigma`` is negative or not finite.
    """
    if not math.isfinite(sigma) or sigma < 0:
        raise ValueError(f"sigma must be finite and >= 0, got {sigma!r}")
    values = np.asarray(counts, dtype=np.float64)
    if sigma > 0:
        values = values + rng.normal(0.0, sigma, size=values.shape)
    return np.maximum(values, 0.0)


def zero_count_floor(sigma: float, merged: int, sds: float) -> float:
    """What the sum of ``merged`` orgs' :func:`noise_counts` of a zero count stays below, ``sds`` SDs aside.

    Each org's clamped noise ``max(N(0, sigma^2), 0)`` has mean
    ``sigma / sqrt(2 pi)`` (not 0) and SD below ``sigma``, so a merged count of a
    tool nobody used reads about ``merged * sigma / sqrt(2 pi)``: at 100 orgs
    that is 4 SDs of the sum's noise, not 0.
    """
    return merged * sigma / math.sqrt(2 * math.pi) + sds * sigma * math.sqrt(merged)


def select_partitions(
    counts: Mapping[K, float], cal: Calibration, rng: np.random.Generator
) -> dict[K, float]:
    """DP partition selection: release the keys whose noised count reaches ``tau``.

    Parameters
    ----------
    counts : Mapping
        Key -> number of distinct events supporting it. Keys must be mutually
        orderable: noise is drawn in sorted key order, so the result does not
        depend on the mapping's insertion order.
    cal : Calibration
        Noise ``sigma`` and threshold ``tau``.
    rng : numpy.random.Generator
        Source of noise.

    Returns
    -------
    dict
        The kept keys (in sorted order) with their noised counts.
    """
    keys = sorted(counts)  # type: ignore[type-var]
    noised = noise_counts(np.array([counts[k] for k in keys], dtype=np.float64), cal.sigma, rng)
    return {k: float(v) for k, v in zip(keys, noised) if v >= cal.threshold}


def bound_contributions(items: Sequence[H], limit: int) -> list[H]:
    """Keep the first ``limit`` distinct items, in order (the L0 bound of one event).

    Parameters
    ----------
    items : Sequence
        Counters one event would touch (hashable), possibly repeated.
    limit : int
        Most distinct counters to keep, ``>= 1``.

    Returns
    -------
    list
        The first ``limit`` distinct items, order preserved; deterministic.

    Raises
    ------
    ValueError
        If ``limit`` is not an integer >= 1.
    """
    if not _is_int(limit) or limit < 1:
        raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
    kept: dict[H, None] = {}
    for item in items:
        if len(kept) == limit:
            break
        kept.setdefault(item, None)
    return list(kept)
