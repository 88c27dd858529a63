"""Example requests for a catalog's tools, written by an LLM from the catalog alone.

A tool's documentation says what it does; users ask in their own words. A
few example requests per tool, written by any LLM from the tool's name and
description (public text in, public text out: nothing private is read),
move the tool's documentation vector toward the way requests are phrased
(the router's :data:`~synapse_flwr.core.router.EXAMPLE_WEIGHT`). They are
part of the documentation: every arm that reads the catalog, docs_only
included, reads them. They are kept in ``examples.json`` beside the catalog
(tool name -> list of requests), which :func:`~synapse_flwr.core.catalog.load_catalog`
reads; ``synapse examples`` writes it.

The prompt is a few-shot transcript of two invented tools, continued by the
model (an assistant prefill); completions are sampled, cut at the first
line, and kept only when they are new, not an echo of the shots or the
description, and do not read as an instruction.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed

from synapse_flwr.core.catalog import MAX_EXAMPLES, Catalog, ToolDoc
from synapse_flwr.core.phrases import normalize_text
from synapse_flwr.core.sanitize import instruction_like, neutralise
from synapse_flwr.core.schema import MAX_TEXT

log = logging.getLogger(__name__)

#: Requests asked of the model per tool.
PER_TOOL = 6
#: Characters of a tool's description put in the prompt.
PROMPT_DESCRIPTION = 400
SHOTS = (
    ("weather_now", "Gives the current weather and the forecast for a city.",
     "what's the weather like in Lisbon this afternoon?"),
    ("recipe_finder", "Finds recipes from the ingredients you have at home.",
     "I have eggs, spinach and feta, what can I cook tonight?"),
)
_SHOT_REQUESTS = frozenset(normalize_text(r) for _, _, r in SHOTS)
MIN_CHARS = 8


def example_messages(tool: ToolDoc) -> list[dict[str, str]]:
    """The few-shot prompt for one tool, as an instruction and an assistant prefill.

    The catalog's name and description are shown as the reranker shows them (:func:`neutralise`): on one
    line, a description that reads as an instruction to the model replaced by a marker (it steered the
    requests written, which retrieval then reads as the tool's documentation).
    """
    shots = "".join(f"Tool: {n}\nDescription: {d}\nRequest: {r}\n\n" for n, d, r in SHOTS)
    description = neutralise(tool.description[:PROMPT_DESCRIPTION])
    text = f"{shots}Tool: {neutralise(tool.name)}\nDescription: {description}\nRequest:"
    return [{"role": "user", "content": "Write example requests that users send to these tools."},
            {"role": "assistant", "content": text}]


# what a chat model writes around or instead of a request, in full: a refusal ("I'm sorry, but I can't help with
# that", "I can't assist with ..."), a word on itself ("As an AI language model"), a preamble ("Sure! Here are some
# example requests:", any line ending in a colon); a user's "I can't log in" or "Sorry, I locked myself out" is a
# request. Typographic apostrophes read as ASCII ones (chat models write "I’m sorry").
_NOT_A_REQUEST = re.compile(
    r"^\W*(?:i'?m |i am )?sorry,? but\b|^\W*i (?:can'?t|cannot|am unable to|'m unable to|won'?t) (?:help|assist|"
    r"provide|generate|create|write|comply|fulfil)|\bas an ai\b|\bas a (?:large )?language model\b"
    r"|^\W*(?:sure|certainly|of course)\b\W|[:\uff1a]\W*$", re.IGNORECASE)
_APOSTROPHES = str.maketrans(dict.fromkeys("\u2018\u2019\u02bc", "'"))


def clean_examples(texts: list[str], tool: ToolDoc, limit: int = MAX_EXAMPLES) -> list[str]:
    """The usable requests among a model's completions, in order.

    A completion is cut at its first line and kept when it has at least
    :data:`MIN_CHARS` characters, is new (after normalisation), is neither a
    shot's request nor the tool's own description, does not read as an
    instruction to a model, nor as a refusal or a preamble (a chat model's
    "I'm sorry, ..." or "Here are some example requests:").
    """
    seen = set(_SHOT_REQUESTS) | {normalize_text(tool.description)}
    out = []
    for text in texts:
        line = " ".join(text.strip().split("\n", 1)[0].split())[:MAX_TEXT]
        key = normalize_text(line)
        if (len(line) < MIN_CHARS or key in seen or instruction_like(line)
                or _NOT_A_REQUEST.search(line.translate(_APOSTROPHES))):
            continue
        seen.add(key)
        out.append(line)
    return out[:limit]


def without_shared(table: dict[str, list[str]]) -> dict[str, list[str]]:
    """``table`` less every request written for two or more tools (a generic reply, not one tool's request).

    Such a request would document two tools alike; one refusal written for every tool documented them all.
    """
    owners = Counter(key for requests in table.values() for key in {normalize_text(r) for r in requests})
    shared = {key for key, n in owners.items() if n > 1}
    if shared:
        log.warning("%d requests were written for more than one tool and are left out (e.g. %r)", len(shared),
                    next(r for requests in table.values() for r in requests if normalize_text(r) in shared))
    return {tool: [r for r in requests if normalize_text(r) not in shared] for tool, requests in table.items()}


def generate_examples(
    catalog: Catalog,
    model: str,
    per_tool: int = PER_TOOL,
    seed: int = 0,
    temperature: float = 0.8,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, list[str]]:
    """Example requests for every tool of a catalog (tool name -> requests).

    Parameters
    ----------
    catalog : Catalog
        The tools; only their names and descriptions are read.
    model : str
        litellm model string (``local/smollm2``, or any hosted model).
    per_tool : int
        Completions sampled per tool (fewer are kept when some are unusable).
    seed : int
        Sampling seed (combined with the tool's position).
    temperature : float
        Sampling temperature (> 0, so the completions differ).
    progress : callable or None
        Called with (tools done, tools) after each tool.

    Raises
    ------
    LLMError
        When the model cannot be called (the first failure stops the run).
    """
    from synapse_flwr.core.llm import calls_at_once, register_local_provider, sample

    register_local_provider()

    def write(i: int, tool: ToolDoc) -> list[str]:
        texts = sample(model, example_messages(tool), per_tool, temperature=temperature, top_p=0.95,
                       max_tokens=40, stop=["\n"], seed=seed + i)
        return clean_examples(texts, tool)

    found: dict[str, list[str]] = {}
    start = time.perf_counter()
    # a hosted model writes several tools' requests at once (each tool keeps its own seed)
    with ThreadPoolExecutor(max_workers=calls_at_once(model)) as pool:
        asked = {pool.submit(write, i, tool): tool.name for i, tool in enumerate(catalog.tools)}
        try:
            for done in as_completed(asked):
                found[asked[done]] = done.result()
                if progress:
                    progress(len(found), len(catalog.tools))
        except BaseException:
            pool.shutdown(cancel_futures=True)  # the first failure stops the run
            raise
    out = without_shared({tool.name: found[tool.name] for tool in catalog.tools})
    log.info("wrote %d example requests for %d tools with %s in %.0f s", sum(map(len, out.values())), len(out),
             model, time.perf_counter() - start)
    return out
