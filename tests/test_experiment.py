"""Contradiction injection and the experiment runner (``synapse experiment``)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from synapse_flwr.simulations.experiment import run_experiment
from synapse_flwr.simulations.experiment_config import ARMS, ExperimentConfig
from synapse_flwr.simulations.experiment_report import targets
from synapse_flwr.simulations.taubench import TauConfig

from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.experience import Event
from synapse_flwr.core.wire import load_artifact
from synapse_flwr.data.inject import corrupt_org, inject_contradictions

ROOT = Path(__file__).resolve().parent.parent
SYNAPSE = Path(sys.executable).with_name("synapse")
TOOLS = [f"tool_{i}" for i in range(6)]


def _events(n: int, org: str = "a") -> list[Event]:
    return [Event(query=f"query number {i}", tool=TOOLS[i % 6], success=True, gold=TOOLS[i % 6], org=org)
            for i in range(n)]


# ---------------------------------------------------------------- injection
def test_injection_corrupts_the_share_asked_half_each_way():
    events = _events(100)
    out, records = corrupt_org(events, "a", 0.4, seed=1, tools=TOOLS)
    assert len(records) == 40
    kinds = [r[2] for r in records]
    assert kinds.count("wrong_tool") == 20 and kinds.count("inverted") == 20
    changed = [i for i, (a, b) in enumerate(zip(events, out)) if a != b]
    assert sorted(changed) == sorted(r[1] for r in records)
    for org, index, kind, tool in records:
        before, after = events[index], out[index]
        if kind == "wrong_tool":
            assert after.tool == after.gold == tool != before.tool and after.success
        else:
            assert after.tool == before.tool and not after.success and after.gold is None
    assert out[0].query == events[0].query  # queries are never altered


def test_injection_is_deterministic_nested_and_hashed():
    orgs = {"a": _events(50, "a"), "b": _events(30, "b")}
    same1, inj1 = inject_contradictions(orgs, 0.2, 7, TOOLS)
    same2, inj2 = inject_contradictions(orgs, 0.2, 7, TOOLS)
    assert same1 == same2 and inj1 == inj2
    _, other_seed = inject_contradictions(orgs, 0.2, 8, TOOLS)
    assert other_seed.sha256 != inj1.sha256
    # 20% is a subset of 40%: the same events, corrupted the same way
    low, _ = corrupt_org(orgs["a"], "a", 0.2, 7, TOOLS)
    high, _ = corrupt_org(orgs["a"], "a", 0.4, 7, TOOLS)
    for before, lo, hi in zip(orgs["a"], low, high):
        if lo != before:
            assert hi == lo
    none, inj0 = inject_contradictions(orgs, 0.0, 7, TOOLS)
    assert none == orgs and inj0.counts == {"wrong_tool": 0, "inverted": 0}


def test_injection_can_credit_every_event_to_a_wrong_tool():
    events = _events(60)
    out, records = corrupt_org(events, "a", 1.0, seed=3, tools=TOOLS, kinds=("wrong_tool",))
    assert len(records) == 60 and {r[2] for r in records} == {"wrong_tool"}
    assert all(a.tool == a.gold != b.tool and a.success for a, b in zip(out, events))
    with pytest.raises(ValueError, match="kinds"):
        corrupt_org(events, "a", 1.0, 3, TOOLS, kinds=("shuffled",))


@pytest.mark.parametrize("rate", [-0.1, 1.5])
def test_injection_rejects_bad_rates(rate):
    with pytest.raises(ValueError, match="rate"):
        corrupt_org(_events(5), "a", rate, 0, TOOLS)


# ---------------------------------------------------------------- config
def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(body)
    return path


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[experiment]\nname="x"\ndataset="demo"\nbogus=1\n', "unknown keys in \\[experiment\\]: bogus"),
        ('[experiment]\nname="x"\ndataset="demo"\narms=["oracle","magic"]\n', "arms: unknown \\['magic'\\]"),
        ('[experiment]\nname="x"\ndataset="demo"\nrates=[0.0, 1.0]\n', "rates"),
        ('[experiment]\nname="x"\ndataset="demo"\norgs=1\n', "orgs"),
        ('[experiment]\nname="x"\n', "dataset"),
        ("[other]\n", "needs an \\[experiment\\] table \\(it holds \\[other\\]\\)"),
        ("[experiment\n", "not valid TOML"),
        # values of the wrong type, named before anything runs (a string is not a number, nor a list)
        ('[experiment]\ndataset="demo"\nepsilon="4"\n', "epsilon: expected float, got '4'"),
        ('[experiment]\ndataset="demo"\nseeds="42"\n', "seeds: expected a list of int, got '42'"),
        ('[experiment]\ndataset="demo"\nseeds=42\n', "seeds: expected a list of int"),
        ('[experiment]\ndataset="demo"\nreplay="false"\n', "replay: expected bool"),
        ('[experiment]\ndataset="demo"\norgs=2.5\n', "orgs: expected int"),
        ('[experiment]\ndataset=5\n', "dataset: expected str"),
        ('[experiment]\ndataset="demo"\nembedder="statc"\n', "embedder: unknown 'statc'; choose from minilm"),
        ('[experiment]\ndataset="demo"\nreranker="feilds"\n', "reranker: unknown 'feilds'"),
        ('[experiment]\ndataset="demo"\nfedavg={batchsize=8}\n', "fedavg: unknown \\['batchsize'\\].*batch_size"),
        ('[experiment]\ndataset="demo"\ndelta=2.0\n', "delta in \\(0, 1\\)"),
        # regressions: each of these was accepted, then failed (or drew garbage) after the Flower runs
        ('[experiment]\ndataset="demo"\nseeds=[42, -1]\n', "seeds: each must be an integer >= 0, got -1"),
        ('[experiment]\ndataset="demo"\nseeds=[7, 7]\n', "seeds: .*7 is listed 2 times"),
        ('[experiment]\ndataset="demo"\nalpha=inf\n', "alpha must be a finite number > 0"),
        ('[experiment]\ndataset="demo"\nllm_sample=-1\n', "llm_sample: queries per split, 0 \\(off\\) or more"),
        ('[experiment]\ndataset="demo"\nllm_sample=5\nllm_model="local/smolm2"\n',
         "llm_model: unknown local model 'local/smolm2'; valid: .*local/smollm2"),
        ('[experiment]\ndataset="demo"\nreranker="llm"\nllm_model="local/nope"\n', "llm_model: unknown local model"),
        ('[experiment]\ndataset="demo"\nllm_sample=3\narms=["classifier"]\n',
         "llm_sample: reranks the arms docs_only, federated, centralized, and arms holds none of them"),
        ('[experiment]\ndataset="demo"\nfedavg={batch_size="8"}\n', "fedavg.batch_size: expected int, got '8'"),
        ('[experiment]\ndataset="demo"\nfedavg={learning_rate=0}\n', "fedavg.learning_rate: must be a finite number > 0"),
        ('[experiment]\ndataset="demo"\nfedavg={backend_config=5}\n', "fedavg.backend_config: expected a table"),
        ('[experiment]\ndataset="demo"\nk=0\n', "rounds and k must be at least 1, got rounds 3, k 0"),
        ('[experiment]\ndataset="demo"\narms=[]\n', "arms: an empty list; name at least one"),
        ('[experiment]\ndataset="demo"\nrates=[]\nrenders=[]\n', "rates: an empty list.*; renders: an empty list"),
        ('[experiment]\ndataset="demo"\nmerges=[]\n', "merges: an empty list; name at least one, or leave the key out"),
        ('[experiment]\ndataset="demo"\nrates=[0.0, 0.2, 0.0]\n', "rates: each rate once, got \\[0.0, 0.2, 0.0\\]"),
        # a budget no noise meets failed inside the ClientApps, after the first (non-private) Flower run
        ('[experiment]\ndataset="demo"\nepsilon=1e9\n', "epsilon: epsilon 1e\\+09 at delta 1e-05 allows almost no noise"),
        ('[experiment]\ndataset="demo"\nsweep_epsilon=1e7\n', "sweep_epsilon: epsilon 1e\\+07 .*allows almost no noise"),
        # what a Flower run's config refuses is named by the experiment's key, before the dataset loads
        ('[experiment]\ndataset="demo"\ndelta=0.5\n', "delta: run config 'delta' must be in \\(0.0, 0.1\\], got 0.5"),
        ('[experiment]\ndataset="demo"\nrounds=20000\n', "rounds: run config 'num-rounds' must be in \\[1, 10000\\]"),
        ('[experiment]\ndataset="demo"\nepsilon=-1\n', "must be positive .*got epsilon -1, sweep_epsilon inf"),
        # a byte order mark (Windows editors) is read past, so the config's own mistake is the one named
        ('\ufeff[experiment]\ndataset="demo"\nbogus=1\n', "unknown keys in \\[experiment\\]: bogus"),
    ],
)
def test_config_mistakes_are_named(tmp_path, body, message):
    with pytest.raises(SynapseError, match=message):
        ExperimentConfig.from_toml(_write(tmp_path, body))


def test_config_mistake_exits_2_without_traceback(tmp_path):
    path = _write(tmp_path, '[experiment]\nname="x"\ndataset="demo"\narms=["magic"]\n')
    proc = subprocess.run([str(SYNAPSE), "experiment", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "arms: unknown" in proc.stderr and "Traceback" not in proc.stderr


def test_committed_configs_parse():
    for name in ("metatool", "smoke"):
        cfg = ExperimentConfig.from_toml(ROOT / "configs" / f"{name}.toml")
        assert set(cfg.arms) == set(ARMS)
    # tau-bench runs every arm but the Ray-based fedavg_dp, plus its [taubench] table
    tau = ExperimentConfig.from_toml(ROOT / "configs" / "taubench.toml")
    assert set(tau.arms) == set(ARMS) - {"fedavg_dp"}
    assert TauConfig.from_toml(ROOT / "configs" / "taubench.toml").folds == 5
    assert math.isinf(ExperimentConfig.from_toml(ROOT / "configs" / "metatool.toml").sweep_epsilon)


def test_targets_compare_the_right_numbers():
    def arm(seen, heldout=None):
        out = {"seen": {"acc_mean": seen, "acc_sd": 0.0, "r5_mean": 0.0}}
        if heldout is not None:
            out["heldout"] = {"acc_mean": heldout, "acc_sd": 0.0, "r5_mean": 0.0}
        return out

    results = {
        "arms": {"federated": arm(0.70, 0.50), "federated_private": arm(0.60, 0.516), "centralized": arm(0.71),
                 "docs_only": arm(0.55, 0.52), "classifier": arm(0.86, 0.0)},
        "ablation_2x2": {"typed/typed": arm(0.70, 0.55), "typed/flat": arm(0.62, 0.45)},
        "contradiction": {"0": {"typed/typed": arm(0.70)}, "0.6": {"typed/typed": arm(0.66)}},
    }
    got = {t["target"]: (t["value"], t["met"]) for t in targets(results)}
    assert got["federated - centralized (seen)"] == (-0.01, True)
    assert got["federated - docs_only (seen)"] == (0.15, True)
    assert got["no harm: federated - docs_only (heldout)"] == (-0.02, False)
    assert got["no harm: federated_private - docs_only (heldout)"] == (-0.004, True)  # within the margin
    assert got["no harm: federated_private - docs_only (seen)"] == (0.05, True)
    assert got["typed render - flat render, typed merge (seen)"] == (0.08, True)
    assert got["typed render - flat render, typed merge (heldout)"] == (0.1, True)
    assert got["typed arm change at 60% contradiction (seen)"] == (-0.04, False)
    assert got["federated - classifier (seen, moonshot)"] == (-0.16, False)


# ---------------------------------------------------------------- the runner, end to end
@pytest.mark.slow
def test_smoke_experiment_runs_every_arm_through_flower_and_resumes(tmp_path):
    """configs/smoke.toml (demo data, every arm, 0 and 40% contradiction), then a cached rerun."""
    raw = tomllib.loads((ROOT / "configs" / "smoke.toml").read_text())["experiment"]
    raw.update(output=str(tmp_path / "out"), cache=str(tmp_path / "cache"))
    lines = ["[experiment]"] + [f"{k} = {json.dumps(v)}" for k, v in raw.items() if k != "fedavg"]
    lines.append("fedavg = { batch_size = %d }" % raw["fedavg"]["batch_size"])
    config = _write(tmp_path, "\n".join(lines) + "\n")
    labels: list[str] = []
    starts: list[int] = []
    out = run_experiment(config, progress=labels.append, on_start=starts.append)
    assert len(starts) == 1 and starts[0] > 0  # announced once, after the checks

    results = json.loads((out / "results.json").read_text())
    assert set(results["arms"]) == set(ARMS)
    for arm, splits in results["arms"].items():
        assert set(splits) == {"seen", "heldout"}, arm
        for m in splits.values():
            assert 0.0 <= m["acc_mean"] <= 1.0 and 0.0 <= m["r5_mean"] <= 1.0 and m["n"][0] > 0
    assert results["arms"]["classifier"]["heldout"]["acc_mean"] == 0.0
    for split in ("seen", "heldout"):
        # gold forced into the candidates (a `prefer` redirect may still push it past the top 5)
        oracle, federated = results["arms"]["oracle"][split], results["arms"]["federated"][split]
        assert oracle["r5_mean"] >= max(federated["r5_mean"], 0.9)
        assert oracle["acc_mean"] >= federated["acc_mean"] - 0.05
    assert results["epsilon"] <= 8.0 + 1e-9 and results["fedavg_dp_epsilon"] <= 8.0 + 1e-9
    assert 0 < results["bytes_per_client_round"] < 100_000
    assert set(results["ablation_2x2"]) == {"typed/typed", "typed/flat", "flat-majority/typed",
                                            "flat-majority/flat"}
    assert set(results["contradiction"]) == {"0", "0.4"}
    injected = results["injection"]["42"]["0.4"]
    assert injected["verified"] and injected["injection_counts"]["wrong_tool"] > 0
    assert len(injected["injection_sha256"]) == 64
    assert results["injection"]["42"]["0"]["verified"]
    assert [len(r) for r in results["per_round"].values()] == [2, 2, 2]
    info = results["seed_info"]["42"]
    assert set(info["globals"]) == {"federated", "federated_private"}
    assert all(load_artifact(Path(p)).kind == "global" for p in info["globals"].values())
    # the share of queries reading no prototype: for compendium arms, not for docs_only nor the forced oracle
    assert all("docs_gated_mean" in results["arms"][arm]["seen"] for arm in ("federated", "centralized"))
    assert not any("docs_gated_mean" in results["arms"][arm]["seen"] for arm in ("docs_only", "oracle"))
    assert "docs_gated_mean" not in results["ablation_2x2"]["typed/flat"]["seen"]  # a flat render reads none
    assert (info["tools_with_experience"], info["catalog_tools"]) == (21, 24)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["data_sha256"] and manifest["command"].startswith("synapse experiment")
    for name in ("tables.md", "accuracy_vs_contradiction.png", "accuracy_per_round.png"):
        assert (out / name).stat().st_size > 0
    assert "| federated |" in (out / "tables.md").read_text()
    assert any(k.startswith("flower/") for k in labels) and len(labels) == len(set(labels))  # each unit once

    # resumable: a second run recomputes nothing and reproduces the results
    again = run_experiment(config, output=tmp_path / "again")
    rerun = json.loads((again / "results.json").read_text())
    assert rerun["cache"]["computed"] == 0
    assert rerun["arms"] == results["arms"] and rerun["contradiction"] == results["contradiction"]


def test_a_minimal_config_plans_four_flower_runs_a_seed(tmp_path):
    """Defaults that finish: a config naming only a dataset runs the clean federations (typed without and
    with privacy, the feedback loop, flat-majority for the 2x2), not the opt-in contradiction sweep."""
    from synapse_flwr.simulations.experiment import Experiment

    # five organisations: the demo's three logs re-partitioned per seed, so every seed has runs of its own
    cfg = ExperimentConfig(name="x", dataset="demo", orgs=5, cache=str(tmp_path / "cache"))
    runs = Experiment(cfg).federations()
    assert cfg.rates == [0.0] and len(runs) == 4 * len(cfg.seeds)
    assert {(policy, eps, rate, replay) for _, policy, eps, rate, replay in runs} == {
        ("typed", math.inf, 0.0, False), ("typed", cfg.epsilon, 0.0, False), ("typed", math.inf, 0.0, True),
        ("flat-majority", math.inf, 0.0, False)}
    swept = Experiment(ExperimentConfig(name="x", dataset="demo", orgs=5, cache=str(tmp_path / "c2"),
                                        rates=[0.0, 0.2])).federations()
    assert len(swept) == 6 * len(cfg.seeds)


def test_with_the_dataset_s_own_organisations_one_run_without_noise_serves_every_seed(tmp_path):
    """Nothing a run without noise or injection draws depends on its seed when nothing is re-partitioned:
    the first seed's run stands for the others (the private runs and the injected ones stay per seed)."""
    from synapse_flwr.simulations.experiment import Experiment

    cfg = ExperimentConfig(name="x", dataset="demo", cache=str(tmp_path / "cache"), rates=[0.0, 0.2])
    experiment = Experiment(cfg)
    assert cfg.orgs == 3 and cfg.seeds == [42, 123, 456]
    runs = experiment.federations()
    assert sorted(run for run in runs if run[0] != 42) == [
        (seed, policy, eps, rate, False) for seed in (123, 456)
        for policy, eps, rate in (("flat-majority", math.inf, 0.2), ("typed", 4.0, 0.0), ("typed", math.inf, 0.2))]
    assert len(runs) == 6 + 2 * 3
    assert [experiment.run_seed(s, math.inf, 0.0) for s in cfg.seeds] == [42, 42, 42]
    assert [experiment.run_seed(s, 4.0, 0.0) for s in cfg.seeds] == cfg.seeds
    assert [experiment.run_seed(s, math.inf, 0.2) for s in cfg.seeds] == cfg.seeds


