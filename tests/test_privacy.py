"""Differential privacy: calibration, accounting, noise and partition selection."""

from __future__ import annotations

import math
import re
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synapse_flwr.core.privacy import (
    Calibration,
    PrivacyParams,
    bound_contributions,
    calibrate,
    epsilon_spent,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_noise_multiplier,
    noise_counts,
    noise_multiplier_for,
    select_partitions,
)

PARAMS = PrivacyParams(epsilon=1.0, delta=1e-5, rounds=3, max_contributions=8)


@pytest.fixture(scope="module")
def cal() -> Calibration:
    return calibrate(PARAMS)


# ------------------------------------------------------------------ params
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": 0.0}, "epsilon must be > 0"),
        ({"epsilon": -1.0}, "epsilon must be > 0"),
        ({"epsilon": math.nan}, "epsilon must be > 0"),
        ({"delta": 0.0}, "delta must satisfy"),
        ({"delta": 1.0}, "delta must satisfy"),
        ({"rounds": 0}, "rounds must be an integer >= 1"),
        ({"rounds": 2.5}, "rounds must be an integer >= 1"),
        ({"max_contributions": 0}, "max_contributions must be an integer >= 1"),
        ({"max_contributions": True}, "max_contributions must be an integer >= 1"),
        ({"delta_split": 0.0}, "delta_split must satisfy"),
        ({"delta_split": 1.0}, "delta_split must satisfy"),
        ({"min_support": 0}, "min_support must be an integer >= 1"),
    ],
)
def test_bad_params_raise(kwargs: dict[str, float], message: str) -> None:
    base = {"epsilon": 1.0, "delta": 1e-5, "rounds": 3, "max_contributions": 8}
    with pytest.raises(ValueError, match=message):
        PrivacyParams(**{**base, **kwargs})  # type: ignore[arg-type]


def test_a_tiny_delta_still_gives_a_finite_threshold() -> None:
    cal = calibrate(PrivacyParams(epsilon=4.0, delta=1e-300, rounds=1, max_contributions=8))
    assert math.isfinite(cal.threshold) and cal.threshold > 30 * cal.sigma


def test_budget_too_small_raises_value_error() -> None:
    with pytest.raises(ValueError, match="cannot calibrate .* needs a noise multiplier above"):
        calibrate(PrivacyParams(epsilon=1e-9, delta=1e-13, rounds=3, max_contributions=8))
    # a tiny but reachable budget calibrates to (useless but correct) enormous noise:
    # as epsilon -> 0 a Gaussian release is (0, delta)-DP once z ~ 0.4 sqrt(R) / delta
    assert calibrate(PrivacyParams(epsilon=1e-9, delta=1e-5, rounds=3, max_contributions=8)).noise_multiplier > 1e5


# ------------------------------------------------------------- calibration
def test_delta_split(cal: Calibration) -> None:
    assert cal.delta_accounting == pytest.approx(0.5e-5)
    assert cal.delta_selection == pytest.approx(0.5e-5)
    other = calibrate(PrivacyParams(1.0, 1e-5, 3, 8, delta_split=0.8))
    assert other.delta_accounting == pytest.approx(0.8e-5)
    assert other.delta_selection == pytest.approx(0.2e-5)


def test_sigma_and_threshold_formulas(cal: Calibration) -> None:
    assert cal.sigma == pytest.approx(cal.noise_multiplier * math.sqrt(8))
    per_key = cal.delta_selection / (PARAMS.rounds * PARAMS.max_contributions)
    assert cal.threshold == pytest.approx(1 + cal.sigma * NormalDist().inv_cdf(1 - per_key))


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0, 8.0])
@pytest.mark.parametrize("rounds", [1, 3, 10])
def test_calibration_meets_and_nearly_uses_the_budget(epsilon: float, rounds: int) -> None:
    params = PrivacyParams(epsilon=epsilon, delta=1e-5, rounds=rounds, max_contributions=8)
    cal = calibrate(params)
    spent = epsilon_spent(params, cal, rounds)
    assert spent <= epsilon
    assert spent >= 0.999 * epsilon  # exact accounting: the budget is used, not merely bounded


