"""The ``synapse`` command line: build, validate, merge, schema, inspect, and its error handling."""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from synapse_flwr import cli
from synapse_flwr.core.errors import InputError, SynapseError
from synapse_flwr.core.prototypes import decode_prototype
from synapse_flwr.core.schema import Compendium, FlatCompendium
from synapse_flwr.core.wire import content_hash, load_artifact, save_artifact
from synapse_flwr.data.federation import demo_dir

SYNAPSE = Path(sys.executable).with_name("synapse")
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
runner = CliRunner()

CATALOG = [
    {"name": "get_weather", "description": "Current weather for a city."},
    {
        "type": "function",
        "function": {
            "name": "convert_currency",
            "description": "Convert an amount between currencies.",
            "parameters": {"type": "object", "properties": {"amount": {"type": "number"}}},
        },
    },
    {"name": "book_flight", "description": "Book a flight.", "inputSchema": {"type": "object"}},
]
CITIES = ["paris", "london", "tokyo", "berlin", "rome"]


def org_events(org: str, hotel_success: bool) -> list[dict]:
    """~30 events: repeated phrasings, tool-name aliases, and the contested hotel phrase."""
    ev: list[dict] = []
    for c in CITIES:
        ev.append({"query": f"what is the weather in {c} today", "tool": "GetWeather", "success": True, "org": org})
        ev.append({"query": f"weather forecast for {c}", "tool": "get-weather", "success": True, "org": org})
        ev.append(
            {"query": f"book a flight to {c}", "tool": "Book Flight", "success": True, "org": org, "prev_tool": "get_weather"}
        )
        # the contradiction: acme's successes are globex's failures (both orgs non-private)
        ev.append({"query": f"cheap hotel booking in {c}", "tool": "book_flight", "success": hotel_success, "org": org})
    for amount in (10, 20, 50, 100, 200):
        ev.append({"query": f"convert {amount} euros to dollars", "tool": "ConvertCurrency", "success": True, "org": org})
    ev += [{"query": "weather forecast for paris", "tool": "get_weather", "success": True, "org": org}] * 5
    return ev


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli")
    paths = {
        "catalog": d / "catalog.json",
        "acme": write_jsonl(d / "acme.jsonl", org_events("acme", hotel_success=True)),
        "globex": write_jsonl(d / "globex.jsonl", org_events("globex", hotel_success=False)),
        "bad_catalog": d / "bad_catalog.jsonl",
        "invalid": d / "invalid.json",
        "dir": d,
    }
    paths["catalog"].write_text(json.dumps(CATALOG, indent=2))
    paths["bad_catalog"].write_text(json.dumps(CATALOG[0]) + "\n" + '{"name": "x", "description": \n')
    doc = {"issuer": {"org": "acme"}, "tools": [{"tool_id": "t", "when": [{"text": "x", "support": -1}]}]}
    paths["invalid"].write_text(json.dumps(doc))
    assert len(org_events("acme", True)) + len(org_events("globex", False)) == 60
    return paths


