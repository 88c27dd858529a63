"""tau-bench per-step scoring: the typed transition prior, the instruction lift, step metrics.

Everything uses the lexical TF-IDF embedder (no model download). The test
marked ``data`` reads the real tau-bench files and is skipped without them.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from synapse_flwr.simulations.taubench import fold_ids, make_folds, summary, targets

from synapse_flwr.core.builder import BuildConfig, build_compendium
from synapse_flwr.core.catalog import ToolDoc, make_catalog
from synapse_flwr.core.embed import TfidfEmbedder
from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.router import Router
from synapse_flwr.core.schema import Compendium, Issuer, ToolCount, ToolEntry, ToolStats
from synapse_flwr.core.sequences import SequenceBounds, record_events
from synapse_flwr.data.pins import data_dir
from synapse_flwr.data.taubench import (
    Task,
    load_taubench,
    task_records,
    taubench_step_items,
)
from synapse_flwr.eval.taubench import (
    STEP_KINDS,
    StepWeights,
    TransitionPrior,
    bigram_rankings,
    prior_noise_floor,
    rankings,
    step_metrics,
    step_scores,
)

CATALOG = make_catalog(
    [
        ToolDoc("find_user", "find_user", "Find a user id by name and zip code."),
        ToolDoc("get_order", "get_order", "Get the status and details of an order."),
        ToolDoc("cancel_order", "cancel_order", "Cancel a pending order."),
        ToolDoc("return_items", "return_items", "Return items of a delivered order for a refund."),
    ]
)

TRAIN = [
    Task(i, f"user_{i}", f"Your name is User {i}, zip 9{i:04d}. Cancel order #W{i:05d}, it is pending.",
         ("find_user", "get_order", "cancel_order"))
    for i in range(6)
] + [
    Task(10 + i, f"user_{i}", f"You are User {i}. Return the delivered items of order #W{i:05d}.",
         ("find_user", "get_order", "return_items"))
    for i in range(6)
]
TEST = [
    Task(0, "ann", "Your name is Ann Lee, zip 12345. Cancel your pending order #W00099.",
         ("find_user", "get_order", "cancel_order")),
    Task(1, "bob", "You are Bob. Return the lamp you got in order #W00042.",
         ("find_user", "get_order", "return_items")),
    Task(2, "eve", "You just want to chat.", ()),
]
BOUNDS = SequenceBounds(max_tools=4, max_counters=4, weight=4.0)


def _compendium(next_tools: dict[str, dict[str, float]], starts: dict[str, float] | None = None) -> Compendium:
    return Compendium(
        kind="global",
        issuer=Issuer(org="global"),
        tools=[
            ToolEntry(
                tool_id=t,
                stats=ToolStats(starts=(starts or {}).get(t, 0.0)),
                next_tools=[ToolCount(tool=b, count=c) for b, c in sorted(next_tools.get(t, {}).items())],
            )
            for t in CATALOG.ids
        ],
    )


def _entries(comp: Compendium) -> dict[str, ToolEntry]:
    return {e.tool_id: e for e in comp.tools}


def _learned() -> Compendium:
    records = task_records(TRAIN)
    return build_compendium([e for r in records for e in record_events(r, BOUNDS)], CATALOG, "central",
                            config=BuildConfig(sequences=BOUNDS), sequences=records, epsilon=math.inf, seed=0)


# --------------------------------------------------------------------------- prior


def test_prior_uses_starts_own_row_and_backs_off_to_the_marginal():
    comp = _compendium({"find_user": {"get_order": 8.0}, "get_order": {"cancel_order": 3.0, "return_items": 1.0}},
                       starts={"find_user": 9.0})
    prior = TransitionPrior(_entries(comp), smoothing=1.0, backoff=1.0)
    ids = prior.ids
    p_start = np.exp(prior.log_prior(None))
    assert math.isclose(p_start.sum(), 1.0) and p_start[ids.index("find_user")] == pytest.approx(10 / 13)
    p_next = np.exp(prior.log_prior("find_user"))
    assert p_next[ids.index("get_order")] == pytest.approx(9 / 12)
    # cancel_order has no released transitions: the next-tool marginal (column sums) stands in
    marginal = prior.counts("cancel_order")
    assert dict(zip(ids, marginal)) == {"cancel_order": 3.0, "find_user": 0.0, "get_order": 8.0, "return_items": 1.0}
    assert (prior.counts("unknown") == marginal).all()
    # a row with fewer released transitions than ``backoff`` backs off too
    assert (TransitionPrior(_entries(comp), 1.0, backoff=5.0).counts("get_order") == marginal).all()
    with pytest.raises(ValueError, match="smoothing"):
        StepWeights(smoothing=0)


def test_counts_that_noise_alone_could_make_leave_the_prior_flat():
    # organisations whose records are sequences release every start and transition count with noise, also
    # when they hold no sequence: the merged counts are then sums of clamped noise, which the floor predicts
    from synapse_flwr.core.merge import merge_typed

    config = BuildConfig(sequences=replace(BOUNDS, floor_sds=0.0))  # an org that drops no positive count
    flat, raw, cells = 0, 0, []
    for seed in range(10):
        merged = merge_typed([build_compendium([], CATALOG, f"org{o}", epsilon=4.0, seed=seed + 100 * o,
                                               config=config, sequences=[]) for o in range(3)])
        entries = _entries(merged)
        cells += [e.stats.starts for e in entries.values()]
        cells += [c for e in entries.values() for c in [*(x.count for x in e.next_tools),
                                                         *[0.0] * (len(entries) - len(e.next_tools))]]
        floored = TransitionPrior(entries, 0.1, 1.0, prior_noise_floor(merged, 3.0))
        flat += all(np.ptp(floored.log_prior(p)) < 1e-9 for p in (None, *CATALOG.ids))
        raw += all(np.ptp(TransitionPrior(entries, 0.1, 1.0).log_prior(p)) < 1e-9 for p in (None, *CATALOG.ids))
    s = merged.privacy.sigma / merged.privacy.sequence_weight
    mean, sd_of_mean = prior_noise_floor(merged, 0.0), s * math.sqrt(3 * (0.5 - 1 / (2 * math.pi)) / len(cells))
    assert abs(np.mean(cells) - mean) < 4 * sd_of_mean, (np.mean(cells), mean)
    assert mean == pytest.approx(3 * s / math.sqrt(2 * math.pi))
    assert flat >= 8 and raw == 0  # at 3 SDs the prior of noise is flat; read as released it never is
    assert prior_noise_floor(_learned(), 3.0) == 0.0 and prior_noise_floor(None, 3.0) == 0.0  # no noise, no floor
    with pytest.raises(ValueError, match="non-negative"):
        StepWeights(floor_sds=-1.0)


def test_docs_only_is_the_router_alone():
    router = Router(None, CATALOG, embedder=TfidfEmbedder())
    items = taubench_step_items(TEST)
    scores = step_scores(router, items, docs_only=True)
    expected = router.retrieve([i.query for i in items])
    assert np.allclose(scores, expected, atol=1e-5)
    # without a compendium the prior is uniform and the lift 0: the same ranking either way
    assert rankings(step_scores(router, items), router.tool_ids) == rankings(scores, router.tool_ids)


def test_learned_transitions_and_starts_predict_every_step():
    router = Router(_learned(), CATALOG, embedder=TfidfEmbedder())
    items = taubench_step_items(TEST)
    ranked = rankings(step_scores(router, items, StepWeights(lift_first=0, lift_later=0, route=0)), router.tool_ids)
    m = step_metrics(ranked, items)
    assert m["n"] == 6 and m["tasks"] == 2
    # start -> find_user and find_user -> get_order are certain; get_order -> cancel / return is a
    # tie the prior alone cannot break (the toy tools are not tau-bench's write tools: all "read")
    assert m["by_kind"]["first"] == {"acc": 1.0, "n": 2}
    assert m["by_kind"]["read"] == {"acc": 0.75, "n": 4}
    assert m["by_kind"]["write"]["n"] == 0
    # the instruction (router score) breaks it
    with_route = step_metrics(rankings(step_scores(router, items, StepWeights(0, 0, 1.0)), router.tool_ids), items)
    assert with_route["acc"] == 1.0 and with_route["task_acc"] == 1.0
    assert set(m["by_kind"]) == set(STEP_KINDS)
    assert 0.0 <= m["task_acc"] <= m["acc"] <= m["r5"] <= 1.0


def test_the_docs_weight_adds_what_a_documentation_only_router_scores():
    items = taubench_step_items(TEST)
    router = Router(_learned(), CATALOG, embedder=TfidfEmbedder())
    added = step_scores(router, items, StepWeights(0, 0, 1.0, docs=2.0)) - step_scores(router, items, StepWeights(0, 0, 1.0))
    docs = step_scores(Router(None, CATALOG, embedder=TfidfEmbedder()), items, docs_only=True)
    assert np.allclose(added, 2.0 * docs, atol=1e-5)
    with pytest.raises(ValueError, match="non-negative"):
        StepWeights(docs=-1.0)


def test_history_never_enters_the_query():
    items = taubench_step_items(TEST)
    assert len(items) == sum(len(t.actions) for t in TEST) == 6
    assert [i.prev_tool for i in items[:3]] == [None, "find_user", "get_order"]
    assert {i.query for i in items[:3]} == {TEST[0].instruction}
    assert [i.kind for i in items[:3]] == ["first", "read", "read"]


def test_bigram_with_start_and_its_fallback():
    items = taubench_step_items(TEST)
    starts = Counter({"find_user": 2})
    pairs = Counter({("find_user", "get_order"): 2, ("get_order", "cancel_order"): 1})
    ranked = bigram_rankings(starts, pairs, CATALOG.ids, items)
    assert [r[0] for r in ranked[:3]] == ["find_user", "get_order", "cancel_order"]
    # a previous tool never seen as a source: the next-tool marginal (get_order, then cancel_order)
    odd = [items[0].__class__(query="q", prev_tool="return_items", gold="get_order", task_id=9, step=1)]
    assert bigram_rankings(starts, pairs, CATALOG.ids, odd)[0][:2] == ["get_order", "cancel_order"]


def test_oracle_set_and_task_level_view():
    items = taubench_step_items(TEST)
    ranked = [["get_order", "find_user"]] * len(items)
    allowed = [{"find_user"} if i.step == 0 else {i.gold} for i in items]
    assert step_metrics(rankings(np.tile([0.0, 2.0, 1.0, 0.5], (6, 1)), CATALOG.ids, allowed), items)["acc"] == 1.0
    m = step_metrics(ranked, items)
    assert m["acc"] == pytest.approx(2 / 6) and m["task_acc"] == 0.0


# --------------------------------------------------------------------------- protocol


def test_folds_hold_out_every_test_task_once_and_never_a_train_task():
    ids = fold_ids(10, 5, seed=3)
    assert sorted(Counter(ids).values()) == [2] * 5 and ids == fold_ids(10, 5, seed=3) != fold_ids(10, 5, seed=4)
    folds = make_folds(TRAIN, TEST, "cv", 3, orgs=2, seed=1, train_sequences=False)
    held = [s.task_id for f in folds for s in f.test]
    assert sorted(set(held)) == [0, 1]  # task 2 has no calls, hence no steps
    for fold in folds:
        test_queries = {s.query for s in fold.test}
        assert not test_queries & {r.query for r in fold.records}
        assert set(fold.orgs) <= {0, 1}
        # train records count as calls only; other-fold test tasks as sequences
        assert sum(fold.sequenced) == len(fold.records) - len(TRAIN)
    only = make_folds(TRAIN, TEST, "train_only", 3, orgs=2, seed=1, train_sequences=True)
    assert len(only) == 1 and all(only[0].sequenced) and len(only[0].test) == 6


def test_targets_and_summary_read_the_cross_validated_block():
    def arm(acc: float, kinds: tuple[float, float, float]) -> dict:
        return {"acc": acc, "by_kind": {k: {"acc": v} for k, v in zip(STEP_KINDS, kinds)}}

    cv = {"steps": 582, "arms": {"federated": arm(0.61, (0.7, 0.7, 0.3)), "federated_private": arm(0.5, (0, 0, 0)),
                                 "docs_only": arm(0.12, (0.2, 0.03, 0.35)), "bigram_start": arm(0.55, (0, 0, 0))}}
    met = {t["target"]: t["met"] for t in targets(cv)}
    assert met["federated per-step top-1"] and not met["federated_private per-step top-1 (epsilon 4)"]
    assert not met["no harm: federated - docs_only (write steps)"] and met["no harm: federated - docs_only (read steps)"]
    shifted = {"arms": {"federated": arm(0.13, (0.2, 0.04, 0.36)), "federated_private": arm(0.14, (0.1, 0.1, 0.4)),
                        "docs_only": arm(0.12, (0.2, 0.03, 0.35))}}
    worst = {t["target"]: t["value"] for t in targets(cv, shifted) if "worst" in t["target"]}
    assert worst == {  # the smallest margin over docs_only, overall or on one step kind
        "no harm, cross-validated: federated_private - docs_only (worst of overall and each step kind)": -0.35,
        "no harm, train-only: federated - docs_only (worst of overall and each step kind)": 0.0,
        "no harm, train-only: federated_private - docs_only (worst of overall and each step kind)": -0.1}
    assert summary(cv) == {"steps": 582, "federated_step_cv": 0.61, "federated_private_step_cv_eps4": 0.5,
                           "docs_only_step_cv": 0.12, "bigram_start_step_cv": 0.55}


# --------------------------------------------------------------------------- real data


def _data_missing() -> str | None:
    try:
        root = data_dir()
    except SynapseError as exc:
        return f"benchmark data not found ({exc})"
    return None if (root / "taubench-retail").is_dir() else f"no taubench-retail/ in {root}"


@pytest.mark.data
@pytest.mark.skipif(_data_missing() is not None, reason=str(_data_missing()))
def test_real_data_smoke():
    catalog, test = load_taubench(split="test")
    few = [t for t in test if t.actions][:5]
    items = taubench_step_items(few)
    router = Router(None, catalog, embedder=TfidfEmbedder())
    m = step_metrics(rankings(step_scores(router, items, docs_only=True), router.tool_ids), items)
    assert m["n"] == sum(len(t.actions) for t in few)
    assert sum(v["n"] for v in m["by_kind"].values()) == m["n"]