def test_the_2x2_and_the_contradiction_sweep_run_only_with_the_federated_arm(tmp_path):
    """They are ablations of the federated arm: a config that leaves it out pays for none of their Flower runs."""
    from synapse_flwr.simulations.experiment import Experiment

    cfg = ExperimentConfig(name="x", dataset="demo", cache=str(tmp_path / "cache"), seeds=[42],
                           arms=["docs_only", "federated_private"], rates=[0.0, 0.2])
    experiment = Experiment(cfg)
    assert not cfg.sweeps
    assert experiment.federations() == [(42, "typed", cfg.epsilon, 0.0, False)]
    assert experiment.sweep_for_seed(42) == {"2x2": {}, "rates": {}, "injection": {}}
    with_it = Experiment(replace(cfg, arms=["federated"])).federations()
    assert {(policy, rate) for _, policy, _, rate, replay in with_it if not replay} == {
        (policy, rate) for policy in ("typed", "flat-majority") for rate in (0.0, 0.2)}


def test_a_config_naming_only_its_dataset_loads_and_takes_its_title_from_it(tmp_path):
    folder = tmp_path / "data" / "bench" / "tools92"
    folder.mkdir(parents=True)
    path = tmp_path / "exp.toml"
    path.write_text(f'[experiment]\ndataset = "{folder}"\n')
    cfg = ExperimentConfig.from_toml(path)
    assert cfg.name == "tools92" and cfg.dataset == str(folder)
    assert (cfg.output, cfg.cache) == ("docs/results/tools92", "runs/experiments/tools92")


