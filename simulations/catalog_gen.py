"""Large catalogs and artifacts for scale measurements: real MetaTool tools first, generated ones beyond.

MetaTool has 199 labelled tools and a few hundred unlabelled plugin
manifests with real descriptions (:func:`~synapse_flwr.data.metatool.load_metatool`
with ``with_extra_tools``). :func:`scaled_catalog` takes those and tops them
up with generated tools whose description splices sentences of two real
ones, so text length and vocabulary stay realistic. :func:`replicate_artifact`
spreads a real organisation artifact over such a catalog: tool ``j`` gets a
copy of the real entry ``j mod n`` with every word of its texts renamed for
its replica (``weather`` -> ``weather3``), so replicas do not claim each
other's scenarios while the structure inside a tool (and the similarity
between its scenarios) is the real one. These only serve size and speed
measurements, never accuracy.
"""

from __future__ import annotations

import re

import numpy as np

from synapse_flwr.core.catalog import Catalog, ToolDoc, make_catalog
from synapse_flwr.core.schema import Compendium, Scenario, ToolCount, ToolEntry
from synapse_flwr.data.metatool import load_metatool

GENERATED_PREFIX = "generated_"
_WORD = re.compile(r"[a-z0-9]+")


def real_catalog() -> Catalog:
    """MetaTool's 199 labelled tools plus the unlabelled plugin manifests (real descriptions)."""
    return load_metatool(with_extra_tools=True).catalog


def scaled_catalog(size: int, seed: int = 0, real: Catalog | None = None) -> Catalog:
    """A catalog of ``size`` tools: the real ones (all of them, or the first ``size``), then generated ones.

    Parameters
    ----------
    size : int
        Number of tools wanted.
    seed : int
        Seed of the sentence splicing of generated descriptions.
    real : Catalog or None
        The real tools; None loads :func:`real_catalog`.
    """
    real = real if real is not None else real_catalog()
    docs = list(real.tools)[:size]
    texts = [d.description for d in docs if d.description]
    rng = np.random.default_rng(seed)
    for i in range(size - len(docs)):
        a, b = rng.choice(len(texts), 2, replace=False)
        desc = f"{texts[a].split('. ')[0]}. {texts[b].split('. ')[-1]}"
        docs.append(ToolDoc(f"{GENERATED_PREFIX}{i:05d}", f"{GENERATED_PREFIX}{i:05d}", desc))
    return make_catalog(docs)


def _rename(text: str, replica: int) -> str:
    return text if replica == 0 else _WORD.sub(lambda m: f"{m.group(0)}{replica}", text)


def _copy_entry(entry: ToolEntry, tool_id: str, description: str, replica: int, ids: dict[str, str]) -> ToolEntry:
    def scen(s: Scenario) -> Scenario:
        update = {"text": _rename(s.text, replica), "variants": [_rename(v, replica) for v in s.variants]}
        if getattr(s, "prefer", None):
            update["prefer"] = ids.get(s.prefer)
        return s.model_copy(update=update)

    def counts(xs: list[ToolCount]) -> list[ToolCount]:
        return sorted((x.model_copy(update={"tool": ids[x.tool]}) for x in xs if x.tool in ids),
                      key=lambda x: x.tool)

    return entry.model_copy(update={
        "tool_id": tool_id, "description": description,
        "when": [scen(s) for s in entry.when], "when_not": [scen(w) for w in entry.when_not],
        "precautions": [p.model_copy(update={"text": _rename(p.text, replica)}) for p in entry.precautions],
        "confusions": counts(entry.confusions), "next_tools": counts(entry.next_tools),
    })


def replicate_artifact(art: Compendium, catalog: Catalog) -> Compendium:
    """``art``'s tool entries spread over every tool of ``catalog`` (see the module docstring).

    The entries of ``art`` are taken in tool-id order; catalog tool ``j``
    (in catalog order) receives entry ``j mod n`` of replica ``j // n``, with
    its own id and description, and with ``prefer``, confusion and next-tool
    pointers moved to the same replica's tools (those of the real replica 0
    keep theirs). The result is a valid artifact of ``len(catalog)`` tools.
    """
    src = sorted(art.tools, key=lambda e: e.tool_id)
    if not src:
        raise ValueError("cannot replicate an artifact without tools")
    position = {e.tool_id: i for i, e in enumerate(src)}
    targets = catalog.ids
    tools = []
    for j, tool_id in enumerate(targets):
        replica, base = divmod(j, len(src))
        # pointer to source tool i -> the catalog tool holding i in this replica (if the catalog is that long)
        ids = {t: targets[replica * len(src) + i] for t, i in position.items()
               if replica * len(src) + i < len(targets)}
        tools.append(_copy_entry(src[base], tool_id, catalog.get(tool_id).description, replica, ids))
    return art.model_copy(update={"tools": sorted(tools, key=lambda e: e.tool_id)})


def replicate_org(art: Compendium, org: str, seed: int, keep: float = 0.8) -> Compendium:
    """Another organisation like ``art``: renamed, each scenario kept with probability ``keep``,
    supports jittered by a factor in [0.5, 1.5] (so K orgs share vocabulary without being copies).
    """
    rng = np.random.default_rng(seed)

    def vary(xs: list) -> list:
        kept = [x for x in xs if rng.random() < keep]
        return [x.model_copy(update={"support": round(x.support * rng.uniform(0.5, 1.5), 4),
                                     "orgs": [org] if x.orgs else []}) for x in kept]

    tools = [e.model_copy(update={
        "when": vary(e.when), "when_not": vary(e.when_not),
        "precautions": [p.model_copy(update={"orgs": [org] if p.orgs else []}) for p in e.precautions],
        "provenance": e.provenance.model_copy(update={"orgs": [org] if e.provenance.orgs else []}),
    }) for e in art.tools]
    return art.model_copy(update={"tools": tools, "issuer": art.issuer.model_copy(update={"org": org})})