@pytest.mark.parametrize("epsilon", [0.5, 4.0])
@pytest.mark.parametrize("rounds", [1, 3])
def test_exact_accounting_agrees_with_opacus(epsilon: float, rounds: int) -> None:
    # opacus' PRV accountant computes the same curve numerically (to its discretisation);
    # its RDP accountant is an upper bound, so it always asks for more noise
    from opacus.accountants import PRVAccountant

    z = gaussian_noise_multiplier(epsilon, 0.5e-5, rounds)
    prv = PRVAccountant()
    for _ in range(rounds):
        prv.step(noise_multiplier=z, sample_rate=1.0)
    # PRV reports an upper estimate within its default absolute eps_error (0.01)
    assert epsilon - 1e-3 <= prv.get_epsilon(delta=0.5e-5) <= epsilon + 0.02
    rdp_z = noise_multiplier_for(epsilon, 0.5e-5, 1.0, rounds)
    assert 1.03 * z < rdp_z < 1.15 * z


def test_gaussian_delta_closed_form() -> None:
    # mu-GDP at epsilon 0 is the total variation between N(0,1) and N(mu,1): 2 Phi(mu/2) - 1
    for mu in (0.1, 1.0, 3.0):
        assert gaussian_delta(mu, 0.0) == pytest.approx(2 * NormalDist().cdf(mu / 2) - 1, rel=1e-12)
    assert gaussian_delta(1.0, 1.0) > gaussian_delta(1.0, 2.0) > gaussian_delta(0.5, 2.0) > 0
    assert gaussian_delta(1.0, 800.0) == 0.0  # no overflow at a huge epsilon
    assert gaussian_epsilon(1e6, 1, 1e-5) == 0.0  # noise this large spends nothing at this delta


def test_gaussian_noise_multiplier_rejects_bad_budgets() -> None:
    with pytest.raises(ValueError, match="epsilon must be finite and > 0, got inf"):
        gaussian_noise_multiplier(math.inf, 1e-5, 1)
    with pytest.raises(ValueError, match="delta must be in"):
        gaussian_noise_multiplier(1.0, 0.0, 1)


def test_epsilon_spent_is_monotone(cal: Calibration) -> None:
    spent = [epsilon_spent(PARAMS, cal, r) for r in range(6)]
    assert spent[0] == 0.0
    assert all(a < b for a, b in zip(spent, spent[1:]))
    assert all(math.isfinite(e) for e in spent)


def test_epsilon_spent_rejects_negative_rounds(cal: Calibration) -> None:
    with pytest.raises(ValueError, match="rounds_done"):
        epsilon_spent(PARAMS, cal, -1)


def test_smaller_epsilon_more_noise() -> None:
    sigmas = [calibrate(PrivacyParams(e, 1e-5, 3, 8)).sigma for e in (0.5, 1, 2, 4, 8)]
    assert all(a > b for a, b in zip(sigmas, sigmas[1:]))


def test_more_contributions_more_noise() -> None:
    sigmas = [calibrate(PrivacyParams(1.0, 1e-5, 3, m)).sigma for m in (1, 4, 16)]
    assert all(a < b for a, b in zip(sigmas, sigmas[1:]))


def test_privacy_off_is_exact() -> None:
    params = PrivacyParams(epsilon=math.inf, delta=1e-5, rounds=3, max_contributions=8, min_support=2)
    cal = calibrate(params)
    assert (cal.noise_multiplier, cal.sigma, cal.threshold) == (0.0, 0.0, 2.0)
    assert epsilon_spent(params, cal, 0) == 0.0
    assert epsilon_spent(params, cal, 1) == math.inf
    counts = np.array([0.0, 1.0, 5.0])
    np.testing.assert_array_equal(noise_counts(counts, cal.sigma, np.random.default_rng(0)), counts)
    kept = select_partitions({"a": 1, "b": 2, "c": 7}, cal, np.random.default_rng(0))
    assert kept == {"b": 2.0, "c": 7.0}


# ------------------------------------------------------------------- noise
def test_noise_std_matches_sigma() -> None:
    sigma = 3.7
    rng = np.random.default_rng(1)
    noised = noise_counts(np.full(40_000, 1e6), sigma, rng)
    assert noised.dtype == np.float64
    assert np.std(noised - 1e6) == pytest.approx(sigma, rel=0.03)


def test_clamped_noise_is_unbiased_for_large_counts() -> None:
    sigma = 5.0
    rng = np.random.default_rng(2)
    counts = np.full(40_000, 100.0)  # 20 sigma above zero: the clamp never bites
    noised = noise_counts(counts, sigma, rng)
    assert abs(noised.mean() - 100.0) < 4 * sigma / math.sqrt(counts.size)


def test_noise_is_clamped_and_shape_preserved() -> None:
    noised = noise_counts(np.zeros((50, 4)), 10.0, np.random.default_rng(3))
    assert noised.shape == (50, 4)
    assert noised.min() >= 0.0


