"""Router: retrieve k candidate tools for a query, then pick one by reading their fields.

Retrieval is hybrid, built so that pooled scenarios cannot drown tools that
only have documentation:

* dense: every tool's description is a vector in a faiss inner-product
  index, and so is every pooled ``when`` scenario (pointing at its tool);
* lexical: per tool, the likelihood that a query mentions each phrase,
  estimated from released phrase supports over the tool's calls and smoothed
  toward its description (:class:`~synapse_flwr.core.phrase_profile.PhraseProfile`).

* prototypes: per tool, the DP sum of the unit embeddings of the queries it
  served (:mod:`synapse_flwr.core.prototypes`).

Experience only adds to each tool's documentation score, gated per query
(:mod:`synapse_flwr.core.fusion`).

Rerankers choose among ``k`` candidates: retrieval's top ``k``, holding the
documentation's best ``DOCS_CANDIDATES`` tools (:func:`candidate_set`), so
that experienced tools lifted by an open gate cannot push the documented tool
out of what a reranker reads; retrieval's top-1 stays first.

``none``
    retrieval order;
``fields``
    deterministic, no LLM: ``when_not`` matches and ``prefer`` redirects, only
    where a scenario beats the tool's own evidence by :data:`WHEN_NOT_MARGIN`
    (a success prior read only from stats above the privacy noise is
    reported, not scored);
``llm``
    any litellm model (the embedded SmolLM2 by default) reads the candidates
    rendered as typed fields (or one flat string) and scores them, free of
    position bias (it reads a candidate's experience only where retrieval's
    prototype gate counts it for the query; elsewhere, the documentation as
    docs_only shows it): an embedded model scores each tool on its own (the channel
    direction, ``log P(query | tool entry)``); a hosted one picks from the
    list shown in every cyclic order, its votes averaged. The LLM's score
    then refines retrieval's (:mod:`synapse_flwr.core.rerank_llm`).
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace

import numpy as np

from synapse_flwr.core.catalog import Catalog
from synapse_flwr.core.documentation import catalog_arguments, doc_entry, doc_text
from synapse_flwr.core.embed import Embedder, get_embedder, l2_normalize, uncached
from synapse_flwr.core.errors import log_once
from synapse_flwr.core.experience import MAX_QUERY, cut_query
from synapse_flwr.core.explain import decided_by
from synapse_flwr.core.fusion import Fusion, gate_open, voted_fusion
from synapse_flwr.core.phrase_profile import PhraseProfile
from synapse_flwr.core.phrases import is_text
from synapse_flwr.core.privacy import zero_count_floor
from synapse_flwr.core.progress import Progress
from synapse_flwr.core.prototypes import (
    gate_reads,
    shrunk_directions,
    space_mismatch,
    stacked_prototypes,
)
from synapse_flwr.core.render import (
    SHOWN_REQUESTS,
    parse_flat,
    render_flat,
    render_typed,
)
from synapse_flwr.core.rerank_llm import (
    CHANNEL_CUE,
    balanced_list_scores,
    fuse_llm,
    llm_answered,
    llm_weight_for,
)
from synapse_flwr.core.sanitize import neutralise
from synapse_flwr.core.scenarios import split_when
from synapse_flwr.core.schema import Compendium, FlatCompendium, ToolEntry, ToolStats
from synapse_flwr.core.shift import SHIFT_Z, WINDOW, ShiftMonitor

log = logging.getLogger(__name__)

# Retrieval weights (dense documentation, phrase likelihood, scenario beyond
# documentation), chosen on the seed-7 split: with query prototypes a scenario
# weight of 0.3 cost 2-4 held-out points (simulations/tune_router.py), so it is
# 0. A compendium without prototypes reads its scenarios, gated per query like
# prototypes (held-out then equals docs_only at every weight); the weight is
# MiniLM's best on every dev row (simulations/scenario_weight.py,
# docs/results/tuning/scenario_weight; MetaTool seen 0.6037 docs -> 0.6479
# without noise, 0.6052 at epsilon 4; demo 0.7364 -> 0.7636 without noise,
# equal at epsilon 4). The static and TF-IDF rows stay within one demo query
# (0.009) of docs_only. The previous weight, 0.3, gained MiniLM less (0.6275
# and 0.7364 without noise).
PROTOTYPE_WEIGHTS = (1.0, 0.015, 0.0)
SCENARIO_WEIGHTS = (1.0, 0.015, 0.6)
# Stats whose call count is within this many noise SDs of a never-called tool's are not evidence.
NOISE_SDS = 3.0
RERANKERS = ("fields", "llm", "none")
#: How the ``llm`` reranker asks: ``auto`` is channel for embedded models, list for hosted ones.
LLM_MODES = ("auto", "channel", "list")
# The documentation's best tools that every candidate set keeps. Experience
# reorders retrieval: on queries whose documented tool has no experience but
# whose gate is open, experienced tools filled the other slots, so a reranker
# never saw the documented tool. Seed-7 dev split, K=5, recall@5 of the
# candidate sets (simulations/candidates.py, docs/results/tuning/candidates):
# held-out 0.716 keeping 0, 0.805 keeping 2 (docs_only 0.861), seen 0.876 ->
# 0.879 at epsilon 4 and 0.923 -> 0.918 without noise; 2 is the largest that
# keeps seen recall within 0.5 points at both (3 costs 1.2 without noise;
# rerun 2026-12-03 on today's code).
# Retrieval's top-1 never changes.
DOCS_CANDIDATES = 2
# How much better than anything in a tool's favour (cosine) a when_not scenario
# must match before it counts: its excess above this margin is the penalty,
# and any excess hands the tool's score to the scenario's `prefer` tool. On the
# embedded demo without privacy (seed 7; MetaTool logs no failures, so it has
# no when_not) released single words ("order", "seat", "25") fired redirects:
# 7 routes broken for 2 fixed at 0 and one still broken at 0.1 (seen top-1
# 0.673 vs 0.718 without the field); with example requests in the
# documentation 5 for 2 at 0 and none from 0.1. 0.2 breaks none in either
# (simulations/when_not.py, docs/results/tuning/when_not).
WHEN_NOT_MARGIN = 0.2
# Weight of a tool's example requests (the normalised mean of their
# embeddings) beside its documentation's embedding in its documentation
# vector. Seed-7 dev split, the shipped local/smollm2 requests (6 a tool),
# simulations/example_weight.py (docs/results/tuning/examples): MetaTool
# docs_only held-out 0.6248 -> 0.6554 / 0.6719 / 0.6740 / 0.6665 at
# 0.25 / 0.5 / 1 / 2, seen 0.5558 -> 0.5921 at 0.5, the private compendium's
# seen 0.6852 -> 0.7005; the demo's hand-written documentation loses
# 0.7636 -> 0.7364 at 0.5 and 0.7182 at 1. 0.5 is within 0.25 points of 1 on
# every MetaTool row and costs the demo less.
EXAMPLE_WEIGHT = 0.5
# Retrieval evidence, in the order the explain output lists it.
EVIDENCE = ("description", "phrases", "scenario", "prototype")
# a batch's documentation score, and its dense and lexical parts unweighted (Router._description)
Described = tuple[np.ndarray, np.ndarray, np.ndarray]
# the most memory route_many keeps a batch's documentation scores in between the query-shift test and the routes
DESCRIBED_BYTES = 64 * 2**20


RENDERS = ("typed", "flat")


@dataclass(frozen=True)
class Candidate:
    """A retrieved tool with its scores.

    Parameters
    ----------
    tool_id : str
        The tool.
    score : float
        Final score (after reranking).
    retrieval : float
        Fused retrieval score.
    signals : dict
        The per-field evidence the reranker used.
    """

    tool_id: str
    score: float
    retrieval: float
    signals: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RouteResult:
    """The answer to one query.

    Parameters
    ----------
    query : str
        The query.
    tool : str
        The chosen tool.
    candidates : list of Candidate
        Ranked, best first.
    decided_by : list of str
        The fields (or reranker) that decided.
    fallback : bool
        True when the reranker failed and retrieval order was used.
    experience_off : bool
        True when the query-shift test had turned experience off: routed as
        docs_only routes it (:meth:`Router.observe`).
    """

    query: str
    tool: str
    candidates: list[Candidate]
    decided_by: list[str]
    fallback: bool = False
    experience_off: bool = False

    def to_dict(self, names: Mapping[str, str] | None = None) -> dict:
        """JSON-ready form.

        Parameters
        ----------
        names : mapping of str to str, optional
            Catalog spelling of each tool id (``Router.names``): ``tool`` is
            then the name an agent calls, ``tool_id`` the normalised id.
        """
        names = names or {}
        return {
            "query": self.query,
            "tool": names.get(self.tool, self.tool),
            "tool_id": self.tool,
            "decided_by": self.decided_by,
            "fallback": self.fallback,
            "experience_off": self.experience_off,
            "candidates": [
                {"tool": names.get(c.tool_id, c.tool_id), "tool_id": c.tool_id, "score": round(c.score, 4),
                 "retrieval": round(c.retrieval, 4), "signals": {k: round(v, 4) for k, v in c.signals.items()}}
                for c in self.candidates
            ],
        }


def typed_entries(compendium: Compendium | FlatCompendium | None, catalog: Catalog) -> dict[str, ToolEntry]:
    """Tool id -> typed entry for every catalog tool (flat compendia are decoded).

    A tool's documentation is the catalog's: a compendium's copy is read only
    where the catalog has none. The copy may be older than the catalog, and a
    merged one is what most organisations sent, so one organisation could
    otherwise rewrite what a tool is documented to do.
    """
    known: dict[str, ToolEntry] = {}
    if isinstance(compendium, FlatCompendium):
        known = {t: parse_flat(t, text) for t, text in compendium.texts.items()}
    elif compendium is not None:
        known = {e.tool_id: e for e in compendium.tools}
    out = {}
    for doc in catalog.tools:
        entry = known.get(doc.tool_id) or ToolEntry(tool_id=doc.tool_id)
        if doc.description and entry.description != doc.description:
            entry = entry.model_copy(update={"description": doc.description})
        out[doc.tool_id] = entry
    return out


def without_requests(entry: ToolEntry, examples: Sequence[str]) -> ToolEntry:
    """The entry without the ``when`` scenarios that are its tool's public example requests."""
    if not examples or not entry.when:
        return entry
    return entry.model_copy(update={"when": split_when(entry.when, examples)[1]})


