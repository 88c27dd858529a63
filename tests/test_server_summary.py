"""The ServerApp's final table (one row per round, dashes where nothing was measured) and its evaluation."""

from synapse_flwr.core.merge import GLOBAL_ORG
from synapse_flwr.core.router import Router
from synapse_flwr.core.schema import Compendium, Issuer
from synapse_flwr.flower import server_app
from synapse_flwr.flower.config import RunConfig
from synapse_flwr.flower.server_app import SUMMARY_COLUMNS, summary_table


def test_summary_table_has_a_row_per_round_and_reads_lists_as_counts():
    rounds = [
        {"round": 1, "accepted": [1, 2, 3], "rejected": [], "epsilon": 3.991, "bytes_per_client": 48213,
         "vote_bytes_per_client": 495,
         "prototype_share": 1.0, "prototype_used_share": 0.25, "fusion_prototype": 8.0,
         "fusion_prior": 0.0, "experience_off": 0.0, "seen_acc": 0.61, "heldout_acc": 0.7, "docs_seen_acc": 0.5, "docs_heldout_acc": 0.7},
        {"round": 2, "accepted": [1], "rejected": [{"node_id": 3, "reason": "x"}], "epsilon": None},
    ]
    lines = summary_table(rounds).splitlines()
    assert len(lines) == 3 and lines[0].split()[0] == "round"
    rounds[0]["global"] = "new"
    lines = summary_table(rounds).splitlines()
    assert lines[1].split() == ["1", "3", "0", "new", "3.991", "48,213", "495", "100%", "25%", "8", "0", "0", "0.610",
                                "0.700", "0.500", "0.700"]
    assert lines[2].split()[:5] == ["2", "1", "1", "-", "-"] and lines[2].split().count("-") == len(SUMMARY_COLUMNS) - 3


def test_a_global_that_routes_alike_is_not_scored_again(monkeypatch):
    # a round in which nothing new was released yields a global that differs only in its round and inputs
    routers = []

    def counting_router(*args, **kwargs):
        routers.append(args[0])
        return Router(*args, **kwargs)

    monkeypatch.setattr(server_app, "Router", counting_router)
    cfg = RunConfig.from_mapping({"dataset": "demo", "embedder": "static"})
    evaluate = server_app.make_evaluator(cfg, server_app.federation_catalog(cfg))
    assert routers == [None]  # the documentation-only line

    def global_(round_: int, inputs: list[str], policy: str = "typed") -> Compendium:
        return Compendium(kind="global", issuer=Issuer(org=GLOBAL_ORG, round=round_), policy=policy, inputs=inputs)

    first = evaluate(global_(1, ["a" * 64]))
    assert first["seen_n"] > 0 and len(routers) == 2
    # every score goes into the round's MetricRecord: numbers only (a string flag crashed every round 1)
    assert all(isinstance(v, (int, float)) for v in first.values()) and first["experience_off"] == 0.0
    first["seen_acc"] = -1.0  # a caller's change to its copy does not reach the next round's
    again = evaluate(global_(2, ["b" * 64]))
    assert len(routers) == 2 and again["seen_acc"] == again["docs_seen_acc"] >= 0.0
    evaluate(global_(3, ["b" * 64], policy="robust"))  # any other content is scored
    assert len(routers) == 3


def test_a_run_on_another_catalog_is_not_scored_on_the_dataset_s_queries(tmp_path, caplog):
    """Regression: deploy-local of one's own nodes (their catalog named for the server, the dataset left at the
    demo) printed the demo's accuracies as the federation's."""
    import json

    from synapse_flwr.core.catalog import load_catalog
    from synapse_flwr.data.federation import demo_dir

    own = [{"name": f"x_{tool}", "description": text}
           for tool, text in load_catalog(demo_dir() / "catalog.json").descriptions().items()]
    (tmp_path / "catalog.json").write_text(json.dumps(own))
    with caplog.at_level("WARNING"):
        cfg = RunConfig.from_mapping({"dataset": "demo", "embedder": "static",
                                      "catalog": str(tmp_path / "catalog.json")})
        assert server_app.make_evaluator(cfg, server_app.federation_catalog(cfg)) is None
    assert "no evaluation: the run's catalog" in caplog.text
    same = RunConfig.from_mapping({"dataset": "demo", "embedder": "static",
                                   "catalog": str(demo_dir() / "catalog.json")})
    # the dataset's own catalog, named: scored
    assert server_app.make_evaluator(same, server_app.federation_catalog(same)) is not None
