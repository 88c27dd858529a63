"""Sequence records: bounded counters, the dense public-domain release, the sensitivity, the builder."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from synapse_flwr.core.builder import BuildConfig, build_compendium, count_experience
from synapse_flwr.core.catalog import ToolDoc, make_catalog
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.sequences import (
    SequenceBounds,
    SequenceRecord,
    record_counters,
    record_events,
    release_sequences,
    sequence_counts,
)

CATALOG = make_catalog([ToolDoc(t, t, f"{t.replace('_', ' ')} of an order.") for t in
                        ("find_user", "get_order", "get_product", "cancel_order", "return_items")])
BOUNDS = SequenceBounds(max_tools=3, max_counters=4, weight=4.0)
LONG = SequenceRecord("Cancel my order #W1, I am Ann in 12345.",
                      ("find_user", "get_order", "get_order", "get_order", "get_product", "get_order",
                       "get_product", "return_items", "cancel_order"))


def test_a_record_is_clipped_to_the_bounds():
    counters = record_counters(LONG, BOUNDS)
    raw = {(None, "find_user"): 1, ("find_user", "get_order"): 1, ("get_order", "get_order"): 2,
           ("get_order", "get_product"): 2, ("get_product", "get_order"): 1, ("get_product", "return_items"): 1,
           ("return_items", "cancel_order"): 1}
    norm = math.sqrt(sum(v * v for v in raw.values()))
    assert set(counters) == set(raw)
    for k, v in raw.items():  # repeats keep their weight, the whole vector is scaled to norm sqrt(4)
        assert counters[k] == pytest.approx(v * 2.0 / norm)
    short = SequenceRecord("q", ("find_user", "get_order"))
    assert record_counters(short, BOUNDS) == {(None, "find_user"): 1.0, ("find_user", "get_order"): 1.0}
    events = record_events(LONG, BOUNDS)
    assert [e.tool for e in events] == ["find_user", "get_order", "get_product"]
    assert {e.query for e in events} == {LONG.query}
    assert record_counters(SequenceRecord("q", ()), BOUNDS) == {}
    assert record_events(SequenceRecord("q", ()), BOUNDS) == []


def test_counts_sum_the_clipped_records():
    starts, pairs = sequence_counts([LONG, LONG, SequenceRecord("x", ("get_order", "get_order"))], BOUNDS)
    clipped = record_counters(LONG, BOUNDS)
    assert starts["find_user"] == pytest.approx(2 * clipped[(None, "find_user")]) and starts["get_order"] == 1.0
    assert pairs[("get_order", "get_order")] == pytest.approx(2 * clipped[("get_order", "get_order")] + 1.0)


def test_release_without_noise_is_exact_and_with_noise_covers_the_whole_domain():
    starts, pairs = sequence_counts([LONG], BOUNDS)
    rng = np.random.default_rng(0)
    s0, p0 = release_sequences(starts, pairs, CATALOG.ids, 0.0, BOUNDS.weight, rng)
    assert set(s0) == {"find_user"} and p0 == pytest.approx(dict(pairs))
    # with noise and no floor every tool and ordered pair gets a draw: pairs nobody used can appear
    _, p1 = release_sequences(Counter(), Counter(), CATALOG.ids, 8.0, BOUNDS.weight, rng, floor_sds=0.0)
    assert len(p1) > 5 and set(p1) <= {(a, b) for a in CATALOG.ids for b in CATALOG.ids}
    # the released counts carry noise sigma / weight
    draws = [release_sequences(Counter({"get_order": 50}), Counter(), CATALOG.ids, 8.0, 4.0,
                               np.random.default_rng(i), floor_sds=0.0)[0]["get_order"] for i in range(400)]
    assert abs(np.std(draws) - 2.0) < 0.3 and abs(np.mean(draws) - 50) < 0.5
    with pytest.raises(ValueError, match="weight"):
        SequenceBounds(weight=0.5)


def _release_vector(records, config: BuildConfig, c: float) -> dict:
    """The exact (pre-noise) released vector of some records, as key -> value (prototype part analytic)."""
    events = [e for r in records for e in record_events(r, config.sequences)]
    counts = count_experience(events, config)
    vec: dict = {}
    for name in ("calls", "successes", "when", "when_not", "confusions", "transitions"):
        for k, v in getattr(counts, name).items():
            vec[(name, k)] = float(v)
    starts, pairs = sequence_counts(records, config.sequences)
    for k, v in [*starts.items(), *pairs.items()]:
        vec[("seq", k)] = config.sequences.weight * v
    # each event adds c * u (u a unit vector) and +1 to its own (distinct) tool's prototype
    for e in events:
        vec[("proto", e.tool)] = vec.get(("proto", e.tool), 0.0) + math.sqrt(c * c + 1.0)
    return vec


def test_one_record_moves_the_release_by_at_most_the_calibrated_sensitivity():
    c = 8.0
    config = BuildConfig(prototype_weight=c, sequences=BOUNDS)
    clip = config.privacy_params(4.0, 1e-5, 1, c).l2_sensitivity
    others = [SequenceRecord("Return the lamp of order #W2.", ("get_order", "return_items")),
              SequenceRecord("Cancel order #W3 please.", ("find_user", "get_order", "cancel_order"))]
    for extra in (LONG, SequenceRecord(LONG.query, ("get_order",) * 9)):
        a, b = _release_vector(others, config, c), _release_vector([*others, extra], config, c)
        diff = math.sqrt(sum((b.get(k, 0.0) - a.get(k, 0.0)) ** 2 for k in set(a) | set(b)))
        assert 0 < diff <= clip + 1e-9
    # the formula: 12 counters and one prototype per distinct tool, w^2 per sequence counter
    assert clip == pytest.approx(math.sqrt(12 * 3 + 3 * (1 + c * c) + 16 * 4))


def test_builder_releases_starts_and_next_tools_and_the_merge_sums_them():
    config = BuildConfig(sequences=BOUNDS)
    records = [LONG, SequenceRecord("Return item of #W4.", ("find_user", "get_order", "return_items"))]
    arts = [build_compendium([e for e in record_events(r, BOUNDS)], CATALOG, f"org{i}", config=config,
                             sequences=[r], epsilon=math.inf, seed=0) for i, r in enumerate(records)]
    clipped = record_counters(LONG, BOUNDS)  # LONG is clipped, the short record is not
    assert arts[0].tool("find_user").stats.starts == pytest.approx(clipped[(None, "find_user")], abs=1e-4)
    assert {c.tool: c.count for c in arts[1].tool("get_order").next_tools} == {"return_items": 1.0}
    merged = merge_typed(arts)
    assert merged.tool("find_user").stats.starts == pytest.approx(1.0 + clipped[(None, "find_user")], abs=1e-4)
    assert {c.tool: c.count for c in merged.tool("get_order").next_tools} == pytest.approx({
        "get_order": clipped[("get_order", "get_order")], "get_product": clipped[("get_order", "get_product")],
        "return_items": 1.0}, abs=1e-4)
    private = build_compendium(record_events(LONG, BOUNDS), CATALOG, "org0", epsilon=4.0, config=config,
                               sequences=[LONG], seed=0)
    assert private.privacy.clip == pytest.approx(config.privacy_params(4.0, 1e-5, 1, 0.0).l2_sensitivity, abs=1e-5)
    with pytest.raises(ValueError, match="sequences"):
        build_compendium(record_events(LONG, BOUNDS), CATALOG, "org0", config=config, epsilon=math.inf, seed=0)
    with pytest.raises(ValueError, match="events_per_record"):
        BuildConfig(events_per_record=2, sequences=BOUNDS)