def _scenario_text(text: str, variants: Sequence[str]) -> str:
    return "; ".join([text, *variants])


def check_router_args(reranker: str, k: int, render: str, model: str, llm_mode: str, llm_weight: float | None,
                      docs_candidates: int) -> None:
    """Reject a router configuration that cannot work, naming the argument and its choices."""
    if llm_mode not in LLM_MODES:
        raise ValueError(f"unknown llm_mode {llm_mode!r}; choose one of {', '.join(LLM_MODES)}")
    if reranker == "llm" and model.startswith("local/"):
        # imported here: litellm loads only for an LLM reranker
        from synapse_flwr.core.llm import LOCAL_MODELS

        if model.removeprefix("local/") not in LOCAL_MODELS:
            raise ValueError(f"unknown local model {model!r}; valid: "
                             + ", ".join(f"local/{n}" for n in sorted(LOCAL_MODELS)))
    if llm_mode == "channel" and not model.startswith("local/"):
        raise ValueError(f"llm_mode 'channel' needs an embedded local/ model, not {model!r}")
    if llm_weight is not None and not 0 <= llm_weight < math.inf:  # inf * a zero score is NaN, which argmax picks
        raise ValueError(f"llm_weight must be a finite number >= 0, got {llm_weight}")
    if reranker not in RERANKERS:
        raise ValueError(f"unknown reranker {reranker!r}; choose one of {', '.join(RERANKERS)}")
    if render not in RENDERS:
        raise ValueError(f"unknown render {render!r}; choose one of {', '.join(RENDERS)}")
    if k < 1:
        raise ValueError("k must be at least 1")
    if docs_candidates < 0:
        raise ValueError(f"docs_candidates must be >= 0, got {docs_candidates}")


