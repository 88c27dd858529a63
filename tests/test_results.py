"""The shared summary.json: each benchmark replaces only its own keys."""

from __future__ import annotations

import json
import math

import pytest

from synapse_flwr.eval.results import update_summary


def test_update_summary_keeps_the_other_keys(tmp_path):
    path = tmp_path / "perf" / "summary.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"merge_s_k100_t3180": 9.5, "wire_bytes_3180_steady": 1}))
    update_summary(path, {"wire_bytes_3180_steady": 812, "sim_k200_wall_s": math.inf})
    assert json.loads(path.read_text()) == {"merge_s_k100_t3180": 9.5, "wire_bytes_3180_steady": 812,
                                            "sim_k200_wall_s": "inf"}


def test_the_llm_seed_table_averages_what_every_seed_reports():
    from synapse_flwr.simulations.llm_seeds import mean_row, seed_row, tables

    def summary(llm, ret, flat=None):
        out = {"llm_model": "local/gemma3", "n_per_split": 200, "transfer_gain_over_docs": {"local/gemma3": llm - 0.6},
               "llm_top1_seen": llm, "llm_top1_heldout": llm - 0.1, "retrieval_top1_seen": ret,
               "retrieval_top1_heldout": ret - 0.1, "fields_top1_seen": ret, "fields_top1_heldout": ret - 0.1}
        if flat is not None:
            out |= {"typed_minus_flat_llm_seen": flat, "typed_minus_flat_llm_heldout": flat}
        return out

    rows = {"42": seed_row(summary(0.70, 0.68, 0.05)), "123": seed_row(summary(0.74, 0.75, 0.09))}
    mean = mean_row(rows)
    assert mean["llm_minus_retrieval_seen"] == pytest.approx(0.005)
    assert mean["typed_minus_flat_llm_heldout"] == pytest.approx(0.07)
    assert mean["transfer_gain_over_docs"] == {"local/gemma3": pytest.approx(0.12)}
    rows["456"] = seed_row(summary(0.72, 0.72))  # a seed without the flat arm leaves typed - flat out of the mean
    assert "typed_minus_flat_llm_seen" not in mean_row(rows)
    text = tables(rows, mean_row(rows))
    assert "| 456 | 0.720 / 0.620 | 0.720 / 0.620 | 0.720 / 0.620 | +0.000 / +0.000 | - / - | +0.120 |" in text
