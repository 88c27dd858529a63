"""Dataset folders checked before any work: each broken kind gives its clear error within a second."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from synapse_flwr import cli
from synapse_flwr.core.builder import build_compendium
from synapse_flwr.core.catalog import load_catalog
from synapse_flwr.core.errors import InputError
from synapse_flwr.core.experience import Event, load_experience, load_testset
from synapse_flwr.data.check import DataError, check_folder, file_hashes, require_valid
from synapse_flwr.data.federation import demo_dir, load_folder, load_partition
from synapse_flwr.data.split import split_orgs

CATALOG = [{"name": "get_weather", "description": "Forecast for a city."},
           {"name": "book_hotel", "description": "Book a hotel room."},
           {"name": "convert_currency", "description": "Convert money."}]
EVENTS = [{"query": f"weather in city {i}", "tool": "get_weather", "success": True} for i in range(6)] + [
    {"query": f"book a room number {i}", "tool": "book_hotel", "success": True} for i in range(6)]
TEST = [{"query": "will it rain tomorrow", "gold": "get_weather"},
        {"query": "a hotel for two nights", "gold": "book_hotel"}]


def _jsonl(path: Path, records: list) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


@pytest.fixture()
def folder(tmp_path) -> Path:
    (tmp_path / "catalog.json").write_text(json.dumps(CATALOG))
    _jsonl(tmp_path / "org_a.jsonl", EVENTS[:6])
    _jsonl(tmp_path / "org_b.jsonl", EVENTS[6:])
    _jsonl(tmp_path / "test.jsonl", TEST)
    return tmp_path


def _problems(folder: Path) -> list[str]:
    t0 = time.perf_counter()
    report = check_folder(folder)
    assert time.perf_counter() - t0 < 1.0
    return [str(p) for p in report.problems]


def test_valid_folder(folder):
    report = require_valid(folder)
    assert report.ok and report.tools == 3 and report.orgs == {"a": 6, "b": 6} and report.test == 2
    assert set(report.hashes) == {"catalog.json", "org_a.jsonl", "org_b.jsonl", "test.jsonl"}


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\u0085"])
def test_a_record_holding_a_unicode_line_separator_is_one_record(folder, sep):
    # JSON lets these stand raw in a string (json.dumps(..., ensure_ascii=False) writes them);
    # str.splitlines split there, and the valid record read as two invalid lines
    events = [{**EVENTS[0], "query": f"weather in Oslo{sep}this weekend"}, *EVENTS[1:6]]
    (folder / "org_a.jsonl").write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in events),
                                        encoding="utf-8")
    assert require_valid(folder).orgs == {"a": 6, "b": 6}
    assert load_experience(folder / "org_a.jsonl")[0].query == f"weather in Oslo{sep}this weekend"
    for end in ("\r\n", "\r"):  # Windows' and old Mac's line ends are still line ends
        (folder / "org_a.jsonl").write_bytes(end.join(json.dumps(e) for e in EVENTS[:6]).encode())
        assert require_valid(folder).orgs == {"a": 6, "b": 6} and len(load_experience(folder / "org_a.jsonl")) == 6


@pytest.mark.parametrize("tools", [[], ["get_weather", "book_hotel"], [{"query": "other", "gold": "book_hotel"}]])
def test_one_record_with_a_tools_field_is_a_record_not_a_catalog(folder, tools):
    # converted benchmarks list each request's candidate tools under "tools": a one-line log or test set
    # was read as a {"tools": [...]} catalog (the record lost, refused, or replaced by its first candidate)
    _jsonl(folder / "org_a.jsonl", [{**EVENTS[0], "tools": tools}])
    _jsonl(folder / "test.jsonl", [{**TEST[0], "tools": tools}])
    assert require_valid(folder).orgs == {"a": 1, "b": 6}
    assert [e.query for e in load_experience(folder / "org_a.jsonl")] == [EVENTS[0]["query"]]
    assert [(t.query, t.gold) for t in load_testset(folder / "test.jsonl")] == [(TEST[0]["query"], ("get_weather",))]


def test_a_catalog_saved_as_the_test_set_is_named_as_one(folder):
    # a one-line {"tools": [...]} is a record now (records may carry candidate tools): the hint is kept
    _jsonl(folder / "test.jsonl", [{"tools": CATALOG}])
    (problem,) = _problems(folder)
    assert 'this looks like a catalog ({"tools": [...]}); tools go in catalog.json' in problem


def test_an_empty_organisation_log_is_said(folder, caplog):
    (folder / "org_a.jsonl").write_text("")
    with caplog.at_level("WARNING"):
        assert require_valid(folder).orgs == {"a": 0, "b": 6}
    assert "org_a.jsonl: holds no record; organisation 'a' joins with no experience" in caplog.text


def test_demo_folder_is_valid():
    assert require_valid(demo_dir()).ok


def test_missing_folder_and_catalog(folder):
    assert "does not exist" in _problems(folder / "nope")[0]
    (folder / "catalog.json").unlink()
    assert "no catalog.json or catalog.jsonl" in _problems(folder)[0]


def test_empty_catalog(folder):
    (folder / "catalog.json").write_text("[]")
    assert "catalog holds no tools" in _problems(folder)[0]


def test_a_catalog_no_compendium_can_carry_is_named_before_any_work(folder, monkeypatch):
    """A private artifact carries every catalog tool: more than the schema allows failed at the first build."""
    monkeypatch.setattr("synapse_flwr.core.catalog.MAX_TOOLS", 2)
    (problem,) = _problems(folder)
    assert "catalog.json: the catalog holds 3 tools, a compendium at most 2: split it" in problem
    with pytest.raises(ValueError, match="the catalog holds 3 tools, a compendium at most 2"):
        build_compendium(load_experience(folder / "org_a.jsonl"), load_catalog(folder / "catalog.json"), "a")


def test_bad_json_lines_each_named(folder):
    _jsonl(folder / "org_a.jsonl", [EVENTS[0], "{not json", EVENTS[1], "[1, 2]"])
    problems = _problems(folder)
    assert any("org_a.jsonl:2: invalid JSON" in p for p in problems)
    assert any("org_a.jsonl:4: not a JSON object" in p for p in problems)


def test_bad_field(folder):
    _jsonl(folder / "org_b.jsonl", [{"query": "x", "tool": "book_hotel"},
                                    {"query": "x", "tool": "book_hotel", "success": "maybe"},
                                    {"query": "x", "tool": "book_hotel", "success": True, "ts": [1, 2]}])
    problems = _problems(folder)
    # regression: a union was named by pydantic's first member ("field 'ts.str': Input should be a valid string")
    assert any("org_b.jsonl:3: field 'ts': expected a string or a number, got [1, 2]" in p for p in problems)
    # a missing field is named with what it should hold: a converter's labelled examples lack `success`
    assert any("org_b.jsonl:1: field 'success': Field required: whether the call served the request, true or "
               'false; a labelled example is "success": true' in p for p in problems)
    # the value given is named, so a converter's wrong encoding shows at once
    assert any("org_b.jsonl:2: field 'success': expected true or false, written without quotes, got 'maybe'" in p for p in problems)


def test_fields_outside_the_format_are_ignored_and_named_once_per_file(folder, caplog):
    """A converted benchmark's own fields (an id, a category) do not stop a run; a misspelt one is named."""
    _jsonl(folder / "org_a.jsonl", [{**e, "id": i, "glod": e["tool"]} for i, e in enumerate(EVENTS[:6])])
    _jsonl(folder / "test.jsonl", [{**t, "category": "travel"} for t in TEST])
    with caplog.at_level("WARNING"):
        data = load_folder(folder)  # checks the folder first: each file's fields are named once, not per reader
        report = require_valid(folder)  # nor again when the same process reads the folder again
    warned = [r.getMessage() for r in caplog.records if "ignored fields" in r.getMessage()]
    assert report.orgs == {"a": 6, "b": 6} and report.test == 2
    assert [e.query for e in data.orgs["a"]] == [e["query"] for e in EVENTS[:6]]
    assert all(e.gold is None for e in data.orgs["a"])  # the misspelt gold is not read as gold
    assert sum("org_a.jsonl" in w and "'glod' (6 records), 'id' (6 records)" in w for w in warned) == 1
    assert sum("test.jsonl" in w and "'category' (2 records)" in w for w in warned) == 1
    assert not any("org_b.jsonl" in w for w in warned)
    # a field the format requires is still required
    _jsonl(folder / "org_b.jsonl", [{"query": "x", "tool": "book_hotel", "succes": True}])
    assert any("org_b.jsonl:1: field 'success'" in p for p in _problems(folder))