class Router:
    """Route queries to tools with a (global) compendium.

    Parameters
    ----------
    compendium : Compendium, FlatCompendium or None
        The knowledge to route with; None routes on documentation alone.
    catalog : Catalog
        The tools that can be chosen.
    embedder : Embedder or str
        An embedder or its name (``minilm``, ``static``, ``tfidf``).
    reranker : {"fields", "llm", "none"}
        How the final choice among the candidates is made.
    k : int
        Candidates retrieved per query.
    render : {"typed", "flat"}
        ``typed`` reads the compendium's fields; ``flat`` (the ablation)
        reads each tool's entry as one string, for retrieval and reranking.
    model : str
        litellm model string for the ``llm`` reranker.
    llm_mode : {"auto", "channel", "list"}
        ``channel`` scores each tool alone (embedded models only); ``list``
        shows the candidates in every cyclic order; ``auto`` picks channel
        for ``local/`` models and list for hosted ones.
    llm_weight : float or None
        Weight of the LLM's standardised score beside retrieval's (``>= 0``);
        None: the model's dev weight (:func:`~synapse_flwr.core.rerank_llm.llm_weight_for`).
    docs_candidates : int
        The documentation's best tools that every candidate set keeps
        (:func:`candidate_set`; ``>= 0``, at most ``k - 1`` are kept).
    shift_window : int
        Open-gate queries the query-shift test keeps (:meth:`observe`); 0: no
        such test (experience is read whatever the queries: the lab scripts
        that tune the router's constants on a dataset's test queries).
    weights : tuple of float or None
        Weights of (dense documentation, lexical profile, extra scenario
        similarity) in the retrieval score; None: :data:`PROTOTYPE_WEIGHTS`
        when the compendium's prototypes are used, else :data:`SCENARIO_WEIGHTS`.
    fusion : Fusion or None
        How phrases and prototypes add to the documentation score. None: the
        defaults, with the prototype weight and count prior the compendium's
        fusion votes chose (:mod:`synapse_flwr.core.votes`) when it has any;
        a fusion that adds nothing (:attr:`~synapse_flwr.core.fusion.Fusion.docs_only`) reads no ``when_not`` either.
    """

    def __init__(
        self,
        compendium: Compendium | FlatCompendium | None,
        catalog: Catalog,
        embedder: Embedder | str = "minilm",
        reranker: str = "fields",
        k: int = 5,
        render: str = "typed",
        model: str = "local/smollm2",
        weights: tuple[float, float, float] | None = None,
        fusion: Fusion | None = None,
        llm_mode: str = "auto",
        llm_weight: float | None = None,
        docs_candidates: int = DOCS_CANDIDATES,
        shift_window: int = WINDOW,
    ) -> None:
        check_router_inputs(compendium, catalog)
        check_router_args(reranker, k, render, model, llm_mode, llm_weight, docs_candidates)
        self.catalog = catalog
        self.embedder = get_embedder(embedder) if isinstance(embedder, str) else embedder
        self.reranker, self.k, self.render, self.model = reranker, k, render, model
        self.llm_mode = llm_mode if llm_mode != "auto" else ("channel" if model.startswith("local/") else "list")
        self.llm_weight = llm_weight_for(model) if llm_weight is None else llm_weight
        self.docs_candidates = docs_candidates
        self.fusion = fusion or voted_fusion(compendium, self.embedder.name)
        self.entries = typed_entries(compendium, catalog)
        privacy = getattr(compendium, "privacy", None)
        self.calls_floor = calls_floor(compendium)
        if render == "flat":
            # The ablation of the typed fields (the paper's flat arm): the router
            # reads one string per tool, as if it were the tool's documentation,
            # so it can neither weigh a phrase by its support nor tell "use when"
            # from "avoid when". (Not validated: a flat string may be longer than
            # a description is allowed to be.)
            self.entries = {t: doc_entry(t, render_flat(self._readable(e))) for t, e in self.entries.items()}
        self.tool_ids = list(self.entries)
        self.examples = {d.tool_id: d.examples for d in catalog.tools}
        # example requests listed under `when` (their supports read off the prototype)
        # already reach retrieval through the documentation vector (_add_examples)
        # and the prototype: indexed as scenarios too they would count a third time
        indexed = {t: without_requests(e, self.examples[t]) for t, e in self.entries.items()}
        self.descriptions = catalog.descriptions()
        self.fallbacks = 0
        names = {d.tool_id: d.name for d in catalog.tools}
        self.names = names  # what an agent must call, as its catalog spells it
        self.arguments = catalog_arguments(catalog)
        self._index(indexed, names)
        self.profile = PhraseProfile(indexed, names, privacy.threshold if privacy is not None else 1.0,
                                     self.arguments)
        # exactly the phrase model a documentation-only router builds
        docs = {t: doc_entry(t, e.description) for t, e in self.entries.items()}
        self.docs_profile = PhraseProfile(docs, names, 1.0, self.arguments)
        self.phrase_tools = np.array([bool(e.when) for e in indexed.values()])
        self.compendium = compendium
        self.prototypes = self._load_prototypes(compendium)
        self.shift_window = shift_window
        self.shift = self._shift_monitor()
        self.weights = weights or (SCENARIO_WEIGHTS if self.prototypes is None else PROTOTYPE_WEIGHTS)
        self._docs_twin: Router | None = None
        self._twin_lock = threading.Lock()

    def _index(self, indexed: dict[str, ToolEntry], names: dict[str, str]) -> None:
        """Embed every tool's documentation and scenarios into the flat indexes retrieval searches."""
        import faiss

        texts, owners, kinds = [], [], []
        for i, (tool_id, entry) in enumerate(indexed.items()):
            texts.append(doc_text(entry, names[tool_id], self.arguments.get(tool_id, "")))
            owners.append(i)
            kinds.append(0)
            for s in entry.when:
                texts.append(_scenario_text(s.text, s.variants))
                owners.append(i)
                kinds.append(1)
            for w in entry.when_not:
                texts.append(_scenario_text(w.text, w.variants))
                owners.append(i)
                kinds.append(2)
        self.doc_embedder = self.embedder
        if hasattr(self.embedder, "fit") and not self.embedder.dim:
            # a lexical embedder learns its vocabulary from the whole index (words only
            # experience uses), and the documentation score keeps a fit on the documentation
            # alone: refitted on more text, the idf moved held-out tools' scores (seed 7, one
            # org holding all training experience: held-out 0.392 vs docs_only 0.416)
            docs = [t for t, kind in zip(texts, kinds) if kind == 0]
            self.embedder.fit(texts)
            if len(docs) < len(texts):
                self.doc_embedder = copy.deepcopy(self.embedder).fit(docs)
        vectors = self._embed(texts)
        self.owners = np.array(owners)
        self.kinds = np.array(kinds)
        self.doc_rows = np.flatnonzero(self.kinds == 0)
        self._add_examples(vectors, self.doc_rows, self.embedder)
        self.vectors = vectors
        # entries are laid out tool by tool: doc, when..., when_not...
        self.row_end = np.append(self.doc_rows[1:], len(self.kinds))
        self.position = {tool_id: i for i, tool_id in enumerate(self.tool_ids)}
        doc_vectors = vectors[self.doc_rows]
        if self.doc_embedder is not self.embedder:
            doc_vectors = self._embed(docs, self.doc_embedder)
            self._add_examples(doc_vectors, np.arange(len(docs)), self.doc_embedder)
        self.doc_index = faiss.IndexFlatIP(doc_vectors.shape[1])
        self.doc_index.add(doc_vectors)
        self.scenario_index = faiss.IndexFlatIP(vectors.shape[1])
        self.scenario_index.add(vectors[self.kinds == 1])
        self.scenario_owner = self.owners[self.kinds == 1]
        self.scenario_tools = np.isin(np.arange(len(self.tool_ids)), self.scenario_owner)

    def _embed(self, texts: Sequence[str], embedder: Embedder | None = None) -> np.ndarray:
        return np.asarray((embedder or self.embedder).encode(list(texts)), dtype=np.float32)

    def _add_examples(self, vectors: np.ndarray, doc_rows: np.ndarray, embedder: Embedder) -> None:
        """Move each documented tool's vector toward its example requests (in place; :data:`EXAMPLE_WEIGHT`)."""
        texts = {i: doc.examples for i, t in enumerate(self.tool_ids)
                 if (doc := self.catalog.get(t)) is not None and doc.examples}
        if not texts:
            return
        examples = l2_normalize(self._embed([x for group in texts.values() for x in group], embedder))
        start = 0
        for i, group in texts.items():
            mean = examples[start:start + len(group)].mean(axis=0)
            start += len(group)
            row = vectors[doc_rows[i]] + EXAMPLE_WEIGHT * mean / max(float(np.linalg.norm(mean)), 1e-12)
            vectors[doc_rows[i]] = row / max(float(np.linalg.norm(row)), 1e-12)

    def set_fusion(self, fusion: Fusion) -> None:
        """Route with other fusion constants from now on (no re-indexing: for tuning)."""
        self.fusion = fusion
        self.prototypes = self._load_prototypes(self.compendium)
        self.shift = self._shift_monitor()

    def _load_prototypes(
        self, compendium: Compendium | FlatCompendium | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Prototype directions ``(n_tools, dim)``, noise shrinkage (0: ignored) and count prior, or None.

        Used only when the compendium's embedding space is the router's, and
        never under the flat render: a prototype is a typed field, and the flat
        arm reads one string per tool (with prototypes loaded, every flat entry
        read as a tool without one, so retrieval weighed the strings as a
        prototype router does and an LLM was shown the documentation alone).
        """
        if (self.render == "flat" or not isinstance(compendium, Compendium)
                or not any(e.prototype for e in compendium.tools)):
            return None
        reason = space_mismatch(compendium.embedding, self.embedder)
        if reason:
            log.warning("ignoring the compendium's query prototypes: %s", reason)
            return None
        protos = [e.prototype for e in self.entries.values()]
        gate = self.fusion
        read = np.array(gate_reads(protos, self.vectors[self.doc_rows], gate.gate_alpha, gate.gate_count_sds,
                                   gate.gate_doc_sds))
        sums, sds, counts = stacked_prototypes(protos, compendium.embedding.dim)
        dirs, gain = shrunk_directions(sums, sds, self.fusion.shrink)
        prior = self.fusion.prior * np.log1p(counts)
        return ((dirs * read[:, None]).astype(np.float32), (gain * read).astype(np.float32),
                (prior * read).astype(np.float32))

    # ------------------------------------------------------------- retrieval
    def scenario_scores(self, q: np.ndarray) -> np.ndarray:
        """Best ``when`` scenario similarity per tool (-1 for tools without any)."""
        n_tools = len(self.tool_ids)
        out = np.full((len(q), n_tools), -1.0, dtype=np.float32)
        if self.scenario_index.ntotal == 0:
            return out
        depth = min(self.scenario_index.ntotal, max(64, 8 * self.k))
        sims, idx = self.scenario_index.search(q, depth)
        for row in range(len(q)):
            owners = self.scenario_owner[idx[row]]
            # sims are sorted descending, so an owner's first hit is its best
            _, first = np.unique(owners, return_index=True)
            out[row, owners[first]] = sims[row, first]
        return out

    def prototype_scores(self, q: np.ndarray, opened: np.ndarray) -> np.ndarray:
        """Prototype evidence ``>= 0`` per query and tool, zero where the gate is closed.

        Parameters
        ----------
        q : numpy.ndarray
            ``(n, dim)`` query embeddings.
        opened : numpy.ndarray
            ``(n,)`` booleans: the queries whose gate is open (:meth:`gate`).
        """
        out = np.zeros((len(q), len(self.tool_ids)), np.float32)
        if self.prototypes is None:
            return out
        dirs, gain, prior = self.prototypes
        used = self.prototypes_read()
        if used.any():
            out[:, used] = (self.fusion.prototype * np.maximum(q @ dirs[used].T - self.fusion.margin, 0.0) * gain[used]
                            + prior[used])
        return out * opened[:, None]

    def gate(self, queries: Sequence[str], docs: np.ndarray, read: np.ndarray) -> np.ndarray:
        """Per query, whether its prototype evidence is read.

        Parameters
        ----------
        queries : sequence of str
            The requests.
        docs : numpy.ndarray
            ``(n, n_tools)`` their documentation scores.
        read : numpy.ndarray
            ``(n_tools,)`` booleans: the tools whose prototype is read.

        Returns
        -------
        numpy.ndarray
            ``(n,)`` booleans: the documentation-best tool is among ``read``
            (:func:`~synapse_flwr.core.fusion.gate_open`), and the query is not
            a tool's name (:meth:`unnamed`).
        """
        return gate_open(docs, read) & self.unnamed(queries)

    def unnamed(self, queries: Sequence[str]) -> np.ndarray:
        """Per query, whether it is other than exactly a catalog tool's name or alias.

        The prototypes are not read for a tool's name or alias (in any case or
        punctuation, :meth:`Catalog.resolve <synapse_flwr.core.catalog.Catalog.resolve>`):
        the documentation holds the names, and the prototypes and count priors,
        all alike for a query of one word, sent "ABCmouse" to FinanceTool (a
        rehearsal folder's name-only queries: docs_only 0.912, the private
        compendium 0.616). Released phrases and scenarios are read as for any
        query: they are about the query's own words (users who type "weather"
        for the forecast tool).

        Parameters
        ----------
        queries : sequence of str
            The requests.

        Returns
        -------
        numpy.ndarray
            ``(n,)`` booleans, False for a tool's name or alias.
        """
        return np.fromiter((self.catalog.resolve(q) is None for q in queries), bool, len(queries))

    def prototypes_read(self) -> np.ndarray:
        """``(n_tools,)`` booleans: the tools whose prototype the gate reads (none without prototypes).

        A query whose documentation-best tool is not among them is routed on
        the documentation alone, exactly as docs_only routes it.
        """
        if self.prototypes is None:
            return np.zeros(len(self.tool_ids), bool)
        return self.prototypes[1] > 0

    # ------------------------------------------------------------- query shift
    def _shift_monitor(self) -> ShiftMonitor | None:
        """The query-shift window over the prototypes this router reads (None: it reads none, or no window)."""
        read = self.prototypes_read()
        if not read.any() or self.shift_window <= 0:
            return None
        sums, sds, counts = stacked_prototypes([e.prototype for e in self.entries.values()],
                                               self.compendium.embedding.dim)
        return ShiftMonitor(sums, sds, counts, read, self.shift_window)

    def observe(self, queries: Sequence[str], remember: bool = True, batch_size: int = 256) -> bool:
        """Add ``queries`` to the query-shift window (:mod:`~synapse_flwr.core.shift`); whether it has shifted.

        While it has, :meth:`route_many` routes as docs_only does: the queries
        sit far from where the experience was gathered, where it routed below
        the documentation. Always False when the router reads no prototype or
        the votes chose the documentation only (there is nothing to turn off).
        An experiment observes its whole test set first, so that every split
        is routed on one decision, as a deployment's mixed traffic would be.
        A change of the decision is logged (a warning when experience goes off).

        Parameters
        ----------
        queries : sequence of str
            Queries to add (their embeddings are kept in the cache only with ``remember``).
        remember : bool
            As in :meth:`route_many`.
        batch_size : int
            Queries embedded at once.
        """
        if self.shift is None or self.fusion.docs_only:
            return False
        self._observe(_chunked(queries, batch_size), None if remember else uncached(self.embedder), keep=False)
        return self.shifted()

    def _observe(self, chunks: Sequence[list[str]], embedder: Embedder | None, keep: bool
                 ) -> tuple[list[np.ndarray], list[Described | None]]:
        """:meth:`observe` of chunks of queries: their embeddings, and with ``keep`` their :meth:`_description`
        (else None each), for routing them after."""
        vectors = [self._embed(c, embedder) for c in chunks]
        described: list[Described | None] = [None] * len(chunks)
        read, was = self.prototypes_read(), self.shift.off
        for i, (chunk, q) in enumerate(zip(chunks, vectors, strict=True)):
            desc = self._description(chunk, q)
            self.shift.observe(q, self.gate(chunk, desc[0], read))
            if keep:
                described[i] = desc
        n, mean, shifted = self.shift.state()
        if shifted != was:
            # once a process for one statistic: an experiment's arms each route the same test set
            if shifted:
                log_once(log, f"the queries routed sit far from the federation's experience (mean shift {mean:.3f} "
                              f"over the last {n} queries, below {SHIFT_Z}): routing on the documentation alone, as "
                              "docs_only does, while they do (docs/experiments.md, \"Query shift\")", logging.WARNING)
            else:
                log_once(log, f"the queries routed are back near the federation's experience (mean shift {mean:.3f} "
                              f"over the last {n} queries): reading it again")
        return vectors, described

    def shifted(self) -> bool:
        """Whether the query-shift window has shifted (:meth:`observe`): queries route as docs_only does."""
        return self.shift is not None and not self.fusion.docs_only and self.shift.state()[2]

    def docs_router(self) -> Router:
        """A router of this one's catalog, embedder and reranker without the compendium: docs_only (made once)."""
        with self._twin_lock:
            if self._docs_twin is None:
                # (a lexical embedder is fitted already: the twin's index does not fit it again)
                self._docs_twin = Router(None, self.catalog, embedder=self.embedder, reranker=self.reranker,
                                         k=self.k, render=self.render, model=self.model, weights=self.weights,
                                         llm_mode=self.llm_mode, llm_weight=self.llm_weight,
                                         docs_candidates=self.docs_candidates)
            return self._docs_twin

    def docs_gated_share(self, queries: Sequence[str], batch: int = 1024) -> float:
        """Share of ``queries`` whose route reads no prototype.

        The votes chose documentation only, the query-shift test turned
        experience off (:meth:`shifted`), the query's documentation-best
        tool has no prototype this router reads, or the query is a tool's
        name (the gate, :meth:`gate`).

        Those route on the documentation as docs_only does, unless released
        scenarios or a ``when_not`` scenario move them. On a catalog where most tools have no
        experience most seen queries are among them, so the compendium gains
        little over docs_only there (docs/experiments.md, "Limits measured").

        Parameters
        ----------
        queries : sequence of str
            The requests.
        batch : int
            Queries embedded and searched at once.

        Returns
        -------
        float
            In [0, 1]; 0 for no queries.
        """
        if not queries:
            return 0.0
        if self.fusion.docs_only or self.shifted():
            return 1.0
        read, closed = self.prototypes_read(), 0
        for start in range(0, len(queries), batch):
            chunk = list(queries[start:start + batch])
            closed += int((~self.gate(chunk, self._description(chunk, self._embed(chunk))[0], read)).sum())
        return closed / len(queries)

    def evidence(self, queries: Sequence[str], q: np.ndarray | None = None,
                 described: Described | None = None) -> dict[str, np.ndarray]:
        """Weighted retrieval evidence per field (:data:`EVIDENCE`), each ``(len(queries), n_tools)``.

        ``description`` is exactly a documentation-only router's score; the
        other fields are non-negative and zero for tools without experience.

        Parameters
        ----------
        queries : sequence of str
            The requests.
        q : numpy.ndarray, optional
            Their embeddings (embedded here when left out).
        described : tuple of numpy.ndarray, optional
            Their :meth:`_description`, when computed already (the query-shift test's, in :meth:`route_many`).
        """
        q = self._embed(queries) if q is None else q
        w_scen = self.weights[2]
        description, dense_doc, docs_lex = self._description(queries, q) if described is None else described
        out = {"description": description}
        zero = np.zeros_like(dense_doc)
        out["phrases"] = (self.fusion.phrases * np.maximum(self.profile.score(queries) - docs_lex, 0.0)
                          * self.phrase_tools[None, :]) if self.fusion.phrases and self.phrase_tools.any() else zero
        out["scenario"] = zero
        if w_scen and not self.fusion.docs_only:
            # the prototypes' per-query gate: without it, released scenarios pulled queries for
            # tools without experience to tools with it (seed 7, MiniLM, one org holding all
            # training experience: held-out 0.652 vs docs_only 0.675)
            out["scenario"] = (w_scen * np.maximum(self.scenario_scores(q) - dense_doc, 0.0)
                               * gate_open(description, self.scenario_tools)[:, None])
        out["prototype"] = self.prototype_scores(q, self.gate(queries, description, self.prototypes_read()))
        return out

    def _description(self, queries: Sequence[str], q: np.ndarray) -> Described:
        """The documentation score (what docs_only ranks by), and its dense and lexical parts unweighted."""
        w_doc, w_lex, _ = self.weights
        q_docs = q if self.doc_embedder is self.embedder else self._embed(queries, self.doc_embedder)
        doc = self.doc_index.search(q_docs, len(self.tool_ids))
        dense_doc = np.empty((len(q), len(self.tool_ids)), dtype=np.float32)
        np.put_along_axis(dense_doc, doc[1], doc[0], axis=1)
        docs_lex = self.docs_profile.score(queries)
        return w_doc * dense_doc + w_lex * docs_lex, dense_doc, docs_lex

    def retrieve(self, queries: Sequence[str], q: np.ndarray | None = None) -> np.ndarray:
        """Retrieval scores ``(len(queries), n_tools)``: the sum of :meth:`evidence`."""
        return sum(self.evidence(queries, q).values())

    # ------------------------------------------------------------- reranking
    def _field_signals(self, qv: np.ndarray, tool: int, best_doc: float) -> dict[str, float]:
        rows = slice(self.doc_rows[tool], self.row_end[tool])
        sims = self.vectors[rows] @ qv
        kinds = self.kinds[rows]

        def best(kind: int) -> float:
            return float(sims[kinds == kind].max()) if (kinds == kind).any() else -1.0

        doc, when, when_not = best(0), best(1), best(2)
        stats = self.entries[self.tool_ids[tool]].stats
        # counts within noise of zero (e.g. a tool never called, under DP) say nothing
        known = stats.calls > self.calls_floor and stats.calls > 0
        return {
            # evidence beyond the best documentation match among the candidates:
            # a scenario counts only where no tool's docs already explain the query
            "when": max(when - best_doc, 0.0),
            # a when_not scenario that matches clearly better than anything in favour
            # (none where the votes chose documentation only)
            "when_not": 0.0 if self.fusion.docs_only else max(when_not - max(when, doc) - WHEN_NOT_MARGIN, 0.0),
            # how often a tool known to fail fails (Laplace-smoothed success rate
            # below one half), reported for the explanation and the LLM's
            # precautions; not added to the score: a tool's overall failure
            # rate says nothing about this request (on the demo it moved
            # queries off the right tool, below the docs-only line)
            "success_prior": min(0.0, math.log((stats.successes + 1) / (stats.calls + 2) / 0.5)) if known else 0.0,
        }

    def _prior_part(self, qv: np.ndarray, tool: int, evidence: float) -> dict[str, float]:
        """A tool's prototype evidence split into the query's match (``prototype``) and the count prior (``prior``).

        Reported apart so an explanation does not credit the query's likeness
        to a prototype with what only the tool's released count decided (a
        query unlike every prototype is routed by the prior alone); the score
        is their sum, unchanged.
        """
        if evidence <= 0 or self.prototypes is None:
            return {}
        dirs, gain, prior = self.prototypes
        match = self.fusion.prototype * max(float(qv @ dirs[tool]) - self.fusion.margin, 0.0) * float(gain[tool])
        return {"prototype": match, "prior": float(prior[tool])}

    def _prefer_target(self, qv: np.ndarray, tool: int) -> tuple[str | None, float]:
        """The ``prefer`` tool of the best-matching when_not scenario (None if it names none), with its similarity.

        Only that scenario decides whether the tool is avoided, so only it may
        say what to use instead: a weaker one's ``prefer`` redirected queries to
        tools that the matching scenario never named.
        """
        when_not = self.entries[self.tool_ids[tool]].when_not
        if not when_not:
            return None, -1.0
        start = self.row_end[tool] - len(when_not)
        sims = [float(self.vectors[row] @ qv) for row in range(start, self.row_end[tool])]
        best = int(np.argmax(sims))
        prefer = when_not[best].prefer
        return (prefer if prefer in self.entries else None), sims[best]

    def _rerank_fields(
        self, qv: np.ndarray, cand: list[int], fused: np.ndarray, parts: dict[str, np.ndarray]
    ) -> tuple[list[Candidate], list[str]]:
        scores: dict[str, Candidate] = {}
        redirects: dict[str, float] = {}
        best_doc = max(float(self.vectors[self.doc_rows[t]] @ qv) for t in cand)
        for t in cand:
            tool_id = self.tool_ids[t]
            # (a flat render has no fields to read: its entries are documentation only)
            s = {**{f: float(parts[f][t]) for f in EVIDENCE}, **self._prior_part(qv, t, float(parts["prototype"][t])),
                 **self._field_signals(qv, t, best_doc)}
            # `when` is reported but not added: retrieval already counts scenario
            # evidence (weights[2]); counting it twice cost held-out accuracy (seed 7)
            score = fused[t] - s["when_not"]
            target, sim = self._prefer_target(qv, t)
            if target is not None and s["when_not"] > 0:
                # the experience says: for this request, use `target` instead
                redirects[target] = max(redirects.get(target, -math.inf), float(score + s["when_not"]))
                s["prefer_" + target] = sim
            scores[tool_id] = Candidate(tool_id, float(score), float(fused[t]), s)
        for target, score in redirects.items():
            old = scores.get(target)
            t = self.position[target]
            if old is None or old.score < score:
                signals = {**(old.signals if old else {}), "redirected": 1.0}
                scores[target] = Candidate(target, score, float(fused[t]), signals)
        ranked = sorted(scores.values(), key=lambda c: (-c.score, c.tool_id))
        if self.render == "flat":
            return ranked, ["flat"]
        # the documentation's own choice over the whole catalog (with k = 1 the lone candidate is no choice)
        return ranked, decided_by(ranked, self.tool_ids[int(np.argmax(parts["description"]))])

    def _readable(self, entry: ToolEntry) -> ToolEntry:
        """``entry`` as a model reads it: call statistics within noise of zero (a tool never called, under DP) left out."""
        if 0 < entry.stats.calls <= self.calls_floor:
            return entry.model_copy(update={"stats": ToolStats()})
        return entry

    def _shown(self, t: int, experience: bool = True) -> str:
        """A candidate as the LLM reads it: typed fields, or the flat arm's one string.

        Without ``experience`` it is exactly what a documentation-only router shows.
        """
        tool_id = self.tool_ids[t]
        entry = self.entries[tool_id]
        if not experience:
            docs = doc_entry(tool_id, self.descriptions[tool_id])
            entry = docs if self.render == "typed" else doc_entry(tool_id, render_flat(docs))
        examples = self.examples.get(tool_id, ())
        if self.render == "typed":
            return render_typed(self._readable(entry), examples=examples)
        shown = f"\nexample requests: {'; '.join(map(neutralise, examples[:SHOWN_REQUESTS]))}" if examples else ""
        return f"tool: {entry.tool_id}\n{entry.description}{shown}"

    def experience_read(self, prototype: np.ndarray, cand: Sequence[int]) -> set[int]:
        """The candidates whose experience the LLM reads for one query.

        The LLM obeys retrieval's gate: it reads a candidate's experience
        fields only where that candidate's prototype evidence for the query is
        above zero (a prototype above the noise, and the query's gate open);
        every other candidate is shown as docs_only shows it. Without it, on
        MetaTool seed 42 the richer entries of experienced tools drew 3 of 200
        held-out queries off their documented tool (docs/results/llm). A
        compendium whose prototypes are not used has no such gate: every
        candidate's entry is read. Under a fusion that adds nothing
        (:attr:`~synapse_flwr.core.fusion.Fusion.docs_only`, the votes' documentation only), none is.

        Parameters
        ----------
        prototype : numpy.ndarray
            ``(n_tools,)`` prototype evidence of the query (:meth:`evidence`).
        cand : sequence of int
            The query's candidates.
        """
        if self.fusion.docs_only:
            return set()
        if self.prototypes is None:
            return set(cand)
        return {t for t in cand if prototype[t] > 0}

    def llm_scores(
        self, queries: Sequence[str], cands: Sequence[Sequence[int]], reads: Sequence[set[int]] | None = None
    ) -> list[np.ndarray | None]:
        """The LLM's raw score of each query's candidates (None where the call failed).

        ``reads``: per query, the candidates whose experience fields are shown
        (:meth:`experience_read`); None shows every candidate's whole entry.
        Channel mode batches every (tool, query) pair of the chunk, so each
        tool's entry runs through the model once however many queries it serves.
        """
        from synapse_flwr.core.llm import LLMError, calls_at_once, channel_scores

        reads = reads if reads is not None else [set(c) for c in cands]
        if self.llm_mode == "channel":
            pairs = [(self._shown(t, t in read) + CHANNEL_CUE, q)
                     for q, cand, read in zip(queries, cands, reads) for t in cand]
            try:
                flat = np.asarray(channel_scores(self.model.removeprefix("local/"), pairs))
            except (LLMError, ValueError, RuntimeError) as exc:
                log.warning("llm rerank failed (%s); using retrieval order", exc)
                return [None] * len(queries)
            bounds = np.cumsum([0, *map(len, cands)])
            return [flat[a:b] for a, b in itertools.pairwise(bounds)]

        def score(q: str, cand: Sequence[int], read: set[int]) -> np.ndarray | None:
            try:
                return balanced_list_scores(self.model, q, [self._shown(t, t in read) for t in cand],
                                            [self.tool_ids[t] for t in cand])
            except (LLMError, ValueError, RuntimeError) as exc:
                log.warning("llm rerank failed (%s); using retrieval order", exc)
                return None

        out: list[np.ndarray | None] = [None] * len(queries)
        # k LLM calls per query (one per cyclic order of its candidates): a long batch ran silently.
        progress = Progress(f"{self.model} list scores", len(queries), unit="queries", logger=log)
        # each query asks for its k orders at once: about calls_at_once requests in flight in all
        with ThreadPoolExecutor(max_workers=math.ceil(calls_at_once(self.model) / max(self.k, 1))) as pool:
            asked = {pool.submit(score, *job): j for j, job in enumerate(zip(queries, cands, reads))}
            for done in as_completed(asked):
                out[asked[done]] = done.result()
                progress.advance()
        progress.done()
        return out

    def _rerank_llm(
        self, cand: list[int], fused: np.ndarray, docs: np.ndarray, llm: np.ndarray | None
    ) -> tuple[list[Candidate], list[str], bool]:
        if not llm_answered(llm):
            self.fallbacks += 1
            return self._retrieval_order(cand, fused), ["retrieval"], True
        retrieval = fused[cand]
        final = fuse_llm(retrieval, docs[cand], llm, self.llm_weight)
        order = sorted(range(len(cand)), key=lambda i: (-final[i], i))
        return ([Candidate(self.tool_ids[cand[i]], float(final[i]), float(retrieval[i]),
                           {"llm": float(llm[i]), "description": float(docs[cand[i]])})
                 for i in order], [f"llm-{self.llm_mode}:{self.render}"], False)

    def _retrieval_order(self, cand: list[int], fused: np.ndarray) -> list[Candidate]:
        return [Candidate(self.tool_ids[t], float(fused[t]), float(fused[t])) for t in cand]

    # ------------------------------------------------------------- public
    def route_many(
        self, queries: Sequence[str], batch_size: int = 256, force: Sequence[Sequence[str]] | None = None,
        remember: bool = True, observe: bool = True,
    ) -> list[RouteResult]:
        """Route a batch of queries (embedding and retrieval are batched).

        Parameters
        ----------
        queries : sequence of str
            The queries.
        batch_size : int
            Queries embedded and retrieved at once.
        force : sequence of sequences of str, optional
            Oracle retrieval: per query, the acceptable gold tool ids. When
            none of them is among the ``k`` retrieved candidates, the
            best-scoring of them replaces the last candidate before reranking,
            so the reranker is measured on its own.
        remember : bool
            Keep the queries' embeddings in the embedder's on-disk cache (an
            experiment routes one test set many times). False: embedded and
            forgotten, as a served request is (a server's cache would grow by
            a file per request, and keep its users' requests on disk).
        observe : bool
            Add the queries to the query-shift window first (:meth:`observe`);
            False where they were observed already. Either way, while the
            window has shifted the queries are routed by :meth:`docs_router`.
        """
        if force is not None and len(force) != len(queries):
            raise ValueError("force needs one sequence of gold tool ids per query")
        embedder = None if remember else uncached(self.embedder)
        chunks = _chunked(queries, batch_size)
        vectors: list[np.ndarray | None] = [None] * len(chunks)
        described: list[Described | None] = [None] * len(chunks)
        if observe and self.shift is not None and not self.fusion.docs_only:
            # embedded (and, while it fits DESCRIBED_BYTES, scored on the documentation) once, for the test and
            # the routes: kept for a whole test set of a large catalog the scores took 585 MB
            keep = 12 * len(queries) * len(self.tool_ids) <= DESCRIBED_BYTES  # three float32 arrays a query and tool
            vectors, described = self._observe(chunks, embedder, keep)
        if not self.shifted():
            return self._route_chunks(chunks, vectors, force, embedder, described)
        docs = self.docs_router()._route_chunks(chunks, vectors, force, embedder)  # its embedder is this router's
        return [replace(r, experience_off=True) for r in docs]

    def _route_chunks(self, chunks: Sequence[list[str]], vectors: Sequence[np.ndarray | None],
                      force: Sequence[Sequence[str]] | None, embedder: Embedder | None,
                      described: Sequence[Described | None] | None = None) -> list[RouteResult]:
        """:meth:`route_many` of chunked queries, each chunk's embeddings (and scores) given or computed."""
        out: list[RouteResult] = []
        start = 0
        for i, (chunk, given) in enumerate(zip(chunks, vectors, strict=True)):
            qv = given if given is not None else self._embed(chunk, embedder)
            parts = self.evidence(chunk, qv, described[i] if described is not None else None)
            fused = sum(parts.values())
            cands = []
            for row in range(len(chunk)):
                cand = candidate_set(fused[row], parts["description"][row], self.k, self.docs_candidates)
                gold = [self.position[g] for g in force[start + row] if g in self.position] if force is not None else []
                if gold and not set(gold) & set(cand):
                    cand[-1] = max(gold, key=lambda t: fused[row, t])
                cands.append(cand)
            llm = []
            if self.reranker == "llm":
                reads = [self.experience_read(parts["prototype"][row], c) for row, c in enumerate(cands)]
                llm = self.llm_scores(chunk, cands, reads)
            for row, query in enumerate(chunk):
                cand = cands[row]
                fallback = False
                if self.reranker == "none":
                    ranked, decided = self._retrieval_order(cand, fused[row]), ["retrieval"]
                elif self.reranker == "fields":
                    ranked, decided = self._rerank_fields(qv[row], cand, fused[row],
                                                          {f: v[row] for f, v in parts.items()})
                else:
                    ranked, decided, fallback = self._rerank_llm(cand, fused[row], parts["description"][row],
                                                                 llm[row])
                out.append(RouteResult(query, ranked[0].tool_id, ranked, decided, fallback))
            start += len(chunk)
        return out

    def route(self, query: str) -> RouteResult:
        """Route one query.

        Parameters
        ----------
        query : str
            The user request, in plain text.

        Returns
        -------
        RouteResult
            The chosen tool, the ranked candidates and what decided.

        Raises
        ------
        TypeError
            ``query`` is not a string.
        ValueError
            ``query`` is empty, or holds no letter or digit (:func:`query_problem`).

        Notes
        -----
        A query longer than :data:`~synapse_flwr.core.experience.MAX_QUERY`
        characters is cut there, as a logged or tested one is: a served
        request of megabytes held the router for seconds, and the embedder
        reads its first few hundred tokens only.
        """
        if not isinstance(query, str):
            raise TypeError(f"query must be a string, got {type(query).__name__}")
        query = request_text(query)
        if problem := query_problem(query):
            raise ValueError(f"query {problem}: nothing to route")
        return self.route_many([query], remember=False)[0]


