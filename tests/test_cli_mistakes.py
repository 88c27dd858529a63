"""``synapse`` user mistakes found by the CLI audit: each refused in one line, before any slow work, losing nothing."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest
from test_cli import CATALOG, invoke, ok, org_events, refused, write_jsonl

from synapse_flwr.core.errors import InputError
from synapse_flwr.core.files import write_atomic


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A dataset folder (catalog and one log) with a static-space artifact and a prototype-free one built from it."""
    d = tmp_path_factory.mktemp("mistakes")
    (d / "catalog.json").write_text(json.dumps(CATALOG, indent=2))
    write_jsonl(d / "train.jsonl", org_events("acme", hotel_success=True))
    for name, embedder in (("static.json", "static"), ("docs.json", "none")):
        ok(invoke("build", "--experience", d / "train.jsonl", "--catalog", d / "catalog.json", "--org", "acme",
                  "--embedder", embedder, "--epsilon", "inf", "-o", d / name))
    return d


def no_model(monkeypatch) -> None:
    """Fail the test if `examples` gets as far as its model."""
    from synapse_flwr.core import examples

    def generate(*args, **kwargs):
        raise AssertionError("the model was called before the mistake was refused")

    monkeypatch.setattr(examples, "generate_examples", generate)


# --------------------------------------------------------------------------- outputs: never an input, writable first


def test_split_orgs_never_removes_its_input_and_says_why_a_log_cannot_be_split(tmp_path):
    log = write_jsonl(tmp_path / "org_all.jsonl", org_events("acme", True))
    before = log.read_bytes()
    for extra in ([], ["--overwrite"]):
        res = refused(invoke("split-orgs", log, "--orgs", "3", *extra), "is named like an organisation's log")
        assert "pass --overwrite" not in str(res.exception)  # the hint would have removed the input
    assert log.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["org_all.jsonl"]
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    res = refused(invoke("split-orgs", empty, "--out", tmp_path / "a"), "holds no events: nothing to split")
    assert "alpha" not in str(res.exception)
    three = write_jsonl(tmp_path / "three.jsonl", org_events("acme", True)[:3])
    res = refused(invoke("split-orgs", three, "--orgs", "5", "--out", tmp_path / "a"), "use --orgs 3 or fewer")
    assert "alpha" not in str(res.exception)  # an IID split has none
    ok(invoke("split-orgs", three, "--orgs", "2", "--out", tmp_path / "a"))
    refused(invoke("split-orgs", three, "--orgs", "3", "--out", tmp_path / "a"),
            "(org_org0.jsonl, org_org1.jsonl); pass --overwrite")


def test_split_orgs_refuses_a_negative_seed_in_one_line(tmp_path):
    """Regression: --seed -1 reached numpy's generator and ended in a ValueError traceback."""
    log = write_jsonl(tmp_path / "train.jsonl", org_events("acme", True))
    res = invoke("split-orgs", log, "--orgs", "2", "--seed", "-1")
    assert res.exit_code == 2 and "--seed" in res.output and "x>=0" in res.output
    assert not list(tmp_path.glob("org_*.jsonl"))


def test_examples_checks_its_output_and_model_before_the_model_runs(folder, tmp_path, monkeypatch):
    no_model(monkeypatch)
    catalog = folder / "catalog.json"
    before = catalog.read_bytes()
    refused(invoke("examples", folder, "--out", catalog, "--overwrite"), f"--out {catalog} is one of the inputs")
    assert catalog.read_bytes() == before
    refused(invoke("examples", folder, "--out", tmp_path, "--overwrite"), "is a folder")
    refused(invoke("examples", folder, "--out", catalog / "x.json"), "is a file, not a folder")
    for model in ("local/nope", "local/smollm3"):
        refused(invoke("examples", folder, "--out", tmp_path / "x.json", "--model", model),
                f"--model {model!r}: unknown local model; valid: local/")
    assert not (tmp_path / "x.json").exists()
    shown = " ".join(invoke("examples", "--help").stdout.split())
    assert "about 25 s to load, then about 5 s a tool" in shown  # as measured on idle cores


def test_examples_overwrites_a_broken_table_it_was_asked_to_replace(tmp_path, monkeypatch):
    """Regression: `examples FOLDER --overwrite` read the old examples.json first and stopped on its error."""
    from synapse_flwr.core import examples

    monkeypatch.setattr(examples, "generate_examples",
                        lambda catalog, *args, **kwargs: {t: [f"a request for {t}"] for t in catalog.ids})
    (tmp_path / "catalog.json").write_text(json.dumps(CATALOG))
    table = tmp_path / "examples.json"
    table.write_text('{"get_weather": "one string, not a list"}')
    refused(invoke("examples", tmp_path), f"{table} exists; pass --overwrite")
    ok(invoke("examples", tmp_path, "--overwrite"))
    assert json.loads(table.read_text())["get_weather"] == ["a request for get_weather"]