def test_a_tool_taught_only_by_a_failed_call_s_gold_is_seen_not_held_out(folder):
    """Held-out means no record teaches the tool; a failed call naming it as gold adds to its prototype."""
    test = [*TEST, {"query": "convert 10 euros", "gold": "convert_currency"}]
    _jsonl(folder / "test.jsonl", test)
    assert [i.gold for i in load_folder(folder).heldout_test] == [("convert_currency",)]
    failed = {"query": "euros to yen", "tool": "book_hotel", "success": False, "gold": "convert_currency"}
    _jsonl(folder / "org_b.jsonl", [*EVENTS[6:], failed])
    data = load_folder(folder)
    assert not data.heldout_test and len(data.seen_test) == 3


def test_unknown_tool_in_log_suggests_the_close_one(folder):
    _jsonl(folder / "org_a.jsonl", [EVENTS[0], {"query": "q", "tool": "get_wether", "success": True}])
    (problem,) = _problems(folder)
    assert "org_a.jsonl:2: field 'tool': tool 'get_wether' is not in the catalog" in problem
    assert "did you mean 'get_weather'?" in problem


def test_duplicate_and_colliding_ids_name_both(folder):
    entries = [*CATALOG, {"name": "get_weather", "description": "again"}, {"name": "Book-Hotel", "description": "?"}]
    (folder / "catalog.json").write_text(json.dumps(entries))
    problems = _problems(folder)
    assert len(problems) == 2
    assert "catalog.json:1 (item 4): field 'name': duplicate tool 'get_weather'" in problems[0]
    assert "(the first at line 1 (item 1))" in problems[0]
    assert "'book_hotel' and 'Book-Hotel'" in problems[1] and "(the first at line 1 (item 2))" in problems[1]


def test_alias_table_declares_a_collision(folder):
    entries = [*CATALOG, {"name": "GetWeather", "description": "MCP spelling"}]
    (folder / "catalog.json").write_text(json.dumps(entries))
    assert "aliases.json" in _problems(folder)[0]
    (folder / "aliases.json").write_text('{"GetWeather": "get_weather"}')
    assert _problems(folder) == []


