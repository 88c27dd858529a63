"""The label-shift lab's subsample and skew: what its table's rows stand on."""

from __future__ import annotations

from collections import Counter

from synapse_flwr.simulations.label_shift import balanced, skew

from synapse_flwr.core.experience import event_label
from synapse_flwr.data.federation import load_federated


def test_balanced_keeps_per_tool_queries_of_every_tool_that_has_them():
    ds = load_federated("demo", 3, 7)
    counts = Counter(t.gold[0] for t in ds.seen_test)
    cut = balanced(ds, 6, seed=1)
    kept = Counter(t.gold[0] for t in cut.seen_test)
    assert kept == {tool: 6 for tool, n in counts.items() if n >= 6} and kept
    assert set(kept) < set(counts), "the demo has tools with 5 seen queries: they are left out at 6"
    assert {t.query for t in cut.seen_test} <= {t.query for t in ds.seen_test}
    assert cut.heldout_test == ds.heldout_test and cut.orgs is ds.orgs
    assert balanced(ds, 6, seed=1).seen_test == cut.seen_test


def test_skew_is_largest_over_smallest_labelled_count():
    ds = load_federated("demo", 3, 7)
    counts = Counter(y for evs in ds.orgs.values() for e in evs if (y := event_label(e, ds.catalog)))
    assert (counts["search_flights"], counts["online_check_in"]) == (max(counts.values()), min(counts.values()))
    assert skew(ds) == 69 / 11  # the demo's busiest and quietest tools (tuning/label_shift: 6.27)
