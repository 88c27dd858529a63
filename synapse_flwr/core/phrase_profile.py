"""Phrase profile: per tool, the likelihood that a query mentions each phrase (retrieval's lexical evidence)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from synapse_flwr.core.documentation import doc_text
from synapse_flwr.core.phrases import candidate_phrases
from synapse_flwr.core.schema import ToolEntry

# Phrase-likelihood constants, chosen on the seed-7 MetaTool split (dev), never
# on the reported seeds: description pseudo-count per unit of release threshold,
# probability of a phrase a tool neither released nor documents, documentation
# prior used when no tool has experience, and the support share of a variant.
PRIOR_STRENGTH = 10.0
PHRASE_FLOOR = 1e-4
DESCRIPTION_RATE = 0.06
VARIANT_SHARE = 0.5


class PhraseProfile:
    """Per-tool phrase likelihoods: released phrase supports, smoothed toward the description.

    A tool's probability that a query mentions phrase ``w`` is estimated as
    ``(n_t(w) + m * prior_t(w)) / (N_t + m)``, where ``n_t(w)`` is the phrase's
    released support, ``N_t`` the tool's (noised) number of calls, and the
    prior is ``rho`` for the tool's description phrases and ``floor``
    otherwise. A query scores the sum, over its phrases, of the positive part
    of ``log P(w | t) / mean_t' P(w | t')``: only evidence *for* a tool counts,
    because a phrase missing from a tool's release may just be below the
    release threshold. A tool without experience keeps its documentation
    prior, so it competes on the same (description) terms as before.

    Parameters
    ----------
    entries : dict of str to ToolEntry
        The tools, in index order.
    names : dict of str to str
        Tool id to display name (its words count as description).
    threshold : float
        Release threshold of the compendium (1 without privacy): the
        description's pseudo-count scales with it, since experience thinned by
        a high threshold says less beyond the documentation.
    arguments : mapping of str to str, or None
        Tool id to the arguments its documentation reads, which count as
        description too (:func:`~synapse_flwr.core.documentation.catalog_arguments`).
    """

    def __init__(self, entries: dict[str, ToolEntry], names: dict[str, str], threshold: float = 1.0,
                 arguments: Mapping[str, str] | None = None) -> None:
        arguments = arguments or {}
        vocab: dict[str, int] = {}
        n_tools = len(entries)
        c_rows, c_cols, c_vals, d_rows, d_cols = [], [], [], [], []
        calls = np.zeros(n_tools)
        for i, (tool_id, entry) in enumerate(entries.items()):
            text = doc_text(entry, names[tool_id], arguments.get(tool_id, "")).lower()
            for phrase in set(candidate_phrases(text, 10_000, 10_000)):
                d_rows.append(i)
                d_cols.append(vocab.setdefault(phrase, len(vocab)))
            top = 0.0
            for s in entry.when:
                for j, phrase in enumerate((s.text, *s.variants)):
                    # variants carry no support of their own: a share of their group's
                    c_rows.append(i)
                    c_cols.append(vocab.setdefault(phrase, len(vocab)))
                    c_vals.append(s.support * (VARIANT_SHARE if j else 1.0))
                top = max(top, s.support)
            calls[i] = max(entry.stats.calls, top)
        shape = (n_tools, max(len(vocab), 1))
        counts = sp.csr_matrix((c_vals, (c_rows, c_cols)), shape=shape)
        counts.sum_duplicates()
        desc = sp.csr_matrix((np.ones(len(d_rows)), (d_rows, d_cols)), shape=shape)
        with_exp = calls > 0
        # how often a query for a tool with experience mentions one of its
        # description phrases: the documentation prior, measured on the compendium
        rho = DESCRIPTION_RATE
        if with_exp.any():
            d_exp = desc[with_exp]
            hits = d_exp.multiply(counts[with_exp]).multiply(1.0 / calls[with_exp][:, None]).sum()
            rho = float(hits / max(d_exp.sum(), 1.0)) or DESCRIPTION_RATE
        m = PRIOR_STRENGTH * max(threshold, 1.0)
        scale = 1.0 / (calls + m)
        # P(w | t) is (counts + m * prior) * scale; its mean over tools, per phrase
        mean = (scale @ counts + m * PHRASE_FLOOR * scale.sum() + m * (rho - PHRASE_FLOOR) * (scale @ desc)) / n_tools
        self.log_mean = np.log(np.asarray(mean).ravel())
        # ... and for a phrase nobody released or documents
        log_mean_unknown = np.log(m * PHRASE_FLOOR * scale.sum() / n_tools)
        # a phrase the tool never released: the floor, shrunk by the tool's own
        # experience (a tool without experience keeps a broad model, so phrases
        # no release explains are mild evidence for it: the novelty effect)
        self.log_floor = np.log(m * PHRASE_FLOOR * scale).astype(np.float32)
        listed = ((counts + desc) > 0).astype(np.float64).tocoo()
        r, col = listed.row, listed.col
        # (a catalog whose texts hold no phrase lists none: scipy would index out a sparse matrix)
        c_at, d_at = ((np.asarray(x[r, col]).ravel() if len(r) else np.zeros(0)) for x in (counts, desc))
        prob = (c_at + m * (PHRASE_FLOOR + (rho - PHRASE_FLOOR) * d_at)) * scale[r]
        ratio = np.maximum(np.log(prob) - self.log_mean[col], 0.0)
        background = np.maximum(self.log_floor[r] - self.log_mean[col], 0.0)
        # listed phrases replace the background term the dense part adds for them
        # stored phrase-major (the transpose scoring multiplies by), converted once rather than per query
        self.correction_t = sp.csr_matrix((ratio - background, (r, col)), shape=shape, dtype=np.float32).T.tocsr()
        self.unknown = np.maximum(self.log_floor - log_mean_unknown, 0.0).astype(np.float32)
        self.vocab = vocab

    def encode(self, queries: Sequence[str]) -> tuple[sp.csr_matrix, np.ndarray]:
        """Binary phrase-presence vectors over the vocabulary, and the count of phrases outside it."""
        rows, cols = [], []
        unknown = np.zeros(len(queries), np.float32)
        for i, q in enumerate(queries):
            for phrase in set(candidate_phrases(q.lower(), 10_000, 10_000)):
                j = self.vocab.get(phrase)
                if j is None:
                    unknown[i] += 1
                else:
                    rows.append(i)
                    cols.append(j)
        enc = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)),
                            shape=(len(queries), max(len(self.vocab), 1)))
        return enc, unknown

    def score(self, queries: Sequence[str]) -> np.ndarray:
        """Positive log-likelihood-ratio evidence of each query for each tool: ``(len(queries), n_tools)``."""
        enc, unknown = self.encode(queries)
        out = np.asarray((enc @ self.correction_t).todense(), dtype=np.float32)
        out += unknown[:, None] * self.unknown[None, :]
        for i in range(len(queries)):
            cols = enc.indices[enc.indptr[i] : enc.indptr[i + 1]]
            if len(cols):
                log_mean = self.log_mean[cols].astype(np.float32)
                out[i] += np.maximum(self.log_floor[:, None] - log_mean[None, :], 0.0).sum(axis=1)
        return out
