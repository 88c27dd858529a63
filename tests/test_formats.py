"""Input formats: catalogs (three shapes), experience logs, test sets, atomic writes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from synapse_flwr.core.catalog import (
    AliasCollision,
    Catalog,
    ToolCollision,
    alias_key,
    entry_notes,
    load_catalog,
    make_catalog,
    normalize_tool_id,
    parse_tool,
)
from synapse_flwr.core.errors import InputError, SynapseError
from synapse_flwr.core.experience import (
    Event,
    event_label,
    load_experience,
    load_testset,
    write_jsonl,
)
from synapse_flwr.core.files import read_records, write_atomic
from synapse_flwr.core.schema import MAX_DESCRIPTION

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

PLAIN = {"name": "get_weather", "description": "Current  weather\nfor a city.", "parameters": PARAMS}
OPENAI = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather for a city.", "parameters": PARAMS},
}
MCP = {"name": "get_weather", "description": "Current weather for a city.", "inputSchema": PARAMS}


def write_jsonl_file(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def raises_input_error(fn, *args, **kwargs) -> InputError:
    with pytest.raises(InputError) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, SynapseError)
    return info.value


# --------------------------------------------------------------------------- catalog


def test_three_shapes_parse_to_the_same_tool():
    docs = [parse_tool(obj) for obj in (PLAIN, OPENAI, MCP)]
    for doc in docs:
        assert doc.tool_id == "get_weather"
        assert doc.name == "get_weather"
        assert doc.description == "Current weather for a city."  # whitespace collapsed
        assert dict(doc.parameters) == PARAMS
        assert doc.aliases == ()
    assert docs[0] == docs[1] == docs[2]


@pytest.mark.parametrize("shape", [PLAIN, OPENAI, MCP])
def test_each_shape_loads_from_a_file(tmp_path, shape):
    cat = load_catalog(write_jsonl_file(tmp_path / "c.jsonl", [shape]))
    assert cat.ids == ["get_weather"]
    assert cat.get("get_weather").description == "Current weather for a city."


def test_mixed_shapes_in_one_catalog(tmp_path):
    records = [
        {"name": "Book Flight", "description": "Book a flight."},
        {"type": "function", "function": {"name": "convertCurrency", "description": "FX."}},
        {"name": "search-web", "description": "Search.", "inputSchema": {"type": "object"}},
    ]
    cat = load_catalog(write_jsonl_file(tmp_path / "c.jsonl", records))
    assert cat.ids == ["book_flight", "convertcurrency", "search-web"]  # sorted by id
    assert len(cat) == 3
    assert cat.descriptions() == {"book_flight": "Book a flight.", "convertcurrency": "FX.", "search-web": "Search."}
    assert cat.resolve("convert_currency") == "convertcurrency"
    assert cat.resolve("SEARCH_WEB") == "search-web"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Get Weather!", "get_weather"),
        ("  get_weather  ", "get_weather"),
        ("GetWeather", "getweather"),
        ("get-weather", "get-weather"),
        ("api.v2/Search", "api.v2_search"),
        ("__private__", "private"),
        ("Café au lait", "cafe_au_lait"),
        ("天気", "u5929u6c17"),
        ("get_天气", "get_u5929u6c14"),
        ("x" * 200, "x" * 128),
    ],
)
def test_normalize_tool_id(name, expected):
    assert normalize_tool_id(name) == expected


def test_names_in_other_scripts_stay_distinct_tools():
    cat = make_catalog([parse_tool({"name": "天气查询", "description": "weather"}), parse_tool({"name": "酒店预订", "description": "hotels"})])
    assert len(cat) == 2
    assert cat.resolve("天气查询") != cat.resolve("酒店预订")


@pytest.mark.parametrize("name", ["", "   ", "!!!", "___", "📅"])
def test_normalize_rejects_names_without_letters_or_digits(name):
    with pytest.raises(ValueError, match="no letters or digits"):
        normalize_tool_id(name)


def test_declared_alias_collapse_first_id_wins():
    docs = [
        parse_tool({"name": "get_weather", "description": ""}),
        parse_tool({"name": "GetWeather", "description": "Weather now."}),
        parse_tool({"name": "get-weather", "description": "other", "aliases": ["weather"]}),
    ]
    cat = make_catalog(docs, {"GetWeather": "get_weather", "get-weather": "get_weather"})
    assert cat.ids == ["get_weather"]
    doc = cat.tools[0]
    assert doc.name == "get_weather"
    assert doc.description == "Weather now."  # missing description filled from a later duplicate
    assert set(doc.aliases) == {"GetWeather", "get-weather", "weather"}
    for spelling in ("GetWeather", "get-weather", "get_weather", "GET WEATHER", "weather", "Get.Weather"):
        assert cat.resolve(spelling) == "get_weather", spelling
        assert cat.get(spelling) is doc
    assert cat.resolve("get_forecast") is None
    assert cat.get("get_forecast") is None


def test_declared_alias_order_decides_the_id():
    cat = make_catalog([parse_tool({"name": "GetWeather", "aliases": ["get_weather"]}),
                        parse_tool({"name": "get_weather"})])
    assert cat.ids == ["getweather"]
    assert cat.tools[0].aliases == ("get_weather",)
    assert cat.resolve("get_weather") == "getweather"


def test_undeclared_collision_is_an_error_naming_both():
    docs = [parse_tool({"name": "qrcodegenerator", "description": "A."}),
            parse_tool({"name": "qr_code_generator", "description": "B."})]
    with pytest.raises(ToolCollision, match="'qrcodegenerator' and 'qr_code_generator'"):
        make_catalog(docs)
    with pytest.raises(ToolCollision):  # the same name twice is two entries too (file readers drop exact repeats)
        make_catalog([docs[0], docs[0]])


@pytest.mark.parametrize("entries, match", [
    # an entry's own alias took another tool's name: every record naming book_hotel went to the lister
    ([{"name": "accommodation_search", "aliases": ["book_hotel"]}, {"name": "book_hotel"}],
     "'accommodation_search' lists the alias 'book_hotel', which is already the name of the tool 'book_hotel'"),
    # two entries listing one alias: records naming it went to whichever sorted first
    ([{"name": "book_hotel", "aliases": ["lodging"]}, {"name": "rent_apartment", "aliases": ["Lodging"]}],
     "'rent_apartment' lists the alias 'Lodging', which is already an alias of the tool 'book_hotel'"),
])
def test_an_entry_alias_naming_another_tool_is_refused(entries, match):
    with pytest.raises(AliasCollision, match=match):
        make_catalog([parse_tool(e) for e in entries])


def test_names_in_two_unicode_forms_are_one_name(tmp_path, caplog):
    """Regression (data review): "Café_Finder" composed and decomposed printed alike and were named a collision
    that only an alias typed byte for byte could lift; a word-for-word repeat is now read once."""
    import unicodedata

    nfc, nfd = (unicodedata.normalize(form, "Café_Finder") for form in ("NFC", "NFD"))
    entries = [{"name": nfc, "description": "Find a café."}, {"name": nfd, "description": "Find a café."}]
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(entries), encoding="utf-8")
    catalog = load_catalog(path)
    assert len(catalog) == 1 and catalog.tools[0].name == nfc and catalog.resolve(nfd) == catalog.tools[0].tool_id
    entries[1]["description"] = "Another text."
    path.write_text(json.dumps(entries), encoding="utf-8")
    assert "duplicate tool 'Café_Finder' with another description" in str(raises_input_error(load_catalog, path))


def test_an_entry_alias_of_its_own_spellings_is_kept():
    catalog = make_catalog([parse_tool({"name": "get_weather", "aliases": ["GetWeather", "weather"]}),
                            parse_tool({"name": "book_hotel"})])
    assert catalog.resolve("GetWeather") == catalog.resolve("weather") == "get_weather"


def test_an_alias_declares_its_own_spelling_not_every_spelling_of_its_key():
    """Every spelling of a name shares its alias key: a table naming Search.Web said nothing of SEARCH-WEB."""
    docs = [parse_tool({"name": "search_web", "description": "Search the web."}),
            parse_tool({"name": "SEARCH-WEB", "description": "Delete all files."})]
    with pytest.raises(ToolCollision, match="'search_web' and 'SEARCH-WEB'"):
        make_catalog(docs, {"Search.Web": "search_web"})
    assert make_catalog(docs, {"SEARCH-WEB": "search_web"}).get("search_web").description == "Search the web."


def test_alias_table_beside_the_catalog_file(tmp_path):
    path = write_jsonl_file(
        tmp_path / "c.jsonl",
        [{"name": "get_weather", "description": "W."}, {"name": "GetWeather"}, {"name": "get-weather"}],
    )
    with pytest.raises(InputError, match="entries at lines 1 and 2"):
        load_catalog(path)
    (tmp_path / "aliases.json").write_text('{"GetWeather": "get_weather", "get-weather": "get_weather"}')
    cat = load_catalog(path)
    assert len(cat) == 1 and cat.ids == ["get_weather"]
    assert set(cat.tools[0].aliases) == {"GetWeather", "get-weather"}


def test_declared_aliases_resolve():
    cat = make_catalog([parse_tool({"name": "get_weather", "aliases": ["forecast", "Wetter"]})])
    assert cat.resolve("Forecast") == "get_weather"
    assert cat.resolve("wetter") == "get_weather"
    assert alias_key("Get-Weather") == alias_key("get_weather") == "getweather"


def test_catalog_equality_ignores_index():
    a = make_catalog([parse_tool(PLAIN)])
    b = Catalog(a.tools)
    assert a == b


def test_catalog_text_is_folded_onto_one_line():
    # an org artifact carries it, and the edge refuses a control character there
    doc = parse_tool({"name": "t", "description": "Weather\x1b[0m now.\u2028Line two\r\n",
                      "examples": ["rain\x07 in oslo", "snow\n\ttomorrow"]})
    assert doc.description == "Weather [0m now. Line two"
    assert doc.examples == ("rain in oslo", "snow tomorrow")


def test_description_truncated_to_schema_limit():
    doc = parse_tool({"name": "t", "description": "d" * (MAX_DESCRIPTION + 50)})
    assert len(doc.description) == MAX_DESCRIPTION


def test_json_list_and_jsonl_both_accepted(tmp_path):
    records = [PLAIN, {"name": "book_flight", "description": "Book."}]
    as_list = tmp_path / "c.json"
    as_list.write_text(json.dumps(records, indent=2))
    as_jsonl = write_jsonl_file(tmp_path / "c.jsonl", records)
    with_blank = tmp_path / "blank.jsonl"
    with_blank.write_text("\n" + json.dumps(records[0]) + "\n\n   \n" + json.dumps(records[1]) + "\n")
    # an MCP tools/list result (or any {"tools": [...]} export), pretty-printed or on one line
    as_object = tmp_path / "tools.json"
    as_object.write_text(json.dumps({"tools": records}, indent=2))
    one_line = tmp_path / "tools_line.json"
    one_line.write_text(json.dumps({"tools": records}))
    cats = [load_catalog(p) for p in (as_list, as_jsonl, with_blank, as_object, one_line)]
    assert all(c == cats[0] for c in cats)
    assert cats[0].ids == ["book_flight", "get_weather"]
    # an object of another shape is named as such, not as one bad JSON line per line
    by_name = tmp_path / "by_name.json"
    by_name.write_text(json.dumps({"get_weather": "Weather.", "book_flight": "Book."}, indent=2))
    with pytest.raises(InputError, match=r"one JSON object \(keys 'get_weather', 'book_flight'\) where records"):
        load_catalog(by_name)


def test_read_records_line_numbers(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert list(read_records(p)) == [(1, {"a": 1}), (3, {"a": 2})]
    q = tmp_path / "r.json"
    q.write_text('[{"a": 1}, {"a": 2}]')
    lines = [line for line, _ in read_records(q)]
    assert lines == [1, 1] and [line.item for line in lines] == [1, 2] and str(lines[1]) == "1 (item 2)"


def test_a_pretty_printed_document_names_the_line_each_record_starts_on(tmp_path):
    """An MCP ``tools/list`` result as editors save it: the item's own line, not its number, plus the number."""
    tools = [{"name": "a", "description": "x", "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}},
             {"description": "no name", "inputSchema": {"type": "object"}}]
    path = tmp_path / "catalog.json"
    text = json.dumps({"server": {"tools": ["not these"]}, "tools": tools}, indent=2)
    path.write_text("\n" + text)
    first, second = [i for i, row in enumerate(text.splitlines(), start=2) if row == "    {"]  # the items' "{"
    assert [(int(line), line.item) for line, _ in read_records(path, catalog=True)] == [(first, 1), (second, 2)]
    err = raises_input_error(load_catalog, path)
    assert str(err).startswith(f"{path}:{second} (item 2): field 'name'")


# --------------------------------------------------------------------------- catalog errors


def test_missing_name_names_file_line_and_field(tmp_path):
    path = write_jsonl_file(tmp_path / "cat.jsonl", [PLAIN, {"description": "no name"}])
    err = raises_input_error(load_catalog, path)
    assert (err.path, err.line, err.field) == (str(path), 2, "name")
    assert str(err).startswith(f"{path}:2: field 'name':")
    assert "\n" not in str(err)


def test_a_name_no_record_could_give_is_refused_in_the_catalog(tmp_path):
    long = "restaurant_finder_" + "x" * 290  # records cap tool names at the same bound
    path = write_jsonl_file(tmp_path / "cat.jsonl", [PLAIN, {"name": long, "description": "Find one."}])
    err = raises_input_error(load_catalog, path)
    assert (err.line, err.field) == (2, "name") and "308 characters, at most 256" in str(err)
    ok = write_jsonl_file(tmp_path / "ok.jsonl", [PLAIN, {"name": long[:256], "description": "Find one."}])
    assert len(load_catalog(ok).ids) == 2


def test_openai_shape_errors_name_nested_field(tmp_path):
    bad = {"type": "function", "function": {"name": "x", "description": 5}}
    path = write_jsonl_file(tmp_path / "cat.jsonl", [bad])
    err = raises_input_error(load_catalog, path)
    assert (err.line, err.field) == (1, "function.description")
    assert "not a string" in err.message


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"name": "x", "description": ["a"]}, "description"),
        ({"name": 7}, "name"),
        ({"name": "   "}, "name"),
        ({"name": "!!!"}, "name"),
        ({"name": "x", "parameters": "string"}, "parameters"),
        ({"name": "x", "inputSchema": [1]}, "inputSchema"),
        ({"name": "x", "aliases": "y"}, "aliases"),
        ({"name": "x", "aliases": [1]}, "aliases"),
        ({"type": "function", "function": {"description": "no name"}}, "function.name"),
    ],
)
def test_bad_catalog_fields(tmp_path, record, field):
    path = write_jsonl_file(tmp_path / "cat.jsonl", [PLAIN, PLAIN, record])
    err = raises_input_error(load_catalog, path)
    assert (err.path, err.line, err.field) == (str(path), 3, field)
    assert f":3: field '{field}':" in str(err)