def test_a_dataset_folder_stands_for_its_one_line_config(tmp_path):
    folder = tmp_path / "tools92"
    folder.mkdir()
    for org in "ab":
        (folder / f"org_{org}.jsonl").write_text("")
    path = tmp_path / "exp.toml"
    path.write_text(f'[experiment]\ndataset = "{folder}"\n')
    assert ExperimentConfig.from_toml(folder) == ExperimentConfig.from_toml(path)
    assert ExperimentConfig.from_toml(folder).orgs == 2


def test_a_dataset_folder_beside_its_config_is_found_from_any_working_folder(tmp_path, monkeypatch):
    folder = tmp_path / "configs" / "tools92"
    folder.mkdir(parents=True)
    for org in "abc":
        (folder / f"org_{org}.jsonl").write_text("")
    path = tmp_path / "configs" / "exp.toml"
    path.write_text('[experiment]\ndataset = "tools92"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = ExperimentConfig.from_toml(path)
    assert cfg.dataset == str(folder) and cfg.orgs == 3
    # one under the working folder is the one meant, as for the config's other paths (made absolute)
    (elsewhere / "tools92").mkdir()
    (elsewhere / "tools92" / "org_a.jsonl").write_text("")
    assert ExperimentConfig.from_toml(path).dataset == str(elsewhere / "tools92")


def test_a_dataset_found_nowhere_is_named_with_the_folder_looked_for(tmp_path, monkeypatch):
    from synapse_flwr.data.federation import load_dataset

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SynapseError, match=f"or a dataset folder \\(no folder {tmp_path / 'tools92'}\\)"):
        load_dataset("tools92", 42)


def test_a_config_whose_dataset_is_found_nowhere_names_both_places_looked_before_any_work(tmp_path, monkeypatch):
    """Regression: a relative ``dataset`` missing both from the working folder and beside the config was refused
    after the data modules loaded (seconds later), naming only the working folder's path, so a user who meant it
    relative to the config was not told where that was looked for."""
    (tmp_path / "configs" / "mine").mkdir(parents=True)
    path = tmp_path / "configs" / "mine" / "exp.toml"
    path.write_text('[experiment]\ndataset = "../data/tools92"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(SynapseError) as info:
        ExperimentConfig.from_toml(path)
    message = str(info.value)
    assert message.startswith(f"{path}: dataset: no folder {tmp_path / 'data' / 'tools92'} (from the working folder)")
    assert f"nor {tmp_path / 'configs' / 'data' / 'tools92'} (beside the config)" in message
    path.write_text(f'[experiment]\ndataset = "{tmp_path / "nowhere"}"\n')  # absolute: one place only
    with pytest.raises(SynapseError, match="no folder .*nowhere \\(from the working folder\\); name 'demo'"):
        ExperimentConfig.from_toml(path)


def test_a_dataset_naming_a_file_of_the_folder_names_the_folder(tmp_path):
    """Regression: dataset = ".../catalog.json" was refused as "no folder .../catalog.json", a path that exists."""
    from synapse_flwr.data.federation import load_dataset

    (tmp_path / "catalog.json").write_text("[]")
    with pytest.raises(SynapseError, match=f"catalog.json is a file: name the folder that holds it, {tmp_path}\\)"):
        load_dataset(str(tmp_path / "catalog.json"))


def test_a_folder_without_test_queries_is_refused_before_any_flower_run(tmp_path):
    import shutil

    from synapse_flwr.simulations.experiment import run_experiment

    from synapse_flwr.core.errors import SynapseError
    from synapse_flwr.data.federation import demo_dir

    folder = tmp_path / "bench"
    shutil.copytree(demo_dir(), folder)
    (folder / "test.jsonl").unlink()
    config = tmp_path / "exp.toml"
    config.write_text(f'[experiment]\ndataset = "{folder}"\ncache = "{tmp_path / "cache"}"\n')
    starts: list[int] = []
    with pytest.raises(SynapseError, match="no test queries"):
        run_experiment(config, output=tmp_path / "out", on_start=starts.append)
    assert not (tmp_path / "cache" / "flower").exists() and not starts


def test_a_refused_folder_gets_its_problems_and_no_progress_bar(tmp_path):
    """The bar starts once every check passed: a refusal is the only thing on the screen."""
    import shutil

    from synapse_flwr.data.federation import demo_dir

    folder = tmp_path / "bench"
    shutil.copytree(demo_dir(), folder)
    (folder / "org_a.jsonl").write_text('{"query": "q", "tool": "teleport", "success": true}\n')
    proc = subprocess.run([str(SYNAPSE), "experiment", str(folder)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 2 and "org_a.jsonl:1: field 'tool': tool 'teleport'" in proc.stderr
    assert "0:00:0" not in proc.stderr and "━" not in proc.stderr and "Traceback" not in proc.stderr  # no bar


@pytest.mark.parametrize("place", ["results/file", "results/under-file", "cache/file"])
def test_a_folder_that_cannot_be_written_is_refused_before_any_unit(tmp_path, place):
    """Regression: `-o` naming a file ran every unit, then failed making the folder; a `cache` naming a file
    passed every check and failed at the first unit, a Flower run."""
    from synapse_flwr.simulations.experiment import run_experiment

    from synapse_flwr.core.errors import SynapseError
    from synapse_flwr.data.federation import demo_dir

    taken = tmp_path / "one.jsonl"
    taken.write_text("{}\n")
    what, where = place.split("/")
    bad = taken / "results" if where == "under-file" else taken
    cache, out = (bad, tmp_path / "results") if what == "cache" else (tmp_path / "cache", bad)
    config = tmp_path / "exp.toml"
    config.write_text(f'[experiment]\ndataset = "{demo_dir()}"\ncache = "{cache}"\n')
    started = []
    with pytest.raises(SynapseError, match=f"{what} folder {bad} "):
        run_experiment(config, output=out, on_start=started.append)
    assert not started and not (tmp_path / "cache").exists() and taken.read_text() == "{}\n"


def test_more_organisations_than_events_are_refused_before_any_flower_run(tmp_path):
    """Regression: orgs = 1000 over a folder of 20 events re-partitioned them, 982 organisations empty, and started
    a Flower simulation of 1000 nodes."""
    folder = tmp_path / "small"
    folder.mkdir()
    (folder / "catalog.json").write_text(json.dumps([{"name": t, "description": f"does {t}"} for t in TOOLS]))
    for org in ("a", "b"):
        (folder / f"org_{org}.jsonl").write_text("".join(e.model_dump_json() + "\n" for e in _events(10, org)))
    (folder / "test.jsonl").write_text(json.dumps({"query": "which tool", "gold": TOOLS[0]}) + "\n")
    config = _write(tmp_path, f'[experiment]\ndataset = "{folder}"\norgs = 1000\ncache = "{tmp_path / "cache"}"\n')
    started = []
    with pytest.raises(SynapseError, match="orgs: 1000 organisations re-partition 20 events .* use orgs = 20 or fewer"):
        run_experiment(config, output=tmp_path / "results", on_start=started.append)
    assert not started


def test_arms_the_data_cannot_train_are_left_out_by_default_and_refused_by_name(tmp_path, caplog):
    import json
    import shutil

    from synapse_flwr.simulations.experiment import run_experiment, runnable_arms
    from synapse_flwr.simulations.experiment_config import ARMS, ExperimentConfig

    from synapse_flwr.core.errors import SynapseError
    from synapse_flwr.data.federation import demo_dir, load_federated

    folder = tmp_path / "bench"
    shutil.copytree(demo_dir(), folder)
    # one organisation whose every call failed without naming the right tool: nothing labelled to train on
    org = max(folder.glob("org_*.jsonl"))
    name = org.stem.removeprefix("org_")
    failed = [{**json.loads(line), "success": False} for line in org.read_text().splitlines() if line.strip()]
    org.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "gold"}) + "\n" for r in failed))
    # the default arms: fedavg_dp is left out with a warning, every other arm runs
    cfg = ExperimentConfig.from_toml(folder)
    ds = load_federated(str(folder), cfg.orgs, cfg.seeds[0], cfg.alpha)
    with caplog.at_level("WARNING"):
        kept, left_out = runnable_arms(cfg, ds)
    assert kept.arms == [a for a in ARMS if a != "fedavg_dp"] and cfg.arms == list(ARMS)
    assert list(left_out) == ["fedavg_dp"] and runnable_arms(kept, ds) == (kept, {})
    assert f"arm 'fedavg_dp' left out of this run: it needs labelled events in every organisation; {name} has none" \
        in caplog.text
    # named in the config: refused before any Flower run
    config = tmp_path / "exp.toml"
    config.write_text(f'[experiment]\ndataset = "{folder}"\ncache = "{tmp_path / "cache"}"\n'
                      'arms = ["docs_only", "fedavg_dp"]\n')
    with pytest.raises(SynapseError, match=f"arm 'fedavg_dp': it needs labelled events in every organisation; "
                                           f"{name} has none.*; drop it from arms"):
        run_experiment(config, output=tmp_path / "out")
    assert not (tmp_path / "cache" / "flower").exists()
    # no organisation with a label at all: the classifier has nothing to learn either
    unlabelled = tmp_path / "unlabelled"
    shutil.copytree(folder, unlabelled)
    for other in unlabelled.glob("org_*.jsonl"):
        other.write_text(org.read_text())
    config.write_text(f'[experiment]\ndataset = "{unlabelled}"\ncache = "{tmp_path / "cache"}"\n'
                      'arms = ["docs_only", "federated", "classifier"]\n')
    with pytest.raises(SynapseError, match="arm 'classifier': it needs .* of at least 2 tools, got 0"):
        run_experiment(config, output=tmp_path / "out")
    assert not (tmp_path / "cache" / "flower").exists()


