"""Run the Flower app as separate hosts would, on this machine: one SuperLink and one SuperNode per organisation.

:func:`run_local_deployment` starts ``flower-superlink`` and one
``flower-supernode`` per organisation on ``127.0.0.1``, each SuperNode given
its organisation's private experience file through ``--node-config``, exactly
as separate hosts would be (see ``docs/deployment.md``); it submits the run
with ``flwr run``, follows it to its end and stops every process. The setup
and teardown it shares with the simulation are :class:`~synapse_flwr.flower.launch.Launch`'s.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from synapse_flwr.core.errors import SynapseError
from synapse_flwr.flower.config import RunConfig
from synapse_flwr.flower.launch import Launch, check_nodes_wanted
from synapse_flwr.flower.processes import HOST, LOG_TAIL, ProcessGroup, pick_ports, tail

log = logging.getLogger(__name__)

POLL_S = 2.0  # seconds between run-status polls


@dataclass(frozen=True)
class NodeSpec:
    """One organisation's SuperNode.

    Parameters
    ----------
    org : str
        Organisation name (``org`` in the node config).
    data_path : Path
        Its private experience log (JSONL), passed as ``data-path``.
    catalog_path : Path or None
        Its tool catalog (``catalog-path``); without it the ClientApp loads
        the catalog of the run config's ``dataset``.
    noise : str or None
        The node config's ``noise``: ``"seeded"`` lets the run seed this
        organisation's noise (``client_app.node_refusal``); None: only secret noise.
    """

    org: str
    data_path: Path
    catalog_path: Path | None = None
    noise: str | None = None

    def node_config(self) -> str:
        """The ``--node-config`` value of this node (absolute paths).

        Returns
        -------
        str
            ``data-path="..." org="..."`` (and ``catalog-path="..."`` when set).

        Raises
        ------
        SynapseError
            If a value holds a quote or a newline.
        """
        items = {"data-path": self.data_path, "org": self.org, "catalog-path": self.catalog_path, "noise": self.noise}
        parts = []
        for key, value in items.items():
            if value is None:
                continue
            text = str(Path(value).resolve()) if isinstance(value, Path) else str(value)
            if '"' in text or "\n" in text:
                raise SynapseError(f"node {self.org!r}: {key} {text!r} may not contain quotes or newlines")
            parts.append(f'{key}="{text}"')
        return " ".join(parts)


@dataclass
class DeploymentConfig:
    """A local real deployment: one SuperLink and one SuperNode per organisation.

    Parameters
    ----------
    app_dir : Path
        The Flower app (folder with ``pyproject.toml``).
    nodes : int or sequence of NodeSpec
        Explicit SuperNodes, or a number: that many organisations of the run
        config's ``dataset`` (its own org logs when it has exactly that many,
        otherwise a non-IID re-partition written under ``flwr_home``).
        Explicit nodes are checked before anything starts (:func:`check_nodes`).
    run_config : mapping
        Overrides of ``[tool.flwr.app.config]`` (``num-rounds``, ``policy``,
        ``epsilon``, ``output-dir``...). Relative ``output-dir`` and dataset
        folders are made absolute (the app runs from a copy under
        ``flwr_home``).
    flwr_home : Path or None
        Private ``FLWR_HOME`` (CLI config, installed app, SuperLink state),
        kept after the run; a new temporary folder, removed after the run,
        when None. Logs go to ``<output-dir>/logs/``.
    superlink_port : int or None
        SuperLink port (Fleet, Control and ServerAppIo APIs); a free one when
        None.
    node_ports : sequence of int or None
        One local Runtime API port per SuperNode; free ones when None.
    timeout : float
        Seconds the run may take once submitted.
    online_timeout : float
        Seconds for the SuperLink to start and every SuperNode to come online.
    check_data : bool
        Load every explicit node's catalog, experience log and signing key
        before anything starts and refuse the run if one fails
        (:func:`check_nodes`, :func:`check_node_keys`). False hands the files
        over unchecked, as to separate hosts: a node whose log does not load,
        or that cannot sign, is then rejected by the server in every round (how
        the federation treats a broken organisation).
    """

    app_dir: Path
    nodes: int | Sequence[NodeSpec] = 3
    run_config: Mapping[str, Any] = field(default_factory=dict)
    flwr_home: Path | None = None
    superlink_port: int | None = None
    node_ports: Sequence[int] | None = None
    timeout: float = 900.0
    online_timeout: float = 60.0
    check_data: bool = True


@dataclass(frozen=True)
class DeploymentResult:
    """What a local deployment did.

    Parameters
    ----------
    run_id : str
        Flower run id.
    status : str
        Final status (``finished:completed`` on success).
    output_dir : Path
        Where ``global_round_<r>.json`` and ``metrics.json`` are.
    wall_s : float
        Seconds from the first process started to the last one stopped.
    run_s : float
        Seconds from submission to the run's end.
    log_path : Path
        The run's log (``flwr log``); SuperLink and SuperNode logs are next to it.
    node_ids : dict of str to int
        Flower node id of each organisation's SuperNode.
    peak_rss_bytes : int or None
        Peak of the summed resident memory of all started processes (sampled).
    """

    run_id: str
    status: str
    output_dir: Path
    wall_s: float
    run_s: float
    log_path: Path
    node_ids: dict[str, int]
    peak_rss_bytes: int | None = None


def parse_node(text: str, catalog_path: Path | None = None) -> NodeSpec:
    """A node from ``ORG=DATA_PATH`` (a CLI's ``--node a=/data/org_a.jsonl``).

    Parameters
    ----------
    text : str
        ``ORG=DATA_PATH``.
    catalog_path : Path or None
        The node's tool catalog.

    Returns
    -------
    NodeSpec
        The node (``~`` in the path expanded).

    Raises
    ------
    SynapseError
        If the text has no ``=`` or an empty side.
    """
    org, sep, path = text.partition("=")
    if not sep or not org.strip() or not path.strip():
        raise SynapseError(f"node {text!r} must be ORG=DATA_PATH")
    return NodeSpec(org.strip(), Path(path.strip()).expanduser(), catalog_path)


def nodes_from_dataset(dataset: str, n: int, out_dir: Path, seed: int = 42, alpha: float = 0.5) -> list[NodeSpec]:
    """One :class:`NodeSpec` per organisation of a dataset, split over ``n`` orgs.

    A dataset folder with exactly ``n`` ``org_*.jsonl`` logs (the demo has
    three) is used as is; otherwise its pooled experience is re-partitioned
    non-IID and written to ``out_dir/org_<i>.jsonl``. The catalog is the
    folder's, or written to ``out_dir/catalog.json``.

    Parameters
    ----------
    dataset : str
        ``demo``, ``metatool``, ``taubench`` or a dataset folder.
    n : int
        Organisations.
    out_dir : Path
        Where re-partitioned logs and the catalog are written.
    seed : int
        Seed of the re-partition.
    alpha : float
        Dirichlet concentration of the re-partition (non-IID skew).

    Returns
    -------
    list of NodeSpec
        One per organisation, sorted by name, with absolute paths.
    """
    from synapse_flwr.core.experience import write_jsonl
    from synapse_flwr.core.files import write_atomic
    from synapse_flwr.data.federation import demo_dir, load_federated

    folder = demo_dir() if dataset == "demo" else Path(dataset)
    catalogs = [p for p in (folder / "catalog.json", folder / "catalog.jsonl") if p.is_file()]
    logs = sorted(folder.glob("org_*.jsonl")) if folder.is_dir() else []
    if len(logs) == n and catalogs:
        return [NodeSpec(p.stem.removeprefix("org_"), p.resolve(), catalogs[0].resolve()) for p in logs]
    ds = load_federated(dataset, n, seed, alpha)
    if catalogs:
        catalog_path = catalogs[0].resolve()
    else:
        catalog_path = out_dir / "catalog.json"
        docs = [{"name": d.name, "description": d.description, "aliases": list(d.aliases),
                 **({"parameters": dict(d.parameters)} if d.parameters else {})}
                for d in (ds.catalog.get(t) for t in ds.catalog.ids) if d is not None]
        write_atomic(catalog_path, json.dumps(docs, indent=1))
    specs = []
    for org in sorted(ds.orgs):
        path = out_dir / f"org_{org}.jsonl"
        write_atomic(path, write_jsonl(ds.orgs[org]))
        specs.append(NodeSpec(org, path.resolve(), catalog_path))
    return specs


def _node_status(group: ProcessGroup, cwd: Path) -> dict[str, str]:
    """Node id -> status, from ``flwr supernode ls`` ({} if unreadable)."""
    res = group.flwr(["supernode", "ls", "--format", "json"], cwd=cwd)
    try:
        return {str(n["node-id"]): str(n["status"]) for n in json.loads(res.stdout)["nodes"]}
    except (ValueError, KeyError, TypeError):
        return {}


_NODE_ID = re.compile(r"SuperNode ID: (\d+)")


def _wait_online(group: ProcessGroup, specs: Sequence[NodeSpec], cwd: Path, timeout: float) -> dict[str, int]:
    """Wait until every SuperNode is online; return org -> node id.

    A SuperNode logs its id once registered (cheap to watch); only then is
    the SuperLink asked (``flwr supernode ls``, a ~2 s command) whether all
    are online.

    Parameters
    ----------
    group : ProcessGroup
        The SuperLink first, then one SuperNode per spec, in order.
    specs : sequence of NodeSpec
        The nodes.
    cwd : Path
        Working folder of the ``flwr`` commands.
    timeout : float
        Seconds to wait.

    Returns
    -------
    dict of str to int
        Flower node id of each organisation.

    Raises
    ------
    SynapseError
        If a process exits, or a SuperNode is not online in time (with its log tail).
    """
    deadline = time.monotonic() + timeout
    names = [name for name, _ in group.started[1:]]
    ids: dict[str, int] = {}
    while True:
        for name, proc in group.started:
            if proc.poll() is not None:
                raise SynapseError(f"{name} exited with code {proc.returncode} before the run; "
                                   f"log tail ({group.log_path(name)}):\n{tail(group.log_path(name))}")
        for name, spec in zip(names, specs, strict=True):
            if spec.org not in ids and (match := _NODE_ID.search(tail(group.log_path(name), 100_000))):
                ids[spec.org] = int(match.group(1))
        online: set[str] = set()
        if len(ids) == len(specs):
            online = {nid for nid, st in _node_status(group, cwd).items() if st == "online"}
            if all(str(i) in online for i in ids.values()):
                return ids
        if time.monotonic() > deadline:
            late = [(n, s) for n, s in zip(names, specs, strict=True) if str(ids.get(s.org)) not in online]
            name, spec = late[0]
            raise SynapseError(
                f"{len(late)} of {len(specs)} SuperNodes not online after {timeout:.0f}s "
                f"(orgs {', '.join(s.org for _, s in late)}); log tail of org {spec.org!r} "
                f"({group.log_path(name)}):\n{tail(group.log_path(name))}"
            )
        time.sleep(0.5)


def deployment_refusal(run_config: Mapping[str, Any]) -> str | None:
    """Why ``synapse deploy-local`` refuses a run config it could not apply; None when it applies all of it.

    ``inject`` corrupts a share of each organisation's events when the
    simulation splits the dataset into partitions; a deployment's SuperNodes
    read their own experience files (node config ``data-path``) as they are,
    so it would be ignored and the run would not be the one asked for.

    Parameters
    ----------
    run_config : mapping
        The run's whole validated run config (:func:`~synapse_flwr.flower.launch.effective_run_config`).
    """
    inject = float(run_config.get("inject", 0.0))
    if inject > 0:
        return (f"run config inject {inject:g} is applied by `synapse simulate` only (it corrupts the simulated "
                "partitions): deploy-local's SuperNodes read their own experience files unchanged; set inject=0, "
                "or corrupt the node files themselves")
    return None


def check_nodes(nodes: int | Sequence[NodeSpec], run_config: Mapping[str, Any],
                check_data: bool = True) -> list[NodeSpec] | None:
    """Check a deployment's SuperNodes before anything starts; the explicit ones, or None for a count.

    A count must be at least 1 (its nodes come from the dataset, checked with
    it). Explicit nodes need a valid, distinct organisation id (the
    artifact's rule: :func:`~synapse_flwr.core.schema.org_id_problem`) and an
    existing experience file; with ``check_data`` each node's catalog
    (``catalog_path``, else the run config's ``dataset`` catalog, as the
    ClientApp does) must load and its log load against it.

    Parameters
    ----------
    nodes : int or sequence of NodeSpec
        Explicit nodes, or a number of organisations of the run config's ``dataset``.
    run_config : mapping
        The absolute run config (``dataset``, ``seed``).
    check_data : bool
        Whether to load the catalogs and logs.

    Returns
    -------
    list of NodeSpec or None
        The explicit nodes; None when ``nodes`` is a count.

    Raises
    ------
    SynapseError
        If there are no nodes, an organisation id is invalid or repeated, or
        an experience file is missing.
    InputError
        If a catalog or a log does not load (naming the file, line and organisation).
    """
    from synapse_flwr.core.schema import org_id_problem

    if isinstance(nodes, int):
        if nodes < 1:
            raise SynapseError(f"a deployment needs at least one SuperNode, got --nodes {nodes}")
        return None
    specs = list(nodes)
    if not specs:
        raise SynapseError("a deployment needs at least one SuperNode (--node ORG=DATA_PATH)")
    for spec in specs:
        if problem := org_id_problem(spec.org):
            raise SynapseError(f"node {spec.org!r} (--node ORG=DATA_PATH): organisation id {problem}")
        if not Path(spec.data_path).is_file():
            raise SynapseError(f"experience file of org {spec.org!r} not found: {spec.data_path}")
    if len({s.org for s in specs}) != len(specs):
        raise SynapseError(f"organisation names must be distinct: {[s.org for s in specs]}")
    if shared := _shared_log(specs):
        raise SynapseError(f"organisations {shared[0]!r} and {shared[1]!r} read the same experience ({shared[2]}): "
                           "each would release its records, so every record would be released twice while the run "
                           "reports one budget; give each organisation its own log")
    if check_data:
        _check_node_data(specs, run_config)
    return specs


def check_node_keys(specs: Sequence[NodeSpec], run_config: Mapping[str, Any]) -> None:
    """Refuse, before anything starts, an organisation that could not sign: its private key missing or unreadable
    beside the keys file, or not the key the registry lists for it (every reply of it would be rejected, every
    round, while the run reported success). Nothing to check without signing or with the demo key set.

    Raises
    ------
    SynapseError
        Naming the organisation, the key file and what is wrong.
    """
    from synapse_flwr.core.signing import KeyFileError
    from synapse_flwr.flower.keys import key_path, registry_for, signer_for

    cfg = RunConfig.from_mapping(run_config)
    if not cfg.sign or not cfg.keys_file:
        return
    registry = registry_for(cfg)
    for spec in specs:
        try:
            signer = signer_for(cfg, spec.org)
        except KeyFileError as exc:
            key = key_path(cfg.keys_file, spec.org)
            how = (f"`synapse keygen {spec.org} --dir {key.parent} --registry {cfg.keys_file}" + (" --replace`"
                   if key.exists() else "`"))
            raise SynapseError(f"node {spec.org!r} cannot sign: {exc} (make its key with {how})") from None
        owner = registry.keys.get(signer.key_id, (None,))[0]
        if owner != spec.org:
            listed = f"is registered to {owner!r}" if owner else "is not in the registry"
            raise SynapseError(f"node {spec.org!r} cannot sign: its key {signer.key_id!r} {listed} "
                               f"({cfg.keys_file}); every reply of it would be rejected")


def _shared_log(specs: Sequence[NodeSpec]) -> tuple[str, str, str] | None:
    """Two organisations whose logs are one file, or files of the same bytes: ``(org, org, what)``, or None.

    Byte for byte: a copy re-saved with other line ends or its lines in another order is not caught. Files are
    hashed (streamed) only when another has their size.
    """
    paths = {spec.org: Path(spec.data_path).resolve() for spec in specs}
    seen: dict[object, str] = {}
    sizes = Counter(p.stat().st_size for p in paths.values())
    for org, path in paths.items():
        size = path.stat().st_size
        digest = None
        if size and sizes[size] > 1:  # (two empty logs release nothing twice)
            with path.open("rb") as handle:
                digest = hashlib.file_digest(handle, "sha256").hexdigest()
        for key, what in ((path, f"the file {path}"), (digest, "files of the same bytes")):
            if key is not None and size and key in seen:
                return seen[key], org, what
            if key is not None:
                seen[key] = org
    return None


def _check_node_data(specs: Sequence[NodeSpec], run_config: Mapping[str, Any]) -> None:
    """Load each node's catalog and its log against it, as its ClientApp will.

    Raises
    ------
    InputError
        For the first catalog or log that does not load: its file and line, the
        organisation, and which catalog the log was checked against.
    """
    from synapse_flwr.core.catalog import load_catalog, size_problem
    from synapse_flwr.core.errors import InputError
    from synapse_flwr.core.experience import load_experience
    from synapse_flwr.data.federation import load_dataset

    cfg = RunConfig.from_mapping(run_config)
    catalogs: dict[str, Any] = {}
    for spec in specs:
        source = str(Path(spec.catalog_path).resolve()) if spec.catalog_path else ""
        where = f"the catalog {source}" if source else f"the catalog of dataset {cfg.dataset!r} (no --catalog)"
        try:
            if source not in catalogs:  # a catalog shared by every node is loaded once
                catalogs[source] = load_catalog(source) if source else load_dataset(cfg.dataset, cfg.seed).catalog
            if too_large := size_problem(catalogs[source]):  # the catalog's fault, not this org's log's
                raise SynapseError(f"{source or cfg.dataset}: {too_large}")
            load_experience(spec.data_path, catalogs[source], warn=False)
        except InputError as exc:
            raise InputError(exc.path, f"{exc.message} (org {spec.org!r}: its log checked against {where})",
                             exc.line, exc.field) from None


def _deployment_ports(cfg: DeploymentConfig, specs: Sequence[NodeSpec] | None) -> tuple[int, list[int]]:
    """SuperLink port and one SuperNode port per node: the configured ones checked, the rest free.

    Parameters
    ----------
    cfg : DeploymentConfig
        Its ``superlink_port``, ``node_ports`` and ``nodes``.
    specs : sequence of NodeSpec or None
        The explicit nodes; None: ``cfg.nodes`` nodes of the dataset, not known yet.

    Returns
    -------
    tuple of (int, list of int)
        The SuperLink port and the SuperNode ports.

    Raises
    ------
    SynapseError
        If the number of node ports is wrong, or a port is busy or repeated.
    """
    names = ([f"SuperNode {i + 1} of {cfg.nodes}" for i in range(int(cfg.nodes))] if specs is None
             else [f"SuperNode of org {s.org!r}" for s in specs])
    node_ports = list(cfg.node_ports) if cfg.node_ports is not None else [None] * len(names)
    if len(node_ports) != len(names):
        raise SynapseError(f"{len(node_ports)} node ports given for {len(names)} SuperNodes")
    ports = pick_ports([cfg.superlink_port, *node_ports], ["SuperLink", *names])
    return ports[0], ports[1:]


def _start_federation(
    launch: Launch, specs: Sequence[NodeSpec], link_port: int, node_ports: Sequence[int], online_timeout: float,
) -> dict[str, int]:
    """Start the SuperLink and one SuperNode per organisation; wait until all are online.

    Parameters
    ----------
    launch : Launch
        The running launch.
    specs : sequence of NodeSpec
        The organisations' nodes.
    link_port : int
        SuperLink port.
    node_ports : sequence of int
        One local port per SuperNode.
    online_timeout : float
        Seconds for every SuperNode to come online.

    Returns
    -------
    dict of str to int
        Flower node id of each organisation.

    Raises
    ------
    SynapseError
        If a process exits early or a SuperNode is not online in time.
    """
    group, home = launch.group, launch.home
    group.start("superlink", ["flower-superlink", "--insecure", "--disable-runtime-dependency-installation",
                              "--host", HOST, "--port", str(link_port)], cwd=home)
    for spec, port in zip(specs, node_ports, strict=True):
        group.start(f"supernode_{spec.org}", [
            "flower-supernode", "--insecure", "--superlink", f"{HOST}:{link_port}",
            "--host", HOST, "--port", str(port), "--node-config", spec.node_config(),
        ], cwd=home)
    node_ids = _wait_online(group, specs, home, online_timeout)
    log.info("%d SuperNodes online after %.1fs: %s", len(specs), time.monotonic() - launch.t0,
             ", ".join(f"{o}={i}" for o, i in node_ids.items()))
    return node_ids


def with_node_catalog(run_config: Mapping[str, Any], nodes: int | Sequence[NodeSpec]) -> dict[str, Any]:
    """``run_config`` with ``catalog`` the explicit nodes' catalog, when they all read one and it names none.

    The server refuses tools outside the run config's catalog (its dataset's
    without one), so nodes that all read one catalog of their own (one file,
    or copies with the same tool ids) name it for it. Nodes that read none
    or different ones, and files that do not load, are left as they are:
    :func:`check_nodes` names what does not load.

    Parameters
    ----------
    run_config : mapping
        The run config's overrides.
    nodes : int or sequence of NodeSpec
        The explicit nodes, or a number of the dataset's (left as they are).

    Returns
    -------
    dict
        A copy of ``run_config``, with ``catalog`` set when it was found.
    """
    from synapse_flwr.core.catalog import load_catalog

    paths = [] if isinstance(nodes, int) else [s.catalog_path and Path(s.catalog_path).resolve() for s in nodes]
    if run_config.get("catalog") or not paths or not all(p and p.is_file() for p in paths):
        return dict(run_config)
    try:
        one = len({tuple(load_catalog(p).ids) for p in set(paths)}) == 1
    except SynapseError:
        return dict(run_config)
    return {**run_config, "catalog": str(paths[0])} if one else dict(run_config)


def run_local_deployment(cfg: DeploymentConfig) -> DeploymentResult:
    """Deploy the app for real on 127.0.0.1: SuperLink, SuperNodes, one run, teardown.

    Steps: check everything a user can get wrong (:class:`~synapse_flwr.flower.launch.Launch`,
    :func:`check_nodes`, the ports) and only then create ``FLWR_HOME``; start
    ``flower-superlink`` and one ``flower-supernode`` per organisation
    (``--node-config 'data-path="..." org="..."'``, plus ``catalog-path`` when
    given), wait until all are online, submit the run with ``flwr run <app>
    deploy``, log progress per round until the run finishes, save its log
    (``flwr log``, in ``<output-dir>/logs/``), stop every process started
    (also on error or Ctrl-C) and remove a temporary ``FLWR_HOME``.

    Parameters
    ----------
    cfg : DeploymentConfig
        The app, nodes, run config, home, ports and timeouts.

    Returns
    -------
    DeploymentResult
        Run id, final status, outputs, timings, log, node ids and peak memory.

    Raises
    ------
    SynapseError
        Before any process starts: if the app, the run config (dataset,
        output folder, keys, an ``inject`` it cannot apply:
        :func:`deployment_refusal`) or a node (organisation id, experience
        file, catalog, log: :class:`~synapse_flwr.core.errors.InputError`) is
        unusable, Flower is missing or a port is busy. Later: if a SuperNode
        does not come online in time (with its log tail), or the run fails or
        times out (with the tail of ``flwr log``).
    """
    launch = Launch("deployment", cfg.app_dir, with_node_catalog(cfg.run_config, cfg.nodes), cfg.flwr_home,
                    "synapse-flwr-deploy-", cfg.nodes if isinstance(cfg.nodes, int) else len(cfg.nodes))
    if problem := deployment_refusal(launch.effective_config):
        raise SynapseError(problem)
    explicit = check_nodes(cfg.nodes, launch.run_config, cfg.check_data)
    check_nodes_wanted(launch.effective_config, launch.nodes)
    link_port, node_ports = _deployment_ports(cfg, explicit)
    with launch.opened():  # every check passed
        specs = explicit or _dataset_nodes(int(cfg.nodes), launch.run_config, launch.home / "data")
        if cfg.check_data:  # every node, the dataset's too (unchecked, as on separate hosts: each holds its own key)
            check_node_keys(specs, launch.effective_config)
        if launch.run_config.get("noise") == "seeded":
            # one person runs every node here, and asks for reproducible noise: each node consents
            log.info("deployment: seeded noise (run config); every local SuperNode allows it (node config noise)")
            specs = [replace(s, noise="seeded") for s in specs]
        group = launch.stage("deploy", f"{HOST}:{link_port}", insecure=True)
        launch.log_start(f"{len(specs)} SuperNodes, SuperLink {HOST}:{link_port}")
        log_path = group.log_path("run")
        with launch.running():
            node_ids = _start_federation(launch, specs, link_port, node_ports, cfg.online_timeout)
            run_id, status, run_s = _submit_and_wait(launch, cfg.timeout)
            _save_run_log(group, run_id, log_path, launch.home)
    launch.check(run_id, status, log_path, "`flwr log`")
    log.info("deployment run %s %s in %.1fs (total %.1fs)", run_id, status, run_s, launch.wall_s)
    return DeploymentResult(run_id, status, launch.output_dir, round(launch.wall_s, 3), round(run_s, 3),
                            log_path, node_ids, launch.peak_rss_bytes)


def _dataset_nodes(n: int, run_config: Mapping[str, Any], data_dir: Path) -> list[NodeSpec]:
    """``n`` SuperNodes of the run config's dataset (:func:`nodes_from_dataset`), re-partitioned logs in ``data_dir``."""
    cfg = RunConfig.from_mapping(run_config)
    return nodes_from_dataset(cfg.dataset, n, data_dir, cfg.seed, cfg.alpha)


def _save_run_log(group: ProcessGroup, run_id: str, log_path: Path, cwd: Path) -> None:
    """Write the run's log (``flwr log``) to ``log_path``, or why it could not be fetched.

    Parameters
    ----------
    group : ProcessGroup
        The deployment's processes (their environment).
    run_id : str
        The run.
    log_path : Path
        Where the log goes.
    cwd : Path
        Working folder of the ``flwr`` command.
    """
    try:
        res = group.flwr(["log", run_id, "--show"], cwd=cwd)
        log_path.write_text(res.stdout + res.stderr, encoding="utf-8")
    except SynapseError as exc:  # keep the run's status; say why the log is missing
        log_path.write_text(f"could not fetch the run log: {exc}\n", encoding="utf-8")


def _submit_and_wait(launch: Launch, timeout: float) -> tuple[str, str, float]:
    """Submit the run, poll its status until finished; return (run id, status, seconds).

    Parameters
    ----------
    launch : Launch
        The running deployment (staged app, overrides, outputs).
    timeout : float
        Seconds the run may take once submitted; then it is stopped.

    Returns
    -------
    tuple of (str, str, float)
        Run id, final status (or why it timed out) and seconds since submission.

    Raises
    ------
    SynapseError
        If ``flwr run`` did not submit the run.
    """
    group, cwd = launch.group, launch.home
    t0 = time.monotonic()
    res = group.flwr(["run", str(launch.app_dir), "deploy", "--run-config", str(launch.overrides),
                      "--format", "json"], cwd=cwd, timeout=120)
    try:
        run_id = str(json.loads(res.stdout)["run-id"])
    except (ValueError, KeyError, TypeError):
        raise SynapseError(f"`flwr run` did not submit the run (rc {res.returncode}):\n"
                           f"{(res.stdout + res.stderr)[-LOG_TAIL:]}") from None
    log.info("submitted run %s", run_id)
    status, seen, last = "", 0, ""
    while time.monotonic() - t0 < timeout:
        res = group.flwr(["ls", "--run-id", run_id, "--format", "json"], cwd=cwd)
        try:
            status = str(json.loads(res.stdout)["runs"][0]["status"])
        except (ValueError, KeyError, IndexError, TypeError):
            status = "unknown"
        if status != last:
            log.info("run %s: %s", run_id, status)
            last = status
        seen = launch.progress(seen)
        group.stop_orphans()  # a SuperNode killed mid-run: its SuperExec would retry until teardown
        if status.startswith("finished"):
            return run_id, status, time.monotonic() - t0
        time.sleep(POLL_S)  # each `flwr ls` costs ~1 CPU-second: do not poll hot
    group.flwr(["stop", run_id], cwd=cwd)
    return run_id, f"timed out after {timeout:.0f}s (last status {status!r})", time.monotonic() - t0