@pytest.mark.parametrize("entry", [
    {"name": "ping", "description": None},
    {"name": "ping", "description": None, "inputSchema": None},
    {"type": "function", "function": {"name": "ping", "description": None, "parameters": None}},
])
def test_a_null_description_reads_as_none_given(entry):
    """MCP and OpenAI entries may leave the description out; a converter that writes Python's None gives null."""
    doc = parse_tool(entry)
    assert (doc.tool_id, doc.description, doc.parameters) == ("ping", "", None)


def test_an_entry_repeated_word_for_word_is_read_once(tmp_path, caplog):
    """Catalogs concatenated from several sources list a tool twice; only a repeat that differs is ambiguous."""
    other = {"name": "get_time", "description": "Current time in a zone."}
    path = write_jsonl_file(tmp_path / "cat.jsonl", [PLAIN, other, OPENAI, other])  # OPENAI is PLAIN in another shape
    with caplog.at_level("WARNING"):
        catalog = load_catalog(path)
    assert catalog.ids == ["get_time", "get_weather"]
    assert any(f"{path}: 2 entries repeat an earlier entry word for word" in r.getMessage()
               and "'get_weather', 'get_time'" in r.getMessage() for r in caplog.records)
    differs = write_jsonl_file(tmp_path / "c2.jsonl", [PLAIN, {**other, "name": "get_weather"}])
    err = raises_input_error(load_catalog, differs)
    assert (err.line, err.field) == (None, "name")
    assert "duplicate tool 'get_weather' with another description, arguments or examples" in err.message
    # an alias of the same spelling declares nothing about two contents of one name
    (tmp_path / "aliases.json").write_text('{"GetWeather": "get_weather"}')
    assert "duplicate tool 'get_weather'" in raises_input_error(load_catalog, differs).message