def test_build_refuses_an_unknown_summarise_model_before_any_work(folder, tmp_path):
    """Regression: a misspelt local model failed once per scenario, in a litellm traceback each, and exited 0."""
    refused(invoke("build", "--experience", folder / "train.jsonl", "--catalog", folder / "catalog.json", "--org",
                   "acme", "--embedder", "none", "--epsilon", "inf", "--summarise-model", "local/bogus",
                   "-o", tmp_path / "x.json"), "--summarise-model 'local/bogus': unknown local model; valid: local/")
    assert not (tmp_path / "x.json").exists()


def test_an_output_under_a_file_is_refused_before_any_work(folder, tmp_path):
    # the experience log is missing: reading it first would have named that instead
    blocked = folder / "catalog.json" / "x.json"
    refused(invoke("build", "--experience", tmp_path / "absent.jsonl", "--catalog", folder / "catalog.json",
                   "--org", "acme", "-o", blocked), f"--output {blocked} cannot be written: ")
    refused(invoke("build", "--experience", tmp_path / "absent.jsonl", "--catalog", folder / "catalog.json",
                   "--org", "acme", "--release-cache", blocked, "-o", tmp_path / "ok.json"),
            f"--release-cache {blocked} cannot be written: ")
    refused(invoke("merge", tmp_path / "absent.json", "-o", blocked), "is a file, not a folder")
    refused(invoke("schema", "-o", blocked), "is a file, not a folder")
    refused(invoke("split-orgs", tmp_path / "absent.jsonl", "--out", folder / "catalog.json"), "is a file")
    refused(invoke("split-orgs", tmp_path / "absent.jsonl", "--out", blocked), "is a file, not a folder")
    refused(invoke("keygen", "acme", "--dir", tmp_path / "keys", "--registry", blocked), "--registry")
    refused(invoke("keygen", "acme", "--dir", blocked), "--dir")
    assert not (tmp_path / "keys").exists()


def test_write_atomic_names_a_path_it_cannot_write(tmp_path):
    parent = tmp_path / "file"
    parent.write_text("x")
    with pytest.raises(InputError, match="is a file, not a folder"):
        write_atomic(parent / "out.json", "{}")
    if Path("/proc/self").exists():  # a folder that takes no files, whatever the permission bits say
        with pytest.raises(InputError, match="cannot be written"):
            write_atomic("/proc/synapse-test.json", "{}")
    assert parent.read_text() == "x"


def test_keygen_reads_the_registry_before_it_writes_a_key(tmp_path):
    keys, registry = tmp_path / "keys", tmp_path / "garbage.json"
    registry.write_text('{"format": "synapse-keys/1",\n "keys": [}\n')
    res = refused(invoke("keygen", "acme", "--dir", keys, "--registry", registry), f"{registry}:2: not valid JSON")
    assert "(column 11)" in str(res.exception)  # the closing brace where a key was due
    assert not (keys / "acme.key").exists()
    registry.write_text("")
    refused(invoke("keygen", "acme", "--dir", keys, "--registry", registry), "is empty")
    registry.unlink()
    ok(invoke("keygen", "acme", "--dir", keys, "--registry", registry))  # no --replace needed: nothing was left
    assert (keys / "acme.key").exists() and registry.exists()


# --------------------------------------------------------------------------- route and serve


def test_route_refuses_an_empty_test_set(folder, tmp_path):
    empty = tmp_path / "test.jsonl"
    empty.touch()
    refused(invoke("route", "--catalog", folder / "catalog.json", "--embedder", "tfidf", "--test", empty),
            f"--test {empty} holds no test items")


def test_route_embeds_in_the_compendiums_space_and_refuses_another(folder, caplog):
    def weather(*extra: str) -> dict:
        res = invoke("route", "weather forecast for paris", "--catalog", folder / "catalog.json", *extra)
        ok(res)
        (row,) = [c for c in json.loads(res.stdout)["candidates"] if c["tool"] == "get_weather"]
        return row["signals"]

    with caplog.at_level(logging.WARNING, logger="synapse_flwr"):
        signals = weather("--compendium", folder / "static.json")
    assert signals["prototype"] > 0  # the static prototypes are read: the default followed the compendium
    assert "ignoring the compendium's query prototypes" not in caplog.text
    for other in ("minilm", "tfidf"):
        refused(invoke("route", "rain?", "--catalog", folder / "catalog.json", "--compendium", folder / "static.json",
                       "--embedder", other), f"--embedder {other}: prototypes are in 'tokenlearn-static-64d'")
    # without prototypes there is no space to follow or to clash with
    ok(invoke("route", "rain?", "--catalog", folder / "catalog.json", "--compendium", folder / "docs.json",
              "--embedder", "tfidf"))
    assert "the compendium's embedding space" in " ".join(invoke("route", "--help").stdout.split())