def test_example_table_is_checked_and_hashed(folder):
    # regression (dress rehearsal): only the first of a converter's dropped tools was named, one run each
    (folder / "examples.json").write_text('{"pay_bill": ["pay my bill"], "get_weather": ["rain?"], "fly": ["a seat"]}')
    (problem,) = _problems(folder)
    assert "examples.json" in problem and "examples for 2 names that are no tool of the catalog: 'pay_bill', 'fly'" \
        in problem and "remove them, or add the tools to the catalog" in problem
    (folder / "examples.json").write_text('{"get_weather": ["umbrella today?"]}')
    assert _problems(folder) == [] and "examples.json" in file_hashes(folder)
    assert load_folder(folder).catalog.get("get_weather").examples == ("umbrella today?",)


def test_a_broken_alias_table_does_not_hide_the_other_files_problems(folder):
    """Regression: an unreadable aliases.json ended the check, so examples.json's problem came a run later."""
    (folder / "aliases.json").write_text('{"GetWeather": ')
    (folder / "examples.json").write_text('{"pay_bill": ["pay my bill"]}')
    problems = _problems(folder)
    assert len(problems) == 2 and "aliases.json" in problems[0] and "examples.json" in problems[1]


def test_a_broken_catalog_does_not_hide_the_other_files_problems(folder):
    """Regression: an unreadable catalog ended the check, so a bad log line, a broken examples.json and a bad test
    item came a run later, though docs/formats.md says every file is checked."""
    (folder / "catalog.json").write_text('[{"name": "get_weather", "description": 5}]')
    (folder / "examples.json").write_text('{"get_weather": NaN}')
    _jsonl(folder / "org_a.jsonl", [*EVENTS[:5], {"query": "rain?", "tool": "get_weather", "success": "yes"}])
    _jsonl(folder / "test.jsonl", [*TEST, {"query": "umbrella", "gold": 3}])
    problems = _problems(folder)
    assert [p.split(":")[0].rsplit("/", 1)[-1] for p in problems] == [
        "catalog.json", "examples.json", "org_a.jsonl", "test.jsonl"]
    assert "success" in problems[2] and ":6:" in problems[2] and ":3:" in problems[3]
    # tool names are not checked against a catalog that could not be read: no guess is reported as a problem
    _jsonl(folder / "org_b.jsonl", [{"query": "pay my bill", "tool": "pay_bill", "success": True}])
    assert len(_problems(folder)) == 4


def test_mismatched_test_gold(folder):
    _jsonl(folder / "test.jsonl", [TEST[0], {"query": "pay", "gold": ["book_hotel", "pay_bill"]}])
    (problem,) = _problems(folder)
    assert "test.jsonl:2: field 'gold': tool 'pay_bill' is not in the catalog" in problem


def test_a_gold_of_the_wrong_shape_is_named_in_the_format_s_words(folder):
    """Regression: a gold of 5 or [] was "Input should be a valid tuple" / "Tuple should have at least 1 item"."""
    _jsonl(folder / "test.jsonl", [{"query": "pay", "gold": 5}, {"query": "pay", "gold": []}])
    problems = _problems(folder)
    assert "test.jsonl:1: field 'gold': expected a tool id or a list of tool ids, got 5" in problems[0]
    assert "test.jsonl:2: field 'gold': expected at least one tool id, got []" in problems[1]
    assert not any("tuple" in p.lower() for p in problems)


@pytest.mark.parametrize(("record", "other", "text", "said"), [
    # regression: {"tool": "a", "tool": "b"} passed as an event of tool b, as json.loads keeps the last key
    ('{"query": "the weather", "tool": "get_weather", "success": true, "success": false}', "aliases.json",
     '{"GetWeather": "get_weather", "GetWeather": "book_hotel"}',
     ["org_a.jsonl:1: invalid JSON: key 'success' appears twice in one object",
      "aliases.json: invalid JSON: key 'GetWeather' appears twice"]),
    # regression: "ts": NaN passed (json.loads reads NaN and Infinity), so a record held a value no JSON has
    ('{"query": "the weather", "tool": "get_weather", "success": true, "ts": NaN}', "test.jsonl",
     '[{"query": "pay", "gold": "book_hotel", "score": -Infinity}]',
     ["org_a.jsonl:1: invalid JSON: NaN is not a JSON value", "test.jsonl: invalid JSON: -Infinity is not a JSON value"]),
])
def test_what_json_refuses_is_named_not_read(folder, record, other, text, said):
    _jsonl(folder / "org_a.jsonl", [record])
    (folder / other).write_text(text)
    problems = _problems(folder)
    assert all(any(line in p for p in problems) for line in said), problems
    with pytest.raises(InputError, match=re.escape(said[0])):
        load_experience(folder / "org_a.jsonl")


def test_a_pretty_printed_nan_and_a_number_too_large_are_named(folder):
    """A pretty-printed document is named as such (not parsed again line by line); 1e999 reads as infinity."""
    _jsonl(folder / "org_b.jsonl", ['{"query": "the weather", "tool": "get_weather", "success": true, "ts": 1e999}'])
    assert any("org_b.jsonl:1: invalid JSON: 1e999 is too large for a number" in p for p in _problems(folder))
    (folder / "catalog.json").write_text(json.dumps({"tools": [{**CATALOG[0], "score": float("nan")}]}, indent=2))
    assert any("catalog.json: invalid JSON: NaN is not a JSON value" in p for p in _problems(folder))