def test_a_budget_dp_sgd_cannot_meet_leaves_fedavg_dp_out_before_any_flower_run(tmp_path, caplog):
    """Regression: epsilon 0.001 passed the config check (the compendium's noise can meet it), then the fedavg_dp
    arm raised a traceback after every Flower run of the experiment, when DP-SGD met the organisations' sizes."""
    from synapse_flwr.simulations.experiment import runnable_arms

    from synapse_flwr.data.federation import load_federated

    cfg = ExperimentConfig(dataset="demo", seeds=[42], epsilon=0.001, cache=str(tmp_path / "cache"))
    ds = load_federated("demo", cfg.orgs, 42, cfg.alpha)
    with caplog.at_level("WARNING"):
        kept, left_out = runnable_arms(cfg, ds)
    assert "fedavg_dp" not in kept.arms and "federated_private" in kept.arms
    assert left_out["fedavg_dp"].startswith("its DP-SGD noise cannot meet epsilon 0.001: an organisation of ")
    assert "privacy budget is too low" in left_out["fedavg_dp"]
    assert runnable_arms(replace(cfg, epsilon=4.0), ds) == (replace(cfg, epsilon=4.0), {})
    _refused_before_any_flower_run(tmp_path, 'dataset = "demo"\nepsilon = 0.001\narms = ["docs_only", "fedavg_dp"]',
                                   "arm 'fedavg_dp': its DP-SGD noise cannot meet epsilon 0.001")


def _refused_before_any_flower_run(tmp_path: Path, keys: str, match: str) -> None:
    """An experiment of these ``[experiment]`` keys is refused with ``match`` before any Flower run."""
    from synapse_flwr.simulations.experiment import run_experiment

    config = tmp_path / "exp.toml"
    config.write_text(f'[experiment]\ncache = "{tmp_path / "cache"}"\n{keys}\n')
    with pytest.raises(SynapseError, match=match):
        run_experiment(config, output=tmp_path / "out")
    assert not (tmp_path / "cache" / "flower").exists()


def test_orgs_default_to_the_dataset_s_own(tmp_path):
    from synapse_flwr.simulations.experiment_config import DEFAULT_ORGS

    folder = tmp_path / "bench"
    folder.mkdir()
    for org in "abcdefg":
        (folder / f"org_{org}.jsonl").write_text("")
    assert ExperimentConfig(dataset=str(folder)).orgs == 7  # a folder keeps its organisations
    assert ExperimentConfig(dataset="demo").orgs == 3
    assert ExperimentConfig(dataset="metatool").orgs == DEFAULT_ORGS == 5  # pooled: the paper's K
    assert ExperimentConfig(dataset=str(folder), orgs=4).orgs == 4  # asked for: re-partitioned
    single = tmp_path / "single"
    single.mkdir()
    (single / "org_all.jsonl").write_text("")
    assert ExperimentConfig(dataset=str(single)).orgs == DEFAULT_ORGS  # one log: pooled experience


def test_a_folder_with_one_organisation_log_is_split_like_a_pooled_benchmark(tmp_path, caplog):
    import shutil

    from synapse_flwr.data.federation import demo_dir, load_federated

    folder = tmp_path / "single"
    folder.mkdir()
    for name in ("catalog.json", "aliases.json", "test.jsonl"):
        shutil.copy(demo_dir() / name, folder / name)
    events = "".join((demo_dir() / f"org_{o}.jsonl").read_text() for o in "abc")
    (folder / "org_all.jsonl").write_text(events)
    with caplog.at_level("WARNING", logger="synapse_flwr"):
        ds = load_federated(str(folder), 5, 7)
    assert len(ds.orgs) == 5 and sum(len(e) for e in ds.orgs.values()) == len(events.splitlines())
    # a warning (dress rehearsal: it was an INFO line, and check-data said "1 orgs")
    assert (f"dataset {folder} has one organisation log: one organisation is no federation, so its experience is "
            "split into 5") in caplog.text


def test_re_partitioning_a_folder_s_organisations_is_logged(caplog):
    from synapse_flwr.data.federation import load_federated

    with caplog.at_level("WARNING"):
        ds = load_federated("demo", 4, 7)
    assert len(ds.orgs) == 4
    assert "dataset demo has 3 organisations; 4 asked for" in caplog.text
    assert ExperimentConfig(dataset="demo", name="My title").name == "My title"


def test_the_run_ends_with_a_readable_summary_of_arms_and_targets():
    from synapse_flwr.simulations.experiment_report import summary_lines

    def arm(seen, held):
        return {"seen": {"acc_mean": seen}, "heldout": {"acc_mean": held}}

    results = {"name": "mine", "dataset": "my_folder", "seeds": [1, 2], "orgs": 4, "ablation_2x2": {},
               "contradiction": {}, "epsilon": 3.96, "epsilon_target": 4.0, "delta": 1e-5,
               "arms": {"docs_only": arm(0.5, 0.6), "federated": arm(0.7, 0.59), "classifier": arm(0.9, 0.0)}}
    results["targets"] = targets(results)
    lines = summary_lines(results)
    assert lines[0].startswith("mine: my_folder, seeds [1, 2], K=4")
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:5]}
    assert rows == {"docs_only": ["0.500", "0.600"], "federated": ["0.700", "0.590"],
                    "classifier": ["0.900", "0.000"]}
    assert any("spent epsilon 3.96" in line for line in lines)
    # held-out 0.01 below docs_only is more than the margin: the summary says so
    assert any(line.strip().startswith("MISSED no harm: federated - docs_only (heldout): -0.010")
               for line in lines), lines
    assert any(line.strip().startswith("met    no harm: federated - docs_only (seen): +0.200") for line in lines)
    # an arm the data could not train is named with its reason below the arms
    results["arms_left_out"] = {"fedavg_dp": "it needs labelled events in every organisation"}
    assert summary_lines(results)[5].split() == ["fedavg_dp", "left", "out:", "it", "needs", "labelled", "events", "in",
                                                 "every", "organisation"]


def test_the_summary_gives_each_split_s_size_and_names_an_empty_or_small_one():
    from synapse_flwr.simulations.experiment_report import summary_lines

    results = {"name": "tiny", "dataset": "f", "seeds": [1, 2], "orgs": 2, "epsilon": None, "epsilon_target": 4.0,
               "delta": 1e-5, "arms": {"docs_only": {"seen": {"acc_mean": 0.5}}}, "targets": [],
               "seed_info": {"1": {"test_sizes": {"seen": 40}}, "2": {"test_sizes": {"seen": 44}}}}
    lines = [line.strip() for line in summary_lines(results)]
    assert "test queries per seed: seen 40-44, heldout 0" in lines
    assert any(line.startswith("note: no heldout queries (on tools without experience)") for line in lines)
    assert any(line.startswith("note: seen has 40 queries: one query moves its top-1 by 0.025") for line in lines)
    results["seed_info"] = {"1": {"test_sizes": {"seen": 400, "heldout": 300}}}
    assert not any(line.strip().startswith("note:") for line in summary_lines(results))


def test_the_summary_and_tables_say_what_the_fusion_votes_chose():
    """A federated arm that routes exactly as docs_only is explained: its votes chose documentation only."""
    from synapse_flwr.simulations.experiment_report import summary_lines, tables

    results = {"name": "v", "dataset": "f", "seeds": [1, 2], "orgs": 3, "epsilon": 4.0, "epsilon_target": 4.0,
               "delta": 1e-5, "rounds": 3, "embedder": "minilm", "reranker": "fields", "k": 5, "alpha": 0.5,
               "arms": {"docs_only": {"seen": {"acc_mean": 0.5, "acc_sd": 0.0, "r5_mean": 0.9}}}, "targets": [],
               "leak_filter": {}, "ablation_2x2": {}, "contradiction": {}, "injection": {}, "per_round": {},
               "llm_sample": {},
               "seed_info": {"1": {"votes_chose": {"federated": [8.0, 0.5], "federated_private": [0.0, 0.0]}},
                             "2": {"votes_chose": {"federated": [8.0, 0.5], "federated_private": [4.0, 0.0]}}}}
    line = next(x.strip() for x in summary_lines(results) if x.strip().startswith("fusion votes"))
    assert "`federated` prototype weight 8, prior 0.5 on every seed" in line
    assert ("`federated_private` seed 1: documentation only, seed 2: prototype weight 4, prior 0" in line)
    assert line[0].upper() + line[1:] in tables(results)
    results["seed_info"]["2"]["votes_chose"]["federated"] = None
    assert "seed 2: no votes (the embedder's default fusion)" in "\n".join(summary_lines(results))
    del results["seed_info"]
    assert not any("votes" in x for x in summary_lines(results))


