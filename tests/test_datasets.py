"""Benchmark data: pins, loaders, leak filter, splits and non-IID partitions.

Tests marked ``data`` read the real MetaTool / tau-bench files and are skipped
when no data folder is found (set SYNAPSE_DATA_DIR to run them).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from synapse_flwr.core.catalog import make_catalog, parse_tool
from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.experience import Event
from synapse_flwr.core.phrases import normalize_text
from synapse_flwr.data import pins
from synapse_flwr.data.metatool import load_metatool
from synapse_flwr.data.pins import PINNED, tasks_module_to_json, verify
from synapse_flwr.data.protocol import (
    leak_filter,
    make_splits,
    near_duplicates,
    partition_noniid,
)
from synapse_flwr.data.taubench import (
    WRITE_TOOLS,
    load_taubench,
    taubench_events,
    taubench_step_items,
)


def _find_data() -> Path | None:
    try:
        return pins.data_dir()
    except SynapseError:
        return None


DATA = _find_data()
_skip_without_data = pytest.mark.skipif(
    DATA is None or not (DATA / "metatool").is_dir(),
    reason="benchmark data not found: set SYNAPSE_DATA_DIR to the shared data folder",
)


def needs_data(test):
    """Mark a test as reading the real data (marker ``data``); skipped without it."""
    return pytest.mark.data(_skip_without_data(test))


@pytest.fixture(scope="module")
def data() -> Path:
    assert DATA is not None
    return DATA


@pytest.fixture(scope="module")
def metatool(data):
    return load_metatool(data)


@pytest.fixture(scope="module")
def split42(metatool):
    return make_splits(metatool.catalog, metatool.events, seed=42)


def _event(query: str, tool: str = "weather") -> Event:
    return Event(query=query, tool=tool, success=True, gold=tool)


# --------------------------------------------------------------------------- location


def test_data_dir_env(tmp_path, monkeypatch):
    monkeypatch.setenv(pins.ENV_VAR, str(tmp_path))
    assert pins.data_dir() == tmp_path
    monkeypatch.setenv(pins.ENV_VAR, str(tmp_path / "missing"))
    with pytest.raises(SynapseError, match=pins.ENV_VAR):
        pins.data_dir()


def test_data_dir_relative_and_missing(tmp_path, monkeypatch):
    monkeypatch.delenv(pins.ENV_VAR, raising=False)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "main").mkdir()
    monkeypatch.chdir(tmp_path / "main")
    assert pins.data_dir() == (tmp_path / "shared" / "data").resolve()
    # Neither the working directory nor the repository root has ../shared/data.
    (tmp_path / "shared" / "data").rmdir()
    monkeypatch.setattr(pins, "__file__", str(tmp_path / "x" / "pkg" / "pins.py"))
    with pytest.raises(SynapseError, match="SYNAPSE_DATA_DIR"):
        pins.data_dir()


# --------------------------------------------------------------------------- pins


def test_pins_cover_the_shipped_checksums():
    assert {p.path for p in PINNED} == {
        "metatool/LICENSE",
        "metatool/all_clean_data.csv",
        "metatool/multi_tool_query_golden.json",
        "metatool/plugin_des.json",
        "metatool/plugin_info.json",
        "taubench-retail/LICENSE",
        "taubench-retail/tasks_dev.json",
        "taubench-retail/tasks_test.json",
        "taubench-retail/tasks_train.json",
        "taubench-retail/tools.json",
        "taubench-retail/wiki.md",
    }
    for pin in PINNED:
        assert len(pin.sha256) == 64 and len(pin.commit) == 40
        assert all(
            u.startswith(f"https://raw.githubusercontent.com/{pin.repo}/{pin.commit}/")
            for u in pin.urls()
        )


@needs_data
def test_verify_real_files_match_sha256sums(data):
    assert len(verify(data)) == len(PINNED)
    sums = dict(
        reversed(line.split()) for line in (data / "SHA256SUMS").read_text().splitlines() if line
    )
    assert {f"./{p.path}": p.sha256 for p in PINNED} == sums


@needs_data
def test_verify_catches_tampered_file(data, tmp_path):
    target = tmp_path / "metatool" / "plugin_des.json"
    target.parent.mkdir()
    shutil.copyfile(data / "metatool" / "plugin_des.json", target)
    assert verify(tmp_path) == ["metatool/plugin_des.json"]  # absent files are skipped
    target.write_bytes(target.read_bytes().replace(b"calculator", b"calculat0r", 1))
    with pytest.raises(SynapseError, match="sha256"):
        verify(tmp_path)
    with pytest.raises(SynapseError, match="sha256"):
        load_metatool(tmp_path)


# --------------------------------------------------------------------------- download


def _tasks_module(tasks: list[dict], name: str) -> str:
    """An upstream-style tasks module (Task/Action calls) holding these tasks."""
    items = []
    for t in tasks:
        actions = ", ".join(
            f"Action(name={a['name']!r}, kwargs={a['kwargs']!r})" for a in t["actions"]
        )
        items.append(
            f"    Task(\n        annotator='0',\n        user_id={t['user_id']!r},\n"
            f"        instruction={t['instruction']!r},\n        actions=[{actions}],\n"
            f"        outputs={t['outputs']!r},\n    ),"
        )
    return (
        "from tau_bench.types import Task, Action\n\n"
        + f"{name} = [\n"
        + "\n".join(items)
        + "\n]\n"
    )


def _tool_module(info: dict) -> str:
    return (
        "import json\nfrom typing import Any, Dict\nfrom tau_bench.envs.tool import Tool\n\n\n"
        "class T(Tool):\n    @staticmethod\n    def invoke(data: Dict[str, Any]) -> str:\n"
        "        return json.dumps(data)\n\n    @staticmethod\n"
        f"    def get_info() -> Dict[str, Any]:\n        return {info!r}\n"
    )


@needs_data
def test_download_offline_reproduces_every_pin(data, tmp_path, monkeypatch):
    """Serve upstream-shaped sources from the local copy; download must rebuild every file."""
    served: dict[str, bytes] = {}
    tools = {
        t["function"]["name"]: t
        for t in json.loads((data / "taubench-retail/tools.json").read_text())
    }
    for pin in PINNED:
        if pin.convert == "tasks":
            tasks = json.loads((data / pin.path).read_text())
            split = Path(pin.path).stem.split("_")[1].upper()
            served[pin.urls()[0]] = _tasks_module(tasks, f"TASKS_{split}").encode()
        elif pin.convert == "tools":
            for url in pin.urls():
                served[url] = _tool_module(tools[Path(url).stem]).encode()
        else:
            served[pin.urls()[0]] = (data / pin.path).read_bytes()
    monkeypatch.setattr(pins, "_fetch", lambda url, timeout: served[url])
    written = pins.download(tmp_path)
    assert len(written) == len(PINNED)
    assert len(verify(tmp_path)) == len(PINNED)
    assert pins.download(tmp_path) == []  # already there, nothing fetched again

    bad = tmp_path / "bad"
    monkeypatch.setattr(pins, "_fetch", lambda url, timeout: served[url] + b" ")
    with pytest.raises(SynapseError, match="sha256"):
        pins.download(bad)
    assert not bad.exists() or not any(p.is_file() for p in bad.rglob("*"))


def test_task_conversion_never_runs_code():
    source = (
        "import os\nTASKS_TEST = [Task(user_id='u', instruction='i', "
        "actions=[Action(name=__import__('os').system('echo pwned'), kwargs={})])]\n"
    )
    with pytest.raises(SynapseError, match="not a literal"):
        tasks_module_to_json(source, "tasks_test.py")
    ok = "TASKS_DEV = [Task(annotator='', user_id='u', instruction='i', actions=[], outputs=[])]"
    assert json.loads(tasks_module_to_json(ok)) == [
        {"task_id": 0, "user_id": "u", "instruction": "i", "actions": [], "outputs": []}
    ]


# --------------------------------------------------------------------------- MetaTool


@needs_data
def test_metatool_catalog_and_events(metatool):
    catalog, events, report = metatool
    assert len(catalog) == 199
    # Every label of the CSV is spelled exactly as in plugin_des.json: no garbage,
    # no unknown label, nothing resolved only through an alias.
    assert report.rows == 20614 and report.kept == len(events) == 20614
    assert (report.garbage_query, report.unknown_label, report.alias_labels) == (0, 0, 0)
    assert {e.gold for e in events} == set(catalog.ids)
    assert all(e.success and e.tool == e.gold for e in events)
    assert catalog.resolve("PDF&URLTool") == "pdf_urltool"


@needs_data
def test_metatool_extra_tools(data, metatool):
    catalog, events, report = load_metatool(data, with_extra_tools=True)
    # 390 manifests: 154 describe one of the 199 labelled tools, 3 repeat another
    # manifest, 233 are new unlabelled tools.
    assert (report.extra_tools, report.skipped_manifests) == (233, 157)
    assert len(catalog) == 199 + 233
    assert set(metatool.catalog.ids) < set(catalog.ids)
    assert len(events) == 20614
    labelled = {e.gold for e in events}
    assert len(set(catalog.ids) - labelled) == 233
    # A labelled tool keeps its plugin_des.json description.
    assert catalog.get("calculator").description == metatool.catalog.get("calculator").description


def test_metatool_garbage_is_dropped_and_counted(tmp_path):
    root = tmp_path / "metatool"
    root.mkdir()
    (root / "plugin_des.json").write_text(
        json.dumps({"WeatherTool": "Forecasts.", "NewsTool": "Headlines."})
    )
    (root / "all_clean_data.csv").write_text(
        "Query,Tool\n"
        "Will it rain tomorrow?,WeatherTool\n"
        "Latest headlines please,news-tool\n"
        '"",WeatherTool\n'
        "???,NewsTool\n"
        "Book me a flight,FlightTool\n"
    )
    catalog, events, report = load_metatool(tmp_path, check=False)
    assert [e.gold for e in events] == ["weathertool", "newstool"]
    assert (report.rows, report.kept, report.garbage_query, report.unknown_label) == (5, 2, 2, 1)
    assert report.alias_labels == 1


# --------------------------------------------------------------------------- tau-bench


@needs_data
@pytest.mark.parametrize(
    ("split", "n_tasks", "n_calls"), [("train", 500, 768), ("test", 115, 582), ("dev", 20, 25)]
)
def test_taubench_splits(data, split, n_tasks, n_calls):
    catalog, tasks = load_taubench(data, split)
    assert len(catalog) == 16
    assert len(tasks) == n_tasks
    items = taubench_step_items(tasks)
    assert len(items) == sum(len(t.actions) for t in tasks) == n_calls
    for item in items:
        task = tasks[item.task_id]
        assert item.gold == task.actions[item.step]
        assert item.prev_tool == (task.actions[item.step - 1] if item.step else None)
        assert item.query == task.instruction  # the history is never appended to the query
        assert item.kind == ("first" if item.step == 0 else "write" if item.gold in WRITE_TOOLS else "read")


@needs_data
def test_taubench_events(data):
    _, tasks = load_taubench(data, "test")
    task = next(t for t in tasks if len(t.actions) >= 3)
    events = taubench_events([task])
    assert [e.gold for e in events] == list(task.actions)
    assert [e.prev_tool for e in events] == [None, *task.actions[:-1]]
    assert {e.query for e in events} == {task.instruction}
    assert all(e.success for e in events)


def test_taubench_unknown_split():
    with pytest.raises(ValueError, match="split"):
        load_taubench(Path("."), "validation")


# --------------------------------------------------------------------------- leak filter


def test_leak_filter_synthetic():
    catalog = make_catalog([parse_tool({"name": "weather"}), parse_tool({"name": "news"})])
    test = ["Will it rain in Paris tomorrow morning?", "Show me today's football results"]
    train = [
        _event("will it RAIN in paris,   tomorrow morning"),  # exact after normalisation
        _event("Will it rain in Paris tomorrow mornings?"),  # near duplicate
        _event("What are the top headlines in Berlin?", "news"),  # distinct
        Event(query="Book a flight to Rome", tool="flights", success=True),  # not in catalog
    ]
    kept, report = leak_filter(train, test, jaccard=0.8, catalog=catalog)
    assert [e.query for e in kept] == ["What are the top headlines in Berlin?"]
    assert (report.total, report.exact, report.near, report.garbage, report.kept) == (4, 1, 1, 1, 1)
    # Without a catalog the unknown tool is not garbage.
    _, report = leak_filter(train, test)
    assert (report.garbage, report.kept) == (0, 2)


def test_leak_filter_compares_text_that_reads_alike():
    """Regression (data review): a decomposed accent (macOS writes NFD), fullwidth letters and "ß" against "SS"
    passed both the exact and the near-duplicate test, so a test query stayed in training."""
    import unicodedata

    test = ["Réserve un vol pour Zürich le 3 décembre", "book a hotel", "Straße nach Köln", "what's the weather",
            "I'm late, tell Bob", "a re-booking"]
    train = [_event(unicodedata.normalize("NFD", test[0])), _event("ｂｏｏｋ ａ ｈｏｔｅｌ"),
             _event("STRASSE NACH KÖLN"), _event("What are the top headlines in Berlin?", "news"),
             # a typographic apostrophe or hyphen (a phone's keyboard), short enough to escape the 3-gram test
             _event("what\u2019s the weather"), _event("I\u2019m late, tell Bob"), _event("a re\u2010booking")]
    kept, report = leak_filter(train, test)
    assert [e.query for e in kept] == ["What are the top headlines in Berlin?"] and report.exact == 6


def test_leak_filter_reads_the_request_inside_a_prompt_template(caplog):
    """Regression (acceptance pass): queries written into one long template ("Hi there. ... {request}. Please
    ...") were near duplicates of every test query in it, so a different request was dropped as a leak."""
    catalog = make_catalog([parse_tool({"name": "weather"}), parse_tool({"name": "news"})])
    wrap = ("Hi there. I have a somewhat complicated situation at work and at home, and I would really appreciate "
            "your help with the following: {}. Please also keep in mind that I am in a hurry and prefer short "
            "answers, thank you so much in advance for your help.")
    asks = ["msft share price", "who was napoleon", "lisbon weather", "spain football", "porto faro train",
            "ten euros in yen"]
    test = [wrap.format(a) for a in asks[:3]]
    train = [_event(wrap.format(a)) for a in asks[3:]]  # other requests in the same template
    train.append(_event(wrap.format("lisbon weathers")))  # a test request again: a leak
    assert near_duplicates([normalize_text(e.query) for e in train], [normalize_text(q) for q in test], 0.8).all()
    with caplog.at_level(logging.INFO, logger="synapse_flwr"):
        kept, report = leak_filter(train, test, jaccard=0.8, catalog=catalog)
    assert [e.query for e in kept] == [e.query for e in train[:3]] and report.near == 1
    assert "the training events: 4 of 4 texts open or close with a wrapper of 32 words or more" in caplog.text
    # (the test set's three are too few to be a template on their own: its warning counts its own texts alone)
    assert "the test set:" not in caplog.text
    # without the template the same requests are compared as before
    assert leak_filter([_event(a) for a in asks[3:]], asks[:3], jaccard=0.8, catalog=catalog)[1].near == 0


def test_leak_filter_reads_the_request_inside_an_agent_prompt_of_hundreds_of_words():
    """Regression (dress rehearsal, ToolBench-like folder): a template was recognised by its first 64 words only,
    so with a longer one every request in it was a near duplicate of every test query (201 of 204 records
    dropped); and a test query written into a template was not near its own request in training."""
    catalog = make_catalog([parse_tool({"name": "weather"}), parse_tool({"name": "news"})])
    vocabulary = ["tool", "agent", "call", "answer", "format", "json", "step", "think", "user", "api", "result"]
    template = " ".join(f"{vocabulary[i % len(vocabulary)]}{i % 7}" for i in range(200))
    asks = ["msft share price today", "who was napoleon bonaparte", "lisbon weather this weekend",
            "spain football results", "porto to faro train times", "ten euros in japanese yen",
            "news about the election", "best pizza in naples", "translate hello to german",
            "rain in oslo tomorrow", "nasdaq index now", "flights from rome"]
    for wrap in (f"{template} User query: {{}}. Begin!", f"{{}}. {template}"):
        test = [wrap.format(a) for a in asks[:6]]
        kept, report = leak_filter([_event(wrap.format(a)) for a in asks[6:]], test, jaccard=0.8, catalog=catalog)
        assert len(kept) == 6 and report.near == 0  # other requests in one template: kept
    # the test queries in a template, their requests alone in training: the same requests, dropped
    kept, report = leak_filter([_event(a) for a in asks[:6]], [f"{template} User query: {a}" for a in asks],
                               jaccard=0.8, catalog=catalog)
    assert kept == [] and report.near == 6


def test_leak_filter_reads_queries_in_every_script():
    # A benchmark in Chinese or Russian keeps its experience (it used to be dropped
    # whole as "garbage", no ASCII word in it) and still loses its leaks.
    catalog = make_catalog([parse_tool({"name": "weather"}), parse_tool({"name": "news"})])
    test = ["北京明天天气怎么样？", "Какая погода завтра в Москве?"]
    train = [
        _event("北京明天天气怎么样"),  # exact after normalisation
        _event("北京明天的天气怎么样？"),  # near duplicate
        _event("上海今天有什么新闻", "news"),
        _event("Какие новости сегодня в Берлине?", "news"),
        _event("Wie wird das Wetter morgen in München?"),
        _event("17*23"),  # a request without a letter is still one
    ]
    kept, report = leak_filter(train, test, jaccard=0.6, catalog=catalog)
    assert [e.query for e in kept] == [e.query for e in train[2:6]]
    assert (report.exact, report.near, report.garbage) == (1, 1, 0)
    assert normalize_text("München Straße") == "münchen straße"


@needs_data
def test_near_duplicates_is_exact(metatool):
    """The prefix-filtered search finds exactly what an all-pairs scan finds."""

    def shingles(key: str) -> set[str]:
        key = key.ljust(3, "\0")
        return {key[i : i + 3] for i in range(len(key) - 2)}

    keys = [normalize_text(e.query) for e in metatool.events[::40]]
    queries = keys[:300] + [k[:-2] for k in keys[300:400]] + ["ab", "x"]
    reference = keys[300:500] + ["ab"]
    ref_sets = [shingles(k) for k in reference]
    for threshold in (0.5, 0.8, 1.0):
        fast = near_duplicates(queries, reference, threshold)
        slow = [
            any(len(a & b) >= threshold * len(a | b) for b in ref_sets)
            for a in map(shingles, queries)
        ]
        assert fast.tolist() == slow


# --------------------------------------------------------------------------- splits


@needs_data
def test_real_split_seed42(metatool, split42):
    assert len(split42.heldout_tools) == 40  # 20% of 199
    heldout = set(split42.heldout_tools)
    assert not {e.gold for e in split42.train} & heldout
    assert {g for t in split42.heldout_test for g in t.gold} == heldout
    assert not {g for t in split42.seen_test for g in t.gold} & heldout
    # Measured: 12,968 training candidates, 30 exact and 26 near (Jaccard >= 0.8)
    # duplicates of test queries, no garbage.
    leak = split42.leak
    assert (leak.total, leak.exact, leak.near, leak.garbage, leak.kept) == (12968, 30, 26, 0, 12912)
    assert (len(split42.train), len(split42.seen_test), len(split42.heldout_test)) == (
        12912,
        3250,
        4383,
    )
    test_keys = {normalize_text(t.query) for t in (*split42.seen_test, *split42.heldout_test)}
    assert not {normalize_text(e.query) for e in split42.train} & test_keys


@needs_data
def test_splits_deterministic_per_seed(metatool):
    events = metatool.events[::5]
    a = make_splits(metatool.catalog, events, seed=7, test_per_tool=5)
    b = make_splits(metatool.catalog, events, seed=7, test_per_tool=5)
    c = make_splits(metatool.catalog, events, seed=8, test_per_tool=5)
    assert a == b
    assert a.heldout_tools != c.heldout_tools
    per_tool = Counter(g for t in (*a.seen_test, *a.heldout_test) for g in t.gold)
    assert max(per_tool.values()) <= 5


def test_splits_exclude_heldout_tools_in_every_role():
    tools = [f"t{i}" for i in range(10)]
    catalog = make_catalog(parse_tool({"name": t}) for t in tools)
    events = [
        Event(
            query=f"query {i} about {t} number {i * 7}",
            tool=t,
            success=True,
            gold=t,
            prev_tool=tools[(j + 1) % 10],
        )
        for j, t in enumerate(tools)
        for i in range(10)
    ]
    s = make_splits(catalog, events, seed=0, heldout_frac=0.2)
    heldout = set(s.heldout_tools)
    assert len(heldout) == 2
    assert not {n for e in s.train for n in (e.tool, e.gold, e.prev_tool)} & heldout
    assert len(s.heldout_test) == 20  # every event of both held-out tools
    assert len(s.seen_test) == 8 * 2  # 20% of 10 events of each seen tool


# --------------------------------------------------------------------------- partition


@needs_data
def test_partition_noniid(metatool):
    events = metatool.events
    parts = partition_noniid(events, k=5, alpha=0.1, seed=0)
    assert len(parts) == 5
    flat = [e for p in parts for e in p]
    assert len(flat) == len(events)
    assert Counter((e.query, e.gold) for e in flat) == Counter((e.query, e.gold) for e in events)
    assert all(e.org == f"org{i}" for i, p in enumerate(parts) for e in p)
    per_tool: dict[str, Counter] = defaultdict(Counter)
    for e in flat:
        per_tool[e.gold][e.org] += 1
    top2 = [
        sum(c for _, c in orgs.most_common(2)) / sum(orgs.values()) for orgs in per_tool.values()
    ]
    # Measured with seed 0: 86% of tools have >= 90% of their events in two orgs.
    assert sum(share >= 0.9 for share in top2) / len(top2) > 0.75
    again = partition_noniid(events, k=5, alpha=0.1, seed=0)
    assert [[e.query for e in p] for p in again] == [[e.query for e in p] for p in parts]


def test_partition_iid_limit_and_arguments():
    events = [_event(f"query {i}", f"tool{i % 4}") for i in range(4000)]
    parts = partition_noniid(events, k=4, alpha=1000.0, seed=1)
    assert all(900 <= len(p) <= 1100 for p in parts)
    with pytest.raises(ValueError):
        partition_noniid(events, k=0, alpha=1.0, seed=0)
    with pytest.raises(ValueError):
        partition_noniid(events, k=2, alpha=0.0, seed=0)


def test_a_template_on_the_test_queries_alone_is_named_on_the_test_set_once(caplog):
    """Regression (dress rehearsal): a wrapper only the test queries carried was warned of as "org_0.jsonl and the
    test set", once for every organisation."""
    wrap = ("Dear assistant, I hope this message finds you well. I would be most grateful if you could help me with "
            "a small request of mine, namely: {}. Thank you very much in advance for your kind and patient help!")
    test = [wrap.format(a) for a in ("msft share price", "lisbon weather", "porto faro train", "ten euros in yen",
                                     "rome museums", "kyoto temples")]
    with caplog.at_level(logging.WARNING, logger="synapse_flwr"):
        for org in ("org_p.jsonl", "org_q.jsonl"):
            leak_filter([_event(a) for a in ("who was napoleon", "spain football", "oslo rain")], test, source=org)
    said = [r.getMessage() for r in caplog.records if "wrapper" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("the test set: 6 of 6 texts")


def test_the_test_set_s_template_is_counted_on_the_test_set_alone():
    """Regression (diff review): the test set's wrappers were found together with each organisation's log, so
    organisations of other sizes counted them differently ("16 of 16", "10 of 16") and each warned again."""
    from synapse_flwr.data import protocol

    wraps = [("Dear assistant, I hope this message finds you well. I would be most grateful if you could help me "
              "with a small request of mine, namely: {}. Thank you very much in advance for your kind help!"),
             ("Hello there, I am writing to you today because I need some assistance with the following task that "
              "came up at work this week: {}. Please answer briefly, as I am in a hurry right now, thanks!")]
    test = [w.format(f"request number {i} about topic {i * 7}") for w, n in zip(wraps, (6, 10)) for i in range(n)]
    said = []
    for n in (3, 700):
        train = [_event(f"a different request {i} on subject {i * 13}") for i in range(n)]
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(protocol, "warn_once", lambda _log, message: said.append(message))
            leak_filter(train, test, source=f"org_{n}.jsonl")
    assert len(said) == 2 and said[0] == said[1] and said[0].startswith("the test set: 16 of 16 texts")
