"""Flower ClientApp: an organisation returns its privatised compendium, not weights.

On each train message the client decodes and validates the incoming global
compendium, loads its own private experience (deployment: ``--node-config
'data-path="..." org="..."'``; simulation: partition ``partition-id`` of the
configured dataset, with run config ``inject`` > 0 corrupting that share of
it for robustness experiments), optionally replays that traffic with the global
compendium so that the outcomes become new experience (run config
``replay = true``: the feedback loop), builds and privatises its compendium,
and replies with the artifact's wire bytes plus metrics. The raw experience
never leaves it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from synapse_flwr.core.builder import BuildConfig, build_compendium
from synapse_flwr.core.catalog import Catalog, load_catalog
from synapse_flwr.core.embed import get_embedder
from synapse_flwr.core.errors import InputError
from synapse_flwr.core.experience import Event, load_experience
from synapse_flwr.core.replay import replay_events
from synapse_flwr.core.router import Router
from synapse_flwr.core.wire import decode, encode
from synapse_flwr.data.check import DataError
from synapse_flwr.data.federation import load_dataset, load_partition
from synapse_flwr.flower.config import RunConfig
from synapse_flwr.strategies.records import from_record, to_record

log = logging.getLogger(__name__)

app = ClientApp()


@dataclass(frozen=True)
class OrgData:
    """This node's organisation, catalog and private experience."""

    org: str
    catalog: Catalog
    events: list[Event]


def org_data(context: Context, cfg: RunConfig) -> OrgData:
    """Find this node's experience: its node config in deployment, its partition in simulation.

    Parameters
    ----------
    context : flwr.app.Context
        ``node_config`` holds ``data-path`` (+ ``org``, optional
        ``catalog-path``) on a real SuperNode, or ``partition-id`` and
        ``num-partitions`` under the simulation engine.
    cfg : RunConfig
        The run config (names the dataset).
    """
    nc = context.node_config
    if "data-path" in nc:
        data_path = Path(str(nc["data-path"]))
        catalog_path = nc.get("catalog-path")
        if catalog_path:
            catalog = load_catalog(str(catalog_path))
        else:
            catalog = load_dataset(cfg.dataset, cfg.seed).catalog
        org = str(nc.get("org", data_path.stem.removeprefix("org_")))
        return OrgData(org, catalog, load_experience(data_path, catalog))
    k = int(nc["num-partitions"])
    org, ds = load_partition(cfg.dataset, k, int(nc["partition-id"]), cfg.seed, cfg.alpha, cfg.inject)
    return OrgData(org, ds.catalog, ds.orgs[org])


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Validate the global, build and privatise this org's compendium, reply with it."""
    cfg = RunConfig.from_mapping(context.run_config)
    config = msg.content["config"]
    server_round = int(config["server-round"])
    incoming = decode(from_record(msg.content["arrays"]))  # raises on an invalid global
    try:
        data = org_data(context, cfg)
    except (InputError, DataError) as exc:
        # The reason travels to the server: keep the org's file paths out of it.
        log.error("cannot load this org's experience: %s", exc)
        first = exc.report.problems[0] if isinstance(exc, DataError) else exc
        where = f"line {first.line}" if first.line is not None else "file"
        raise RuntimeError(f"invalid local experience data ({where}): {first.message}") from None
    replay = cfg.replay
    events, replayed = data.events, []
    # a typed global has tools, a flat-majority one texts; round 1's global has neither
    if replay and (getattr(incoming, "tools", None) or getattr(incoming, "texts", None)):
        router = Router(incoming, data.catalog, embedder=get_embedder(cfg.replay_embedder))
        replayed = replay_events(data.events, router)
        events = [*data.events, *replayed]
    artifact = build_compendium(
        events,
        data.catalog,
        data.org,
        round_=server_round,
        epsilon=cfg.epsilon,
        delta=cfg.delta,
        rounds=cfg.num_rounds,
        seed=cfg.seed,
        # with replay on, every round is calibrated for two events per record
        config=BuildConfig(events_per_record=2 if replay else 1),
    )
    wire = encode(artifact)
    log.info(
        "%s round %d: %d events -> %d bytes (global in: %d tools)",
        data.org, server_round, len(data.events), len(wire), len(getattr(incoming, "tools", [])),
    )
    metrics = MetricRecord(
        {
            "events": len(data.events),
            "bytes-sent": len(wire),
            "epsilon": artifact.privacy.epsilon if artifact.privacy.epsilon is not None else -1.0,
            "replayed": len(replayed),
            "replay-acc": sum(e.success for e in replayed) / len(replayed) if replayed else -1.0,
        }
    )
    return Message(content=RecordDict({"artifact": to_record(wire), "metrics": metrics}), reply_to=msg)