def test_json_list_errors_name_item_number(tmp_path):
    path = tmp_path / "cat.json"
    path.write_text(json.dumps([PLAIN, {"name": "x", "description": 1}]))
    err = raises_input_error(load_catalog, path)
    assert (err.line, err.line.item, err.field) == (1, 2, "description")
    path.write_text(json.dumps([PLAIN, "not an object"]))
    err = raises_input_error(load_catalog, path)
    assert err.line.item == 2 and "not a JSON object" in err.message and ":1 (item 2):" in str(err)


def test_bad_json_line(tmp_path):
    path = tmp_path / "cat.jsonl"
    path.write_text(json.dumps(PLAIN) + "\n" + '{"name": "x", "description": \n')
    err = raises_input_error(load_catalog, path)
    assert err.line == 2 and "invalid JSON" in err.message
    assert str(err).startswith(f"{path}:2:")


def test_bad_json_in_list_names_line(tmp_path):
    path = tmp_path / "cat.json"
    path.write_text('[\n  {"name": "a"},\n  {"name": }\n]\n')
    err = raises_input_error(load_catalog, path)
    assert err.line == 3 and "invalid JSON" in err.message


@pytest.mark.parametrize("line", ['["a", "b"]', '"just a string"', "42", "null"])
def test_non_object_line(tmp_path, line):
    path = tmp_path / "cat.jsonl"
    path.write_text(json.dumps(PLAIN) + "\n" + line + "\n")
    err = raises_input_error(load_catalog, path)
    assert err.line == 2 and "not a JSON object" in err.message