def test_a_record_without_a_letter_or_digit_is_skipped_and_counted(folder, caplog):
    """A converter's placeholder ("???", "", an emoji) has nothing to route on or learn from: every reader skips it
    and says how many, instead of routing its noise embedding or refusing a whole benchmark for one line."""
    _jsonl(folder / "test.jsonl", [TEST[0], {"query": " ?!? ", "gold": "book_hotel"}, TEST[1]])
    _jsonl(folder / "org_a.jsonl", [{"query": "...", "tool": "get_weather", "success": True},
                                    {"query": "?" * 4000 + " weather", "tool": "get_weather", "success": True},
                                    {"query": "\N{THUMBS UP SIGN}", "tool": "book_hotel", "success": True},
                                    *EVENTS[:6]])  # the second's words lie past the cut: none is read
    with caplog.at_level("WARNING"):
        report = require_valid(folder)
        data = load_folder(folder)
    assert report.orgs == {"a": 6, "b": 6} and report.test == 2
    assert report.skipped == data.info["skipped_records"] == {"org_a.jsonl": 3, "test.jsonl": 1}
    assert [e.query for e in data.orgs["a"]] == [e["query"] for e in EVENTS[:6]]
    assert [i.query for i in data.seen_test] == [t["query"] for t in TEST]
    assert [e.query for e in load_experience(folder / "org_a.jsonl")] == [e["query"] for e in EVENTS[:6]]
    warned = [r.getMessage() for r in caplog.records]
    assert sum("org_a.jsonl: 3 records skipped: a query without a letter or digit" in w for w in warned) == 1
    assert sum("test.jsonl: 1 records skipped: a query without a letter or digit" in w for w in warned) == 1
    with pytest.raises(ValidationError, match="a request without a letter or digit"):  # routing one still refuses
        Event(query="???", tool="get_weather", success=True)
    _jsonl(folder / "test.jsonl", [{"query": "", "gold": "book_hotel"}])
    assert "test.jsonl: holds no records" in _problems(folder)[0]


def test_an_alias_without_letters_or_digits_is_refused(folder):
    """Regression: an alias "!!!" (table or entry) made an event's tool "???" resolve to its tool, unsaid."""
    _jsonl(folder / "org_a.jsonl", [{"query": "the weather", "tool": "???", "success": True}])
    (folder / "aliases.json").write_text('{"!!!": "get_weather"}')
    (problem,) = _problems(folder)
    assert "aliases.json: alias '!!!' -> 'get_weather': '!!!' has no letters or digits" in problem
    (folder / "aliases.json").unlink()
    catalog = json.loads((folder / "catalog.json").read_text())
    catalog[0]["aliases"] = ["-"]
    (folder / "catalog.json").write_text(json.dumps(catalog))
    (problem,) = _problems(folder)
    assert "catalog.json:1 (item 1): field 'aliases': '-' has no letters or digits" in problem


def test_train_without_org_files_suggests_split_orgs(folder):
    for p in folder.glob("org_*.jsonl"):
        p.unlink()
    _jsonl(folder / "train.jsonl", EVENTS)
    (problem,) = _problems(folder)
    assert "train.jsonl found, but no org_*.jsonl" in problem and "synapse split-orgs" in problem


def test_an_empty_org_file_joins_with_no_experience(folder, caplog):
    """As an organisation the leak filter empties: it takes part with nothing to teach, so its tools are held out."""
    (folder / "org_b.jsonl").write_text("\n")
    with caplog.at_level("WARNING"):
        report = require_valid(folder)
        data = load_folder(folder)
    assert report.orgs == {"a": 6, "b": 0} and data.orgs["b"] == []
    assert [i.gold for i in data.heldout_test] == [("book_hotel",)]
    assert any("org_b.jsonl: holds no records; its organisation joins with no experience" in r.getMessage()
               for r in caplog.records)
    assert require_valid(folder, ["b"]).orgs == {"b": 0}  # a node checks its own log alone
    (folder / "org_a.jsonl").write_text("")
    assert "no organisation log holds a record" in _problems(folder)[0]


def test_load_folder_raises_every_problem_at_once(folder):
    _jsonl(folder / "org_a.jsonl", ["{", {"query": "q", "tool": "nope", "success": True}])
    with pytest.raises(DataError) as err:
        load_folder(folder)
    assert "2 problem(s)" in str(err.value) and "synapse check-data" in str(err.value)


def test_one_org_reads_its_own_file_only(folder):
    _jsonl(folder / "org_b.jsonl", ["{broken"])
    org, ds = load_partition(str(folder), 2, 0)
    assert org == "a" and list(ds.orgs) == ["a"] and len(ds.orgs["a"]) == 6
    with pytest.raises(DataError):
        load_partition(str(folder), 2, 1)


def test_a_partition_is_read_once_per_process(folder, monkeypatch):
    # an actor serves its organisations every round and phase: the folder is not read and checked again each time
    from synapse_flwr.data import federation

    reads = []
    monkeypatch.setattr(federation, "load_folder",
                        lambda path, org=None: reads.append(org) or load_folder(path, org=org))
    first = load_partition(str(folder), 2, 1)
    assert load_partition(str(folder), 2, 1) is first and reads == ["b"]
    assert load_partition(str(folder), 2, 0)[0] == "a" and reads == ["b", "a"]


def test_leak_filter_applies_to_folders(folder):
    _jsonl(folder / "org_a.jsonl", [*EVENTS[:6], {"query": "Will it rain tomorrow?", "tool": "get_weather",
                                                 "success": True}])
    ds = load_folder(folder)
    assert ds.info["leak_filter"]["exact"] == 1 and len(ds.orgs["a"]) == 6
    assert ds.info["orgs_as_given"] is True


