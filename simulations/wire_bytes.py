"""Bytes per client per round on the wire: full artifacts against deltas, privacy on, at 199 and 3,180 tools.

Each of K MetaTool organisations runs the ClientApp's own release path
(``org_release``: release-once at the run's epsilon, query prototypes) for R
rounds on a catalog of T tools: MetaTool's 199, or a 3,180-tool catalog with
MetaTool's real descriptions first and generated tools beyond
(``simulations/catalog_gen.py``, without the three real descriptions that
read as instructions), the organisation's real experience on the tools it used. Every round its reply is measured as the full gzip artifact
and as what ``reply_payload`` sends when the server holds the previous one (a
delta from round 2). The server's side rebuilds every delta (``apply_delta``)
and must get the sent bytes exactly; the global merged from the rebuilt
artifacts is compared byte for byte with the one merged from the full ones,
and both route the dataset's test queries (``fields`` reranker), so the
accuracy and the number of routes that differ are reported side by side.

Usage: ``python simulations/wire_bytes.py configs/wire_bytes.toml``
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from synapse_flwr.simulations.catalog_gen import real_catalog, scaled_catalog

from synapse_flwr.core.catalog import Catalog, make_catalog
from synapse_flwr.core.delta import apply_delta, sha256_hex
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.merge import merge_typed
from synapse_flwr.core.metrics import evaluate_routes
from synapse_flwr.core.prototypes import above_noise
from synapse_flwr.core.release import ReleaseState
from synapse_flwr.core.router import Router
from synapse_flwr.core.sanitize import instruction_like
from synapse_flwr.core.schema import Compendium
from synapse_flwr.core.wire import canonical_json, decode, encode, unwrap
from synapse_flwr.data.federation import FederatedDataset, load_federated
from synapse_flwr.data.pins import verified_hashes
from synapse_flwr.eval.results import (
    experiment_parser,
    load_experiment,
    update_summary,
    write_results,
)
from synapse_flwr.flower.client_app import (
    OrgData,
    federation_embedder,
    org_release,
    reply_payload,
)
from synapse_flwr.flower.config import RunConfig

log = logging.getLogger("wire_bytes")


def breakdown(artifact: Compendium) -> dict:
    """Gzip bytes of a round-1 artifact without its prototypes, and keeping only those above 2 or 3 noise SDs.

    Dropping a prototype by its released count is post-processing (no privacy
    cost) but changes the merged global: reported, not applied.
    """
    def gz(tools: list) -> int:
        return len(encode(artifact.model_copy(update={"tools": tools})))

    out = {"full": gz(artifact.tools), "no_prototypes": gz([t.model_copy(update={"prototype": None})
                                                            for t in artifact.tools])}
    for sds in (2, 3):
        kept = [t if t.prototype is not None and above_noise(t.prototype, sds) else
                t.model_copy(update={"prototype": None}) for t in artifact.tools]
        out[f"prototypes_above_{sds}sd"] = {"kept": sum(t.prototype is not None for t in kept), "bytes": gz(kept)}
    return out


def org_rounds(data: OrgData, cfg: RunConfig, sent_dir: Path) -> tuple[list[dict], bytes, bytes, dict]:
    """One org's R rounds: full and sent bytes per round, each delta rebuilt by the server's code.

    Returns the rows, the last round's full wire bytes, what the server rebuilt of it, and
    the round-1 :func:`breakdown`.
    """
    state, held, base, rows = ReleaseState(fingerprint="wire-bytes"), None, b"", []
    embedder = federation_embedder(cfg)
    for rnd in range(1, cfg.num_rounds + 1):
        artifact, state, released = org_release(data, cfg, state, rnd, [], embedder)
        wire = encode(artifact)
        body = unwrap(wire)
        key, payload = reply_payload(cfg, data.org, wire, held, sent_dir / f"{data.org}.sent.json")
        rebuilt = apply_delta(base, payload) if key != "artifact" else unwrap(payload)
        if rebuilt != body:
            raise AssertionError(f"{data.org} round {rnd}: the rebuilt artifact differs from the sent one")
        if rnd == 1:
            first = breakdown(artifact)
        rows.append({"round": rnd, "released": released, "tools": len(artifact.tools), "raw_bytes": len(body),
                     "full_bytes": len(wire), "sent_bytes": len(payload), "sent_as": key})
        base, held = rebuilt, sha256_hex(rebuilt)  # what the server holds for the next round
    return rows, wire, rebuilt, first


def routes_side_by_side(full: list, rebuilt: list, ds: FederatedDataset, catalog: Catalog, cfg: RunConfig) -> dict:
    """The globals merged from full and from rebuilt artifacts: identical bytes, and their routes."""
    g_full, g_rebuilt = merge_typed(full), merge_typed(rebuilt)
    embedder = federation_embedder(cfg)
    items = ds.seen_test + ds.heldout_test
    routes = {}
    for name, glob in (("full", g_full), ("delta", g_rebuilt)):
        router = Router(glob, catalog, embedder=embedder, reranker="fields")
        routes[name] = router.route_many([i.query for i in items])
    ranked = {k: [[c.tool_id for c in r.candidates] for r in v] for k, v in routes.items()}
    differ = sum(a != b for a, b in zip(ranked["full"], ranked["delta"]))  # any change of the ranking counts
    golds = [i.gold for i in items]
    return {"globals_identical": canonical_json(g_full) == canonical_json(g_rebuilt),
            "queries": len(items), "rankings_differing": differ,
            "acc_full": evaluate_routes(routes["full"], golds)["acc"],
            "acc_delta": evaluate_routes(routes["delta"], golds)["acc"]}


def clean_catalog(size: int) -> Catalog:
    """:func:`scaled_catalog` of ``size`` tools from the real tools whose description is not instruction-like.

    Three MetaTool plugin manifests read as instructions to an LLM (``Only
    recommend ...``); the edge quarantines such text, so an org artifact
    carrying them would be rejected whole.
    """
    real = real_catalog()
    return scaled_catalog(size, real=make_catalog([d for d in real.tools if not instruction_like(d.description)]))


def measure(size: int, ds: FederatedDataset, cfg: RunConfig) -> dict:
    """Bytes per client per round and the routes side by side on a catalog of ``size`` tools."""
    catalog = ds.catalog if size == len(ds.catalog) else clean_catalog(size)
    per_org, full, rebuilt = {}, [], []
    with tempfile.TemporaryDirectory(prefix="synapse-wire-") as tmp:
        for org, events in sorted(ds.orgs.items()):
            rows, wire, body, first = org_rounds(OrgData(org, catalog, events), cfg, Path(tmp))
            per_org[org] = {"rounds": rows, "round1_breakdown": first}
            full.append(decode(wire))
            rebuilt.append(decode(body))
            log.info("T=%d %s: %s %s", size, org, [(r["full_bytes"], r["sent_bytes"]) for r in rows], first)
    rounds = []
    for i in range(cfg.num_rounds):
        col = [o["rounds"][i] for o in per_org.values()]
        rounds.append({"round": i + 1, **{f"{k}_mean": round(sum(r[k] for r in col) / len(col))
                                          for k in ("raw_bytes", "full_bytes", "sent_bytes")},
                       "sent_bytes_max": max(r["sent_bytes"] for r in col),
                       "full_bytes_max": max(r["full_bytes"] for r in col)})
    return {"tools": len(catalog), "orgs": len(per_org), "rounds": rounds, "per_org": per_org,
            "routing": routes_side_by_side(full, rebuilt, ds, catalog, cfg)}


def table(results: dict) -> str:
    """Markdown: bytes per client per round (mean and max over orgs), full vs sent, and the routes."""
    lines = ["| tools | round | raw JSON (mean) | full gzip (mean / max) | sent (mean / max) | full / sent |",
             "|---|---|---|---|---|---|"]
    for res in results.values():
        for r in res["rounds"]:
            lines.append(f"| {res['tools']:,} | {r['round']} | {r['raw_bytes_mean']:,} | {r['full_bytes_mean']:,} / "
                         f"{r['full_bytes_max']:,} | {r['sent_bytes_mean']:,} / {r['sent_bytes_max']:,} | "
                         f"{r['full_bytes_mean'] / r['sent_bytes_mean']:.0f}x |")
    lines += ["", ("Round 1, gzip bytes of the first org's artifact: full / without prototypes / keeping prototypes "
              "above 2 SD (kept) / above 3 SD (kept) (not applied: it would change the global)"), ""]
    for res in results.values():
        b = next(iter(res["per_org"].values()))["round1_breakdown"]
        lines.append(f"- {res['tools']:,} tools: {b['full']:,} / {b['no_prototypes']:,} / "
                     f"{b['prototypes_above_2sd']['bytes']:,} ({b['prototypes_above_2sd']['kept']}) / "
                     f"{b['prototypes_above_3sd']['bytes']:,} ({b['prototypes_above_3sd']['kept']})")
    lines += ["", "| tools | globals identical | test queries | rankings differing | acc (full) | acc (delta) |",
              "|---|---|---|---|---|---|"]
    for res in results.values():
        g = res["routing"]
        lines.append(f"| {res['tools']:,} | {g['globals_identical']} | {g['queries']} | {g['rankings_differing']} | "
                     f"{g['acc_full']:.4f} | {g['acc_delta']:.4f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = experiment_parser(__doc__)
    args = parser.parse_args()
    cfg = load_experiment(args.config)
    run_cfg = RunConfig.from_mapping({**cfg["run_config"], "dataset": cfg["dataset"], "num-rounds": cfg["rounds"]})
    ds = load_federated(cfg["dataset"], cfg["orgs"], run_cfg.seed, run_cfg.alpha)
    results = {f"t{size}": measure(size, ds, run_cfg) for size in cfg["catalog_sizes"]}
    out = Path(cfg["output"])
    write_results(out, results, cfg, verified_hashes([cfg["dataset"]]),
                  f"python simulations/wire_bytes.py {args.config}")
    write_atomic(out / "results.md", table(results))
    if "t3180" in results:  # the steady state: the last round's largest reply
        update_summary(Path(cfg["summary"]), {"wire_bytes_3180_steady": results["t3180"]["rounds"][-1]["sent_bytes_max"]})
    log.info("\n%s", table(results))


if __name__ == "__main__":
    main()