@pytest.mark.parametrize("text", ["", "\n\n  \n", "[]"])
def test_empty_catalog(tmp_path, text):
    path = tmp_path / "cat.jsonl"
    path.write_text(text)
    err = raises_input_error(load_catalog, path)
    assert err.path == str(path) and "no tools" in err.message


def test_missing_catalog_file(tmp_path):
    err = raises_input_error(load_catalog, tmp_path / "nope.jsonl")
    assert err.path == str(tmp_path / "nope.jsonl") and "not found" in err.message


def test_undecodable_catalog_file(tmp_path):
    path = tmp_path / "cat.jsonl"
    path.write_bytes(b"\xff\xfe\x00bad")
    err = raises_input_error(load_catalog, path)
    assert err.message == "UTF-16 text (it starts with a UTF-16 byte order mark): save it as UTF-8"


@pytest.mark.parametrize(
    "payload",
    [
        '{"name": "x", "description": ' + "1" * 5000 + "}",  # beyond int digit limit
        "[" * 100_000,  # nested too deeply for the JSON parser
        '{"a":' * 100_000,
    ],
)
def test_hostile_json_is_an_input_error_not_a_crash(tmp_path, payload):
    path = tmp_path / "cat.jsonl"
    path.write_text(json.dumps(PLAIN) + "\n" + payload + "\n")
    err = raises_input_error(load_catalog, path)
    assert "invalid JSON" in err.message and err.line in (1, 2, None)