def test_split_orgs_round_trip(folder, caplog):
    for p in folder.glob("org_*.jsonl"):
        p.unlink()
    _jsonl(folder / "train.jsonl", EVENTS)
    written = split_orgs(folder / "train.jsonl", 3, seed=1)
    assert sorted(written) == ["org0", "org1", "org2"]
    report = require_valid(folder)
    assert report.orgs == {"org0": 4, "org1": 4, "org2": 4}
    ds = load_folder(folder)
    assert sorted(e.query for e in ds.all_events) == sorted(e["query"] for e in EVENTS)
    with caplog.at_level("INFO", logger="synapse_flwr"):
        skewed = split_orgs(folder / "train.jsonl", 2, alpha=0.5, seed=1, overwrite=True)
    assert sum(len(p.read_text().splitlines()) for p in skewed.values()) == len(EVENTS)
    # org2 of the first split would otherwise join the federation: removed, and said so
    assert sorted(p.name for p in folder.glob("org_*.jsonl")) == ["org_org0.jsonl", "org_org1.jsonl"]
    assert "removed the folder's earlier logs: org_org0.jsonl, org_org1.jsonl, org_org2.jsonl" in caplog.text
    with pytest.raises(Exception, match="--overwrite"):
        split_orgs(folder / "train.jsonl", 2)


def test_hashes_change_with_the_data(folder):
    before = file_hashes(folder)
    _jsonl(folder / "org_a.jsonl", EVENTS[:5])
    after = file_hashes(folder)
    assert before["org_a.jsonl"] != after["org_a.jsonl"] and before["test.jsonl"] == after["test.jsonl"]


def test_cli_check_data(folder):
    runner = CliRunner()
    ok = runner.invoke(cli.app, ["check-data", str(folder)])
    assert ok.exit_code == 0 and "valid:" in ok.output and "note:" not in ok.output
    assert ("test: 2 queries on tools with experience (seen), 0 on tools without (held-out); 2 of 3 tools have "
            "experience; leak filter: 0 of 12 training events left out") in ok.output
    # regression: an organisation whose records are the test queries was called valid; the experiment emptied it
    _jsonl(folder / "test.jsonl", TEST + [{"query": e["query"], "gold": e["tool"]} for e in EVENTS[6:]]
           + [{"query": "convert 10 euros to dollars", "gold": "convert_currency"}])
    leaky = runner.invoke(cli.app, ["check-data", str(folder)])
    # (book_hotel is then taught by no record: its queries are held-out)
    assert leaky.exit_code == 0 and ("test: 1 queries on tools with experience (seen), 8 on tools without "
                                     "(held-out); 1 of 3 tools have experience; leak filter: 6 of 12 training events "
                                     "left out (6 equal to a test query, 0 near duplicates)") in leaky.output
    _jsonl(folder / "test.jsonl", TEST)
    test = (folder / "test.jsonl").read_bytes()
    (folder / "test.jsonl").unlink()  # valid without a test set, which only an experiment needs: said so
    untested = runner.invoke(cli.app, ["check-data", str(folder)])
    assert untested.exit_code == 0 and "note: no test.jsonl: `synapse experiment` needs one" in untested.output
    (folder / "test.jsonl").write_bytes(test)
    shutil.copy(folder / "org_a.jsonl", folder / "train.jsonl")
    _jsonl(folder / "test.jsonl", [{"query": "x", "gold": "nope"}])
    bad = runner.invoke(cli.app, ["check-data", str(folder)])
    assert bad.exit_code == 2 and "test.jsonl:1: field 'gold'" in bad.output
    assert "check it with" not in bad.output  # the command already run is not suggested again


def test_experiment_cache_key_follows_the_data(folder):
    from synapse_flwr.simulations.experiment import cache_fingerprint
    from synapse_flwr.simulations.experiment_config import ExperimentConfig

    cfg = ExperimentConfig(name="t", dataset=str(folder), orgs=2)
    before = cache_fingerprint(cfg)
    assert cache_fingerprint(cfg) == before
    _jsonl(folder / "org_b.jsonl", EVENTS[6:11])
    assert cache_fingerprint(cfg) != before


def test_tables_describe_what_ran():
    from synapse_flwr.simulations.experiment_report import tables

    arm = {"seen": {"acc_mean": 0.5, "acc_sd": 0.0, "r5_mean": 0.7}}
    results = {"name": "t", "dataset": "f", "seeds": [1], "orgs": 2, "alpha": 0.5, "rounds": 3,
               "embedder": "static", "reranker": "fields", "k": 5, "arms": {"federated": arm},
               "ablation_2x2": {}, "contradiction": {}, "injection": {"1": {"0": {"injection_sha256": None}}},
               "per_round": {}, "llm_sample": {}, "targets": [], "orgs_as_given": True, "epsilon": None,
               "epsilon_target": 8.0, "delta": 1e-5,
               "leak_filter": {"1": {"total": 10, "exact": 1, "near": 2, "garbage": 0, "kept": 7}},
               "cache": {"computed": 3, "hits": 4}}
    text = tables(results)
    assert "org files as given" in text and "Dirichlet" not in text
    assert "Injected sets" not in text and "None" not in text and "## Merge x render" not in text
    assert "## Contradiction" not in text
    assert "1 exact, 2 near duplicates and 0 garbage dropped of 10" in text
    assert "3 computed in this run, 4 read from an earlier run's cache" in text


