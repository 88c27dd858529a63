"""The shared summary.json: each benchmark replaces only its own keys."""

from __future__ import annotations

import json
import math

from synapse_flwr.eval.results import update_summary


def test_update_summary_keeps_the_other_keys(tmp_path):
    path = tmp_path / "perf" / "summary.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"merge_s_k100_t3180": 9.5, "wire_bytes_3180_steady": 1}))
    update_summary(path, {"wire_bytes_3180_steady": 812, "sim_k200_wall_s": math.inf})
    assert json.loads(path.read_text()) == {"merge_s_k100_t3180": 9.5, "wire_bytes_3180_steady": 812,
                                            "sim_k200_wall_s": "inf"}