# --------------------------------------------------------------------------- experience


@pytest.fixture
def catalog(tmp_path):
    return load_catalog(
        write_jsonl_file(
            tmp_path / "cat.jsonl",
            [PLAIN, {"name": "geocode", "description": "Geocode."}, {"name": "BookFlight"}],
        )
    )


def test_valid_events_load_and_resolve_through_catalog(tmp_path, catalog):
    path = write_jsonl_file(
        tmp_path / "exp.jsonl",
        [
            {"query": "  weather in Paris ", "tool": "GetWeather", "success": True},
            {
                "query": "fly to Rome",
                "tool": "book-flight",
                "success": False,
                "gold": "book_flight",
                "org": "acme",
                "ts": "2026-01-02T10:00:00Z",
                "prev_tool": "Geocode",
            },
            {"query": "where is it", "tool": "geocode", "success": True, "ts": 1700000000},
            {"query": "and now", "tool": "geocode", "success": True, "ts": 1.5},
        ],
    )
    events = load_experience(path, catalog)
    assert [e.tool for e in events] == ["get_weather", "bookflight", "geocode", "geocode"]
    assert events[0].query == "weather in Paris"  # stripped
    assert events[1].gold == "bookflight" and events[1].prev_tool == "geocode"
    assert events[1].org == "acme" and events[1].ts == "2026-01-02T10:00:00Z"
    assert events[2].ts == 1700000000 and events[3].ts == 1.5
    assert events[0].gold is None and events[0].prev_tool is None


