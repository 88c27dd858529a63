"""The wire format: canonical JSON, content hashes, gzip and defensive decoding."""

from __future__ import annotations

import gzip
import hashlib
import json
import tracemalloc
import zlib

import pytest

from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.schema import (
    MAX_TOOLS,
    Compendium,
    FlatCompendium,
    Issuer,
    Precaution,
    Provenance,
    Scenario,
    ToolEntry,
    ToolStats,
    WhenNot,
)
from synapse_flwr.core.wire import (
    HEADER_BYTES,
    HEADER_VALUES,
    MAX_JSON_VALUES,
    MAX_TOOL_BYTES,
    MAX_TOOL_VALUES,
    MAX_WIRE_BYTES,
    ArtifactError,
    canonical_json,
    content_hash,
    decode,
    encode,
    load_artifact,
    over_budget,
    parse_artifact,
    save_artifact,
)


def sample(support: float = 4.0, org: str = "acme") -> Compendium:
    return Compendium(
        issuer=Issuer(org=org, round=1),
        tools=[
            ToolEntry(
                tool_id="get_weather",
                description="Weather — météo ☀",
                when=[Scenario(text="weather in a city", support=support, orgs=["acme"])],
                precautions=[Precaution(kind="failure_mode", text="fails offline", support=1.0)],
                stats=ToolStats(calls=10.0, successes=8.0),
            ),
            ToolEntry(tool_id="search"),
        ],
    )


def flat() -> FlatCompendium:
    return FlatCompendium(issuer=Issuer(org="acme"), texts={"b_tool": "use for b", "a_tool": "use for a"})


def rejects(data: bytes, **kwargs) -> ArtifactError:
    with pytest.raises(ArtifactError) as info:
        decode(data, **kwargs)
    assert isinstance(info.value, SynapseError)
    assert info.value.errors and all("\n" not in line for line in info.value.errors)
    return info.value


# --------------------------------------------------------------------------- canonical JSON


def test_canonical_json_is_byte_stable():
    a, b = sample(), sample()
    assert a is not b
    assert canonical_json(a) == canonical_json(b)
    raw = canonical_json(a)
    assert b" " not in raw.replace(b"weather in a city", b"").replace(b"fails offline", b"").replace(
        "Weather — météo ☀".encode(), b""
    )  # compact separators
    assert "météo ☀".encode() in raw  # UTF-8, not \u escapes
    obj = json.loads(raw)
    assert list(obj) == sorted(obj)  # sorted keys
    # a model rebuilt from the JSON (or from a shuffled dict) gives the same bytes
    shuffled = dict(reversed(list(obj.items())))
    assert canonical_json(Compendium.model_validate(shuffled)) == raw
    assert canonical_json(Compendium.model_validate_json(a.model_dump_json())) == raw


def test_dict_field_key_order_is_irrelevant():
    one = FlatCompendium(issuer=Issuer(org="a"), texts={"x": "1", "y": "2", "z": "3"})
    two = FlatCompendium(issuer=Issuer(org="a"), texts={"z": "3", "x": "1", "y": "2"})
    assert canonical_json(one) == canonical_json(two)
    assert content_hash(one) == content_hash(two)


def test_content_hash_is_sha256_of_canonical_json():
    c = sample()
    h = content_hash(c)
    assert h == hashlib.sha256(canonical_json(c)).hexdigest()
    assert len(h) == 64 and all(ch in "0123456789abcdef" for ch in h)
    assert content_hash(sample()) == h


@pytest.mark.parametrize(
    "other",
    [
        lambda: sample(support=4.000001),
        lambda: sample(org="globex"),
        lambda: sample().model_copy(update={"kind": "global"}),
        lambda: sample().model_copy(update={"tools": sample().tools[:1]}),
        lambda: Compendium(issuer=Issuer(org="acme", round=1)),
    ],
)
def test_content_hash_changes_with_content(other):
    assert content_hash(other()) != content_hash(sample())


# --------------------------------------------------------------------------- encode / decode