@pytest.fixture(scope="module", autouse=True)
def procs(data) -> dict[str, subprocess.Popen]:
    """Real ``synapse`` processes, started first so that they run alongside the in-process tests."""
    assert SYNAPSE.exists(), SYNAPSE
    env = {**os.environ, **ENV}
    d = data["dir"]
    commands = {
        "bad_catalog": ["build", "--experience", str(data["acme"]), "--catalog", str(data["bad_catalog"]),
                        "--org", "acme", "-o", str(d / "never.json")],
        "bad_policy": ["merge", str(data["invalid"]), "--policy", "majority-vote", "-o", str(d / "never.json")],
        "invalid_artifact": ["merge", str(data["invalid"]), "-o", str(d / "never.json")],
        "missing_artifact": ["merge", str(d / "nope.json"), "-o", str(d / "never.json")],
    }
    started = {
        name: subprocess.Popen([str(SYNAPSE), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for name, args in commands.items()
    }
    yield started
    for p in started.values():
        if p.poll() is None:
            p.kill()
            p.wait()


def finished(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def invoke(*args: str):
    return runner.invoke(cli.app, [str(a) for a in args], env=ENV)


def ok(result) -> None:
    assert result.exit_code == 0, (result.output, result.exception)


@pytest.fixture(scope="module")
def built(data) -> dict[str, Path]:
    d = data["dir"]
    out = {"acme": d / "acme.art.json", "globex": d / "globex.art.json.gz", "global": d / "global.json"}
    for org in ("acme", "globex"):
        ok(invoke("build", "--experience", data[org], "--catalog", data["catalog"], "--org", org,
                  "--epsilon", "inf", "-o", out[org]))
    ok(invoke("merge", out["acme"], out["globex"], "-o", out["global"]))
    return out


# --------------------------------------------------------------------------- build / merge / inspect


def test_build_writes_valid_org_artifacts(built):
    acme, globex = load_artifact(built["acme"]), load_artifact(built["globex"])
    assert built["globex"].read_bytes()[:2] == b"\x1f\x8b"  # '.gz' compresses
    for art, org in ((acme, "acme"), (globex, "globex")):
        assert isinstance(art, Compendium) and art.kind == "org" and art.issuer.org == org
        assert [t.tool_id for t in art.tools] == ["book_flight", "convert_currency", "get_weather"]
        assert art.privacy.mechanism == "none" and art.privacy.epsilon is None
        assert art.conflicts == []
        weather = art.tool("get_weather")
        assert weather.description == "Current weather for a city."
        assert weather.when and weather.stats.calls == 15 and weather.stats.successes == 15
        assert weather.provenance.orgs == [org]
        assert art.tool("book_flight").stats.calls == 10
        assert {n.tool for n in art.tool("get_weather").next_tools} == {"book_flight"}
    assert any("hotel" in s.text for s in acme.tool("book_flight").when)
    assert any("hotel" in s.text for s in globex.tool("book_flight").when_not)
    assert not any("hotel" in s.text for s in globex.tool("book_flight").when)


def test_merge_keeps_the_contradiction_as_conflict_and_dissent(built):
    merged = load_artifact(built["global"])
    acme, globex = load_artifact(built["acme"]), load_artifact(built["globex"])
    assert isinstance(merged, Compendium) and merged.kind == "global" and merged.policy == "typed"
    assert merged.inputs == sorted([content_hash(acme), content_hash(globex)])
    assert [t.tool_id for t in merged.tools] == ["book_flight", "convert_currency", "get_weather"]
    assert merged.tool("get_weather").provenance.orgs == ["acme", "globex"]
    assert merged.tool("get_weather").stats.calls == 30
    assert merged.conflicts, "the cross-org contradiction must be logged"
    hotel = [c for c in merged.conflicts if c.tool_id == "book_flight" and c.field == "when"
             and any(w in c.subject for w in ("hotel", "cheap", "booking"))]
    assert hotel, merged.conflicts
    book = merged.tool("book_flight")
    dissent = [p for p in book.precautions if p.kind == "dissent"]
    assert dissent
    for c in hotel:
        when_claim = next(cl for cl in c.claims if cl.view == "when")
        not_claim = next(cl for cl in c.claims if cl.view.startswith("when_not"))
        assert when_claim.orgs == ["acme"] and not_claim.orgs == ["globex"]
        minority = when_claim if when_claim.support <= not_claim.support else not_claim
        assert any(
            c.subject in p.text and set(minority.orgs) <= set(p.orgs) for p in dissent
        ), (c, dissent)


def test_merge_is_order_independent_and_idempotent(built, data):
    d = data["dir"]
    ok(invoke("merge", built["globex"], built["acme"], "-o", d / "g2.json"))
    assert (d / "g2.json").read_bytes() == built["global"].read_bytes()
    ok(invoke("merge", built["global"], built["acme"], "-o", d / "g3.json"))
    assert load_artifact(d / "g3.json").inputs == load_artifact(built["global"]).inputs


@pytest.mark.parametrize("policy", ["support-weighted", "robust", "flat-majority"])
def test_other_merge_policies(built, data, policy):
    out = data["dir"] / f"{policy}.json.gz"
    ok(invoke("merge", built["acme"], built["globex"], "--policy", policy, "-o", out))
    art = load_artifact(out)
    assert art.kind == "global" and art.policy == policy
    if policy == "flat-majority":
        assert isinstance(art, FlatCompendium) and set(art.texts) <= {"book_flight", "convert_currency", "get_weather"}
        res = invoke("merge", out, built["acme"], "-o", data["dir"] / "never.json")
        assert res.exit_code != 0 and isinstance(res.exception, SynapseError)
        assert "flat-majority" in str(res.exception)
        res = invoke("inspect", out)
        ok(res)
        assert "flat text" in res.stdout


def test_inspect_prints_the_tool_table(built):
    res = invoke("inspect", built["global"])
    ok(res)
    out = res.stdout
    assert "global artifact from global" in out and "policy typed" in out
    assert "tools: 3" in out and "conflicts:" in out and "sha256" in out
    for header in ("tool", "when/not/prec", "calls", "success", "prototype", "orgs"):
        assert header in out
    for tool in ("book_flight", "convert_currency", "get_weather"):
        assert tool in out
    assert "acme,globex" in out
    # the prototypes are what a private artifact carries: their released counts, marked when above the noise
    assert "prototype" in out and "30 *" in out and "above the noise (length and count tests): 3 of 3 tools" in out
    res = invoke("inspect", built["acme"], "--limit", "1")
    ok(res)
    assert "org artifact from acme" in res.stdout
    assert sum(t in res.stdout for t in ("book_flight", "convert_currency", "get_weather")) == 1


def test_inspect_lists_tools_with_evidence_above_the_noise_first(tmp_path):
    """Regression (rehearsal): a private global's unused tools read 40-70 noised calls and were listed among the
    most used; counts within the noise of a never-called tool are marked and listed after those with evidence."""
    demo = demo_dir()
    out = tmp_path / "a.json"
    ok(invoke("build", "--experience", demo / "org_a.jsonl", "--catalog", demo / "catalog.json", "--org", "acme",
              "--embedder", "static", "--epsilon", "1", "--seed", "3", "-o", out))
    res = invoke("inspect", out, "--limit", "50")
    ok(res)
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in res.stdout.splitlines() if line.startswith("│")]
    calls, proto = (next(i for i, h in enumerate(("tool", "when/not/prec", "calls", "success", "prototype")) if h == x)
                    for x in ("calls", "prototype"))
    evidence = [not r[calls].endswith("~") or r[proto].endswith("*") for r in rows]
    assert len(rows) == 24 and 0 < sum(evidence) < 24 and evidence == sorted(evidence, reverse=True), rows
    assert "~ at or below" in res.stdout


def test_inspect_leaves_the_scenario_out_of_a_narrow_terminal_and_says_so(built, tmp_path):
    """Regression: in 80 columns the scenario wrapped into the last columns, one word per line."""
    wide, narrow = (runner.invoke(cli.app, ["inspect", str(built["global"])], env={**ENV, "COLUMNS": str(n)})
                    for n in (160, 80))
    ok(wide)
    ok(narrow)
    assert "top scenario" in wide.stdout and "column left out" not in wide.stdout
    assert "top scenario column left out: the terminal is 80 columns wide" in narrow.stdout
    assert max(map(len, narrow.stdout.splitlines())) <= 80 and "acme,globex" in narrow.stdout
    # regression: from 100 to 140 columns a long scenario squeezed calls, success and orgs to nothing
    art = load_artifact(built["global"])
    tool = next(t for t in art.tools if t.when)
    top = max(tool.when, key=lambda w: w.support)
    longer = tool.model_copy(update={"when": [w.model_copy(update={"text": w.text + " and then" * 20}) if w is top
                                              else w for w in tool.when]})
    save_artifact(tmp_path / "long.json", art.model_copy(update={"tools": [
        longer if t is tool else t for t in art.tools]}))
    for n in range(90, 150, 10):
        out = runner.invoke(cli.app, ["inspect", str(tmp_path / "long.json")], env={**ENV, "COLUMNS": str(n)}).stdout
        assert max(map(len, out.splitlines())) <= n
        header = next(line for line in out.splitlines() if "when/not/prec" in line)
        assert all(h in header for h in ("calls", "success", "orgs")), (n, header)


def test_inspect_leaves_out_the_columns_no_tool_fills(data, tmp_path):
    """A private artifact names no orgs and releases no scenarios here: no empty columns squeeze the table."""
    private = tmp_path / "private.json"
    ok(invoke("build", "--experience", data["acme"], "--catalog", data["catalog"], "--org", "acme", "-o", private))
    res = invoke("inspect", private)
    ok(res)
    assert "calls" in res.stdout and "prototype" in res.stdout
    assert "orgs" not in res.stdout and "top scenario" not in res.stdout


def test_build_with_privacy(data):
    out = data["dir"] / "private.json"
    ok(invoke("build", "--experience", data["acme"], "--catalog", data["catalog"], "--org", "acme",
              "--epsilon", "8", "--rounds", "2", "--round", "1", "-o", out))
    art = load_artifact(out)
    assert art.privacy.mechanism == "gaussian" and art.privacy.epsilon_target == 8
    assert 0 < art.privacy.epsilon <= 8 and art.issuer.round == 1


def test_private_noise_comes_from_a_secret_seed_unless_one_is_given(data, tmp_path, caplog):
    def build(name: str, *extra: str):
        ok(invoke("build", "--experience", data["acme"], "--catalog", data["catalog"], "--org", "acme",
                  "--embedder", "static", *extra, "-o", tmp_path / name))
        return load_artifact(tmp_path / name)

    # the server knows the org, the round and any seed in a shared config: a default seed would let it
    # regenerate the noise, so two builds of one log draw different noise
    assert build("a.json").tools != build("b.json").tools
    with caplog.at_level(logging.WARNING, logger="synapse_flwr"):
        assert build("c.json", "--seed", "5").tools == build("d.json", "--seed", "5").tools
    assert "--seed 5 seeds the noise: whoever knows it can remove the noise" in caplog.text


def test_build_says_how_many_prototypes_clear_the_noise(data, caplog):
    out = data["dir"] / "hopeless.json"
    with caplog.at_level(logging.INFO, logger="synapse_flwr"):
        ok(invoke("build", "--experience", data["acme"], "--catalog", data["catalog"], "--org", "acme",
                  "--epsilon", "1e-6", "--embedder", "static", "-o", out))
    assert "prototypes above the noise (length and count tests): 0 of 3 tools" in caplog.text
    assert any(r.levelno == logging.WARNING and "no prototype clears the noise" in r.getMessage()
               for r in caplog.records)


def test_build_on_empty_experience_warns_that_it_carries_the_documentation_only(data, caplog):
    empty = data["dir"] / "empty.jsonl"
    empty.write_text("")
    with caplog.at_level(logging.INFO, logger="synapse_flwr"):
        ok(invoke("build", "--experience", empty, "--catalog", data["catalog"], "--org", "acme",
                  "--embedder", "static", "-o", data["dir"] / "docs_only.json"))
    assert any(r.levelno == logging.WARNING and "holds no events" in r.getMessage() for r in caplog.records)


def test_a_catalog_without_descriptions_is_named_once(tmp_path, caplog):
    from synapse_flwr.core.catalog import load_catalog

    cat = tmp_path / "catalog.json"
    cat.write_text(json.dumps([{"name": "get_weather", "description": "Weather forecast."},
                               {"name": "send_email"}, {"name": "book_hotel", "description": " "}]))
    with caplog.at_level(logging.WARNING, logger="synapse_flwr"):
        load_catalog(cat)
        load_catalog(cat)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "2 of 3 tools have neither a description nor example requests ('book_hotel', 'send_email')" in warned[0]


def test_build_release_beyond_budget_is_a_user_error(data):
    res = invoke("build", "--experience", data["acme"], "--catalog", data["catalog"], "--org", "acme",
                 "--epsilon", "8", "--rounds", "1", "--releases", "2", "-o", data["dir"] / "never.json")
    assert res.exit_code != 0 and isinstance(res.exception, SynapseError)


# --------------------------------------------------------------------------- validate / schema


def test_validate_valid_files(built):
    res = invoke("validate", built["acme"], built["globex"], built["global"])
    ok(res)
    assert res.stdout.splitlines() == [f"{built[k]}: valid" for k in ("acme", "globex", "global")]


def test_validate_invalid_file_prints_one_line_per_error(built, data, tmp_path):
    bad = tmp_path / "bad.json"
    doc = json.loads(built["acme"].read_text())
    doc["tools"][0]["when"][0]["support"] = -3
    doc["tools"][1]["tool_id"] = "Not Valid"
    doc["issuer"]["extra"] = 1
    bad.write_text(json.dumps(doc))
    res = invoke("validate", built["acme"], bad)
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert lines[0] == f"{built['acme']}: valid"
    errors = lines[1:]
    assert len(errors) == 3 and all(line.startswith(f"{bad}: ") for line in errors)
    paths = {line[len(f"{bad}: "):].split(":")[0] for line in errors}
    assert paths == {"tools.0.when.0.support", "tools.1.tool_id", "issuer.extra"}
    res = invoke("validate", data["invalid"], tmp_path / "missing.json")
    assert res.exit_code == 1
    assert f"{data['invalid']}: tools.0.when.0.support:" in res.stdout
    assert f"{tmp_path / 'missing.json'}: (file): cannot read" in res.stdout


def test_schema_command(tmp_path):
    res = invoke("schema")
    ok(res)
    schema = json.loads(res.stdout)
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["required"] == ["issuer"] and "Conflict" in schema["$defs"]
    ok(invoke("schema", "-o", tmp_path / "s.json"))
    assert json.loads((tmp_path / "s.json").read_text()) == schema
    ok(invoke("schema", "-o", tmp_path / "s.json.gz"))  # compressed, as every -o's '.gz' (it wrote plain JSON)
    assert json.loads(gzip.decompress((tmp_path / "s.json.gz").read_bytes())) == schema


# --------------------------------------------------------------------------- help

HELP = {
    "build": ["--experience", "--catalog", "--org", "--output", "--epsilon", "--delta", "--rounds", "--releases", "--round", "--seed", "--embedder", "--no-votes"],
    "validate": ["FILES"],
    "merge": ["FILES", "--output", "--policy"],
    "vote": ["--experience", "--catalog", "--artifact", "--global", "--output", "--embedder", "--seed"],
    "schema": ["--output"],
    "inspect": ["FILE", "--limit"],
    "route": ["QUERY", "--catalog", "--compendium", "--reranker", "--model", "--embedder", "--render",
              "--llm-weight", "--count-prior"],
    "serve": ["--catalog", "--compendium", "--transport", "--host", "--port", "--llm-weight", "--count-prior"],
    "simulate": ["--nodes", "--set", "--flwr-home"],
    "deploy-local": ["--nodes", "--node", "--catalog", "--set"],
}


@pytest.mark.parametrize("command", sorted(HELP))
def test_help(command):
    res = invoke(command, "--help")
    ok(res)
    for option in HELP[command]:
        assert option in res.stdout, (command, option)


def test_every_argument_is_explained_in_help():
    """Each positional argument's own help text shows (click 8.5 dropped it under flwr's typer)."""
    from typer.main import get_command

    root = get_command(cli.app)
    for name, command in root.commands.items():
        shown = " ".join(invoke(name, "--help").stdout.replace("│", " ").split())
        for param in command.params:
            if param.param_type_name == "argument":
                assert param.help, (name, param.name)
                assert " ".join(param.help.split()) in shown, (name, param.name, shown)


def test_root_help_lists_commands():
    res = invoke("--help")
    ok(res)
    for command in HELP:
        assert command in res.stdout


def test_python_dash_m_is_the_synapse_command():
    res = subprocess.run([sys.executable, "-m", "synapse_flwr", "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and all(command in res.stdout for command in HELP)


# --------------------------------------------------------------------------- user mistakes, in process


def test_missing_experience_file(data):
    res = invoke("build", "--experience", data["dir"] / "nope.jsonl", "--catalog", data["catalog"],
                 "--org", "acme", "-o", data["dir"] / "never.json")
    assert res.exit_code != 0 and isinstance(res.exception, InputError)
    assert str(res.exception) == f"{data['dir'] / 'nope.jsonl'}: file not found"
    assert not (data["dir"] / "never.json").exists()


def test_negative_llm_weight_is_a_clear_error(data):
    res = invoke("route", "a forecast", "--catalog", data["catalog"], "--embedder", "tfidf", "--reranker", "llm",
                 "--llm-weight", "-1")
    assert res.exit_code != 0 and isinstance(res.exception, SynapseError)
    assert "--llm-weight must be a finite number >= 0, got -1.0" in str(res.exception)


def test_a_misspelt_local_model_is_named_before_anything_loads(tmp_path):
    # the catalog is missing: loading it first would have named that instead
    refused(invoke("route", "a forecast", "--catalog", tmp_path / "absent.json", "--reranker", "llm",
                   "--model", "local/smollm3"), "--model 'local/smollm3': unknown local model")


def test_negative_count_prior_is_a_clear_error(data):
    res = invoke("route", "a forecast", "--catalog", data["catalog"], "--embedder", "tfidf", "--count-prior", "-1")
    assert res.exit_code != 0 and isinstance(res.exception, SynapseError)
    assert "--count-prior must be a finite number >= 0, got -1.0" in str(res.exception)


def test_count_prior_weighs_the_released_calls(data, built):
    """--count-prior sets the weight of log(1 + calls), reported as ``prior`` beside the query's ``prototype`` match."""
    def evidence(*extra: str) -> tuple[float, float]:
        res = invoke("route", "weather forecast for paris", "--catalog", data["catalog"], "--compendium",
                     built["global"], *extra)
        ok(res)
        (weather,) = [c for c in json.loads(res.stdout)["candidates"] if c["tool"] == "get_weather"]
        return weather["signals"]["prototype"], weather["signals"].get("prior", 0.0)

    calls = load_artifact(built["global"]).tool("get_weather").prototype.count
    assert calls == 30
    default, none, double = evidence(), evidence("--count-prior", "0"), evidence("--count-prior", "1")
    assert none[0] > 0, "the query's own evidence stays"
    assert default[0] == none[0] == double[0], "the query's match does not depend on the prior"
    assert none[1] == 0
    assert default[1] == pytest.approx(0.5 * math.log1p(calls), abs=2e-4)
    assert double[1] == pytest.approx(math.log1p(calls), abs=2e-4)


def test_bad_experience_line_names_line_and_field(data, tmp_path):
    exp = write_jsonl(tmp_path / "e.jsonl", [{"query": "q", "tool": "get_weather", "success": True},
                                              {"query": "q", "tool": "teleport", "success": True}])
    res = invoke("build", "--experience", exp, "--catalog", data["catalog"], "--org", "acme", "-o", tmp_path / "o.json")
    assert isinstance(res.exception, InputError)
    assert str(res.exception).startswith(f"{exp}:2: field 'tool':")
    exp = write_jsonl(tmp_path / "e2.jsonl", [{"query": "q", "tool": "get_weather", "success": "yes"}])
    res = invoke("build", "--experience", exp, "--catalog", data["catalog"], "--org", "acme", "-o", tmp_path / "o.json")
    assert isinstance(res.exception, InputError)
    assert str(res.exception).startswith(f"{exp}:1: field 'success':")


def test_unknown_policy_and_invalid_artifact_in_process(data, built):
    res = invoke("merge", built["acme"], "--policy", "nope", "-o", data["dir"] / "never.json")
    assert isinstance(res.exception, SynapseError) and "unknown merge policy 'nope'" in str(res.exception)
    res = invoke("merge", built["acme"], data["invalid"], "-o", data["dir"] / "never.json")
    assert isinstance(res.exception, SynapseError)
    assert str(data["invalid"]) in str(res.exception) and "tools.0.when.0.support" in str(res.exception)
    res = invoke("inspect", data["invalid"])
    assert isinstance(res.exception, SynapseError) and "tools.0.when.0.support" in str(res.exception)
    assert not (data["dir"] / "never.json").exists()


def test_main_turns_user_errors_into_exit_2(data, monkeypatch, caplog):
    monkeypatch.setattr(
        sys, "argv",
        ["synapse", "build", "--experience", str(data["dir"] / "nope.jsonl"), "--catalog", str(data["catalog"]),
         "--org", "acme", "-o", str(data["dir"] / "never.json")],
    )
    with caplog.at_level(logging.ERROR, logger="synapse_flwr"), pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 2
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None
    assert errors[0].getMessage() == f"{data['dir'] / 'nope.jsonl'}: file not found"


def test_federation_commands_reject_bad_arguments_before_starting_anything(tmp_path):
    res = invoke("simulate", "--set", "epsilon")
    assert isinstance(res.exception, SynapseError) and "KEY=VALUE" in str(res.exception)
    res = invoke("deploy-local", "--node", "just-a-name")
    assert isinstance(res.exception, SynapseError) and "ORG=DATA_PATH" in str(res.exception)
    res = invoke("simulate", "--app-dir", str(tmp_path))
    assert isinstance(res.exception, SynapseError) and "pass --app-dir" in str(res.exception)


@pytest.mark.parametrize("command", ["simulate", "deploy-local"])
def test_federation_commands_find_the_app_from_any_working_folder(tmp_path, monkeypatch, command):
    """Without --app-dir the app is the checkout the package runs from, not the working folder."""
    from synapse_flwr.flower import launch

    seen = []

    def record(app_dir):  # the app's first check: stop before anything starts
        seen.append(app_dir)
        raise SynapseError("stop here")

    monkeypatch.setattr(launch, "_app_dir", record)
    monkeypatch.chdir(tmp_path)
    res = invoke(command, "--flwr-home", str(tmp_path / "home"))
    assert str(res.exception) == "stop here" and seen == [launch.default_app_dir()]
    assert (seen[0] / "pyproject.toml").is_file() and seen[0] != tmp_path


def test_a_federation_refuses_an_output_dir_holding_another_runs_rounds(tmp_path):
    from synapse_flwr.flower.config import RunConfig

    out = tmp_path / "out"
    out.mkdir()
    recorded = RunConfig.from_mapping({"output-dir": str(out)}).to_mapping()
    (out / "metrics.json").write_text(json.dumps({"run_config": recorded, "rounds": [{"round": 1}]}))
    # before anything starts: no FLWR_HOME is created, the rounds on disk stay as they were
    res = invoke("simulate", "--set", f"output-dir={json.dumps(str(out))}", "--set", "epsilon=8",
                 "--flwr-home", str(tmp_path / "home"))
    assert isinstance(res.exception, SynapseError) and "epsilon 4.0 -> 8.0" in str(res.exception)
    assert not (tmp_path / "home").exists()
    assert json.loads((out / "metrics.json").read_text())["rounds"] == [{"round": 1}]


def test_a_finished_run_logs_its_per_round_table(tmp_path, caplog):
    rounds = [{"round": r, "accepted": [1, 2, 3], "rejected": [], "epsilon": 3.96, "bytes_per_client": b,
               "prototype_share": 1.0, "seen_acc": 0.7, "heldout_acc": 1.0, "docs_seen_acc": 0.76,
               "docs_heldout_acc": 1.0} for r, b in ((1, 12755), (2, 202))]
    (tmp_path / "metrics.json").write_text(json.dumps({"rounds": rounds}))
    with caplog.at_level(logging.INFO, logger="synapse_flwr"):
        cli._log_run_table(tmp_path)
        cli._log_run_table(tmp_path / "absent")  # nothing recorded: nothing logged, no error
    table = [r.getMessage() for r in caplog.records if "per round" in r.getMessage()]
    assert len(table) == 1 and "12,755" in table[0] and "docs seen" in table[0]


# --------------------------------------------------------------------------- user mistakes, real processes


def assert_one_line_error(proc: subprocess.Popen, *needles: str) -> str:
    code, out, err = finished(proc)
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("ERROR ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_subprocess_bad_json_line_in_catalog(procs, data):
    line = assert_one_line_error(procs["bad_catalog"], f"{data['bad_catalog']}:2:", "invalid JSON")
    assert not (data["dir"] / "never.json").exists(), line


def test_subprocess_unknown_merge_policy(procs):
    assert_one_line_error(procs["bad_policy"], "unknown merge policy 'majority-vote'", "typed")


def test_subprocess_invalid_artifact_to_merge(procs, data):
    assert_one_line_error(procs["invalid_artifact"], str(data["invalid"]), "tools.0.when.0.support")


def test_subprocess_missing_artifact_to_merge(procs, data):
    assert_one_line_error(procs["missing_artifact"], str(data["dir"] / "nope.json"), "cannot read")


# --------------------------------------------------------------------------- user mistakes, refused before any work


def refused(result, words: str):
    """A user mistake: a SynapseError naming it (or typer's usage error), never a traceback or a file."""
    assert result.exit_code != 0
    if isinstance(result.exception, SynapseError):
        assert words in str(result.exception), str(result.exception)
    else:
        assert result.exit_code == 2 and words in result.output, (result.output, result.exception)
    return result


def test_a_build_that_would_claim_zero_releases_or_rounds_is_refused(data):
    for flag in ("--releases", "--rounds"):
        res = invoke("build", "--experience", data["acme"], "--catalog", data["catalog"], "--org", "acme",
                     flag, "0", "-o", data["dir"] / "zero.json")
        refused(res, flag)
    assert not (data["dir"] / "zero.json").exists()


def test_an_output_that_is_an_input_or_a_folder_is_refused_and_the_input_kept(data, built, tmp_path):
    log = tmp_path / "org.jsonl"
    log.write_bytes(data["acme"].read_bytes())
    refused(invoke("build", "--experience", log, "--catalog", data["catalog"], "--org", "acme", "-o", log),
            "is one of the inputs")
    assert log.read_bytes() == data["acme"].read_bytes()
    before = built["acme"].read_bytes()
    refused(invoke("merge", built["acme"], built["globex"], "-o", built["acme"]), "is one of the inputs")
    assert built["acme"].read_bytes() == before
    refused(invoke("merge", built["acme"], built["globex"], "-o", tmp_path), "is a folder")
    refused(invoke("schema", "-o", tmp_path), "is a folder")


def test_an_org_id_or_key_owner_the_schema_would_refuse_is_refused_first(data, tmp_path):
    from synapse_flwr.core.schema import ORG_ID_RULE

    for org in ("", "Acme Corp", "../evil", "a" * 65):
        # the experience log is missing: loading it first would have named that instead
        refused(invoke("build", "--experience", tmp_path / "absent.jsonl", "--catalog", data["catalog"],
                       "--org", org, "-o", tmp_path / "x.json"), f"--org {org!r}: use {ORG_ID_RULE}")
        refused(invoke("keygen", org, "--dir", tmp_path / "keys"), "owner")
    assert not (tmp_path / "evil.key").exists() and not (tmp_path / "x.json").exists()
    refused(invoke("keygen", "bob", "--dir", data["catalog"]), "is a file")
    # the global's and the server's issuer ids: validate would refuse the artifact, so build refuses the id
    for org in ("server", "global"):
        refused(invoke("build", "--experience", data["acme"], "--catalog", data["catalog"], "--org", org,
                       "-o", tmp_path / "x.json"), f"--org {org!r}: {org!r} is reserved")
    ok(invoke("keygen", "server", "--dir", tmp_path / "keys"))  # the server's own key is issued as "server"
    assert not (tmp_path / "x.json").exists()


def test_build_refuses_an_unshared_space_first_and_an_out_of_range_epsilon_in_one_line(data, tmp_path):
    for name in ("tfidf", "bogus"):
        # the experience log is missing: loading it first would have named that instead
        res = refused(invoke("build", "--experience", tmp_path / "absent.jsonl", "--catalog", data["catalog"],
                             "--org", "acme", "--embedder", name, "-o", tmp_path / "x.json"), "--embedder")
        assert "minilm | mpnet | static | none" in str(res.exception)
    for epsilon, delta, hint in (("1e9", "1e-5", "inf to turn privacy off"), ("1e-9", "1e-13", "a larger epsilon")):
        res = refused(invoke("build", "--experience", data["acme"], "--catalog", data["catalog"], "--org", "acme",
                             "--embedder", "static", "--epsilon", epsilon, "--delta", delta,
                             "-o", tmp_path / "x.json"), hint)
        assert "PrivacyParams(" not in str(res.exception)
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("epsilon, delta, named", [
    ("0", "1e-5", "epsilon must be > 0"), ("nan", "1e-5", "epsilon must be > 0"),
    ("1e9", "1e-5", "inf to turn privacy off"), ("4", "0.5", "--delta must be in (0, 0.1]"),
    ("4", "nan", "--delta must be in (0, 0.1]"),
])
def test_build_refuses_a_budget_before_reading_the_log(data, tmp_path, epsilon, delta, named):
    # the log is missing: a check after loading it would name that instead (every one of these came after it,
    # and a delta of 0.5, which every federation refuses, was built)
    refused(invoke("build", "--experience", tmp_path / "absent.jsonl", "--catalog", data["catalog"], "--org", "acme",
                   "--epsilon", epsilon, "--delta", delta, "-o", tmp_path / "x.json"), named)


@pytest.mark.parametrize("name, content, kind", [
    ("acme.cache.json", '{"fingerprint":"x","settings":{}}', "a release cache"),  # the org's ledger
    ("keys.json", '{"format": "synapse-keys/1", "keys": []}', "a key registry"),
    ("org_a.jsonl", '{"query": "q", "tool": "t"}\n', "a JSONL file"),
])
def test_an_output_never_replaces_a_ledger_a_key_registry_or_a_log(data, built, tmp_path, name, content, kind):
    kept = tmp_path / name
    kept.write_text(content)
    refused(invoke("merge", built["acme"], built["globex"], "-o", kept), f"is {kind}")
    refused(invoke("schema", "-o", kept), f"is {kind}")
    assert kept.read_text() == content


def test_vote_refuses_no_embedding_space_in_one_line(data, tmp_path):
    # a vote routes its records: 'none' passed the space check and ended in get_embedder's traceback
    refused(invoke("vote", "--experience", data["acme"], "--catalog", data["catalog"], "--artifact",
                   tmp_path / "a.json", "--global", tmp_path / "g.json", "--embedder", "none", "-o", tmp_path / "v.json"),
            "use one of minilm | mpnet | static")


def test_merging_spaces_apart_is_a_user_error_and_repeats_are_named(data, built, tmp_path, caplog):
    static = tmp_path / "static.json"
    ok(invoke("build", "--experience", data["acme"], "--catalog", data["catalog"], "--org", "acme",
              "--embedder", "static", "--epsilon", "inf", "-o", static))
    refused(invoke("merge", built["globex"], static, "-o", tmp_path / "m.json"), "embedding spaces")
    with caplog.at_level(logging.WARNING, logger="synapse_flwr"):
        ok(invoke("merge", built["acme"], built["acme"], "-o", tmp_path / "self.json"))
    assert "is the same artifact as" in caplog.text
    private = tmp_path / "private.json"
    ok(invoke("build", "--experience", data["globex"], "--catalog", data["catalog"], "--org", "globex",
              "--embedder", "static", "-o", private))
    with caplog.at_level(logging.WARNING, logger="synapse_flwr"):
        ok(invoke("merge", static, private, "-o", tmp_path / "mixed.json"))
    assert "private and non-private artifacts are mixed" in caplog.text


def test_split_orgs_refuses_a_concentration_or_count_it_cannot_use(tmp_path):
    log = write_jsonl(tmp_path / "train.jsonl", org_events("acme", True))
    for args, words in ((["--alpha", "inf"], "--alpha"), (["--alpha", "0"], "--alpha"), (["--orgs", "0"], "--orgs")):
        refused(invoke("split-orgs", log, *args), words)
    assert not list(tmp_path.glob("org_*.jsonl"))


def test_route_refuses_an_empty_query_and_warns_of_a_catalog_missing_compendium_tools(data, built, tmp_path,
                                                                                      caplog):
    refused(invoke("route", "--catalog", data["catalog"], "--embedder", "tfidf", "weather in Rome", "  "),
            "query 2 of 2 is empty")
    refused(invoke("route", "--catalog", data["catalog"], "--embedder", "tfidf", "?!?", "weather in Rome"),
            "query 1 of 2 has no letter or digit: nothing to route")
    short = tmp_path / "catalog.json"
    short.write_text(json.dumps(CATALOG[:1]))
    with caplog.at_level(logging.WARNING, logger="synapse_flwr"):
        ok(invoke("route", "--catalog", short, "--compendium", built["global"], "rain?"))
    assert "2 of the compendium's 3 tools are not in" in caplog.text


def test_route_scores_a_test_set_line_by_line_and_says_a_global_without_votes_uses_the_defaults(data, built,
                                                                                                tmp_path, caplog):
    test = write_jsonl(tmp_path / "test.jsonl", [{"query": "will it rain in Oslo", "gold": "get_weather"},
                                                 {"query": "100 USD in EUR", "gold": ["convert_currency"]},
                                                 {"query": "a seat to Rome on Friday", "gold": "Book-Flight"}])
    # the catalog spelling names otherwise than their ids ("Get Weather" is get_weather)
    spelt = tmp_path / "spelt.json"
    spelt.write_text(json.dumps([{"name": "Get Weather", "description": "Current weather for a city."},
                                 {"name": "Convert Currency", "description": "Convert an amount between currencies."},
                                 {"name": "Book Flight", "description": "Book a flight."}]))
    with caplog.at_level(logging.INFO, logger="synapse_flwr"):
        res = invoke("route", "--catalog", spelt, "--compendium", built["global"], "--test", test)
    ok(res)
    # stdout alone: the embedder's progress on stderr may share a line with the first row in the mixed output
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert [r["gold_ids"] for r in rows] == [["get_weather"], ["convert_currency"], ["book_flight"]]  # aliases resolved
    # regression (dress rehearsal): `gold` held the ids, so comparing it with `tool` (the catalog's spelling) matched
    # no query of a catalog that spells names otherwise
    assert [r["gold"] for r in rows] == [["Get Weather"], ["Convert Currency"], ["Book Flight"]]
    top1 = sum(r["tool_id"] in r["gold_ids"] for r in rows) / len(rows)
    assert top1 == sum(r["tool"] in r["gold"] for r in rows) / len(rows)
    assert f"top-1 {top1:.3f}, recall@5 1.000 over 3 queries" in caplog.text
    assert "carries no fusion votes" in caplog.text  # a CLI merge has none: the default weights route
    refused(invoke("route", "--catalog", data["catalog"], "--test", test, "rain?"), "not both")
    refused(invoke("route", "--catalog", data["catalog"]), "or a test set with --test")
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"query": "rain?", "gold": "teleport"}])
    refused(invoke("route", "--catalog", data["catalog"], "--model", "local/smollm2", "--test", bad),
            "bad.jsonl:1: field 'gold': tool 'teleport' is not in the catalog")


def test_hand_merged_artifacts_vote_and_the_second_merge_carries_the_votes(data, tmp_path, caplog):
    def build(org: str, *extra: str) -> Path:
        out = tmp_path / f"{org}{''.join(extra)}.json"
        # seeded noise: secret noise made the votes' sign (and so the route's log) vary between runs
        ok(invoke("build", "--experience", data[org], "--catalog", data["catalog"], "--org", org,
                  "--embedder", "static", "--epsilon", "4", "--seed", "7", *extra, "-o", out))
        return out

    def vote(org: str, artifact: Path, merged: Path, *extra: str, out: str = ""):
        return invoke("vote", "--experience", data[org], "--catalog", data["catalog"], "--artifact", artifact,
                      "--global", merged, "--embedder", "static", "--seed", "7", *extra,
                      "-o", tmp_path / (out or f"{org}.voted.json"))

    arts = {org: build(org) for org in ("acme", "globex")}
    first = tmp_path / "g1.json"
    with caplog.at_level(logging.INFO, logger="synapse_flwr"):
        ok(invoke("merge", *arts.values(), "-o", first))
    assert f"next: each organisation runs `synapse vote --artifact ITS_ARTIFACT --global {first}" in caplog.text
    with caplog.at_level(logging.INFO, logger="synapse_flwr"):
        for org, art in arts.items():
            ok(vote(org, art, first))
    acme, voted = load_artifact(arts["acme"]), load_artifact(tmp_path / "acme.voted.json")
    # regression (dress rehearsal): the summary gave the noised count as the records voted ("-2 records voted")
    assert f"30 records voted (released as {voted.votes.records:.0f}, noise SD {voted.votes.sd:.1f})" in caplog.text
    assert voted.votes is not None and voted.votes.sd > 0  # noised sums of the 30 records' right routes
    assert abs(voted.votes.records - 30) < 6 * voted.votes.sd
    # the vote is paid from the share build kept: the record's whole budget, not more
    assert acme.privacy.epsilon < voted.privacy.epsilon == pytest.approx(4.0, abs=1e-5)
    assert voted.tools == acme.tools  # the release itself is unchanged
    second = tmp_path / "g2.json"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="synapse_flwr"):
        ok(invoke("merge", tmp_path / "acme.voted.json", tmp_path / "globex.voted.json", "-o", second))
        ok(invoke("route", "--catalog", data["catalog"], "--compendium", second, "--embedder", "static", "rain?"))
    assert "from 2 of 2 artifacts: a router of" in caplog.text
    assert "carries no fusion votes" not in caplog.text
    assert load_artifact(second).votes.records == pytest.approx(
        voted.votes.records + load_artifact(tmp_path / "globex.voted.json").votes.records, abs=1e-3)
    # each record votes once, against the global its release went into, with a share kept for it
    refused(vote("acme", tmp_path / "acme.voted.json", first, out="x.json"), "already carries its records' votes")
    refused(vote("acme", build("acme", "--seed", "1"), first, out="x.json"), "the global was not merged from it")
    no_share = build("acme", "--no-votes")
    ok(invoke("merge", no_share, arts["globex"], "-o", tmp_path / "g3.json"))
    refused(vote("acme", no_share, tmp_path / "g3.json", out="x.json"), "without a share of its budget kept")
    refused(vote("acme", arts["acme"], first, "--embedder", "minilm", out="x.json"), "prototypes are in")
    assert not (tmp_path / "x.json").exists()  # a refusal writes nothing


def test_a_release_cache_releases_each_record_once_across_builds_and_counts_each_vote(data, tmp_path, caplog):
    from synapse_flwr.core.release import ReleaseState

    lines = data["acme"].read_text().splitlines(keepends=True)
    early = tmp_path / "early.jsonl"
    early.write_text("".join(lines[:20]))
    cache = tmp_path / "acme.cache.json"

    def build(log: Path, out: str, *extra: str):
        return invoke("build", "--experience", log, "--catalog", data["catalog"], "--org", "acme", "--embedder",
                      "static", "--epsilon", "4", "--release-cache", cache, *extra, "-o", tmp_path / out)

    def vote(artifact: str, merged: str, out: str, log: Path = data["acme"]):
        return invoke("vote", "--experience", log, "--catalog", data["catalog"], "--artifact",
                      tmp_path / artifact, "--global", tmp_path / merged, "--embedder", "static",
                      "--release-cache", cache, "-o", tmp_path / out)

    def merged(acme: str, out: str) -> None:
        ok(invoke("build", "--experience", data["globex"], "--catalog", data["catalog"], "--org", "globex",
                  "--embedder", "static", "--epsilon", "4", "-o", tmp_path / f"globex.{out}"))
        ok(invoke("merge", tmp_path / acme, tmp_path / f"globex.{out}", "-o", tmp_path / out))

    with caplog.at_level(logging.INFO, logger="synapse_flwr"):
        ok(build(early, "a1.json"))
        ok(build(early, "a2.json"))  # nothing new: a window of noise alone, no record released again
    assert "0 records released now; 20 released before" in caplog.text and "holds noise alone" in caplog.text
    a1, a2 = (load_artifact(tmp_path / f) for f in ("a1.json", "a2.json"))
    # the same per-record bound; one more window's noise, so that a build does not show whether records arrived
    assert a2.privacy == a1.privacy and a2.tools != a1.tools
    assert ReleaseState.model_validate_json(cache.read_bytes()).windows == 2
    ok(build(data["acme"], "a3.json"))  # the grown log: only its 10 new records are released
    a3 = load_artifact(tmp_path / "a3.json")
    assert a3.tools != a1.tools and a3.privacy.epsilon == a1.privacy.epsilon  # the per-record bound holds
    assert len(ReleaseState.model_validate_json(cache.read_bytes()).released) == 30
    # the cache is the organisation's ledger: other settings, counted releases or a clash are refused, nothing written
    refused(build(data["acme"], "x.json", "--epsilon", "2"), "(epsilon: 4.0 in the cache, 2.0 now)")
    refused(build(data["acme"], "x.json", "--releases", "2"), "counts them itself")
    # windows built without a vote share beside ones with it: the combined artifact could not vote at all
    refused(build(data["acme"], "x.json", "--no-votes"), "holds releases built with a vote share; build this one "
                                                          "without --no-votes too")
    refused(invoke("build", "--experience", data["acme"], "--catalog", data["catalog"], "--org", "acme",
                   "--release-cache", data["acme"], "-o", tmp_path / "x.json"), "one of the command's other files")
    assert not (tmp_path / "x.json").exists()
    # votes: each record once, counted by the cache, also across builds
    merged("a3.json", "g1.json")
    ok(vote("a3.json", "g1.json", "v1.json"))
    v1 = load_artifact(tmp_path / "v1.json")
    assert v1.privacy.epsilon == pytest.approx(4.0, abs=1e-5)
    assert len(ReleaseState.model_validate_json(cache.read_bytes()).voted) == 30
    refused(vote("a3.json", "g1.json", "x.json"), "is not the release")  # the cache holds the voted one now
    merged("v1.json", "g2.json")
    # nobody left to vote: under privacy the vote still goes out, as noise alone (on a copy of the ledger here)
    copy = tmp_path / "copy.cache.json"
    copy.write_bytes(cache.read_bytes())
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="synapse_flwr"):
        ok(invoke("vote", "--experience", data["acme"], "--catalog", data["catalog"], "--artifact",
                  tmp_path / "v1.json", "--global", tmp_path / "g2.json", "--embedder", "static",
                  "--release-cache", copy, "-o", tmp_path / "alone.json"))
    assert "that was released and has not voted to vote with: the votes released are noise alone" in caplog.text
    alone = load_artifact(tmp_path / "alone.json")
    # the earlier votes plus a block of noise alone at the same SD
    assert alone.votes.sd == pytest.approx(math.sqrt(2) * v1.votes.sd, rel=1e-4)
    assert len(ReleaseState.model_validate_json(copy.read_bytes()).voted) == 30
    more = tmp_path / "more.jsonl"
    more.write_text("".join(lines) + "".join(lines[:5]))  # five new records (repeats count as records of their own)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="synapse_flwr"):
        ok(build(more, "a4.json"))
        a4 = load_artifact(tmp_path / "a4.json")
        assert a4.votes == v1.votes  # the earlier votes are re-sent with the release
        merged("a4.json", "g3.json")
        ok(vote("a4.json", "g3.json", "v4.json", more))
    assert "5 records released now; 30 released before" in caplog.text
    assert "5 records of" in caplog.text and "released and not voted yet" in caplog.text
    v4 = load_artifact(tmp_path / "v4.json")
    assert abs(v4.votes.records - v1.votes.records - 5) < 6 * v4.votes.sd  # the five new records only
    assert v4.privacy.epsilon == pytest.approx(4.0, abs=1e-5)
    def rebuilt_under(catalog: list, out: str):
        """The grown log built again under another catalog: no record released again (a window of noise alone)."""
        (tmp_path / f"{out}.catalog.json").write_text(json.dumps(catalog))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="synapse_flwr"):
            ok(invoke("build", "--experience", more, "--catalog", tmp_path / f"{out}.catalog.json", "--org", "acme",
                      "--embedder", "static", "--epsilon", "4", "--release-cache", cache, "-o", tmp_path / out))
        assert "0 records released now; 35 released before" in caplog.text
        return load_artifact(tmp_path / out)

    # the catalog documents a tool anew: the cache is kept, nothing is released again, the new text is sent
    a5 = rebuilt_under(json.loads(json.dumps(CATALOG).replace("Current weather for a city.",
                                                               "Weather now and ahead for a city.")), "a5.json")
    assert a5.tool("get_weather").description == "Weather now and ahead for a city."
    assert a5.privacy.epsilon == v4.privacy.epsilon and a5.votes == v4.votes
    assert not (tmp_path / "x.json").exists()
    # the catalog renames the tool and keeps its old name as an alias: the log still loads, its records keep
    # their keys (regression: they were keyed as resolved, and released again), the cached entry follows
    a6 = rebuilt_under([{"name": "weather_now", "description": "Current weather for a city.",
                         "aliases": ["get_weather"]}, *CATALOG[1:]], "a6.json")
    assert a6.tool("weather_now").prototype is not None and a6.tool("get_weather") is None
    assert a6.tool("weather_now").stats.calls > 0.5 * v4.tool("get_weather").stats.calls