def _chunked(queries: Sequence[str], size: int) -> list[list[str]]:
    """``queries`` in batches of ``size``."""
    return [list(queries[s : s + size]) for s in range(0, len(queries), size)]


def calls_floor(compendium: Compendium | FlatCompendium | None) -> float:
    """The call count a tool nobody called stays below in ``compendium`` (:data:`NOISE_SDS` aside): no evidence.

    A merged count sums the (clamped) noise of every org artifact behind it.
    """
    privacy = getattr(compendium, "privacy", None)
    merged = max(len(getattr(compendium, "inputs", None) or []), 1)
    return zero_count_floor(privacy.sigma if privacy is not None else 0.0, merged, NOISE_SDS)


def request_text(query: str) -> str:
    """``query`` as a request is routed: cut as a logged or tested one is
    (:func:`~synapse_flwr.core.experience.cut_query`), with a warning once a process when it is.

    Parameters
    ----------
    query : str
        The request.

    Returns
    -------
    str
        The text routed.
    """
    if (cut := cut_query(query)) is not query:
        log_once(log, f"a query longer than {MAX_QUERY} characters is routed on its first {MAX_QUERY}, as a logged "
                      "one is", logging.WARNING)
    return cut


def query_problem(query: str) -> str | None:
    """Why ``query`` cannot be routed, or None: it ``"is empty"``, ``"has no letter or digit"`` or is not text.

    The first two would still be answered (an empty query with score 0,
    ``"???"`` by its embedding's noise) as if they had been routed; bytes that
    are not UTF-8 (a shell in another encoding) cannot be embedded.
    """
    if not query.strip():
        return "is empty"
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:
        return "is not UTF-8 text (set the terminal or the caller to UTF-8)"
    return None if is_text(query) else "has no letter or digit"