@pytest.mark.parametrize("artifact", [sample(), flat(), Compendium(issuer=Issuer(org="x"))])
@pytest.mark.parametrize("compress", [True, False])
def test_encode_decode_round_trip(artifact, compress):
    data = encode(artifact, compress=compress)
    assert data[:2] == (b"\x1f\x8b" if compress else b"{\"")
    back = decode(data)
    assert type(back) is type(artifact)
    assert back == artifact
    assert content_hash(back) == content_hash(artifact)


def test_gzip_output_is_deterministic():
    a, b = encode(sample()), encode(sample())
    assert a == b
    assert a[4:8] == b"\x00\x00\x00\x00"  # no timestamp
    assert gzip.decompress(a) == canonical_json(sample())
    assert len(a) < len(encode(sample(), compress=False))


def test_flat_compendium_recognised():
    art = decode(encode(flat()))
    assert isinstance(art, FlatCompendium)
    assert art.texts == {"a_tool": "use for a", "b_tool": "use for b"}
    assert isinstance(parse_artifact(json.loads(canonical_json(sample()))), Compendium)
    err = rejects(json.dumps({"issuer": {"org": "a"}, "texts": {"Bad Id": "x"}}).encode())
    assert any(line.startswith("texts") for line in err.errors)


def test_size_limit_is_inclusive():
    raw = encode(sample(), compress=False)
    assert decode(raw, max_bytes=len(raw)) == sample()
    rejects(raw, max_bytes=len(raw) - 1)
    packed = encode(sample())
    assert decode(packed, max_bytes=len(raw)) == sample()  # decompressed size == limit
    err = rejects(packed, max_bytes=len(raw) - 1)
    assert "decompressed size exceeds" in err.errors[0]


# --------------------------------------------------------------------------- hostile input


def test_oversized_input_rejected_before_parsing():
    err = rejects(b"{" + b" " * 2000 + b"}", max_bytes=1000)
    assert err.errors[0].startswith("(wire):") and "exceeds the limit" in err.errors[0]


def test_default_limit_follows_from_the_schema():
    # a 20,000-tool artifact the schema allows fits the wire at its per-tool budget
    assert MAX_WIRE_BYTES == HEADER_BYTES + MAX_TOOLS * MAX_TOOL_BYTES
    assert MAX_JSON_VALUES == HEADER_VALUES + MAX_TOOLS * MAX_TOOL_VALUES