def test_a_seeded_release_cache_draws_new_noise_for_each_window(data, tmp_path):
    """Regression: one --seed gave every window of a cache the same noise, which cancels in the difference of two
    artifacts. Here no record ever names convert_currency, so its released prototype is noise alone: with one noise
    the second artifact's was exactly twice the first's."""
    weather = [{"query": f"weather forecast for {c} {i}", "tool": "get_weather", "success": True}
               for i in range(4) for c in CITIES]
    cache = tmp_path / "cache.json"
    for n, out in ((10, "a1.json"), (20, "a2.json")):
        log = write_jsonl(tmp_path / f"log{n}.jsonl", weather[:n])
        ok(invoke("build", "--experience", log, "--catalog", data["catalog"], "--org", "acme", "--embedder", "static",
                  "--epsilon", "4", "--seed", "5", "--release-cache", cache, "-o", tmp_path / out))
    first, second = (decode_prototype(load_artifact(tmp_path / f).tool("convert_currency").prototype)
                     for f in ("a1.json", "a2.json"))
    step = np.abs(first).max() / 127  # the int8 step of the stored sums
    assert not np.allclose(second, 2 * first, atol=4 * step)
    assert abs(np.corrcoef(second - first, first)[0, 1]) < 0.5  # the second window's noise is a new draw



