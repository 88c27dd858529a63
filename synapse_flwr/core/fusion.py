"""Fusion: how experience adds to a tool's documentation score in retrieval.

No harm by construction: every tool's retrieval score starts from exactly
the score a documentation-only router gives it (description cosine plus the
phrase evidence of its documentation alone), and experience only *adds*
non-negative evidence, to the tools that have it: the phrase evidence beyond
the documentation, the scenario similarity beyond the description, and the
prototype evidence. A tool's prototype counts only when noise alone would
rarely be as long (``gate_alpha`` over the whole catalog), its released
count clears its noise (``gate_count_sds``) and it points along its tool's
public documentation by more than its noise (``gate_doc_sds``); its evidence is the
query's cosine with the prototype's direction beyond ``margin``, shrunk by
the noise, ``A^2 / (A^2 + k * sd^2)``, plus ``prior * log(1 + n)`` for its
released count ``n`` (how often the tool serves queries at all). Prototype
and scenario evidence are *gated per query*: each is added only when the
documentation's own choice for the query is a tool with that evidence (a
prototype above the noise, a released ``when`` scenario). A query whose
documentation-best tool has no experience is routed exactly as docs_only
routes it, so experience can only re-route queries that docs_only already
sends to an experienced tool (one mean prototype per tool cannot tell a
query of a known kind from a query for a new tool; the documentation's
choice can). A tool without experience, or with experience at noise level,
therefore scores exactly as without a compendium.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from synapse_flwr.core.schema import Compendium, FlatCompendium
from synapse_flwr.core.votes import chosen_setting


@dataclass(frozen=True)
class Fusion:
    """How experience adds to a tool's documentation score.

    The defaults were chosen on the seed-7 MetaTool split only
    (``simulations/tune_router.py``, ``docs/results/tuning/``): phrases beyond
    the documentation cost 17 held-out points without privacy; without the
    per-query gate, every cosine floor that kept held-out tools within 0.005
    of docs_only capped the seen gain at 2-4 points.

    Parameters
    ----------
    phrases : float
        Weight of the phrase evidence beyond what the documentation gives.
    prototype : float
        Weight of the prototype evidence (cosine part).
    shrink : float
        ``k`` of the prototype's noise shrinkage ``A^2 / (A^2 + k * sd^2)``.
    gate_alpha : float
        Chance, over the whole catalog, that any prototype of noise alone is
        read as experience: a prototype is used only when noise alone would
        give a sum as long as its own with probability at most
        ``gate_alpha / n`` (``n`` the noised prototypes, Bonferroni; the
        chi-square tail of :func:`~synapse_flwr.core.prototypes.noise_pvalue`).
        Any other prototype is ignored (the tool keeps exactly its
        documentation score, and counts as a tool without experience for
        the per-query gate). A fixed 3-SD gate let 0.23% of noise-only
        prototypes through, one in every few runs of a 199-tool catalog
        and more than one per run at 811 tools.
    gate_count_sds : float
        A prototype is also read only when its released count exceeds this
        many of its count's noise SDs. The count's noise is drawn apart from
        the sum's, so the test divides how often noise alone passes the gate
        (one noise-only prototype read costs the held-out queries its tool's
        documentation would route right: 8.6 points on one seed-7 lab draw),
        but by less than ``P(N(0, 1) > s)``: each organisation's count is
        clipped at 0 before the merge, so a merged count of noise alone sits
        above 0. At 1 SD noise alone clears it in 0.25 (demo, K = 3), 0.42
        (K = 5) and 0.96 (K = 20) of the cases (``gate_count``). Seed-7 dev split at
        epsilon 4 (``docs/results/tuning/gate_count``): 0 and 1 keep every
        MetaTool prototype the energy test passes (K = 5 and 20, 3 draws
        each); 1 also drops 0-3 of the demo's 9-12 and lifts its seen top-1
        0.677 -> 0.691 (4 draws); 2 costs MetaTool 1.4 seen points at K = 5.
    gate_doc_sds : float or None
        A prototype that passes the length and count tests is also read only
        when its projection on its tool's public documentation vector (the
        one docs_only scores with) exceeds this many of the sum's noise SDs,
        or else when it passes the length test at ``gate_alpha * P(N(0, 1) >
        s)`` (:func:`~synapse_flwr.core.prototypes.gate_reads`). The
        projection's noise is exactly ``N(0, sd^2)`` after any merge (on
        seed 7, 240 noise-only MetaTool prototypes: mean -0.13 SD, SD 1.02),
        so unlike the count test it holds noise back at every federation
        size: at 2 SDs noise alone passes about 16 times less often than the
        length test alone lets it (199 tools, 384 dimensions). The second
        path keeps a tool whose real traffic is unlike its documentation:
        the documentation test alone cost the names-only folder shape 1.5 and
        4.4 seen points at epsilon 4 (``docs/results/folder_stress``), with
        the path nothing. Seed-7 dev split at epsilon 4
        (``docs/results/tuning/gate_count``): 2 reads exactly the prototypes
        the other tests read (MetaTool K = 5 and 20, the demo). None: no
        such test.
    margin : float
        Cosine with a prototype's direction counts only above this floor.
    prior : float
        Weight of ``log(1 + n)``, ``n`` the prototype's released count: a
        class prior learnt from the federation's mix of tools. It helps where
        traffic follows that mix and costs where it does not (a test set
        balanced over tools: ``docs/results/tuning/label_shift``); 0 routes
        on the queries' evidence alone.
    """

    phrases: float = 0.0
    prototype: float = 8.0
    shrink: float = 4.0
    gate_alpha: float = 0.05
    margin: float = 0.0
    prior: float = 0.5
    gate_count_sds: float = 1.0
    gate_doc_sds: float | None = 2.0

    def __post_init__(self) -> None:
        for name in ("phrases", "prototype", "shrink", "prior", "gate_count_sds", "gate_doc_sds"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"fusion {name} must be finite and >= 0, got {value!r}")
        if not 0 < self.gate_alpha <= 1:
            raise ValueError(f"fusion gate_alpha must be in (0, 1], got {self.gate_alpha!r}")
        if not -1 <= self.margin < 1:
            raise ValueError(f"fusion margin must be in [-1, 1), got {self.margin!r}")

    @property
    def docs_only(self) -> bool:
        """Whether experience adds nothing to the documentation (the votes' first setting).

        A router then reads no experience field at all: no ``when``
        scenario, no ``when_not``, and an LLM reranker sees every candidate
        as docs_only shows it.
        """
        return self.prototype == 0 and self.prior == 0 and self.phrases == 0


# Fusion constants of an embedder whose similarity scale is not MiniLM's (the
# defaults), keyed by the embedder's name; seed-7 dev split,
# simulations/tune_router.py configs/tune_router_static.toml
# (docs/results/tuning/static). The 64-d static embedder under MiniLM's
# prototype 8 / prior 0.5 routes seen tools below docs_only (0.3365 at
# epsilon 4 against 0.3625): its cosines are smaller, so the count prior
# outweighs them. Prototype 4 / prior 0.2: 0.4129 at epsilon 4, 0.4618
# without noise, held-out equal to docs_only (0.3857).
EMBEDDER_FUSIONS: dict[str, Fusion] = {"tokenlearn-static-64d": Fusion(prototype=4.0, prior=0.2)}


def voted_fusion(compendium: Compendium | FlatCompendium | None, embedder: str = "") -> Fusion:
    """The embedder's default :class:`Fusion`, with the prototype weight and prior the federation's votes chose, if any.

    Parameters
    ----------
    compendium : Compendium or FlatCompendium or None
        The global compendium; its ``votes`` (if any) choose prototype weight and prior.
    embedder : str
        The router's embedder name: its :data:`EMBEDDER_FUSIONS` entry, else :class:`Fusion`'s defaults.
    """
    base = EMBEDDER_FUSIONS.get(embedder, Fusion())
    setting = chosen_setting(getattr(compendium, "votes", None))
    if setting is None:
        return base
    return replace(base, prototype=setting.prototype, prior=setting.prior)


def gate_open(docs: np.ndarray, experienced: np.ndarray) -> np.ndarray:
    """Per query, whether the documentation's choice (any tool tied at its best score) is experienced.

    Parameters
    ----------
    docs : numpy.ndarray
        ``(n, n_tools)`` documentation scores.
    experienced : numpy.ndarray
        ``(n_tools,)`` booleans: the tools with the evidence the gate admits.
    """
    # ties matter for a lexical embedder: a query sharing no word with any documentation scores 0 everywhere
    return ((docs >= docs.max(axis=1, keepdims=True)) & experienced[None, :]).any(axis=1)
