"""Tests for synapse_flwr.core.progress and the long loops that report through it."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from synapse_flwr.core.embed import MeanPoolEmbedder
from synapse_flwr.core.progress import PROGRESS_EVERY_S, Progress, format_duration

LOGGER = "synapse_flwr.tests.progress"


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make(total: int, clock: FakeClock) -> Progress:
    return Progress("embedding", total, unit="texts", logger=logging.getLogger(LOGGER), clock=clock)


def test_a_short_job_logs_nothing(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    p = make(5000, clock)
    for _ in range(50):
        clock.now += 0.5  # 25 s in all: under the period
        p.advance(100)
    p.done()
    assert messages(caplog) == []


def test_a_long_job_logs_counts_percent_and_time_left(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    p = make(5000, clock)
    clock.now += 10
    p.advance(400)
    assert messages(caplog) == []
    clock.now += 20  # 30 s in: 1,200 texts at 40/s, 3,800 left take ~95 s
    p.advance(800)
    assert messages(caplog) == ["embedding: 1,200/5,000 texts (24%), ~2m left"]
    clock.now += 29  # the period counts from the last line, not the start
    p.advance(100)
    assert len(messages(caplog)) == 1
    clock.now += 1
    p.advance(100)
    assert messages(caplog)[-1] == "embedding: 1,400/5,000 texts (28%), ~3m left"  # 154 s
    clock.now += 5
    p.advance(3600)
    clock.now += 100
    p.done()
    assert messages(caplog)[-1] == "embedding: 5,000/5,000 texts (100%), done in 3m"
    assert len(messages(caplog)) == 3


def test_no_time_left_without_progress_and_no_percent_without_total(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    stalled = make(10, clock)
    clock.now += PROGRESS_EVERY_S
    stalled.advance(0)
    empty = make(0, clock)
    clock.now += PROGRESS_EVERY_S
    empty.advance(0)
    assert messages(caplog) == ["embedding: 0/10 texts (0%)", "embedding: 0/0 texts"]


def test_negative_total_is_refused_with_the_value(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="must be >= 0, got -3"):
        make(-3, clock)


@pytest.mark.parametrize(("seconds", "text"), [(-2, "0s"), (44.6, "45s"), (95, "2m"), (3599, "1h00m"),
                                               (3900, "1h05m")])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


# --- the loops that report -------------------------------------------------------


class FakeTokenizer:
    """Turns each text into its characters' codes, padded to the batch's longest."""

    def __call__(self, texts: list[str], **_: Any) -> dict[str, Any]:
        import torch

        width = max(map(len, texts))
        ids = torch.zeros((len(texts), width), dtype=torch.long)
        mask = torch.zeros((len(texts), width), dtype=torch.long)
        for row, text in enumerate(texts):
            ids[row, : len(text)] = torch.tensor([ord(c) for c in text])
            mask[row, : len(text)] = 1
        return {"input_ids": ids, "attention_mask": mask}


class FakeModel:
    """Hidden states of width 4 made from the token codes; records each batch size."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def __call__(self, input_ids: Any, attention_mask: Any) -> Any:
        import torch

        self.batches.append(int(input_ids.shape[0]))
        x = input_ids.to(torch.float32).unsqueeze(-1)
        return type("Out", (), {"last_hidden_state": torch.cat([x, x + 1, -x, torch.ones_like(x)], -1)})()


def fake_embedder(tmp_path: Path, batch_size: int) -> tuple[MeanPoolEmbedder, FakeModel]:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 4}))
    emb = MeanPoolEmbedder("fake-meanpool", tmp_path, batch_size=batch_size)
    model = FakeModel()
    emb._tokenizer, emb._model = FakeTokenizer(), model  # loaded: _load never runs
    return emb, model


def progress_lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == logging.INFO]


def test_mean_pool_encode_reports_progress_per_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("synapse_flwr.core.progress.PROGRESS_EVERY_S", 0.0)
    caplog.set_level(logging.INFO, logger="synapse_flwr.core.embed")
    emb, model = fake_embedder(tmp_path, batch_size=2)
    texts: Sequence[str] = ["a", "bcd", "ef", "ghij", "k"]
    vectors = emb.encode(texts)
    assert model.batches == [2, 2, 1]
    assert vectors.shape == (5, 4)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    lines = progress_lines(caplog, "synapse_flwr.core.embed")
    assert len(lines) == 4
    assert lines[0].startswith("fake-meanpool embedding: 2/5 texts (40%), ~")
    assert lines[1].startswith("fake-meanpool embedding: 4/5 texts (80%), ~")
    assert lines[2] == "fake-meanpool embedding: 5/5 texts (100%)"
    assert lines[3].startswith("fake-meanpool embedding: 5/5 texts (100%), done in ")


def test_mean_pool_encode_is_quiet_when_short(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="synapse_flwr.core.embed")
    emb, _ = fake_embedder(tmp_path, batch_size=2)
    emb.encode(["a", "bcd", "ef"])
    assert progress_lines(caplog, "synapse_flwr.core.embed") == []


class CharTokenizer:
    """Encodes a text as its characters' codes; no BOS token."""

    bos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def test_channel_scores_report_progress_per_tool_entry(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from synapse_flwr.core import llm

    monkeypatch.setattr("synapse_flwr.core.progress.PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(llm, "load_local_model", lambda name: llm.LocalModel(name, None, CharTokenizer(), 0.0))
    monkeypatch.setattr(llm, "_continuation_logliks", lambda lm, ctx, conts, red, bs: [float(-len(c)) for c in conts])
    caplog.set_level(logging.INFO, logger="synapse_flwr.core.llm")
    pairs = [("tool a", " x"), ("tool b", " yy"), ("tool a", " zzz")]
    assert llm.channel_scores("smollm2", pairs) == [-2.0, -3.0, -4.0]
    lines = progress_lines(caplog, "synapse_flwr.core.llm")
    assert lines[0].startswith("local/smollm2 channel scores: 2/3 pairs (66%), ~")
    assert lines[1] == "local/smollm2 channel scores: 3/3 pairs (100%)"
    assert lines[2].startswith("local/smollm2 channel scores: 3/3 pairs (100%), done in ")