def test_the_tables_count_the_records_skipped_where_read():
    """A benchmark's placeholder queries change its test set's size: the tables say how many were skipped."""
    from synapse_flwr.simulations.experiment_report import tables

    results = {"name": "v", "dataset": "f", "seeds": [1], "orgs": 3, "epsilon": 4.0, "epsilon_target": 4.0,
               "delta": 1e-5, "rounds": 3, "embedder": "minilm", "reranker": "fields", "k": 5, "alpha": 0.5,
               "arms": {"docs_only": {"seen": {"acc_mean": 0.5, "acc_sd": 0.0, "r5_mean": 0.9}}}, "targets": [],
               "leak_filter": {"1": {"total": 9, "exact": 0, "near": 1, "garbage": 0, "kept": 8}},
               "ablation_2x2": {}, "contradiction": {}, "injection": {}, "per_round": {}, "llm_sample": {}}
    assert "Records skipped" not in tables(results)
    results["skipped_records"] = {"org_a.jsonl": 2, "test.jsonl": 1}
    assert ("1 near duplicates and 0 garbage dropped of 9. Records skipped where read, their query holding no "
            "letter or digit: org_a.jsonl 2, test.jsonl 1.") in tables(results)


def test_the_llm_sample_sits_beside_retrieval_order_and_its_order_check_catches_a_position_biased_llm(
        tmp_path, monkeypatch):
    """The LLM rows of an experiment name retrieval order on the same queries, and a reader that picks by
    position is flagged by the reversed / shuffled check (a content reader is not)."""
    import zlib

    from synapse_flwr.simulations.experiment import Experiment
    from synapse_flwr.simulations.experiment_report import llm_targets, tables

    from synapse_flwr.core import rerank_llm

    def by_content(model, pairs):  # order-free: each (entry, query) pair has its own score
        return [float(zlib.crc32((entry + query).encode()) % 97) for entry, query in pairs]

    def by_position(model, pairs):  # the later a candidate is shown, the higher it scores
        out, pos, prev = [], 0, None
        for _, query in pairs:
            pos, prev = (pos + 1 if query == prev else 0), query
            out.append(float(pos))
        return out

    # the federated global is the pooled compendium here: no Flower run in a fast test
    monkeypatch.setattr(Experiment, "federate", lambda self, *a, **k: {})
    monkeypatch.setattr(Experiment, "global_of", lambda self, run, round_=None: self.centralized(7))
    monkeypatch.setitem(rerank_llm.LLM_WEIGHTS, "local/smollm2", 100.0)  # the LLM's pick decides
    def unreachable(model, pairs):  # a hosted model without a network: every call fails
        raise RuntimeError("connection refused")

    found = {}
    for name, reader in (("content", by_content), ("position", by_position), ("failing", unreachable)):
        monkeypatch.setattr("synapse_flwr.core.llm.channel_scores", reader)
        cfg = ExperimentConfig(name="x", dataset="demo", seeds=[7], embedder="static", llm_sample=6,
                               cache=str(tmp_path / name))
        found[name] = Experiment(cfg).llm_sample(7)
    content, position, failing = found["content"], found["position"], found["failing"]
    assert set(content["arms"]) == {"docs_only", "federated", "centralized"}
    for split, m in content["arms"]["federated"].items():
        assert m["n"] == 6 and m["fallbacks"] == 0 and 0.0 <= m["retrieval_acc"] <= 1.0
        assert content["order_check"][split] == {"n": 6, "checked": 6, "checked_reversed": 6,
                                                   "checked_shuffled": 6, "reversed": 0, "shuffled": 0}
        assert position["order_check"][split]["reversed"] == 6  # last shown wins: reversing moves every pick
        # an LLM that never answers routes in retrieval order and compares nothing
        assert failing["arms"]["federated"][split]["fallbacks"] == 6
        assert failing["arms"]["federated"][split]["acc"] == failing["arms"]["federated"][split]["retrieval_acc"]
        assert failing["order_check"][split]["checked"] == 0
    moved = {t["target"]: t["met"] for t in llm_targets(position) if "moved" in t["target"]}
    assert moved and not any(moved.values())
    assert all(t["met"] for t in llm_targets(content) if "moved" in t["target"] or "answered" in t["target"])
    # ... so its rows cannot pass: none answered, no order compared
    unmet = [t["target"] for t in llm_targets(failing) if not t["met"]]
    assert sum("answered" in t for t in unmet) == 6 and sum("moved" in t for t in unmet) == 2
    text = tables({"name": "x", "dataset": "demo", "seeds": [7], "orgs": 3, "alpha": 0.5, "rounds": 3,
                   "embedder": "static", "reranker": "fields", "k": 5, "ablation_2x2": {},
                   "arms": {"docs_only": {s: {"acc_mean": 0.5, "acc_sd": 0.0, "r5_mean": 0.7}
                                          for s in position["arms"]["federated"]}},
                   "contradiction": {}, "injection": {}, "per_round": {}, "llm_sample": position,
                   "targets": llm_targets(position), "orgs_as_given": True, "epsilon": None,
                   "epsilon_target": 4.0, "delta": 1e-5, "leak_filter": {}})
    assert "| LLM top-1 | retrieval order top-1 |" in text and "reversed and shuffled: seen 6 and" in text
    row = position["arms"]["federated"]["seen"]
    assert (f"| federated | seen | {row['acc']:.3f} | {row['retrieval_acc']:.3f} | "
            f"{row['acc'] - row['retrieval_acc']:+.3f} |") in text


def test_the_llm_sample_reranks_only_the_arms_the_config_runs(tmp_path, monkeypatch):
    """Regression (rehearsal): arms = ["docs_only"] with llm_sample still started a Flower run for the federated
    arm and reported federated and centralized LLM rows and targets."""
    from synapse_flwr.simulations.experiment import Experiment

    def no_flower(self, *args, **kwargs):
        raise AssertionError("a Flower run for an arm the config left out")

    monkeypatch.setattr(Experiment, "federate", no_flower)
    monkeypatch.setattr("synapse_flwr.core.llm.channel_scores", lambda model, pairs: [float(len(e)) for e, _ in pairs])
    cfg = ExperimentConfig(name="x", dataset="demo", seeds=[7], embedder="static", llm_sample=3,
                           arms=["docs_only"], cache=str(tmp_path))
    found = Experiment(cfg).llm_sample(7)
    assert set(found["arms"]) == {"docs_only"} and {c["n"] for c in found["order_check"].values()} == {3}
    assert found["order_arm"] == "docs_only"