def test_events_without_catalog_are_normalised(tmp_path):
    path = write_jsonl_file(tmp_path / "exp.jsonl", [{"query": "q", "tool": "Get Weather!", "success": True}])
    assert load_experience(path)[0].tool == "get_weather"
    bad = write_jsonl_file(tmp_path / "bad.jsonl", [{"query": "q", "tool": "!!!", "success": True}])
    err = raises_input_error(load_experience, bad)
    assert (err.line, err.field) == (1, "tool")


def test_experience_as_json_list(tmp_path, catalog):
    path = tmp_path / "exp.json"
    path.write_text(json.dumps([{"query": "q", "tool": "get_weather", "success": True}]))
    assert len(load_experience(path, catalog)) == 1


def test_event_label_is_gold_else_a_successful_tool(catalog):
    ok = Event(query="q", tool="GetWeather", success=True)
    wrong = Event(query="q", tool="geocode", success=False, gold="Book-Flight")
    failed = Event(query="q", tool="geocode", success=False)
    assert [event_label(e) for e in (ok, wrong, failed)] == ["GetWeather", "Book-Flight", None]
    # through a catalog, aliases collapse and unknown tools have no label
    assert [event_label(e, catalog) for e in (ok, wrong, failed)] == ["get_weather", "bookflight", None]
    assert event_label(Event(query="q", tool="unknown_tool", success=True), catalog) is None


@pytest.mark.parametrize("field", ["tool", "gold", "prev_tool"])
def test_unknown_tool_names_line_and_field(tmp_path, catalog, field):
    event = {"query": "q", "tool": "get_weather", "success": True, field: "teleport"}
    path = write_jsonl_file(tmp_path / "exp.jsonl", [{"query": "ok", "tool": "geocode", "success": True}, event])
    err = raises_input_error(load_experience, path, catalog)
    assert (err.path, err.line, err.field) == (str(path), 2, field)
    assert "'teleport' is not in the catalog" in err.message
    assert str(err).startswith(f"{path}:2: field '{field}':")


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"success": "yes"}, "success"),
        ({"success": 1}, "success"),
        ({"success": "true"}, "success"),
        ({"success": None}, "success"),
        ({"query": 5}, "query"),
        ({"tool": ["get_weather"]}, "tool"),
        ({"gold": 3}, "gold"),
        ({"org": ""}, "org"),
        ({"ts": [1]}, "ts"),
    ],
)
def test_wrong_field_types_name_the_field(tmp_path, catalog, patch, field):
    event = {"query": "q", "tool": "get_weather", "success": True, **patch}
    path = write_jsonl_file(tmp_path / "exp.jsonl", [event])
    err = raises_input_error(load_experience, path, catalog)
    assert err.line == 1 and err.field is not None and err.field.split(".")[0] == field
    assert f"field '{field}" in str(err)


@pytest.mark.parametrize("missing", ["query", "tool", "success"])
def test_missing_required_field(tmp_path, catalog, missing):
    event = {"query": "q", "tool": "get_weather", "success": True}
    del event[missing]
    err = raises_input_error(load_experience, write_jsonl_file(tmp_path / "e.jsonl", [event]), catalog)
    assert err.field == missing and "required" in err.message.lower()


def test_a_query_over_the_bound_is_cut_and_named(tmp_path, catalog, caplog):
    long = {"query": "  " + "rain " * 1000 + "  ", "tool": "get_weather", "success": True}
    with caplog.at_level("WARNING"):
        events = load_experience(write_jsonl_file(tmp_path / "e.jsonl", [long, long]), catalog)
        items = load_testset(write_jsonl_file(tmp_path / "t.jsonl", [{"query": long["query"], "gold": "get_weather"}]),
                             catalog)
    # (cut to 4000 characters, then the schema strips the space the cut left at the end)
    assert [len(e.query) for e in events] == [3999, 3999] and events[0].query.startswith("rain rain")
    assert len(items[0].query) == 3999
    assert "2 queries longer than 4000 characters cut" in caplog.text
    assert "1 queries longer than 4000 characters cut" in caplog.text


