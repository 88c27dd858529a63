"""Tests for synapse_flwr.core.llm: choice parsing, offline hosted path, local model (slow)."""

from __future__ import annotations

import os

# Before anything imports litellm: keep it off the network and models off the hub.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from collections.abc import Iterator
from typing import Any

import litellm
import pytest
import torch
from litellm.llms.custom_llm import CustomLLM
from litellm.types.llms.custom_llm import CustomLLMItem

from synapse_flwr.core import llm

HOSTED = "openai/gpt-4o-mini"  # never reached: every hosted call here is mocked
MSGS = [{"role": "user", "content": "Say hi."}]
TOOLS = ["get_weather", "get_weather_forecast", "book_hotel", "send_email"]


# --- parse_choice ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("book_hotel", 2),
        ('  "Book_Hotel".  ', 2),
        ("2", 1),
        ("(4)", 3),
        ("Answer: 3", 2),
        ("The answer is 1", 0),
        ("I would use send_email for this.", 3),
        ("get_weather_forecast", 1),  # not the shorter get_weather it contains
        ("Use get_weather_forecast, it fits best", 1),
        ("book_hotel, then send_email", 2),  # earliest mention wins
        ("book hotel", 2),  # separators ignored
        ("get_wether_forcast", 1),  # fuzzy
        ("9", None),  # out of range
        ("no idea", None),
        ("", None),
    ],
)
def test_parse_choice(text: str, expected: int | None) -> None:
    assert llm.parse_choice(text, TOOLS) == expected


def test_parse_choice_prefers_exact_numeric_names() -> None:
    assert llm.parse_choice("3", ["1", "3", "5"]) == 1


# --- hosted code path, offline ------------------------------------------------------


def test_complete_hosted_via_litellm_mock() -> None:
    assert llm.complete(HOSTED, MSGS, mock_response="hello there") == "hello there"


def test_complete_wraps_provider_errors() -> None:
    with pytest.raises(llm.LLMError, match=r"gpt-4o-mini.*Timeout"):
        llm.complete(HOSTED, MSGS, timeout=1, mock_timeout=True)


def test_score_choices_hosted_one_hot_and_parse_failures() -> None:
    before = llm.SCORE_STATS["parse_failures"]
    assert llm.score_choices(HOSTED, "Which tool?", TOOLS, mock_response="Answer: 3") == [
        0.0,
        0.0,
        1.0,
        0.0,
    ]
    assert llm.score_choices(HOSTED, "Which tool?", TOOLS, mock_response="dunno") == [0.25] * 4
    assert llm.SCORE_STATS["parse_failures"] == before + 1


class EchoProvider(CustomLLM):
    """A stand-in hosted provider: echoes the last user message, or fails on request."""

    def completion(self, *args: Any, **kwargs: Any) -> litellm.ModelResponse:
        text = kwargs["messages"][-1]["content"]
        if "FAIL" in text:
            raise RuntimeError("upstream exploded")
        response: litellm.ModelResponse = kwargs["model_response"]
        response.choices[0].message.content = f"echo: {text.splitlines()[-1]}"
        return response


@pytest.fixture
def echo_provider() -> Iterator[None]:
    entry: CustomLLMItem = {"provider": "echotest", "custom_handler": EchoProvider()}
    litellm.custom_provider_map.append(entry)
    yield
    litellm.custom_provider_map.remove(entry)


@pytest.mark.usefixtures("echo_provider")
def test_custom_provider_dispatch_and_errors() -> None:
    assert llm.complete("echotest/any", MSGS) == "echo: Say hi."
    with pytest.raises(llm.LLMError, match=r"echotest/any.*upstream exploded"):
        llm.complete("echotest/any", [{"role": "user", "content": "FAIL"}])


def test_local_provider_registered_once() -> None:
    llm.register_local_provider()
    providers = [p["provider"] for p in litellm.custom_provider_map]
    assert providers.count(llm.LOCAL_PROVIDER) == 1


def test_unknown_local_model_and_empty_choices() -> None:
    with pytest.raises(llm.LLMError, match="local/smollm2"):
        llm.local_gguf_path("llama-70b")
    with pytest.raises(ValueError, match="at least one"):
        llm.score_choices("local/smollm2", "prompt", [])


def test_gguf_located_without_importing_package() -> None:
    path = llm.local_gguf_path("smollm2")
    assert path.suffix == ".gguf" and path.is_file()


# --- local model (slow) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def local_model() -> llm.LocalModel:
    return llm.load_local_model("smollm2")


@pytest.mark.slow
def test_litellm_completion_local_model(local_model: llm.LocalModel) -> None:
    response = litellm.completion(
        model="local/smollm2",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        timeout=60,
    )
    text = response.choices[0].message.content
    assert isinstance(text, str) and text.strip()
    assert response.model == "local/smollm2"
    assert 0 < response.usage.completion_tokens <= 12
    follow_up = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": text},
        {"role": "user", "content": "Repeat just the city name."},
    ]
    assert llm.complete("local/smollm2", follow_up, max_tokens=8).strip()


@pytest.mark.slow
def test_score_choices_prefers_right_answer(local_model: llm.LocalModel) -> None:
    prompt = (
        "Q: What is the capital of Peru?\nA: Lima\n"
        "Q: What is the capital of Japan?\nA: Tokyo\n"
        "Q: What is the capital of France?\nA:"
    )
    choices = [" Berlin", " Paris", " banana bread"]
    scores = llm.score_choices("local/smollm2", prompt, choices)
    assert max(range(3), key=scores.__getitem__) == 1
    # A trailing space on the prompt moves onto the choices: same scores.
    stripped = [c.lstrip() for c in choices]
    assert llm.score_choices("local/smollm2", prompt + " ", stripped) == pytest.approx(
        scores, abs=1e-4
    )


@pytest.mark.slow
def test_shared_prefix_cache_matches_full_forward(local_model: llm.LocalModel) -> None:
    tok, model = local_model.tokenizer, local_model.model
    prompt, choices = "The sky is", [" blue", " made of green cheese"]
    # One choice per chunk for sums, both in one padded chunk for means.
    sums = llm.loglik_scores("smollm2", prompt, choices, reduction="sum", batch_size=1)
    means = llm.loglik_scores("smollm2", prompt, choices, reduction="mean", batch_size=2)
    ctx = tok.encode(prompt, add_special_tokens=False)
    for choice, total, mean in zip(choices, sums, means, strict=True):
        cont = tok.encode(choice, add_special_tokens=False)
        with torch.inference_mode():
            lp = torch.log_softmax(model(input_ids=torch.tensor([ctx + cont])).logits[0], -1)
        full = sum(float(lp[len(ctx) - 1 + j, t]) for j, t in enumerate(cont))
        assert total == pytest.approx(full, abs=1e-3)
        assert mean == pytest.approx(full / len(cont), abs=1e-3)