def test_one_seed_on_two_logs_that_differ_by_a_record_draws_independent_noise(data, tmp_path):
    """Regression (privacy review): --seed seeded the noise from (seed, org, round) alone, so two builds of logs
    differing by one record drew one noise, and their difference showed that record's exact counts (+1 call) to
    anyone holding both artifacts, seed or not."""
    lines = data["acme"].read_text().splitlines(keepends=True)
    logs = {}
    for name, n in (("l0", 20), ("l1", 21)):
        logs[name] = tmp_path / f"{name}.jsonl"
        logs[name].write_text("".join(lines[:n]))

    def build(log: Path, out: str):
        ok(invoke("build", "--experience", log, "--catalog", data["catalog"], "--org", "acme", "--embedder",
                  "static", "--epsilon", "4", "--seed", "5", "-o", tmp_path / out))
        return load_artifact(tmp_path / out)

    first, again, grown = build(logs["l0"], "a.json"), build(logs["l0"], "b.json"), build(logs["l1"], "c.json")
    assert first.tools == again.tools  # one log, one seed: reproducible
    steps = [b.stats.calls - a.stats.calls for a, b in zip(first.tools, grown.tools)]
    assert not any(abs(step - round(step)) < 1e-3 for step in steps)  # no tool moved by an exact whole count