def test_extra_event_field_ignored_and_named(tmp_path, catalog, caplog):
    event = {"query": "q", "tool": "get_weather", "success": True, "latency_ms": 12}
    with caplog.at_level("WARNING"):
        events = load_experience(write_jsonl_file(tmp_path / "e.jsonl", [event, event]), catalog)
    assert [(e.query, e.tool, e.success) for e in events] == [("q", "get_weather", True)] * 2
    assert "'latency_ms' (2 records)" in caplog.text


def test_bad_json_line_in_experience(tmp_path, catalog):
    path = tmp_path / "e.jsonl"
    path.write_text('{"query": "q", "tool": "get_weather", "success": true}\n{"query": "q",\n')
    err = raises_input_error(load_experience, path, catalog)
    assert err.line == 2 and "invalid JSON" in err.message


def test_missing_experience_file(tmp_path, catalog):
    err = raises_input_error(load_experience, tmp_path / "missing.jsonl", catalog)
    assert "not found" in err.message and err.path.endswith("missing.jsonl")


def test_write_jsonl_round_trips(tmp_path, catalog):
    events = [Event(query="q", tool="get_weather", success=True), Event(query="r", tool="geocode", success=False, org="a")]
    text = write_jsonl(events)
    assert "null" not in text and text.count("\n") == 2
    path = tmp_path / "e.jsonl"
    path.write_text(text)
    assert load_experience(path, catalog) == events


# --------------------------------------------------------------------------- test sets


def test_testset_gold_as_string_or_list(tmp_path, catalog):
    path = write_jsonl_file(
        tmp_path / "test.jsonl",
        [
            {"query": "weather?", "gold": "GetWeather"},
            {"query": "fly", "gold": ["book-flight", "geocode", "BookFlight"]},
        ],
    )
    items = load_testset(path, catalog)
    assert items[0].gold == ("get_weather",)
    assert items[1].gold == ("bookflight", "geocode")  # resolved, de-duplicated, order kept
    no_cat = load_testset(path)
    assert no_cat[0].gold == ("getweather",)


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"query": "q", "gold": []}, "gold"),
        ({"query": "q"}, "gold"),
        ({"query": "q", "gold": 5}, "gold"),
        ({"query": "q", "gold": "teleport"}, "gold"),
    ],
)
def test_testset_errors(tmp_path, catalog, record, field):
    path = write_jsonl_file(tmp_path / "t.jsonl", [{"query": "ok", "gold": "geocode"}, record])
    err = raises_input_error(load_testset, path, catalog)
    assert err.line == 2 and err.field is not None and err.field.split(".")[0] == field


# --------------------------------------------------------------------------- atomic writes


def test_write_atomic_writes_and_creates_folders(tmp_path):
    out = write_atomic(tmp_path / "a" / "b" / "out.json", "héllo")
    assert out.read_bytes() == "héllo".encode()
    write_atomic(out, b"\x00bytes")
    assert out.read_bytes() == b"\x00bytes"
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.json"]


