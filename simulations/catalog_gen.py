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
from dataclasses import replace

import numpy as np

from synapse_flwr.core.catalog import Catalog, ToolDoc, make_catalog
from synapse_flwr.core.sanitize import instruction_like
from synapse_flwr.core.schema import Compendium
from synapse_flwr.data.metatool import load_metatool

GENERATED_PREFIX = "generated_"
_WORD = re.compile(r"[a-z0-9]+")


def real_catalog() -> Catalog:
    """MetaTool's 199 labelled tools plus the unlabelled plugin manifests (real descriptions)."""
    return load_metatool(with_extra_tools=True).catalog


def _plain(description: str) -> str:
    # plugin manifests address the model ("Only recommend ..."): such sentences would be quarantined at the edge
    return ". ".join(s for s in description.split(". ") if not instruction_like(s))


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
    docs = [replace(d, description=_plain(d.description)) for d in list(real.tools)[:size]]
    texts = [d.description for d in docs if d.description]
    rng = np.random.default_rng(seed)
    for i in range(size - len(docs)):
        a, b = rng.choice(len(texts), 2, replace=False)
        desc = f"{texts[a].split('. ')[0]}. {texts[b].split('. ')[-1]}"
        docs.append(ToolDoc(f"{GENERATED_PREFIX}{i:05d}", f"{GENERATED_PREFIX}{i:05d}", desc))
    return make_catalog(docs)


def _rename(text: str, replica: int) -> str:
    return text if replica == 0 else _WORD.sub(lambda m: f"{m.group(0)}{replica}", text)


def _copy_entry(entry: dict, tool_id: str, description: str, replica: int, ids: dict[str, str]) -> dict:
    # on the JSON form: copying pydantic models one by one costs ~10x more at 20,000 tools
    def scen(s: dict) -> dict:
        out = {**s, "text": _rename(s["text"], replica), "variants": [_rename(v, replica) for v in s["variants"]]}
        if s.get("prefer"):
            out["prefer"] = ids.get(s["prefer"])
        return out

    def counts(xs: list[dict]) -> list[dict]:
        return sorted(({**x, "tool": ids[x["tool"]]} for x in xs if x["tool"] in ids), key=lambda x: x["tool"])

    return {**entry, "tool_id": tool_id, "description": description,
            "when": [scen(s) for s in entry["when"]], "when_not": [scen(w) for w in entry["when_not"]],
            "precautions": [{**p, "text": _rename(p["text"], replica)} for p in entry["precautions"]],
            "confusions": counts(entry["confusions"]), "next_tools": counts(entry["next_tools"])}


def replicate_artifact(art: Compendium, catalog: Catalog) -> Compendium:
    """``art``'s tool entries spread over every tool of ``catalog`` (see the module docstring).

    The entries of ``art`` are taken in tool-id order; catalog tool ``j``
    (in catalog order) receives entry ``j mod n`` of replica ``j // n``, with
    its own id and description, and with ``prefer``, confusion and next-tool
    pointers moved to the same replica's tools (those of the real replica 0
    keep theirs). The result is a validated artifact of ``len(catalog)`` tools.
    """
    src = [e.model_dump(mode="json") for e in sorted(art.tools, key=lambda e: e.tool_id)]
    if not src:
        raise ValueError("cannot replicate an artifact without tools")
    n, targets = len(src), catalog.ids
    tools = []
    for replica in range(-(-len(targets) // n)):
        # pointer to source tool i -> the catalog tool holding i in this replica (if the catalog is that long)
        ids = {e["tool_id"]: targets[replica * n + i] for i, e in enumerate(src) if replica * n + i < len(targets)}
        tools += [_copy_entry(src[i], tool_id, catalog.get(tool_id).description, replica, ids)
                  for i, tool_id in enumerate(targets[replica * n:(replica + 1) * n])]
    tools.sort(key=lambda e: e["tool_id"])
    return Compendium.model_validate({**art.model_dump(mode="json"), "tools": tools})


def vary_org(obj: dict, org: str, seed: int, keep: float = 0.8) -> dict:
    """Another organisation like the artifact ``obj`` (its JSON form): renamed, each scenario kept
    with probability ``keep``, supports jittered by a factor in [0.5, 1.5] (so K orgs share
    vocabulary without being copies). Not validated: cheap enough to make hundreds of orgs.
    """
    rng = np.random.default_rng(seed)

    def vary(xs: list[dict]) -> list[dict]:
        kept = [x for x in xs if rng.random() < keep]
        return [{**x, "support": round(x["support"] * rng.uniform(0.5, 1.5), 4), "orgs": [org] if x["orgs"] else []}
                for x in kept]

    tools = [{**e, "when": vary(e["when"]), "when_not": vary(e["when_not"]),
              "precautions": [{**p, "orgs": [org] if p["orgs"] else []} for p in e["precautions"]],
              "provenance": {**e["provenance"], "orgs": [org] if e["provenance"]["orgs"] else []}}
             for e in obj["tools"]]
    return {**obj, "tools": tools, "issuer": {**obj["issuer"], "org": org}}


def replicate_org(art: Compendium, org: str, seed: int, keep: float = 0.8) -> Compendium:
    """:func:`vary_org` on a validated artifact, validated."""
    return Compendium.model_validate(vary_org(art.model_dump(mode="json"), org, seed, keep))