def test_a_results_stamp_is_dirty_for_changed_code_not_for_rewritten_results(tmp_path):
    from synapse_flwr.eval.results import code_commit

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "synapse_flwr").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "synapse_flwr" / "m.py").write_text("x = 1\n")
    (tmp_path / "docs" / "tables.md").write_text("old\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    clean = code_commit(tmp_path)
    assert len(clean) == 40 and not clean.endswith("+dirty")
    (tmp_path / "docs" / "tables.md").write_text("new\n")  # a run rewriting its own results
    (tmp_path / "docs" / "new.md").write_text("new\n")
    assert code_commit(tmp_path) == clean
    (tmp_path / "synapse_flwr" / "new.py").write_text("y = 1\n")  # a script not yet committed
    assert code_commit(tmp_path) == clean + "+dirty"
    (tmp_path / "synapse_flwr" / "new.py").unlink()
    (tmp_path / "synapse_flwr" / "m.py").write_text("x = 2\n")
    assert code_commit(tmp_path) == clean + "+dirty"


def test_the_cache_counts_as_hits_only_units_an_earlier_run_wrote(tmp_path):
    from synapse_flwr.simulations.experiment import UnitCache

    first = UnitCache(tmp_path, "fp")
    assert [first.get("a", lambda: 1), first.get("a", lambda: 2)] == [1, 1]
    assert (first.misses, first.hits) == (1, 0)  # read back within the run: not from the cache
    second = UnitCache(tmp_path, "fp")
    assert second.get("a", lambda: 3) == 1 and (second.misses, second.hits) == (0, 1)
    # regression: a unit read twice from the cache counted twice (a rerun said 41 read of 26 units)
    assert second.get("a", lambda: 3) == 1 and (second.misses, second.hits) == (0, 1)
    assert UnitCache(tmp_path, "other").get("a", lambda: 4) == 4  # another fingerprint recomputes


# ---------------------------------------------------------------- cache keys: what a code change recomputes
def _package_imports(module: str) -> set[str]:
    """The synapse_flwr modules ``module`` imports, at the top or inside a function (names under the package)."""
    import ast

    package = ROOT / "synapse_flwr"
    found = set()
    for node in ast.walk(ast.parse((package / (module.replace(".", "/") + ".py")).read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("synapse_flwr."):
            name = node.module.removeprefix("synapse_flwr.")
            if (package / (name.replace(".", "/") + ".py")).is_file():
                found.add(name)
            found |= {f"{name}.{a.name}" for a in node.names
                      if (package / name.replace(".", "/") / f"{a.name}.py").is_file()}
    return found


def _import_closure(roots: Sequence[str]) -> set[str]:
    """Every synapse_flwr module ``roots`` import, directly or not, the roots included."""
    seen, todo = set(), list(roots)
    while todo:
        if (module := todo.pop()) not in seen:
            seen.add(module)
            todo += _package_imports(module)
    return seen


# modules that cannot change a score: error texts, atomic file writes, the progress bar, BLAS threads
NOT_SCORING = {"core.errors", "core.files", "core.progress", "flower.processes"}


def test_the_routing_code_hash_covers_every_module_the_router_and_the_baselines_read():
    """Regression: core.prototypes, core.privacy, core.scenarios and core.sanitize, which the Router calls,
    were not hashed, so a change there left every cached evaluation standing."""
    from synapse_flwr.simulations.experiment import ROUTER_MODULES, ROUTING_MODULES

    assert _import_closure(["core.router", "core.votes"]) - NOT_SCORING <= set(ROUTER_MODULES)
    assert _import_closure(ROUTING_MODULES) - NOT_SCORING <= set(ROUTING_MODULES)
    assert {"core.prototypes", "core.privacy", "core.scenarios", "core.sanitize"} <= set(ROUTER_MODULES)
    # regression: a change to the split rules (seen / held-out, test items) left cached docs_only scores standing
    assert {"data.protocol", "data.federation"} <= set(ROUTING_MODULES)


def test_baseline_and_verify_keys_carry_the_routing_code_and_a_flower_run_that_votes_the_router_s():
    from synapse_flwr.simulations.experiment import (
        classifier_key,
        fedavg_key,
        flower_key,
        verify_key,
    )

    for key in (classifier_key, lambda seed, code: fedavg_key(4.0, seed, code),
                lambda seed, code: verify_key(math.inf, 0.2, seed, code)):
        assert key(42, "aaa") != key(42, "bbb") and key(42, "aaa").endswith("/seed42/codeaaa")
    assert flower_key("typed", math.inf, 0.0, False, 42) == "flower/typed/epsinf/rate0/seed42"  # cached as before
    assert flower_key("typed", 4.0, 0.2, True, 42, "aaa") == "flower/typed/eps4/rate0.2/replay-seed42/codeaaa"


def test_a_routing_code_change_rescores_the_baselines_and_reruns_only_the_flower_runs_that_vote(tmp_path):
    """Regression: the classifier, fedavg_dp and verify units, and the Flower runs whose fusion votes a Router
    scores, stayed cached after a router change (docs/experiments.md promises every arm is re-scored)."""
    from synapse_flwr.simulations.experiment import Experiment

    from synapse_flwr.core.merge import FLAT_MAJORITY, TYPED

    cfg = ExperimentConfig(dataset="demo", seeds=[42], arms=["classifier", "fedavg_dp"],
                           cache=str(tmp_path / "cache"))
    calls = []
    exp = Experiment(cfg)
    exp._classifier = lambda ds: calls.append("classifier") or {"seen": {"acc": 1.0}}
    exp._fedavg = lambda ds, seed: calls.append("fedavg_dp") or {"seen": {"acc": 1.0}}
    exp.arms_for_seed(42)
    again = Experiment(cfg)
    again._classifier, again._fedavg = exp._classifier, exp._fedavg
    again.arms_for_seed(42)
    assert calls == ["classifier", "fedavg_dp"]  # same code: cached
    again.code = "changed"
    again.arms_for_seed(42)
    assert calls == ["classifier", "fedavg_dp"] * 2  # the router changed: both baselines re-scored
    exp.unit = lambda key, compute: key  # the key each unit is cached under, computing nothing
    assert exp.verify_inputs(42, 0.2, math.inf, {}).endswith(f"/code{exp.code}")
    assert exp.federate(42, TYPED, math.inf, 0.0).endswith(f"/seed42/code{exp.router_code}")  # votes
    assert exp.federate(42, FLAT_MAJORITY, math.inf, 0.0) == "flower/flat-majority/epsinf/rate0/seed42"


# ---------------------------------------------------------------- contradiction injection keeps the split
def test_injected_wrong_tools_are_tools_with_experience_so_held_out_tools_stay_held_out():
    """Regression: a wrong tool was drawn from the whole catalog, crediting held-out tools (scored as tools
    without experience) with successful calls."""
    from synapse_flwr.core.experience import event_label
    from synapse_flwr.data.federation import experienced_tools, load_federated

    clean = load_federated("demo", 3, 42, 0.5, 0.0)
    held_out = {tool for item in clean.heldout_test for tool in item.gold}
    assert held_out and experienced_tools(clean.catalog, clean.all_events) == [
        t for t in clean.catalog.ids if t not in held_out]
    for seed in (42, 123):
        injected = load_federated("demo", 3, seed, 0.5, 0.6)
        assert injected.info["injection"].counts["wrong_tool"] > 0
        taught = {event_label(e, injected.catalog) for e in injected.all_events}
        assert not taught & held_out
        assert injected.all_events == load_federated.__wrapped__("demo", 3, seed, 0.5, 0.6).all_events  # seeded


# ---------------------------------------------------------------- report
def _summary(acc: float) -> dict:
    return {"acc": acc, "r5": acc, "n": 10}


def test_the_report_aggregates_a_contradiction_sweep_of_a_test_set_without_seen_queries():
    """Regression: with no seen queries the contradiction target subtracted None from None (TypeError)."""
    from synapse_flwr.simulations.experiment import aggregate

    row = {"typed/typed": {"heldout": _summary(0.5)}, "centralized": {"heldout": _summary(0.5)}}
    per_seed = {42: {"arms": {"docs_only": {"heldout": _summary(0.5)}}, "2x2": {}, "injection": {},
                     "rates": {"0": row, "0.4": row}, "per_round": {},
                     "info": {"leak_filter": None, "orgs_as_given": True}}}
    results = aggregate(ExperimentConfig(dataset="demo", seeds=[42], rates=[0.0, 0.4]), per_seed, {})
    assert results["contradiction"]["0.4"]["typed/typed"]["heldout"]["acc_mean"] == 0.5
    assert not any("contradiction" in t["target"] for t in results["targets"])


def test_no_harm_compares_the_unrounded_gap_and_rounds_it_only_to_show_it():
    """Regression: a held-out gap of -0.00504 rounded to -0.005 and passed the 0.005 margin."""
    from synapse_flwr.simulations.experiment_report import no_harm

    def arm(heldout):
        return {"heldout": {"acc_mean": heldout, "acc_sd": 0.0, "r5_mean": 0.0}}

    results = {"arms": {"docs_only": arm(0.52), "federated": arm(0.51496)}, "ablation_2x2": {},
               "contradiction": {}}
    assert no_harm(results)["federated"]["heldout"] < -0.005
    row = next(t for t in targets(results) if t["target"] == "no harm: federated - docs_only (heldout)")
    assert row == {"target": "no harm: federated - docs_only (heldout)", "value": -0.00504, "goal": ">= -0.005",
                   "met": False}


# ---------------------------------------------------------------- the dataset: a built-in name or a folder
def _org_folder(folder: Path, orgs: str = "ab") -> Path:
    folder.mkdir(parents=True)
    for org in orgs:
        (folder / f"org_{org}.jsonl").write_text("")
    return folder


def test_a_folder_named_like_a_built_in_dataset_is_read_as_the_folder(tmp_path, monkeypatch):
    """Regression: `./demo` (and the folder `demo` given as the config) became "demo", the built-in dataset."""
    monkeypatch.chdir(tmp_path)
    folder = _org_folder(tmp_path / "demo", "abcd")
    path = _write(tmp_path, '[experiment]\ndataset = "./demo"\n')
    for cfg in (ExperimentConfig.from_toml(path), ExperimentConfig.from_toml(Path("demo"))):
        assert cfg.dataset == str(folder) and cfg.orgs == 4  # the folder's four logs, not the demo's three
    relative = _org_folder(tmp_path / "data" / "bench")
    assert ExperimentConfig.from_toml(_write(tmp_path, '[experiment]\ndataset = "data/bench"\n')).dataset == \
        str(relative)  # a relative folder: from the working folder, absolute


def test_a_built_in_name_never_reads_a_folder_of_that_name(tmp_path, monkeypatch):
    """Regression: with a folder `demo` (or `metatool`) in the working folder, `dataset = "demo"` sent that
    folder to the Flower clients and checked it, while the driver scored the built-in dataset."""
    from synapse_flwr.simulations import experiment as experiment_module
    from synapse_flwr.simulations.experiment import Experiment

    from synapse_flwr.core.merge import TYPED

    monkeypatch.chdir(tmp_path)
    (_org_folder(tmp_path / "demo") / "org_a.jsonl").write_text("not json\n")
    _org_folder(tmp_path / "metatool")
    assert ExperimentConfig(dataset="metatool").orgs == 5 and ExperimentConfig(dataset="demo").orgs == 3
    cfg = ExperimentConfig.from_toml(_write(tmp_path, '[experiment]\ndataset = "demo"\nseeds = [42]\n'))
    assert cfg.dataset == "demo"
    assert Experiment(cfg).run_config(42, TYPED, math.inf, 0.0, False, tmp_path).dataset == "demo"

    class Reached(Exception):
        pass

    def reached(self):
        raise Reached

    monkeypatch.setattr(Experiment, "run", reached)  # no Flower run: only the checks before it
    monkeypatch.setattr(experiment_module, "data_hashes", lambda dataset: {})
    with pytest.raises(Reached):  # the broken folder ./demo is not checked (it raised DataError)
        run_experiment(_write(tmp_path, '[experiment]\ndataset = "demo"\nseeds = [42]\n'
                                        f'cache = "{tmp_path / "cache"}"\n'), output=tmp_path / "out")


def test_results_name_a_folder_under_the_working_folder_relative_to_it(tmp_path):
    from synapse_flwr.simulations.experiment import shown_dataset

    assert shown_dataset(str(tmp_path / "runs" / "bench"), tmp_path) == "runs/bench"
    assert shown_dataset(str(tmp_path / "demo"), tmp_path) == "./demo"  # not the built-in name
    assert shown_dataset("/elsewhere/bench", tmp_path) == "/elsewhere/bench"
    assert shown_dataset("demo", tmp_path) == "demo"


# ---------------------------------------------------------------- the baselines rank at the experiment's k
def test_the_baselines_rank_at_the_config_s_k(tmp_path, monkeypatch):
    """Regression: the classifier and fedavg_dp ranked their top 5 whatever k the tables name (recall@k)."""
    from synapse_flwr.simulations.experiment import Experiment

    from synapse_flwr.eval import baselines

    seen = {}

    def svm(train, catalog, tests, C=1.0, k=5):
        seen["classifier"] = k
        return {}

    def fedavg(org_events, catalog, test, *args, k=5, extra_tests=None, **kwargs):
        seen["fedavg_dp"] = k
        return {"acc": 0.0, "r5": 0.0, "n": 0, "epsilon_spent": 1.0,
                "extra": {s: {"acc": 0.0, "r5": 0.0, "n": 0} for s in extra_tests or {}}}

    monkeypatch.setattr(baselines, "tfidf_svm_arm", svm)
    monkeypatch.setattr(baselines, "fedavg_dp_arm", fedavg)
    exp = Experiment(ExperimentConfig(dataset="demo", seeds=[42], k=3, cache=str(tmp_path / "cache")))
    exp._embedder = object()  # not read by the stand-in
    ds = exp.dataset(42)
    exp._classifier(ds)
    exp._fedavg(ds, 42)
    assert seen == {"classifier": 3, "fedavg_dp": 3}


# ---------------------------------------------------------------- seed info
def test_held_out_tools_are_counted_from_the_held_out_test_queries(tmp_path):
    """Regression: results.json said 0 held-out tools for every folder (only MetaTool's loader named them)."""
    import shutil

    from synapse_flwr.simulations.experiment import Experiment, heldout_tool_count

    from synapse_flwr.core.experience import TestItem
    from synapse_flwr.data.federation import demo_dir

    items = [TestItem(query="q", gold=("a", "b")), TestItem(query="r", gold=("b",)), TestItem(query="s", gold=("c",))]
    assert heldout_tool_count(items) == 3 and heldout_tool_count([]) == 0
    folder = tmp_path / "bench"
    shutil.copytree(demo_dir(), folder)
    exp = Experiment(ExperimentConfig(dataset=str(folder), seeds=[42], cache=str(tmp_path / "cache")))
    exp.votes_chose = exp.globals_for_seed = lambda seed: {}  # a Flower run's
    exp.unit = lambda key, compute: {}  # the paraphrase diagnostic embeds every query
    info = exp.seed_info(42)
    assert info["heldout_tools"] == 3  # the demo's three tools without experience
    assert (info["tools_with_experience"], info["catalog_tools"]) == (21, 24)


def test_the_arguments_line_names_the_common_arguments_it_does_not_read(tmp_path):
    """Regression: an MCP catalog whose every tool takes ``query`` and ``locale`` logged 'reads the arguments of 0 of
    90 tools', as if its inputSchemas were not parsed; the line now says which arguments it drops and why."""
    from synapse_flwr.simulations.experiment import arguments_line

    from synapse_flwr.core.catalog import load_catalog

    schema = {"type": "object", "properties": {"query": {"type": "string"}, "locale": {"type": "string"}}}
    tools = [{"name": f"tool {i}", "description": f"Does thing {i}.", "inputSchema": schema} for i in range(4)]
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"tools": tools}))
    line = arguments_line(load_catalog(path))
    assert "0 of the 4 tools whose parameters' schema lists some" in line and "'locale', 'query'" in line

    tools[0]["inputSchema"] = {"properties": {**schema["properties"], "order_id": {"type": "string"}}}
    path.write_text(json.dumps({"tools": tools}))
    assert "reads the arguments of 1 of the 4 tools" in arguments_line(load_catalog(path))

    path.write_text(json.dumps([{"name": "a", "description": "A."}, {"name": "b", "description": "B."}]))
    assert arguments_line(load_catalog(path)).startswith("no tool of the 2 gives a parameters' schema")