@pytest.mark.parametrize("fail_at", ["replace", "fsync", "write"])
def test_write_atomic_failure_leaves_no_partial_or_temp_file(tmp_path, monkeypatch, fail_at):
    existing = tmp_path / "out.json"
    existing.write_text("original")
    fresh = tmp_path / "new.json"

    def boom(*args, **kwargs):
        raise OSError("disk on fire")

    if fail_at == "replace":
        monkeypatch.setattr(os, "replace", boom)
    elif fail_at == "fsync":
        monkeypatch.setattr(os, "fsync", boom)
    else:
        real_fdopen = os.fdopen

        class HalfWriter:
            def __init__(self, fh):
                self.fh = fh

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.fh.close()

            def write(self, data):
                self.fh.write(data[: len(data) // 2])
                raise OSError("disk full")

        monkeypatch.setattr(os, "fdopen", lambda fd, mode: HalfWriter(real_fdopen(fd, mode)))

    for target in (existing, fresh):
        with pytest.raises(OSError):
            write_atomic(target, "new content " * 1000)
    monkeypatch.undo()
    assert existing.read_text() == "original"
    assert not fresh.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_write_atomic_keyboard_interrupt_cleans_up(tmp_path, monkeypatch):
    target = tmp_path / "out.json"
    target.write_text("original")

    def interrupt(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "original"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_ids_alike_only_once_cut_are_named_with_the_cut():
    first, second = "x" * 128 + "_alpha", "x" * 128 + "_beta"
    with pytest.raises(ToolCollision) as err:
        make_catalog([parse_tool({"name": first}), parse_tool({"name": second})])
    assert f"{first!r} and {second!r}" in str(err.value) and "once cut to 128 characters" in str(err.value)
    assert "aliases.json" not in str(err.value)  # they are two tools: declaring an alias would merge them


def test_alias_table_entries_resolve_and_bad_ones_are_alias_errors():
    from synapse_flwr.core.catalog import AliasError

    docs = [parse_tool({"name": "get_weather"}), parse_tool({"name": "book_hotel"})]
    cat = make_catalog(docs, {"forecast": "Get-Weather"})
    assert cat.resolve("Forecast") == "get_weather" and cat.get("book_hotel").aliases == ()
    for table, words in [({"forecast": "get_forecast"}, "no tool 'get_forecast'"),
                         ({"Book-Hotel": "get_weather"}, "is already a name of the tool 'book_hotel'"),
                         ({"forecast": "get_weather", "FORECAST": "book_hotel"}, "of the tool 'get_weather'")]:
        with pytest.raises(AliasError, match=words) as err:
            make_catalog(docs, table)
        assert isinstance(err.value, SynapseError) and err.value.path == "aliases.json"


def test_a_catalog_that_is_not_utf8_asks_for_utf8(tmp_path):
    path = tmp_path / "cat.json"
    path.write_bytes(b'[{"name": "caf\xe9"}]')
    err = raises_input_error(load_catalog, path)
    assert "not UTF-8 text (byte 0xe9 on line 1): save it as UTF-8" in err.message


def test_an_anthropic_tool_is_read_with_its_arguments():
    """Regression: an Anthropic Messages API tool (``input_schema``, a common shape of public tool lists) was read
    as a plain entry whose ``input_schema`` was an unread key (an INFO line), so its arguments were silently left
    out of the documentation."""
    anthropic = {"name": "get_weather", "description": "Current weather for a city.", "input_schema": PARAMS}
    doc = parse_tool(anthropic)
    assert doc == parse_tool(MCP) and doc.parameters == PARAMS
    assert entry_notes(anthropic) == []
    with pytest.raises(ValueError, match="input_schema: not a JSON object"):
        parse_tool({"name": "x", "input_schema": [1]})


def test_a_saved_json_rpc_tools_list_response_is_told_to_keep_its_result(tmp_path):
    """A whole JSON-RPC response to tools/list saved as the catalog was refused as 'a catalog is a JSON list',
    without saying that its "result" ({"tools": [...]}) is a catalog."""
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"tools": [MCP]}}))
    err = raises_input_error(load_catalog, path)
    assert 'or {"tools": [...]}' in str(err) and 'save its "result"' in str(err)
    path.write_text(json.dumps({"result": {"tools": [MCP]}}["result"]))
    assert load_catalog(path).ids == ["get_weather"]


def test_a_description_past_what_a_compendium_carries_is_cut_with_a_warning(tmp_path, caplog):
    """Regression (dress rehearsal): 748 of a ToolRet-like catalog's 4,484 descriptions were cut to 2,000 characters
    without a word, and two tools whose long boilerplate differed only in its last sentence read alike."""
    import logging

    from synapse_flwr.core.schema import MAX_DESCRIPTION

    boiler = "This API belongs to a large public collection of web services. " * 40
    tools = [{"name": "a", "description": boiler + "Returns weather."},
             {"type": "function", "function": {"name": "b", "description": boiler + "Books hotels."}},
             {"name": "c", "description": "Short."}]
    assert [entry_notes(t) for t in tools] == [["description cut"], ["description cut"], []]
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(tools))
    with caplog.at_level(logging.WARNING, logger="synapse_flwr"):
        catalog = load_catalog(path)
    assert f"2 descriptions are longer than {MAX_DESCRIPTION:,} characters" in caplog.text
    assert "'description cut'" not in caplog.text  # a note, not an unread field
    assert {len(d.description) for d in catalog.tools} == {MAX_DESCRIPTION, len("Short.")}