def test_route_names_its_options_and_the_ones_its_reranker_ignores(folder, tmp_path, caplog):
    absent = tmp_path / "absent.json"  # loading the catalog first would have named it instead
    refused(invoke("route", "rain?", "--catalog", absent, "--reranker", "llm", "--llm-weight", "-1"),
            "--llm-weight must be a finite number >= 0, got -1.0")
    refused(invoke("route", "rain?", "--catalog", absent, "--reranker", "llm", "--llm-weight", "inf"),
            "--llm-weight must be a finite number >= 0, got inf")
    refused(invoke("route", "rain?", "--catalog", absent, "--count-prior", "-1"),
            "--count-prior must be a finite number >= 0, got -1.0")
    refused(invoke("route", "rain?", "--catalog", absent, "--k", "0"), "--k")
    with caplog.at_level(logging.WARNING, logger="synapse_flwr"):
        refused(invoke("route", "rain?", "--catalog", absent, "--llm-weight", "2", "--model", "gpt-4o"),
                "file not found")
    assert "--model and --llm-weight apply only to --reranker llm" in caplog.text


def test_serve_warns_that_a_network_address_has_no_authentication(tmp_path, caplog):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    for host, warned in (("0.0.0.0", True), ("127.0.0.1", False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="synapse_flwr"):
            refused(invoke("serve", "--catalog", tmp_path / "absent.json", "--transport", "streamable-http",
                           "--host", host, "--port", port), "file not found")
        assert ("has no authentication and is reachable from the network" in caplog.text) is warned, host


# --------------------------------------------------------------------------- the rest


def test_verbose_is_a_flag_and_its_help_says_so():
    shown = invoke("--help").stdout
    (line,) = [row for row in shown.splitlines() if "--verbose" in row]
    assert "INTEGER" not in line and "default: 0" not in line
    ok(invoke("-v", "schema"))
    refused(invoke("--verbose=2", "schema"), "does not take a value")


def test_federation_commands_refuse_a_count_or_timeout_out_of_range():
    refused(invoke("deploy-local", "--nodes", "0"), "--nodes")
    for command in ("simulate", "deploy-local"):
        for timeout in ("0", "-5", "nan"):
            refused(invoke(command, "--timeout", timeout), "--timeout must be a finite number of seconds > 0")
    # --catalog only describes --node files: alone it would be ignored
    refused(invoke("deploy-local", "--catalog", "catalog.json"), "is the catalog of --node experience files")


def test_merge_counts_repeats_once_and_names_an_empty_artifact(folder, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="synapse_flwr"):
        ok(invoke("merge", folder / "docs.json", folder / "docs.json", "-o", tmp_path / "m.json"))
    assert "merged 1 artifact from 2 files with the typed policy" in caplog.text
    empty = tmp_path / "empty.json"
    empty.touch()
    res = refused(invoke("merge", empty, "-o", tmp_path / "x.json"), f"{empty} is empty (0 bytes)")
    assert "Expecting value" not in str(res.exception)
    assert not (tmp_path / "x.json").exists()


def test_merge_refuses_two_artifacts_of_one_organisation(folder, tmp_path):
    """Regression: two builds of one log (or an artifact and its voted copy) merged silently, counting it twice."""
    again = tmp_path / "again.json"
    ok(invoke("build", "--experience", folder / "train.jsonl", "--catalog", folder / "catalog.json", "--org", "acme",
              "--embedder", "none", "--epsilon", "inf", "--round", "1", "-o", again))
    refused(invoke("merge", folder / "docs.json", again, "-o", tmp_path / "m.json"),
            f"{folder / 'docs.json'} and {again} both hold records of organisation 'acme'")
    assert not (tmp_path / "m.json").exists()
    # an artifact the global already holds is merged once, as before
    ok(invoke("merge", folder / "docs.json", "-o", tmp_path / "g.json"))
    ok(invoke("merge", tmp_path / "g.json", folder / "docs.json", "-o", tmp_path / "g2.json"))
    # the global and another artifact of an organisation it holds (its voted copy): counted twice, merged silently
    refused(invoke("merge", tmp_path / "g.json", again, "-o", tmp_path / "m.json"),
            f"{tmp_path / 'g.json'} and {again} both hold records of organisation 'acme'")
    ok(invoke("merge", again, "-o", tmp_path / "g3.json"))
    refused(invoke("merge", tmp_path / "g.json", tmp_path / "g3.json", "-o", tmp_path / "m.json"), "'acme'")
    assert not (tmp_path / "m.json").exists()