def test_launch_checks_the_folder_before_any_process(folder):
    from synapse_flwr.flower.launch import check_dataset

    check_dataset({"dataset": str(folder)})
    check_dataset({"dataset": "demo"})
    _jsonl(folder / "org_a.jsonl", ["{"])
    with pytest.raises(DataError, match="org_a.jsonl:1: invalid JSON"):
        check_dataset({"dataset": str(folder)})


def test_a_run_that_merged_nothing_is_a_failure(tmp_path):
    from synapse_flwr.flower.launch import nothing_merged

    rounds = [{"round": 1, "accepted": [], "rejected": [{"node_id": 1, "reason": "invalid local data"}]}]
    (tmp_path / "metrics.json").write_text(json.dumps({"rounds": rounds}))
    assert "no organisation's artifact was merged" in nothing_merged(tmp_path)
    assert "invalid local data" in nothing_merged(tmp_path)
    # regression: a round that accepted artifacts but merged none (fewer than min-nodes) counted as merged
    rounds.append({"round": 2, "accepted": [3], "rejected": [], "merged": False})
    (tmp_path / "metrics.json").write_text(json.dumps({"rounds": rounds}))
    assert "no organisation's artifact was merged" in nothing_merged(tmp_path)
    rounds.append({"round": 3, "accepted": [3, 4], "rejected": [], "merged": True})
    (tmp_path / "metrics.json").write_text(json.dumps({"rounds": rounds}))
    assert nothing_merged(tmp_path) is None


def test_gzip_files_are_read_by_their_bytes_and_a_compressed_org_log_is_named(folder):
    import gzip

    packed = folder / "catalog.json.gz"
    packed.write_bytes(gzip.compress((folder / "catalog.json").read_bytes()))
    log = folder / "org_b.jsonl"
    assert load_catalog(packed).ids == load_catalog(folder / "catalog.json").ids
    (folder / "org_b.jsonl.gz").write_bytes(gzip.compress(log.read_bytes()))
    catalog = load_catalog(folder / "catalog.json")
    assert len(load_experience(folder / "org_b.jsonl.gz", catalog)) == len(load_experience(log, catalog))
    # in a folder only plain logs are organisations: a compressed one is a problem, never silently left out
    assert any("org_b.jsonl.gz" in p and "compressed organisation logs are not read" in p for p in _problems(folder))


def test_an_org_log_whose_name_is_no_org_id_is_named_with_the_rule(folder):
    from synapse_flwr.core.schema import ORG_ID_RULE

    shutil.copy(folder / "org_a.jsonl", folder / "org_acme corp.jsonl")
    (problem,) = _problems(folder)
    assert "org_acme corp.jsonl: organisation id 'acme corp'" in problem and ORG_ID_RULE in problem
    assert check_folder(folder, orgs=["a"]).ok  # a client reading its own file is not failed by another's name
    (folder / "org_acme corp.jsonl").rename(folder / "org_server.jsonl")
    (problem,) = _problems(folder)
    assert "org_server.jsonl: organisation id 'server'" in problem and "'server' is reserved" in problem


def test_an_org_the_leak_filter_empties_is_named_with_the_count(folder, caplog):
    _jsonl(folder / "org_b.jsonl", [{"query": "Will it rain tomorrow?", "tool": "get_weather", "success": True},
                                    {"query": "a hotel for two nights", "tool": "book_hotel", "success": True}])
    with caplog.at_level("WARNING"):
        ds = load_folder(folder)
    assert ds.orgs["b"] == [] and len(ds.orgs["a"]) == 6
    (warned,) = [r.getMessage() for r in caplog.records if "leak filter" in r.getMessage()]
    assert "org_b.jsonl" in warned and "all 2 records of organisation 'b'" in warned
    assert "2 equal to a test query" in warned


def test_a_catalog_of_the_wrong_shape_says_what_was_expected_and_found(folder):
    (folder / "catalog.json").write_text(json.dumps({"get_weather": "Forecast.", "book_hotel": "Rooms."}))
    (problem,) = _problems(folder)
    assert 'expected a tool object {"name", "description"}' in problem
    assert "found an object with keys 'get_weather', 'book_hotel'" in problem
    (folder / "catalog.json").write_text(json.dumps({"tools": {"get_weather": {}}}))
    assert '"tools" is a JSON object: expected a JSON list' in _problems(folder)[0]
    (folder / "catalog.json").write_text(json.dumps(CATALOG))
    (folder / "aliases.json").write_text('[["GetWeather", "get_weather"]]')
    assert "expected a JSON object of alias name -> tool name" in _problems(folder)[0]
    assert "found a JSON list" in _problems(folder)[0]


def test_two_catalog_files_are_refused_naming_both(folder):
    from synapse_flwr.core.errors import InputError
    from synapse_flwr.data.check import catalog_file

    _jsonl(folder / "catalog.jsonl", CATALOG[:1])
    (problem,) = _problems(folder)
    assert "both catalog.json and catalog.jsonl" in problem
    with pytest.raises(InputError, match="both catalog.json and catalog.jsonl"):
        catalog_file(folder)


def test_logs_named_json_are_named_with_the_name_read(folder, caplog):
    shutil.copy(folder / "org_a.jsonl", folder / "org_c.json")
    (folder / "test.jsonl").rename(folder / "test.json")
    with caplog.at_level("WARNING"):
        report = check_folder(folder)
    assert report.ok and report.orgs == {"a": 6, "b": 6} and report.test == 0
    assert "org_c.json: not read" in caplog.text and "named org_c.jsonl" in caplog.text
    assert "test.json: not read" in caplog.text and "named test.jsonl" in caplog.text