def _folder_results(**over) -> dict:
    """The results of a one-seed run on a folder, as the report reads them, with ``over`` replacing keys."""
    return {"name": "mine", "dataset": "my_folder", "seeds": [7], "orgs": 3, "alpha": 0.5, "rounds": 2,
            "embedder": "static", "reranker": "fields", "k": 5, "orgs_as_given": True, "ablation_2x2": {},
            "contradiction": {}, "per_round": {}, "injection": {}, "llm_sample": {}, "leak_filter": {},
            "epsilon": None, "epsilon_target": 4.0, "delta": 1e-5, "bytes_per_client_round": None,
            "bytes_per_client_round_max": None, "bytes_per_client_round_private": None, "targets": [], **over}


def _seen(acc: float, **extra) -> dict:
    """One arm's metrics on the seen split only."""
    return {"seen": {"acc_mean": acc, "acc_sd": 0.0, "r5_mean": acc, "n": [100], **extra}}


def test_tables_say_no_federation_ran_instead_of_zero_bytes_and_no_targets_instead_of_an_empty_table():
    """Regression: a run of docs_only and the classifier (no Flower run) wrote 'Wire (gzip JSON): 0 bytes per client
    per round with privacy on; 0 on average ... (max 0)' and a Targets table without rows; a run without
    ``federated_private`` wrote 0 bytes 'with privacy on'."""
    from synapse_flwr.simulations.experiment_report import tables

    results = _folder_results(arms={"docs_only": _seen(0.4), "classifier": _seen(0.8)})
    results["targets"] = targets(results)
    text = tables(results)
    assert "0 bytes" not in text and "Wire: not measured (no federation ran)." in text
    assert "| target | measured |" not in text and "No target measured" in text

    results.update(bytes_per_client_round=20_000, bytes_per_client_round_max=50_087,
                   arms={**results["arms"], "federated": _seen(0.5)})
    results["targets"] = targets(results)
    text = tables(results)
    assert ("no federation with privacy on ran; 20,000 on average over the federations without privacy; the "
            "largest in any round of any federation 50,087.") in text
    assert "| federated - docs_only (seen) | +0.100 |" in text
    # regression: a run of the private federation alone said 'Wire: not measured', or (with the average over
    # every federation) gave the private bytes as those of the federations without privacy
    results.update(bytes_per_client_round=None, bytes_per_client_round_private=9_000)
    assert ("9,000 bytes per client per round (train and vote replies) with privacy on; no federation without "
            "privacy ran;") in tables(results)


def test_the_bytes_without_privacy_average_the_federations_without_privacy_alone():
    """Regression: the average 'over all clean federations' took the private federation's rounds in too."""
    from synapse_flwr.simulations.experiment import aggregate

    def run(size: int) -> dict:
        return {"rounds": [{}], "records": [{"bytes_per_client": size, "epsilon": None}]}

    seed = {"arms": {}, "2x2": {}, "rates": {}, "injection": None,
            "info": {"leak_filter": None, "orgs_as_given": True},
            "per_round": {"federated": run(1000), "federated_private": run(100)}}
    out = aggregate(ExperimentConfig(dataset="demo", seeds=[7], rounds=1), {7: seed}, {})
    assert (out["bytes_per_client_round"], out["bytes_per_client_round_private"]) == (1000, 100)
    assert out["bytes_per_client_round_max"] == 1000


def test_the_summary_says_how_much_each_compendium_arm_left_to_the_documentation():
    """A catalog where most tools have no experience leaves most seen queries to the documentation (the no-harm
    gate): the summary says so beside the arms, with the tools with experience, not a small gain unexplained."""
    from synapse_flwr.simulations.experiment_report import summary_lines, tables

    results = _folder_results(
        seed_info={"7": {"test_sizes": {"seen": 100, "heldout": 0}, "tools_with_experience": 159, "catalog_tools": 432,
                         "globals": {"federated": "runs/g/global_round_2.json"}}},
        arms={"docs_only": _seen(0.254), "federated": _seen(0.269, docs_gated_mean=0.696)})
    summary = "\n".join(summary_lines(results))
    assert "tools with experience: 159 of 432 in the catalog" in summary
    assert "queries whose route reads no prototype" in summary
    assert "federated seen 70%" in summary and "docs_only seen" not in summary
    assert ("final globals of seed 7 (`synapse route --compendium PATH`): federated runs/g/global_round_2.json"
            in summary)
    assert "Queries whose route reads no prototype" in tables(results)
    # the written tables say the sizes too: a missing heldout column was left unexplained there
    assert "- no heldout queries (on tools without experience) in the test set of some seed" in tables(results)
    assert "- tools with experience: 159 of 432 in the catalog" in tables(results)
    results["arms"]["federated"] = _seen(0.269)  # results written before the share was measured
    assert "reads no prototype" not in "\n".join(summary_lines(results))


def test_the_clean_rate_alone_is_no_sweep_table_nor_figure(tmp_path):
    """Regression: the default ``rates = [0.0]`` wrote a one-rate "Contradiction injection" table (the 2x2's row
    again, beside a centralized row the config did not ask for) and a one-point accuracy_vs_contradiction.png."""
    from synapse_flwr.simulations.experiment_report import figures, tables

    cell = _seen(0.7)
    results = _folder_results(ablation_2x2={"typed/typed": cell}, contradiction={"0": {"typed/typed": cell}},
                              arms={"federated": cell})
    assert "Contradiction injection" not in tables(results) and "Merge x render" in tables(results)
    assert figures(results, tmp_path) == [] and not list(tmp_path.iterdir())
    results["contradiction"] = {"0.3": {"typed/typed": cell}}  # one rate, not the clean one: a sweep's row
    assert "| 30% | typed/typed |" in tables(results)
    results["contradiction"]["0"] = {"typed/typed": cell}
    assert "| 30% | typed/typed |" in tables(results)
    assert [p.name for p in figures(results, tmp_path)] == ["accuracy_vs_contradiction.png"]