def check_router_inputs(compendium: object, catalog: object) -> None:
    """Refuse, before any work, a compendium or catalog of the wrong type (a path, a dict).

    Parameters
    ----------
    compendium : object
        Must be a Compendium, a FlatCompendium or None.
    catalog : object
        Must be a Catalog.

    Raises
    ------
    TypeError
        Saying what was expected and what was given.
    """
    if compendium is not None and not isinstance(compendium, (Compendium, FlatCompendium)):
        raise TypeError("compendium must be a Compendium, a FlatCompendium or None (load an artifact with "
                        f"wire.load_artifact(path)), got {type(compendium).__name__}")
    if not isinstance(catalog, Catalog):
        raise TypeError(f"catalog must be a Catalog (load it with load_catalog(path)), got {type(catalog).__name__}")


def candidate_set(fused: np.ndarray, docs: np.ndarray, k: int, keep: int) -> list[int]:
    """Retrieval's top ``k`` in its order, holding the documentation's top ``keep``.

    A documentation favourite that retrieval ranked below ``k`` replaces the
    lowest candidate that is not one, and goes last; retrieval's top-1 always
    stays first (so at most ``k - 1`` favourites are added).

    Parameters
    ----------
    fused : numpy.ndarray
        ``(n_tools,)`` retrieval scores of one query.
    docs : numpy.ndarray
        ``(n_tools,)`` its documentation-only scores.
    k : int
        Candidates.
    keep : int
        The documentation's best tools every candidate set holds (at most ``k - 1``).
    """
    top = [int(t) for t in np.argsort(-fused, kind="stable")[:k]]
    favourites = [int(t) for t in np.argsort(-docs, kind="stable")[: min(keep, k - 1)]]
    missing = [t for t in favourites if t not in top]
    drop = set([t for t in reversed(top) if t not in favourites][: len(missing)])
    return [t for t in top if t not in drop] + missing