def test_logs_with_another_extension_or_in_a_subfolder_are_named_as_not_read(folder, caplog):
    # each was left out without a word, and an experiment re-partitioned the orgs that remained
    for name in ("org_c.ndjson", "org_d.JSONL", "test.jsonl.gz"):
        shutil.copy(folder / "org_a.jsonl", folder / name)
    for name in ("org_chart.png", "testing_notes.md"):  # not record files: nothing to say
        (folder / name).write_text("x")
    (folder / "orgs").mkdir()
    shutil.copy(folder / "org_a.jsonl", folder / "orgs" / "org_e.jsonl")
    with caplog.at_level("WARNING"):
        report = check_folder(folder)
    assert report.ok and report.orgs == {"a": 6, "b": 6}
    for name in ("org_c.ndjson: not read", "org_d.JSONL: not read", "test.jsonl.gz: not read",
                 "orgs: holds org_e.jsonl, not read"):
        assert name in caplog.text, caplog.text
    assert "org_chart.png" not in caplog.text and "testing_notes.md" not in caplog.text


def test_logs_named_outside_the_pattern_are_named_as_not_read(folder, caplog):
    shutil.copy(folder / "org_a.jsonl", folder / "orgC.jsonl")
    shutil.copy(folder / "org_a.jsonl", folder / "org-d.jsonl")
    with caplog.at_level("WARNING"):
        report = check_folder(folder)
    assert report.ok and report.orgs == {"a": 6, "b": 6}
    assert "orgC.jsonl: not read" in caplog.text and "org-d.jsonl: not read" in caplog.text
    assert "org_<id>.jsonl" in caplog.text and "org_a.jsonl: not read" not in caplog.text


def test_a_record_of_another_kind_is_named_as_that_kind(folder):
    _jsonl(folder / "org_a.jsonl", [*EVENTS[:6], TEST[0], CATALOG[0]])
    _jsonl(folder / "test.jsonl", [*TEST, EVENTS[0]])
    problems = _problems(folder)
    assert any("org_a.jsonl:7:" in p and "looks like a test item; test items go in test.jsonl" in p for p in problems)
    assert any("org_a.jsonl:8:" in p and "looks like a catalog entry; tools go in catalog.json" in p for p in problems)
    assert any("test.jsonl:3: field 'gold'" in p and "looks like an experience event; events go in org_<name>.jsonl"
               in p for p in problems)
    # a record of its own kind with a missing field is not sent elsewhere
    _jsonl(folder / "org_a.jsonl", [{"query": "q", "tool": "get_weather"}])
    assert "looks like" not in _problems(folder)[0]


def test_a_test_row_naming_its_answer_tool_is_told_to_call_it_gold(folder):
    _jsonl(folder / "test.jsonl", [*TEST, {"query": "rain in Oslo?", "tool": "get_weather"}])
    problems = _problems(folder)
    assert len(problems) == 1 and "test.jsonl:3: field 'gold'" in problems[0]
    assert "rename 'tool' to 'gold'" in problems[0] and "looks like" not in problems[0]


def test_an_alias_of_the_table_resolves_records_and_a_bad_one_is_named(folder):
    (folder / "aliases.json").write_text('{"forecast": "get_weather"}')
    _jsonl(folder / "org_a.jsonl", [*EVENTS[:6], {"query": "sun on sunday", "tool": "Forecast", "success": True}])
    assert _problems(folder) == []
    assert load_folder(folder).orgs["a"][-1].tool == "get_weather"
    (folder / "aliases.json").write_text('{"forecast": "get_forecast"}')
    (problem,) = _problems(folder)
    assert "aliases.json" in problem and "no tool 'get_forecast' in the catalog" in problem
    (folder / "aliases.json").write_text('{"book_hotel": "get_weather"}')
    (problem,) = _problems(folder)
    assert "'book_hotel' is already a name of the tool 'book_hotel'" in problem
    # regression (dress rehearsal): only the first bad alias was named, one run each
    (folder / "aliases.json").write_text('{"forecast": "get_forecast", "ok": "get_weather", "?": "book_hotel"}')
    problems = _problems(folder)
    assert len(problems) == 2 and "no tool 'get_forecast'" in problems[0] and "'?'" in problems[1]
    with pytest.raises(InputError, match=r"no tool 'get_forecast' in the catalog \(and 1 more in the table\)"):
        load_catalog(folder / "catalog.json")


def test_a_file_that_is_not_utf8_asks_for_utf8(folder):
    (folder / "org_b.jsonl").write_bytes(json.dumps(EVENTS[6]).encode() + b'\n{"query": "caf\xe9"}\n')
    (problem,) = _problems(folder)
    assert "org_b.jsonl: not UTF-8 text (byte 0xe9 on line 2): save it as UTF-8" in problem
    (folder / "aliases.json").write_bytes(b'{"caf\xe9": "get_weather"}')
    assert "aliases.json: not UTF-8 text" in _problems(folder)[0]


def test_a_missing_required_file_points_at_the_dataset_option(folder):
    for p in folder.glob("org_*.jsonl"):
        p.unlink()
    assert 'dataset = "FOLDER"' in _problems(folder)[0]
    (folder / "catalog.json").unlink()
    (problem,) = _problems(folder)
    assert "no catalog.json or catalog.jsonl" in problem and "--set dataset=FOLDER" in problem