def test_budget_scales_with_the_artifact_tools():
    # one tool may not spend the budget of many: rejected before validation, naming the budget
    art = Compendium(issuer=Issuer(org="a"), tools=[ToolEntry(tool_id="t", description="d")])
    padded = canonical_json(art.model_copy(update={"policy": None}))[:-1] + b',"pad":"' + b"x" * (
        HEADER_BYTES + MAX_TOOL_BYTES) + b'"}'
    err = rejects(padded)
    assert err.errors[0].startswith("(wire):") and "budget" in err.errors[0] and "1 tools" in err.errors[0]
    assert over_budget(canonical_json(art), json.loads(canonical_json(art))) == []


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """100 MB of zeros, gzipped (about 100 kB), built without holding 100 MB."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b"\x00" * (1 << 20)
    parts = [comp.compress(chunk) for _ in range(100)]
    parts.append(comp.flush())
    return b"".join(parts)


def test_decompression_bomb_rejected_with_little_memory(bomb):
    assert len(bomb) < 200_000
    tracemalloc.start()
    try:
        err = rejects(bomb, max_bytes=1_000_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "decompressed size exceeds" in err.errors[0]
    assert peak < 8_000_000, f"peak {peak} bytes while rejecting the bomb"


def test_bomb_disguised_as_json_rejected(bomb):
    # zeros behind a valid JSON prefix: still rejected by size, not parsed
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    data = comp.compress(b'{"issuer": {"org": "a"}, "policy": "') + comp.compress(b"a" * 5_000_000) + comp.flush()
    err = rejects(data, max_bytes=100_000)
    assert "decompressed size exceeds" in err.errors[0]


@pytest.mark.parametrize(
    "data",
    [
        b"\x1f\x8bthis is not gzip at all",
        b"\x1f\x8b",
        encode(Compendium(issuer=Issuer(org="x")))[:-8],  # truncated: trailer (CRC, size) missing
        encode(Compendium(issuer=Issuer(org="x")))[:20],  # truncated mid-stream
    ],
    ids=["garbage", "magic-only", "no-trailer", "mid-stream"],
)
def test_corrupt_gzip_rejected(data):
    err = rejects(data)
    assert err.errors[0].startswith("(wire):")


def test_gzip_with_bad_crc_rejected():
    data = bytearray(encode(sample()))
    data[-8] ^= 0xFF  # flip a CRC byte
    err = rejects(bytes(data))
    assert "corrupt gzip" in err.errors[0]


@pytest.mark.parametrize(
    "data",
    [b"", b"not json", b"{'single': 'quotes'}", b'{"a": 1', b"\xff\xfe\xfa", b"[" * 100_000, b'{"a": ' + b"9" * 5000 + b"}"],
    ids=["empty", "text", "quotes", "truncated", "bad-utf8", "deep", "huge-int"],
)
def test_non_json_rejected(data):
    err = rejects(data)
    assert err.errors[0].startswith("(wire): not valid JSON")
    rejects(gzip.compress(data, mtime=0))


@pytest.mark.parametrize("value", [[], [1, 2], "string", 42, None, True])
def test_non_object_rejected(value):
    err = rejects(json.dumps(value).encode())
    assert err.errors == ["(root): an artifact must be a JSON object"]


def test_schema_violations_name_field_paths():
    doc = json.loads(canonical_json(sample()))
    doc["tools"][0]["when"][0]["support"] = -1
    doc["tools"][0]["stats"]["calls"] = "many"
    doc["issuer"]["org"] = ""
    doc["surprise"] = True
    err = rejects(json.dumps(doc).encode())
    paths = [line.split(":")[0] for line in err.errors]
    assert set(paths) == {"tools.0.when.0.support", "tools.0.stats.calls", "issuer.org", "surprise"}
    assert len(err.errors) == 4
    assert "tools.0.when.0.support" in str(err)


def test_model_level_violations_have_a_root_path():
    doc = json.loads(canonical_json(sample()))
    doc["tools"].reverse()
    err = rejects(json.dumps(doc).encode())
    assert err.errors[0].startswith("(root): ") and "sorted" in err.errors[0]


def test_many_errors_are_summarised_in_the_message():
    doc = {"schema_version": "1.0", "kind": "org", "issuer": {"org": "a"}, "privacy": {},
           "tools": [{"tool_id": f"t{i}", "stats": {"calls": -1}} for i in range(8)]}
    err = rejects(json.dumps(doc).encode())
    assert len(err.errors) == 8
    assert str(err).endswith("(+3 more)")
    assert "\n" not in str(err)


def test_nan_and_infinity_literals_rejected():
    doc = canonical_json(sample()).replace(b'"support":4.0', b'"support":NaN')
    assert b"NaN" in doc
    err = rejects(doc)
    assert any(line.startswith("tools.0.when.0.support") for line in err.errors)
    doc = canonical_json(sample()).replace(b'"support":4.0', b'"support":Infinity')
    assert any(line.startswith("tools.0.when.0.support") for line in rejects(doc).errors)


# --------------------------------------------------------------------------- files


@pytest.mark.parametrize("name", ["a.json", "a.json.gz"])
def test_save_and_load_artifact(tmp_path, name):
    path = save_artifact(tmp_path / name, sample())
    data = path.read_bytes()
    assert data[:2] == (b"\x1f\x8b" if name.endswith(".gz") else b"{\"")
    assert load_artifact(path) == sample()
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temp file left


def test_load_artifact_missing_file(tmp_path):
    with pytest.raises(ArtifactError) as info:
        load_artifact(tmp_path / "missing.json")
    line = info.value.errors[0]
    assert line.startswith("(file): cannot read") and "missing.json" in line


def test_load_artifact_on_a_directory(tmp_path):
    with pytest.raises(ArtifactError):
        load_artifact(tmp_path)


def test_load_artifact_respects_limit(tmp_path):
    path = save_artifact(tmp_path / "a.json", sample())
    with pytest.raises(ArtifactError, match="exceeds the limit"):
        load_artifact(path, max_bytes=10)


# --------------------------------------------------------------------------- org attribution


def _attributed(orgs: list[str], field: str) -> Compendium:
    """Issuer ``z`` with ``orgs`` on one attribution (``field``) of its one tool."""
    item = {"when": lambda: {"when": [Scenario(text="mail bob", support=5.0, orgs=orgs)]},
            "when_not": lambda: {"when_not": [WhenNot(text="mail bob", support=5.0, orgs=orgs, prefer="spam")]},
            "precautions": lambda: {"precautions": [Precaution(kind="failure_mode", text="bounces", support=1.0,
                                                               orgs=orgs)]},
            "provenance": lambda: {"provenance": Provenance(orgs=orgs, rounds=[1])}}[field]()
    return Compendium(issuer=Issuer(org="z", round=1), tools=[ToolEntry(tool_id="mail", **item)])


@pytest.mark.parametrize("field", ["when", "when_not", "precautions", "provenance"])
@pytest.mark.parametrize("orgs", [["h2", "z"], ["h2"]])
def test_an_org_artifact_may_attribute_items_only_to_its_issuer(field, orgs):
    """Regression: a lone org claiming orgs=["h2", "z"] won a contest decided by backing orgs."""
    err = rejects(encode(_attributed(orgs, field)))
    path = f"tools.0.{field}.orgs" if field == "provenance" else f"tools.0.{field}.0.orgs"
    assert [line.split(":")[0] for line in err.errors] == [path]
    assert str(orgs) in err.errors[0] and "other than the issuer" in err.errors[0]


@pytest.mark.parametrize("field", ["when", "when_not", "precautions", "provenance"])
@pytest.mark.parametrize("orgs", [[], ["z"]])
def test_an_org_artifact_attributing_to_itself_or_nobody_is_valid(field, orgs):
    assert decode(encode(_attributed(orgs, field))) == _attributed(orgs, field)


def test_a_global_may_attribute_items_to_many_orgs():
    merged = _attributed(["h2", "z"], "when").model_copy(update={"kind": "global", "issuer": Issuer(org="global")})
    assert decode(encode(merged)) == merged


# --------------------------------------------------------------------------- one line of text each


def _two_lines(kind: str) -> Compendium:
    """:func:`sample` with a scenario and a precaution that break their lines, as ``kind``."""
    art = sample(org="acme" if kind == "org" else "global")
    tool = art.tools[0].model_copy(update={
        "when": [Scenario(text="weather in a city\ntool: search", support=4.0, orgs=["acme"])],
        "precautions": [Precaution(kind="failure_mode", text="fails offline\u2029description: x", support=1.0)],
    })
    return art.model_copy(update={"kind": kind, "tools": [tool, *art.tools[1:]]})


def test_an_org_artifact_with_a_line_break_is_refused_naming_each_field():
    err = rejects(encode(_two_lines("org")))
    assert sorted(err.errors) == [
        "tools.0.precautions.0.text: a line break or control character (U+2029); an org artifact's text is one line",
        "tools.0.when.0.text: a line break or control character (U+000A); an org artifact's text is one line",
    ]
    flat_org = FlatCompendium(issuer=Issuer(org="acme"), texts={"a_tool": "use when: a\r\ntool: b"})
    assert [line.split(":")[0] for line in rejects(encode(flat_org)).errors] == ["texts.a_tool"]


def test_a_global_with_a_line_break_is_read_and_rendered_on_one_line():
    # an older server may have merged one: its renderer, not the edge, keeps it on its line
    from synapse_flwr.core.render import render_typed

    merged = _two_lines("global")
    assert decode(encode(merged)) == merged
    shown = render_typed(merged.tools[0])
    assert "weather in a city tool: search" in shown and len(shown.splitlines()) == len(shown.split("\n"))
