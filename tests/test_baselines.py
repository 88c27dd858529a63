"""Baseline arms on a tiny synthetic catalog: the SVM classifier and FedAvg + DP-SGD through Flower."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from synapse_flwr.core.catalog import Catalog, ToolDoc
from synapse_flwr.core.embed import TfidfEmbedder
from synapse_flwr.core.experience import Event, TestItem
from synapse_flwr.eval.baselines import (
    calibrate_noise,
    fedavg_dp_arm,
    ranking_metrics,
    tfidf_svm_arm,
    tfidf_svm_scores,
)
from synapse_flwr.flower.fedavg_dp import aggregate_train_metrics

# Descriptions share no word with the queries: the untrained head (description
# retrieval) cannot tell the tools apart, a trained map can.
CATALOG = Catalog(tuple(
    ToolDoc(tool_id=t, name=t, description=d) for t, d in (
        ("book_hotel", "bravo"),
        ("convert_currency", "charlie"),
        ("get_weather", "alpha"),
        ("translate_text", "delta"),  # no training events: the unseen tool
    )
))
WORDS = {
    "get_weather": ["rain", "sunny", "forecast", "umbrella"],
    "book_hotel": ["room", "reserve", "night", "suite"],
    "convert_currency": ["dollars", "euros", "exchange", "yen"],
}
CITIES = ["paris", "rome", "berlin", "oslo", "lima"]
UNSEEN = [TestItem(query="please say this in french", gold=("translate_text",))]


def toy_events(n: int, seed: int, org: str = "a") -> list[Event]:
    """``n`` separable labelled events (two keywords of the tool, one shared city)."""
    rng = random.Random(seed)
    events = []
    for _ in range(n):
        tool = rng.choice(sorted(WORDS))
        query = " ".join([*rng.sample(WORDS[tool], 2), rng.choice(CITIES)])
        events.append(Event(query=query, tool=tool, success=True, gold=tool, org=org))
    return events


def toy_test(n: int, seed: int) -> list[TestItem]:
    return [TestItem(query=e.query, gold=(e.tool,)) for e in toy_events(n, seed)]


@pytest.fixture(scope="module")
def embedder() -> TfidfEmbedder:
    texts = [e.query for e in toy_events(200, 99)] + [d.description for d in CATALOG.tools]
    return TfidfEmbedder().fit([*texts, UNSEEN[0].query])


def test_svm_separates_seen_tools_and_never_predicts_unseen() -> None:
    # one fit scores every test set
    out = tfidf_svm_arm(toy_events(60, 1), CATALOG, {"seen": toy_test(30, 2), "unseen": UNSEEN, "none": []})
    assert out == {"seen": {"acc": 1.0, "r5": 1.0, "n": 30}, "unseen": {"acc": 0.0, "r5": 0.0, "n": 1},
                   "none": {"acc": 0.0, "r5": 0.0, "n": 0}}


def test_svm_scores_do_not_depend_on_numpy_s_global_random_state() -> None:
    """A rerun of the classifier gives the same scores (unseeded, its solver differed by ~3e-5 here)."""
    events = toy_events(60, 1)
    queries, labels = [e.query for e in events], [e.tool for e in events]
    np.random.seed(1)
    first, _ = tfidf_svm_scores(queries, labels, queries[:20])
    np.random.seed(2)
    again, _ = tfidf_svm_scores(queries, labels, queries[:20])
    assert np.array_equal(first, again)


def test_svm_reads_chinese_as_words() -> None:
    # Without spaces a whole query would be one TF-IDF token: no test query would share one.
    queries = ["北京明天天气怎么样", "上海后天的天气预报", "今天有什么新闻", "体育新闻头条"]
    scores, classes = tfidf_svm_scores(queries, ["get_weather"] * 2 + ["news"] * 2, ["广州天气", "财经新闻"])
    assert [classes[i] for i in scores.argmax(axis=1)] == ["get_weather", "news"]


def test_svm_weights_are_capped_to_the_most_frequent_features(monkeypatch, caplog) -> None:
    from synapse_flwr.eval import baselines

    queries = ["weather in paris today", "weather forecast rome", "weather tomorrow oslo",
               "latest news headlines", "news about sport", "news from berlin"]
    labels = ["get_weather"] * 3 + ["news"] * 3
    monkeypatch.setattr(baselines, "SVM_WEIGHT_BYTES", 8 * 2 * 2)  # two classes: room for two features
    with caplog.at_level("INFO", logger=baselines.log.name):
        scores, classes = tfidf_svm_scores(queries, labels, ["weather in madrid", "news of the day"])
    assert "the 2 most frequent features are kept" in caplog.text
    # the two kept are the most frequent words, which still tell the tools apart
    assert [classes[i] for i in scores.argmax(axis=1)] == ["get_weather", "news"]


def test_svm_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="at least 2 tools"):
        tfidf_svm_arm([e for e in toy_events(30, 1) if e.tool == "book_hotel"], CATALOG, {"test": UNSEEN})
    with pytest.raises(ValueError, match="C must be"):
        tfidf_svm_arm(toy_events(30, 1), CATALOG, {"test": UNSEEN}, C=0.0)
    failed = [Event(query="x y", tool="book_hotel", success=False)]
    with pytest.raises(ValueError, match="at least 2 tools"):
        tfidf_svm_arm(failed, CATALOG, {"test": UNSEEN})


def test_ranking_metrics_match_router_semantics() -> None:
    scores = np.array([[0.1, 0.9, 0.5], [0.8, 0.1, 0.2]])
    test = [TestItem(query="q", gold=("b",)), TestItem(query="q", gold=("c", "x"))]
    assert ranking_metrics(scores, ["a", "b", "c"], test, k=2) == {"acc": 0.5, "r5": 1.0, "n": 2}
    assert ranking_metrics(np.zeros((0, 3)), ["a", "b", "c"], []) == {"acc": 0.0, "r5": 0.0, "n": 0}


def test_aggregate_takes_max_epsilon_and_weighted_loss() -> None:
    from flwr.app import MetricRecord, RecordDict

    recs = [RecordDict({"m": MetricRecord({"num-examples": n, "loss": l, "epsilon": e})})
            for n, l, e in ((1, 1.0, 2.0), (3, 3.0, 1.0))]
    out = aggregate_train_metrics(recs, "num-examples")
    assert out["loss"] == pytest.approx(2.5) and out["epsilon"] == 2.0
    assert out["orgs"] == 2 and out["num-examples"] == 4


# One Ray actor for all organisations: on a small machine that starts fastest.
ONE_ACTOR = {"client_resources": {"num_cpus": 2, "num_gpus": 0.0}, "init_args": {"num_cpus": 2}}


def orgs() -> list[list[Event]]:
    return [toy_events(40, 10 + i, org=f"o{i}") for i in range(3)]


def test_fedavg_learns_through_flower_without_noise(embedder: TfidfEmbedder, capfd: pytest.CaptureFixture) -> None:
    out = fedavg_dp_arm(orgs(), CATALOG, toy_test(40, 3), epsilon=math.inf, delta=1e-5, rounds=2,
                        embedder=embedder, batch_size=8, learning_rate=0.05,
                        extra_tests={"heldout": UNSEEN}, backend_config=ONE_ACTOR)
    assert out["init_acc"] < 0.6  # descriptions alone do not separate the tools
    assert out["acc"] > out["init_acc"] and out["acc"] >= 0.9
    assert out["epsilon_spent"] == math.inf and out["noise_multipliers"] == [0.0] * 3
    assert out["rounds"] == 2 and out["n"] == 40
    assert set(out["extra"]["heldout"]) >= {"acc", "r5", "n", "init_acc", "init_r5"}
    # Flower's per-round INFO lines from the child interpreter stay out of the caller's output, and so do its
    # warnings about the baseline's own choices (the deprecated run_simulation, no federated evaluation)
    output = "".join(capfd.readouterr())
    assert "[ROUND" not in output and "DEPRECATED FEATURE" not in output and "fraction_evaluate" not in output
    assert "Manually terminating" not in output  # each Ray actor's end, forwarded by Ray


def test_fedavg_spends_at_most_its_budget(embedder: TfidfEmbedder) -> None:
    out = fedavg_dp_arm(orgs(), CATALOG, toy_test(20, 4), epsilon=4.0, delta=1e-5, rounds=2,
                        embedder=embedder, batch_size=8, seed=1, backend_config=ONE_ACTOR)
    # The accountant history survives across rounds in the node state: the
    # spend after round 2 is the whole planned schedule, close to the target.
    assert 0.9 * 4.0 <= out["epsilon_spent"] <= 4.0 * 1.01
    assert all(z > 0 for z in out["noise_multipliers"])
    assert 0.0 <= out["acc"] <= 1.0 and out["delta"] == 1e-5


@pytest.mark.parametrize("kwargs, match", [
    ({"epsilon": 0.0}, "epsilon"),
    ({"epsilon": math.nan}, "epsilon"),
    ({"delta": 1.0}, "delta"),
    ({"rounds": 0}, "rounds"),
    ({"rounds": 1.5}, "rounds"),
    ({"local_epochs": 0}, "local_epochs"),
    ({"batch_size": 0}, "batch_size"),
    ({"learning_rate": -1.0}, "learning_rate"),
    ({"max_grad_norm": math.inf}, "max_grad_norm"),
    ({"temperature": 0.0}, "temperature"),
])
def test_fedavg_rejects_bad_arguments(embedder: TfidfEmbedder, kwargs: dict, match: str) -> None:
    args = {"epsilon": 1.0, "delta": 1e-5, "rounds": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        fedavg_dp_arm(orgs(), CATALOG, UNSEEN, embedder=embedder, **args)


def test_fedavg_rejects_bad_data(embedder: TfidfEmbedder) -> None:
    with pytest.raises(ValueError, match="no organisations"):
        fedavg_dp_arm([], CATALOG, UNSEEN, 1.0, 1e-5, 1, embedder=embedder)
    with pytest.raises(ValueError, match="organisation 1 has no labelled events"):
        fedavg_dp_arm([toy_events(5, 1), []], CATALOG, UNSEEN, 1.0, 1e-5, 1, embedder=embedder)
    with pytest.raises(ValueError, match="fit first"):
        fedavg_dp_arm(orgs(), CATALOG, UNSEEN, 1.0, 1e-5, 1, embedder=TfidfEmbedder())
    with pytest.raises(ValueError, match="cannot calibrate"):
        calibrate_noise(10, 10, 10**6, 1e-6, 1e-12)


def test_in_process_fedavg_learns_and_spends_at_most_its_budget(embedder: TfidfEmbedder) -> None:
    from synapse_flwr.eval.baselines import fedavg_job, fedavg_results
    from synapse_flwr.flower.fedavg_dp import TrainSettings, run_in_process

    splits = {"test": toy_test(40, 3), "heldout": UNSEEN}
    for epsilon, lr in ((math.inf, 0.05), (4.0, 1e-3)):
        settings = TrainSettings(8, 1, lr, 1.0, 0.05, 1e-5, 1)
        job = fedavg_job(orgs(), CATALOG, splits, embedder, settings, epsilon, 2)
        outcome = run_in_process(job)
        out = fedavg_results(outcome, job, ["heldout"], 0.0)
        assert sorted(outcome.evaluations) == [0, 1, 2] and outcome.train[2]["orgs"] == 3
        if math.isinf(epsilon):
            assert out["init_acc"] < 0.6 and out["acc"] >= 0.9 and out["epsilon_spent"] == math.inf
        else:
            assert 0.9 * 4.0 <= out["epsilon_spent"] <= 4.0 * 1.01


def test_flowers_notices_about_the_baselines_own_choices_are_filtered() -> None:
    import inspect
    import logging

    from flwr.simulation.ray_transport.ray_actor import VirtualClientEngineActor

    from synapse_flwr.flower.fedavg_dp import _not_chosen

    # each Ray actor's end, which Ray forwards to the caller's output, as Flower writes it
    assert '"Manually terminating %s"' in inspect.getsource(VirtualClientEngineActor.terminate)
    notice = logging.LogRecord("flwr", logging.WARNING, "", 0, "Manually terminating %s", ("ClientAppActor",), None)
    error = logging.LogRecord("flwr", logging.ERROR, "", 0, "ClientApp raised: %s", ("boom",), None)
    assert not _not_chosen(notice) and _not_chosen(error)


def test_the_baselines_recall_is_at_the_k_asked_for(embedder: TfidfEmbedder) -> None:
    """Regression: both baselines ranked their top 5 whatever ``k`` (the experiment's tables say recall@k)."""
    import json
    import tempfile
    from pathlib import Path

    from synapse_flwr.eval.baselines import fedavg_job
    from synapse_flwr.flower.fedavg_dp import JOB_FILE, TrainSettings, run_in_process

    # queries of one tool whose gold is another: never first, always within 5 of the 3 labelled tools
    wrong = [TestItem(query=e.query, gold=("book_hotel" if e.tool != "book_hotel" else "get_weather",))
             for e in toy_events(20, 5)]
    at5, at1 = (tfidf_svm_arm(toy_events(60, 1), CATALOG, {"wrong": wrong}, k=k)["wrong"] for k in (5, 1))
    assert at5["acc"] == at1["acc"] == at1["r5"] == 0.0 and at5["r5"] == 1.0
    settings = TrainSettings(8, 1, 0.05, 1.0, 0.05, 1e-5, 1)
    for k, below_all in ((1, True), (4, False)):
        job = fedavg_job(orgs(), CATALOG, {"test": toy_test(20, 3)}, embedder, settings, math.inf, 1, k=k)
        for by_split in run_in_process(job).evaluations.values():
            m = by_split["test"]
            assert (m["r5"] == m["acc"]) if below_all else m["r5"] == 1.0  # 4 tools: all within 4
    with tempfile.TemporaryDirectory() as tmp:  # the job folder the Flower ServerApp reads carries k
        assert json.loads((job.save(Path(tmp)) / JOB_FILE).read_text())["k"] == 4
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        fedavg_dp_arm(orgs(), CATALOG, UNSEEN, 1.0, 1e-5, 1, embedder=embedder, k=0)