def test_a_folder_checked_again_is_announced_once(folder, caplog):
    """An experiment rechecks its folder before every Flower run: the log says 'checked' once."""
    with caplog.at_level("DEBUG", logger="synapse_flwr"):
        require_valid(folder)
        require_valid(folder)
    said = [r.levelname for r in caplog.records if r.getMessage().startswith(f"checked {folder}")]
    assert said == ["INFO", "DEBUG"]


def test_a_description_under_another_key_is_named_with_the_undocumented_tools(folder, caplog):
    """A converter that wrote `desc` gets tools routed on their names alone: the warning names the key."""
    (folder / "catalog.json").write_text(json.dumps([
        {"name": "get_weather", "desc": "Forecast for a city."},
        {"type": "function", "function": {"name": "book_hotel", "description": "Reserve a room.", "strict": True}},
        {"name": "send_email", "description": "Send an email.", "title": "Email", "annotations": {}},
    ]))
    with caplog.at_level("INFO"):
        report = require_valid(folder)
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if "catalog.json" in r.getMessage()]
    assert report.tools == 3 and len(messages) == 1
    level, message = messages[0]
    assert level == "WARNING"
    assert "1 of 3 tools have neither a description nor example requests ('get_weather')" in message
    assert "fields of the entries not read: 'annotations' (1 entry), 'desc' (1 entry), 'function.strict' (1 entry), " \
           "'title' (1 entry)" in message


def test_fields_a_documented_catalog_does_not_read_are_only_noted(folder, caplog):
    entries = [{**t, "title": t["name"].title()} for t in CATALOG]
    (folder / "catalog.json").write_text(json.dumps({"tools": entries}))
    with caplog.at_level("INFO"):
        load_catalog(folder / "catalog.json")
    noted = [r for r in caplog.records if "not read" in r.getMessage()]
    assert [r.levelname for r in noted] == ["INFO"]
    assert noted[0].getMessage().endswith(f"fields of the catalog's entries not read (docs/formats.md): "
                                          f"'title' ({len(CATALOG)} entries)")


def test_test_items_repeating_a_query_are_merged_into_one_item(folder, caplog):
    """Regression: one line per (query, tool) pair scored the query twice, once in each split, right at most once."""
    _jsonl(folder / "test.jsonl", TEST + [{"query": "Convert 15 SEK to INR", "gold": "convert_currency"},
                                          {"query": "convert  15 sek to inr", "gold": ["book_hotel"]},
                                          {"query": "will it rain tomorrow", "gold": "get_weather"},
                                          {"query": "will it rain tomorrow?", "gold": "book_hotel"}])
    ds = load_folder(folder)
    assert [(i.query, i.gold) for i in ds.seen_test] == [
        ("will it rain tomorrow", ("get_weather",)), ("a hotel for two nights", ("book_hotel",)),
        ("Convert 15 SEK to INR", ("convert_currency", "book_hotel")),
        ("will it rain tomorrow?", ("book_hotel",))]  # other punctuation: another request
    assert ds.heldout_test == []
    assert "test.jsonl: 2 items repeat an earlier item's query; each is merged into it" in caplog.text


def test_a_query_written_as_a_chat_transcript_is_read_as_its_last_user_message(folder, caplog):
    """Regression (dress rehearsal): a converter that wrote each test query as a JSON-dumped chat transcript passed
    check-data silently and docs_only fell 0.808 -> 0.667 (the system prompt and JSON syntax embedded first); the
    same transcript as a JSON list was refused with pydantic's "Input should be a valid string"."""
    import logging

    system = {"role": "system", "content": "You are a helpful assistant with access to tools."}
    said = [[system, {"role": "user", "content": q["query"]}] for q in TEST]
    _jsonl(folder / "test.jsonl", [{"query": json.dumps(said[0]), "gold": "get_weather"},
                                   {"query": said[1], "gold": "book_hotel"}])
    _jsonl(folder / "org_a.jsonl", [{**e, "query": {"messages": [system, {"role": "assistant", "content": "Hi"},
                                                                {"role": "user", "content": [{"type": "text",
                                                                                              "text": e["query"]}]}]}}
                                    for e in EVENTS[:6]])
    with caplog.at_level(logging.WARNING, logger="synapse_flwr"):
        assert _problems(folder) == []
    assert "2 queries are chat transcripts" in caplog.text and "6 queries are chat transcripts" in caplog.text
    assert [i.query for i in load_testset(folder / "test.jsonl")] == [q["query"] for q in TEST]
    assert [e.query for e in load_experience(folder / "org_a.jsonl")] == [e["query"] for e in EVENTS[:6]]
    # ShareGPT's messages (ToolACE and other chat datasets), under "conversations"
    _jsonl(folder / "test.jsonl", [{"query": {"conversations": [{"from": "system", "value": "Tools: ..."},
                                                                {"from": "human", "value": TEST[0]["query"]}]},
                                    "gold": "get_weather"}])
    assert [i.query for i in load_testset(folder / "test.jsonl")] == [TEST[0]["query"]]
    # a list that is not a transcript is still a mistake, named in the format's words
    _jsonl(folder / "test.jsonl", [{"query": ["will it rain", "tomorrow"], "gold": "get_weather"}])
    assert "test.jsonl:1: field 'query': expected a string, got ['will it rain'" in _problems(folder)[0]
    # and text that merely opens with a bracket is a query as it stands
    _jsonl(folder / "test.jsonl", [{"query": "[urgent] will it rain tomorrow", "gold": "get_weather"}])
    assert load_testset(folder / "test.jsonl")[0].query == "[urgent] will it rain tomorrow"
