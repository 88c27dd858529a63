"""The ServerApp's final table: one row per round, dashes where nothing was measured."""

from synapse_flwr.flower.server_app import SUMMARY_COLUMNS, summary_table


def test_summary_table_has_a_row_per_round_and_reads_lists_as_counts():
    rounds = [
        {"round": 1, "accepted": [1, 2, 3], "rejected": [], "epsilon": 3.991, "bytes_per_client": 48213,
         "vote_bytes_per_client": 495,
         "prototype_share": 1.0, "prototype_used_share": 0.25, "fusion_prototype": 8.0,
         "fusion_prior": 0.0, "seen_acc": 0.61, "heldout_acc": 0.7, "docs_seen_acc": 0.5, "docs_heldout_acc": 0.7},
        {"round": 2, "accepted": [1], "rejected": [{"node_id": 3, "reason": "x"}], "epsilon": None},
    ]
    lines = summary_table(rounds).splitlines()
    assert len(lines) == 3 and lines[0].split()[0] == "round"
    assert lines[1].split() == ["1", "3", "0", "3.991", "48,213", "495", "100%", "25%", "8", "0", "0.610", "0.700",
                                "0.500", "0.700"]
    assert lines[2].split()[:4] == ["2", "1", "1", "-"] and lines[2].split().count("-") == len(SUMMARY_COLUMNS) - 3