def test_a_figure_this_run_does_not_draw_is_not_left_from_an_earlier_run(tmp_path):
    """Regression: a run into a folder that held an earlier run's results (``-o``, or the default
    ``docs/results/<name>`` of a config re-run with fewer arms) rewrote results.json and tables.md but left the
    earlier accuracy_per_round.png beside them, a figure of arms and rounds the new results do not hold."""
    from synapse_flwr.simulations.experiment_report import figures

    cell = _seen(0.7)
    drawn = _folder_results(contradiction={"0": {"typed/typed": cell}, "0.4": {"typed/typed": cell}},
                            arms={"federated": cell}, per_round={"federated": [cell, cell]})
    assert sorted(p.name for p in figures(drawn, tmp_path)) == ["accuracy_per_round.png",
                                                                 "accuracy_vs_contradiction.png"]
    (tmp_path / "notes.txt").write_text("mine")
    docs_only = _folder_results(contradiction={"0": {"typed/typed": cell}}, arms={"docs_only": cell}, per_round={})
    assert figures(docs_only, tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # a file of another name stays


def test_a_misspelt_key_or_a_budget_given_as_a_word_is_told_what_is_read(tmp_path):
    """A config with ``seed = [42]`` was refused with the 23 known keys but not the one meant; ``epsilon =
    "infinity"`` with 'expected float', not that "inf" turns privacy off."""
    path = tmp_path / "exp.toml"
    path.write_text('[experiment]\ndataset = "demo"\nseed = [42]\nepsilson = 4.0\nbogus = 1\n')
    with pytest.raises(SynapseError, match="unknown keys in \\[experiment\\]: bogus, epsilson, seed; did you mean "
                                           "epsilson -> epsilon, seed -> seeds\\? \\(known: "):
        ExperimentConfig.from_toml(path)
    path.write_text('[experiment]\ndataset = "demo"\nepsilon = "infinity"\n')
    with pytest.raises(SynapseError,
                       match="epsilon: expected float, got 'infinity' \\(a number, or \"inf\": privacy off\\)"):
        ExperimentConfig.from_toml(path)
    path.write_text('[experiment]\ndataset = "demo"\nepsilon = "inf"\nsweep_epsilon = "inf"\n')
    assert ExperimentConfig.from_toml(path).epsilon == math.inf


def test_a_lexical_embedder_is_fitted_anew_for_each_router(tmp_path):
    """Regression: with ``embedder = "tfidf"`` every Router of an experiment shared one embedder and kept the first
    Router's vocabulary, so docs_only scored differently after another arm had been evaluated first (a resumed run
    computes units in another order)."""
    from synapse_flwr.simulations.experiment import Experiment

    def docs_only_after(first) -> dict:
        cfg = ExperimentConfig(dataset="demo", seeds=[42], embedder="tfidf", cache=str(tmp_path / f"c{id(first)}"))
        exp = Experiment(cfg)
        ds = exp.dataset(42)
        if first is not None:
            exp.evaluate(first(ds), 42)
        assert exp.embedder is not exp.embedder and not exp.embedder.dim
        fitted = exp.fitted_embedder(ds.catalog)
        assert fitted.dim and fitted.name == exp.fitted_embedder(ds.catalog).name  # documentation only: no order
        return exp.evaluate(None, 42)

    from synapse_flwr.core.builder import build_compendium

    alone = docs_only_after(None)
    after = docs_only_after(lambda ds: build_compendium(ds.all_events, ds.catalog, "pooled", epsilon=math.inf))
    assert after == alone


def test_fresh_never_deletes_the_data_the_config_or_the_working_folder(tmp_path, monkeypatch):
    """Regression: --fresh removed the config's cache folder before any check, so `cache = "."` (or a cache above
    the dataset) deleted the working folder or the data."""
    import shutil

    from synapse_flwr.simulations.experiment import run_experiment

    from synapse_flwr.data.federation import demo_dir

    shutil.copytree(demo_dir(), tmp_path / "runs" / "bench")
    monkeypatch.chdir(tmp_path)
    for cache, held in ((".", "the dataset"), ("runs", "the dataset")):
        config = tmp_path / f"exp{len(cache)}.toml"
        config.write_text(f'[experiment]\ndataset = "runs/bench"\ncache = "{cache}"\noutput = "out"\n')
        with pytest.raises(SynapseError, match=f"--fresh would delete the cache folder {cache}, which holds {held}"):
            run_experiment(config, fresh=True)
    assert (tmp_path / "runs" / "bench" / "catalog.json").exists() and (tmp_path / "exp1.toml").exists()


def test_a_contradiction_rate_the_data_cannot_take_is_refused_before_any_flower_run(tmp_path):
    """Regression: a folder with one experienced tool and rates = [0, 0.2] failed inside the ClientApps, after
    the clean Flower runs."""
    import json
    import shutil

    from synapse_flwr.data.federation import demo_dir

    folder = tmp_path / "bench"
    shutil.copytree(demo_dir(), folder)
    for log in folder.glob("org_*.jsonl"):
        records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        log.write_text("".join(json.dumps(r) + "\n" for r in records
                                if r["tool"] == r.get("gold", r["tool"]) == "search_flights"))
    _refused_before_any_flower_run(tmp_path, f'dataset = "{folder}"\nrates = [0.0, 0.2]\n'
                                             'arms = ["docs_only", "federated"]',
                                   "needs two such tools, found 1; drop the non-zero rates")


def test_a_gap_of_exactly_the_margin_is_met_and_values_are_rounded_once():
    """Regressions: a held-out drop of exactly 0.005 (1 of 200 queries) read as missed in 176 of 200 cases (a
    difference of means is not exact); a value stored at 4 decimals and shown at 3 read +0.163 for 0.16247."""
    from synapse_flwr.simulations.experiment_report import llm_targets

    for k in range(1, 201):
        results = _folder_results(arms={"docs_only": {"heldout": {"acc_mean": k / 200, "acc_sd": 0, "r5_mean": 0,
                                                                  "n": [200]}},
                                        "federated": {"heldout": {"acc_mean": (k - 1) / 200, "acc_sd": 0,
                                                                  "r5_mean": 0, "n": [200]}}})
        (row,) = [t for t in targets(results) if t["target"].startswith("no harm: federated")]
        assert row["met"], k
        llm = {"arms": {"federated": {"heldout": {"acc": (k - 1) / 200, "retrieval_acc": 0.0, "n": 200,
                                                  "fallbacks": 0}},
                        "docs_only": {"heldout": {"acc": k / 200, "retrieval_acc": 0.0, "n": 200, "fallbacks": 0}}}}
        (row,) = [t for t in llm_targets(llm) if "no harm" in t["target"]]
        assert row["met"], k
    results = _folder_results(arms={"docs_only": _seen(0.5), "federated": _seen(0.66247)})
    (row,) = [t for t in targets(results) if t["target"] == "federated - docs_only (seen)"]
    assert f"{row['value']:+.3f}" == "+0.162"


def test_the_order_check_share_counts_each_order_over_its_own_queries_and_splits_come_from_every_seed():
    """Regressions: 3 changes over 20 reversed and 10 shuffled queries read 0.15 (twice the smaller count); a
    held-out split the first seed's draw lacked was dropped from every table, or failed when a later seed lacked
    it."""
    from synapse_flwr.simulations.experiment import _split_summary
    from synapse_flwr.simulations.experiment_report import llm_targets

    check = {"heldout": {"n": 20, "checked": 10, "checked_reversed": 20, "checked_shuffled": 10, "reversed": 2,
                         "shuffled": 1}}
    (row,) = [t for t in llm_targets({"order_check": check}) if "reversing" in t["target"]]
    assert row["value"] == pytest.approx(0.1)
    m = {"acc": 0.5, "r5": 0.5, "n": 10}
    for per_seed in ({1: {"seen": m}, 2: {"seen": m, "heldout": m}}, {1: {"seen": m, "heldout": m}, 2: {"seen": m}}):
        out = _split_summary(per_seed, lambda r: r)
        assert list(out) == ["seen", "heldout"] and out["heldout"]["n"] == [10]


def test_the_llm_sample_table_marks_an_arm_whose_experience_the_query_shift_test_turned_off():
    """Regression (last session's closing note): the LLM sample's rows and its order check named the federated arm
    where the query-shift test had routed it as docs_only."""
    from synapse_flwr.simulations.experiment_report import _llm_lines

    row = {"acc": 0.5, "retrieval_acc": 0.5, "r5": 0.9, "n": 4, "fallbacks": 0}
    check = {"seen": {"n": 4, "checked": 4, "reversed": 0, "shuffled": 0}}
    for off in (True, False):
        llm = {"arms": {"docs_only": {"seen": row}, "federated": {"seen": {**row, "experience_off": off}}},
               "order_check": check, "order_arm": "federated"}
        text = "\n".join(_llm_lines(llm, 7, ["seen"]))
        assert ("| federated (experience off) | seen |" in text) == off
        assert ("| docs_only (experience off)" in text) is False
        assert ("federated arm, its experience off" in text) == off