def test_negative_sigma_raises() -> None:
    with pytest.raises(ValueError, match="sigma"):
        noise_counts(np.ones(3), -1.0, np.random.default_rng(0))


# ------------------------------------------------------ partition selection
def test_singletons_dropped_large_counts_kept(cal: Calibration) -> None:
    rng = np.random.default_rng(4)
    singletons = {f"rare {i}": 1.0 for i in range(20_000)}
    assert select_partitions(singletons, cal, rng) == {}
    frequent = {f"common {i}": cal.threshold + 6 * cal.sigma for i in range(200)}
    assert select_partitions(frequent, cal, rng).keys() == frequent.keys()


def test_select_partitions_returns_noised_values_above_threshold(cal: Calibration) -> None:
    counts = {f"k{i}": float(v) for i, v in enumerate(range(0, 400, 4))}
    kept = select_partitions(counts, cal, np.random.default_rng(5))
    assert kept
    assert all(v >= cal.threshold for v in kept.values())
    assert set(kept) <= set(counts)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=6), st.integers(0, 300).map(float), min_size=1, max_size=40
    ),
    st.randoms(use_true_random=False),
    st.integers(0, 2**32 - 1),
)
def test_select_partitions_ignores_insertion_order(
    counts: dict[str, float], shuffler, seed: int
) -> None:
    cal = Calibration(noise_multiplier=2.0, sigma=20.0, threshold=60.0,
                      delta_accounting=5e-6, delta_selection=5e-6)  # fmt: skip
    items = list(counts.items())
    shuffler.shuffle(items)
    first = select_partitions(counts, cal, np.random.default_rng(seed))
    second = select_partitions(dict(items), cal, np.random.default_rng(seed))
    assert first == second
    assert list(first) == sorted(first)


# ---------------------------------------------------- contribution bounding
def test_bound_contributions() -> None:
    assert bound_contributions(["a", "b", "a", "c", "d"], 3) == ["a", "b", "c"]
    assert bound_contributions(["a", "a"], 5) == ["a"]
    assert bound_contributions([], 2) == []
    with pytest.raises(ValueError, match="limit"):
        bound_contributions(["a"], 0)


@given(st.lists(st.integers(0, 20)), st.integers(1, 10))
def test_bound_contributions_properties(items: list[int], limit: int) -> None:
    kept = bound_contributions(items, limit)
    assert len(kept) == min(limit, len(set(items)))
    assert len(set(kept)) == len(kept)
    assert kept == list(dict.fromkeys(items))[:limit]


def test_the_cost_table_in_docs_privacy_md_is_what_calibrate_gives():
    """docs/privacy.md states the defaults' noise; it must not drift from the code."""
    from pathlib import Path

    from synapse_flwr.core.builder import BuildConfig

    text = (Path(__file__).resolve().parents[1] / "docs" / "privacy.md").read_text()
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ~(\d+) \|$", text, re.MULTILINE)
    assert len(rows) == 3
    # the default private build with prototypes (no phrases), and the same with phrases
    default, phrases = (BuildConfig(phrases=p).resolved(private=True, prototypes=True) for p in (None, True))
    for eps, z, sigma, proto_sd, sigma_phrases, threshold in rows:
        cal = calibrate(default.privacy_params(float(eps), 1e-5, 1, default.prototype_weight))
        with_phrases = calibrate(phrases.privacy_params(float(eps), 1e-5, 1, phrases.prototype_weight))
        assert (float(z), float(sigma), float(proto_sd), float(sigma_phrases), int(threshold)) == (
            round(cal.noise_multiplier, 2), round(cal.sigma, 1), round(cal.sigma / default.prototype_weight, 2),
            round(with_phrases.sigma, 1), round(with_phrases.threshold))


def test_a_zero_count_merged_over_many_orgs_stays_below_its_floor():
    from synapse_flwr.core.privacy import noise_counts, zero_count_floor

    rng = np.random.default_rng(5)
    sigma, orgs = 10.5, 100
    merged = noise_counts(np.zeros((2000, orgs)), sigma, rng).sum(axis=1)
    # the clamp at 0 makes a never-used tool read ~ orgs * sigma / sqrt(2 pi) = 419 "calls"
    assert abs(merged.mean() - orgs * sigma / math.sqrt(2 * math.pi)) < 5
    assert (merged > 3 * sigma * math.sqrt(orgs)).mean() > 0.9  # a floor that ignores the clamp
    assert (merged > zero_count_floor(sigma, orgs, 3.0)).mean() < 0.01
    assert zero_count_floor(0.0, orgs, 3.0) == 0.0