def test_a_release_cache_at_its_window_cap_re_sends_its_release(data, tmp_path, caplog):
    """Regression: every build of a cache added one window's noise, without end, burying the release under
    builds of an unchanged log. Past --max-windows a build re-sends the cached release, as a Flower client does."""
    from synapse_flwr.core.release import ReleaseState

    cache = tmp_path / "cache.json"
    lines = data["acme"].read_text().splitlines(keepends=True)
    for n, out in ((10, "a1.json"), (20, "a2.json"), (30, "a3.json")):
        log = tmp_path / f"log{n}.jsonl"
        log.write_text("".join(lines[:n]))
        with caplog.at_level(logging.INFO, logger="synapse_flwr"):
            ok(invoke("build", "--experience", log, "--catalog", data["catalog"], "--org", "acme", "--embedder",
                      "static", "--epsilon", "4", "--release-cache", cache, "--max-windows", "2", "-o", tmp_path / out))
    state = ReleaseState.model_validate_json(cache.read_bytes())
    assert state.windows == 2 and len(state.released) == 20  # the last ten records were not released
    assert load_artifact(tmp_path / "a3.json").tools == load_artifact(tmp_path / "a2.json").tools
    assert "holds 2 release windows (--max-windows 2): no window released" in caplog.text
    assert "10 records of the log are not released" in caplog.text


def test_other_commands_refuse_their_mistakes_before_loading_anything(data, built):
    refused(invoke("inspect", built["global"], "--limit", "-1"), "--limit")
    refused(invoke("check-data", data["catalog"]), "is a file")
    # the catalog is missing: loading it first would have named that instead
    refused(invoke("serve", "--catalog", data["dir"] / "absent.json", "--transport", "carrier-pigeon"),
            "unknown transport")
    refused(invoke("serve", "--catalog", data["dir"] / "absent.json", "--port", "8123"), "not stdio")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        refused(invoke("serve", "--catalog", data["dir"] / "absent.json", "--transport", "streamable-http",
                       "--port", str(taken.getsockname()[1])), "(Address already in use); choose another --host or --port")
    refused(invoke("simulate", "--nodes", "0"), "--nodes")


def test_written_files_are_shareable_and_private_keys_are_not(built, tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    assert built["global"].stat().st_mode & 0o777 == 0o666 & ~umask
    ok(invoke("keygen", "acme", "--dir", tmp_path))
    assert (tmp_path / "acme.key").stat().st_mode & 0o777 == 0o600


def test_an_artifact_claiming_more_epsilon_than_its_budget_is_invalid():
    from pydantic import ValidationError

    from synapse_flwr.core.schema import PrivacyBlock

    assert PrivacyBlock(mechanism="gaussian", epsilon=4.0, epsilon_target=4.0).epsilon == 4.0
    with pytest.raises(ValidationError, match="exceeds the budget"):
        PrivacyBlock(mechanism="gaussian", epsilon=9.0, epsilon_target=4.0)


def test_a_log_that_is_not_utf8_and_a_folder_with_two_catalogs_are_refused_in_one_line(data, tmp_path):
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"query": "caf\xe9 nearby", "tool": "get_weather", "success": true}\n')
    refused(invoke("build", "--experience", latin1, "--catalog", data["catalog"], "--org", "acme",
                   "--embedder", "none", "-o", tmp_path / "x.json"),
            "not UTF-8 text (byte 0xe9 on line 1): save it as UTF-8")
    folder = tmp_path / "two"
    folder.mkdir()
    (folder / "catalog.json").write_text(json.dumps(CATALOG))
    (folder / "catalog.jsonl").write_text(json.dumps(CATALOG[0]) + "\n")
    refused(invoke("examples", folder), "both catalog.json and catalog.jsonl")
    assert not (tmp_path / "x.json").exists() and not (folder / "examples.json").exists()


def test_route_says_when_the_query_shift_test_turned_experience_off_and_no_shift_test_keeps_it(tmp_path):
    """The demo's test queries sit far from its logs, so `route --test` routes them on the documentation; a user
    whose traffic is only terser than the federation's (keyword queries) keeps experience with --no-shift-test."""
    from synapse_flwr.core.builder import build_compendium
    from synapse_flwr.core.embed import get_embedder
    from synapse_flwr.data.federation import load_dataset

    ds = load_dataset("demo", 7)
    glob = tmp_path / "global.json"
    save_artifact(glob, build_compendium(ds.all_events, ds.catalog, "pooled", epsilon=math.inf,
                                         embedder=get_embedder("minilm"), seed=0))
    test = write_jsonl(tmp_path / "test.jsonl", [{"query": i.query, "gold": list(i.gold)}
                                                 for i in ds.seen_test + ds.heldout_test])
    off = {}
    for flag in ("--shift-test", "--no-shift-test"):
        res = invoke("route", "--catalog", demo_dir() / "catalog.json", "--compendium", glob, "--test", test, flag)
        ok(res)
        off[flag] = {json.loads(line)["experience_off"] for line in res.stdout.splitlines() if line.startswith("{")}
    assert off == {"--shift-test": {True}, "--no-shift-test": {False}}
