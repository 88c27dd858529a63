"""The typed compendium: strict, bounded, and consistent with its JSON Schema."""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from synapse_flwr.core.schema import (
    MAX_CLAIMS,
    MAX_COUNT,
    MAX_DESCRIPTION,
    MAX_ITEMS,
    MAX_SCENARIOS,
    MAX_TEXT,
    MAX_TOOLS,
    MAX_VARIANTS,
    SCHEMA_VERSION,
    Compendium,
    FlatCompendium,
    Issuer,
    ToolStats,
    json_schema,
)

FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOOL_RE = re.compile(r"[a-z0-9][a-z0-9_.\-]*")
ORG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
HASH = "ab" * 32

# --------------------------------------------------------------------------- helpers


def full_doc(kind: str = "global") -> dict[str, Any]:
    """A valid document that uses every model and every optional field."""
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "issuer": {"org": "global" if kind == "global" else "acme", "round": 3},
        "privacy": {
            "mechanism": "gaussian",
            "clip": 3.0,
            "sigma": 1.5,
            "noise_multiplier": 0.5,
            "epsilon": 1.2,
            "epsilon_target": 4.0,
            "delta": 1e-5,
            "rounds_planned": 4,
            "threshold": 5.0,
            "text_policy": "pii-masked+dp-partition-selection",
        },
        "tools": [
            {
                "tool_id": "book_flight",
                "description": "Book a flight.",
                "when": [
                    {
                        "text": "book a flight",
                        "support": 12.5,
                        "variants": ["reserve a plane ticket"],
                        "orgs": ["acme", "globex"],
                    }
                ],
                "when_not": [
                    {
                        "text": "hotel booking",
                        "support": 3.0,
                        "variants": ["reserve a room"],
                        "orgs": ["globex"],
                        "prefer": "book_hotel",
                    }
                ],
                "precautions": [
                    {"kind": "dissent", "text": "globex says it fails", "support": 3.0, "orgs": ["globex"]}
                ],
                "stats": {"calls": 40.0, "successes": 30.0},
                "confusions": [{"tool": "book_hotel", "count": 2.0}],
                "next_tools": [{"tool": "pay", "count": 7.0}],
                "provenance": {"orgs": ["acme", "globex"], "rounds": [1, 2, 3]},
            },
            {"tool_id": "get_weather"},
        ],
        "conflicts": [],
        "policy": "typed" if kind == "global" else None,
        "inputs": [HASH] if kind == "global" else [],
    }
    if kind == "global":
        doc["conflicts"] = [
            {
                "tool_id": "book_flight",
                "field": "when",
                "subject": "hotel booking",
                "claims": [
                    {"view": "when", "support": 2.0, "orgs": ["acme"]},
                    {"view": "when_not", "support": 3.0, "orgs": ["globex"]},
                ],
                "resolution": "kept in when_not",
                "policy": "typed",
            }
        ]
    return doc


def split(path: str) -> list[str | int]:
    return [int(p) if p.isdigit() else p for p in path.split(".")]


def get_path(doc: Any, path: str) -> Any:
    for key in split(path):
        doc = doc[key]
    return doc


def with_value(doc: dict, path: str, value: Any) -> dict:
    doc = copy.deepcopy(doc)
    *parents, last = split(path)
    target = doc
    for key in parents:
        target = target[key]
    target[last] = value
    return doc


def errors_of(doc: dict, model=Compendium) -> list[dict]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(doc)
    return info.value.errors()


def locs(errors: list[dict]) -> set[str]:
    return {".".join(str(p) for p in e["loc"]) for e in errors}


def assert_rejected_at(doc: dict, path: str, model=Compendium) -> list[dict]:
    errs = errors_of(doc, model)
    assert any(loc == path or loc.startswith(path + ".") for loc in locs(errs)), (path, errs)
    return errs


def object_paths(doc: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every JSON object inside ``doc`` ('' is the root)."""
    out = []
    if isinstance(doc, dict):
        out.append(prefix)
        for k, v in doc.items():
            out += object_paths(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += object_paths(v, f"{prefix}.{i}" if prefix else str(i))
    return out


SCHEMA = json_schema()

try:  # jsonschema is not a declared dependency: use it when it is installed
    import jsonschema
except ImportError:  # pragma: no cover
    jsonschema = None
needs_jsonschema = pytest.mark.skipif(jsonschema is None, reason="jsonschema not installed")


def schema_errors(doc: dict) -> list:
    """Violations of the JSON Schema (an empty list when jsonschema is missing: not checked)."""
    if jsonschema is None:  # pragma: no cover
        return []
    return list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(doc))


def schema_rejects(doc: dict) -> bool:
    return jsonschema is None or bool(schema_errors(doc))


def _resolve(node: dict) -> dict:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def missing_required(doc: Any, node: dict | None = None, path: str = "") -> list[str]:
    """Dotted paths of keys the JSON Schema requires but ``doc`` lacks (no jsonschema needed)."""
    node = _resolve(SCHEMA if node is None else node)
    if "anyOf" in node:  # Optional[...]: follow the branch that fits the value
        for branch in node["anyOf"]:
            b = _resolve(branch)
            if (isinstance(doc, dict) and b.get("type") == "object") or (
                isinstance(doc, list) and b.get("type") == "array"
            ):
                return missing_required(doc, b, path)
        return []
    out = []
    if isinstance(doc, dict) and node.get("type") == "object":
        out += [f"{path}{k}" for k in node.get("required", []) if k not in doc]
        for key, sub in node.get("properties", {}).items():
            if key in doc:
                out += missing_required(doc[key], sub, f"{path}{key}.")
    elif isinstance(doc, list) and "items" in node:
        for i, item in enumerate(doc):
            out += missing_required(item, node["items"], f"{path}{i}.")
    return out


# --------------------------------------------------------------------------- valid documents


def test_minimal_compendium_round_trips():
    c = Compendium(issuer=Issuer(org="acme"))
    assert c.schema_version == SCHEMA_VERSION and c.kind == "org" and c.tools == []
    assert Compendium.model_validate(c.model_dump(mode="json")) == c
    assert Compendium.model_validate_json(c.model_dump_json()) == c
    assert Compendium.model_validate({"issuer": {"org": "acme"}}) == c


@pytest.mark.parametrize("kind", ["org", "global"])
def test_full_compendium_round_trips(kind):
    c = Compendium.model_validate(full_doc(kind))
    assert Compendium.model_validate(c.model_dump(mode="json")) == c
    assert Compendium.model_validate_json(c.model_dump_json()) == c
    assert c.tool("book_flight").stats.success_rate == pytest.approx(0.75)
    assert c.tool("get_weather").stats.success_rate is None
    assert c.tool("nope") is None


def test_models_are_frozen():
    c = Compendium.model_validate(full_doc())
    with pytest.raises(ValidationError):
        c.kind = "org"  # type: ignore[misc]


def test_flat_compendium_round_trips():
    f = FlatCompendium(issuer=Issuer(org="acme"), texts={"get_weather": "use for weather"})
    assert FlatCompendium.model_validate_json(f.model_dump_json()) == f
    assert_rejected_at({"issuer": {"org": "a"}, "texts": {"Bad Id": "x"}}, "texts", FlatCompendium)
    assert_rejected_at(
        {"issuer": {"org": "a"}, "texts": {"t": "x" * 20_001}}, "texts.t", FlatCompendium
    )


# --------------------------------------------------------------------------- extra fields


@pytest.mark.parametrize("path", object_paths(full_doc()))
def test_extra_field_rejected_at_every_level(path):
    doc = copy.deepcopy(full_doc())
    target = get_path(doc, path) if path else doc
    target["bogus"] = 1
    errs = errors_of(doc)
    expected = f"{path}.bogus" if path else "bogus"
    assert [e["type"] for e in errs] == ["extra_forbidden"]
    assert locs(errs) == {expected}


def test_extra_field_rejected_in_flat_compendium():
    errs = errors_of({"issuer": {"org": "a"}, "texts": {}, "tools": []}, FlatCompendium)
    assert locs(errs) == {"tools"}


# --------------------------------------------------------------------------- counts

COUNT_PATHS = [
    "tools.0.when.0.support",
    "tools.0.when_not.0.support",
    "tools.0.precautions.0.support",
    "tools.0.stats.calls",
    "tools.0.stats.successes",
    "tools.0.confusions.0.count",
    "tools.0.next_tools.0.count",
    "conflicts.0.claims.0.support",
    "conflicts.0.claims.1.support",
    "privacy.clip",
    "privacy.sigma",
    "privacy.noise_multiplier",
    "privacy.epsilon",
    "privacy.epsilon_target",
    "privacy.threshold",
]

bad_counts = st.one_of(
    st.floats(max_value=0.0, exclude_max=True),  # negative, including -inf
    st.floats(min_value=MAX_COUNT, exclude_min=True),  # too large, including +inf
    st.just(math.nan),
    st.integers(max_value=-1),
    st.integers(min_value=int(MAX_COUNT) + 1),
)


def _count_doc(path: str, value: Any) -> dict:
    doc = full_doc()
    if path.endswith("stats.calls"):
        doc = with_value(doc, "tools.0.stats.successes", 0.0)
    if path.endswith("stats.successes"):
        doc = with_value(doc, "tools.0.stats.calls", MAX_COUNT)
    # epsilon spent may not exceed its budget: the partner sits where any in-limit value is consistent
    if path == "privacy.epsilon":
        doc = with_value(doc, "privacy.epsilon_target", MAX_COUNT)
    if path == "privacy.epsilon_target":
        doc = with_value(doc, "privacy.epsilon", 0.0)
    return with_value(doc, path, value)


@pytest.mark.parametrize("path", COUNT_PATHS)
@FAST
@given(value=bad_counts)
@example(value=math.nan)
@example(value=math.inf)
@example(value=-math.inf)
@example(value=-5e-324)
@example(value=math.nextafter(MAX_COUNT, math.inf))
def test_out_of_limit_counts_rejected(path, value):
    doc = _count_doc(path, value)
    assert_rejected_at(doc, path)
    if not (isinstance(value, float) and math.isnan(value)):  # NaN is not JSON anyway
        assert schema_rejects(doc), "the JSON Schema must reject it too"


@pytest.mark.parametrize("path", COUNT_PATHS)
@FAST
@given(value=st.floats(min_value=0.0, max_value=MAX_COUNT))
@example(value=0.0)
@example(value=MAX_COUNT)
def test_in_limit_counts_accepted(path, value):
    doc = _count_doc(path, value)
    Compendium.model_validate(doc)
    assert not schema_errors(doc)


def test_optional_epsilon_may_be_null():
    doc = with_value(with_value(full_doc(), "privacy.epsilon", None), "privacy.epsilon_target", None)
    Compendium.model_validate(doc)


@pytest.mark.parametrize("value", [1.0, 1.5, -1e-9, math.nan, math.inf])
def test_delta_out_of_range_rejected(value):
    assert_rejected_at(with_value(full_doc(), "privacy.delta", value), "privacy.delta")


@FAST
@given(calls=st.floats(min_value=0.0, max_value=1e11), gap=st.floats(min_value=1e-6, max_value=1e11))
def test_successes_above_calls_rejected(calls, gap):
    successes = calls + gap
    if not successes > calls + 1e-9:  # the gap vanished in rounding
        successes = math.nextafter(calls + 1e-9, math.inf) * (1 + 1e-12) + 1e-6
    with pytest.raises(ValidationError, match="successes must not exceed calls"):
        ToolStats(calls=calls, successes=successes)
    assert_rejected_at(
        with_value(full_doc(), "tools.0.stats", {"calls": calls, "successes": successes}),
        "tools.0.stats",
    )


@FAST
@given(calls=st.floats(min_value=0.0, max_value=MAX_COUNT), frac=st.floats(0.0, 1.0))
def test_successes_within_calls_accepted(calls, frac):
    s = ToolStats(calls=calls, successes=min(calls, calls * frac))
    assert s.successes <= s.calls


# --------------------------------------------------------------------------- texts

TEXT_PATHS = [
    "tools.0.when.0.text",
    "tools.0.when.0.variants.0",
    "tools.0.when_not.0.text",
    "tools.0.when_not.0.variants.0",
    "tools.0.precautions.0.text",
    "conflicts.0.subject",
    "conflicts.0.resolution",
    "conflicts.0.claims.0.view",
]

bad_texts = st.one_of(
    st.just(""), st.text(min_size=MAX_TEXT + 1, max_size=MAX_TEXT + 300)
)


@pytest.mark.parametrize("path", TEXT_PATHS)
@FAST
@given(value=bad_texts)
@example(value="")
@example(value="x" * (MAX_TEXT + 1))
def test_bad_texts_rejected(path, value):
    doc = with_value(full_doc(), path, value)
    assert_rejected_at(doc, path)
    assert schema_rejects(doc), "the JSON Schema must reject it too"


@pytest.mark.parametrize("path", TEXT_PATHS)
def test_text_at_limit_accepted(path):
    Compendium.model_validate(with_value(full_doc(), path, "é" * MAX_TEXT))


def test_description_limit():
    Compendium.model_validate(with_value(full_doc(), "tools.0.description", ""))
    Compendium.model_validate(with_value(full_doc(), "tools.0.description", "d" * MAX_DESCRIPTION))
    assert_rejected_at(
        with_value(full_doc(), "tools.0.description", "d" * (MAX_DESCRIPTION + 1)),
        "tools.0.description",
    )


# --------------------------------------------------------------------------- list lengths

LIST_PATHS = [
    ("tools.0.when", MAX_SCENARIOS),
    ("tools.0.when_not", MAX_SCENARIOS),
    ("tools.0.precautions", MAX_ITEMS),
    ("tools.0.confusions", MAX_ITEMS),
    ("tools.0.next_tools", MAX_ITEMS),
    ("tools.0.when.0.variants", MAX_VARIANTS),
    ("tools.0.when_not.0.variants", MAX_VARIANTS),
    ("conflicts.0.claims", MAX_CLAIMS),
]


@pytest.mark.parametrize(("path", "limit"), LIST_PATHS)
@settings(max_examples=5, deadline=None)
@given(extra=st.integers(min_value=1, max_value=40))
@example(extra=1)
def test_lists_longer_than_limit_rejected(path, limit, extra):
    item = get_path(full_doc(), path)[0]
    too_long = with_value(full_doc(), path, [item] * (limit + extra))
    errs = errors_of(too_long)
    assert any(e["type"] == "too_long" and ".".join(map(str, e["loc"])) == path for e in errs), errs
    assert schema_rejects(too_long)
    Compendium.model_validate(with_value(full_doc(), path, [item] * limit))


def test_too_many_tools_rejected():
    tools = [{"tool_id": f"t{i:05d}"} for i in range(MAX_TOOLS + 1)]
    errs = errors_of({"issuer": {"org": "a"}, "tools": tools})
    assert any(e["type"] == "too_long" and e["loc"] == ("tools",) for e in errs)


# --------------------------------------------------------------------------- ids

bad_tool_ids = st.one_of(
    st.text(max_size=20).filter(lambda s: not TOOL_RE.fullmatch(s)),
    st.from_regex(r"[a-z0-9]{129,140}", fullmatch=True),
)
good_tool_ids = st.from_regex(r"[a-z0-9][a-z0-9_.\-]{0,30}", fullmatch=True)
good_org_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,10}", fullmatch=True)

TOOL_ID_PATHS = [
    "tools.0.tool_id",
    "tools.0.when_not.0.prefer",
    "tools.0.confusions.0.tool",
    "tools.0.next_tools.0.tool",
    "conflicts.0.tool_id",
]


def _single_tool_doc() -> dict:
    doc = full_doc()
    doc["tools"] = doc["tools"][:1]
    return doc


@pytest.mark.parametrize("path", TOOL_ID_PATHS)
@FAST
@given(value=bad_tool_ids)
@example(value="")
@example(value="Get_Weather")
@example(value="get weather")
@example(value="_get")
@example(value="-get")
@example(value="get\n")
@example(value="météo")
@example(value="x" * 129)
def test_bad_tool_ids_rejected(path, value):
    assert_rejected_at(with_value(_single_tool_doc(), path, value), path)


@pytest.mark.parametrize("path", TOOL_ID_PATHS)
@FAST
@given(value=good_tool_ids)
def test_good_tool_ids_accepted(path, value):
    Compendium.model_validate(with_value(_single_tool_doc(), path, value))


@FAST
@given(ids=st.lists(good_tool_ids, min_size=2, max_size=6))
@example(ids=["b", "a"])
@example(ids=["a", "a"])
def test_unsorted_or_duplicate_tool_ids_rejected(ids):
    doc = {"issuer": {"org": "a"}, "tools": [{"tool_id": i} for i in ids]}
    if ids == sorted(set(ids)):
        Compendium.model_validate(doc)
    else:
        with pytest.raises(ValidationError, match="sorted by tool_id"):
            Compendium.model_validate(doc)
    Compendium.model_validate({**doc, "tools": [{"tool_id": i} for i in sorted(set(ids))]})


ORG_LIST_PATHS = [
    "tools.0.when.0.orgs",
    "tools.0.when_not.0.orgs",
    "tools.0.precautions.0.orgs",
    "tools.0.provenance.orgs",
    "conflicts.0.claims.0.orgs",
]


@pytest.mark.parametrize("path", ORG_LIST_PATHS)
@FAST
@given(orgs=st.lists(good_org_ids, min_size=2, max_size=6))
@example(orgs=["globex", "acme"])
@example(orgs=["acme", "acme"])
def test_unsorted_or_duplicate_org_lists_rejected(path, orgs):
    if orgs == sorted(set(orgs)):
        Compendium.model_validate(with_value(full_doc(), path, orgs))
    else:
        errs = assert_rejected_at(with_value(full_doc(), path, orgs), path)
        assert any("sorted" in e["msg"] for e in errs)
    Compendium.model_validate(with_value(full_doc(), path, sorted(set(orgs))))


@pytest.mark.parametrize("value", ["", "has space", "-lead", "o" * 65, "ünï"])
def test_bad_org_ids_rejected(value):
    assert_rejected_at(with_value(full_doc(), "issuer.org", value), "issuer.org")
    assert_rejected_at(with_value(full_doc(), "tools.0.provenance.orgs", [value]), "tools.0.provenance.orgs")


# --------------------------------------------------------------------------- document rules


def test_org_artifact_with_conflicts_rejected():
    doc = full_doc("global")
    doc["kind"] = "org"
    with pytest.raises(ValidationError, match="no conflict log"):
        Compendium.model_validate(doc)
    Compendium.model_validate(full_doc("global"))
    Compendium.model_validate(full_doc("org"))


@FAST
@given(version=st.one_of(st.text(max_size=10), st.floats(), st.integers(), st.none()))
@example(version="1.1")
@example(version="2.0")
@example(version=1.0)
@example(version=" 1.0")
def test_bad_schema_version_rejected(version):
    if version == SCHEMA_VERSION and isinstance(version, str):
        return
    assert_rejected_at(with_value(full_doc(), "schema_version", version), "schema_version")
    assert_rejected_at(
        {"schema_version": version, "issuer": {"org": "a"}, "texts": {}}, "schema_version", FlatCompendium
    )


@pytest.mark.parametrize("n", [0, 1])
def test_conflict_with_fewer_than_two_claims_rejected(n):
    doc = full_doc()
    doc["conflicts"][0]["claims"] = doc["conflicts"][0]["claims"][:n]
    errs = assert_rejected_at(doc, "conflicts.0.claims")
    assert any(e["type"] == "too_short" for e in errs)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("kind", "local"),
        ("privacy.mechanism", "laplace"),
        ("privacy.text_policy", "raw"),
        ("privacy.rounds_planned", 0),
        ("issuer.round", -1),
        ("tools.0.provenance.rounds", [-1]),
        ("tools.0.precautions.0.kind", "rumour"),
        ("conflicts.0.field", "when_not"),
        ("inputs", ["not-a-hash"]),
        ("inputs", ["AB" * 32]),
        ("policy", "p" * 65),
        ("tools.0.when", "not a list"),
        ("issuer", None),
    ],
)
def test_other_invalid_values_rejected(path, value):
    assert_rejected_at(with_value(full_doc(), path, value), path)


# --------------------------------------------------------------------------- JSON Schema


def test_json_schema_structure():
    assert SCHEMA["type"] == "object" and "properties" in SCHEMA
    refs = {m for m in re.findall(r'"\$ref": "#/\$defs/(\w+)"', json.dumps(SCHEMA))}
    assert refs and refs <= set(SCHEMA["$defs"])  # every reference resolves
    assert set(SCHEMA["properties"]) == set(Compendium.model_fields)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert SCHEMA["$id"].endswith(f"compendium-{SCHEMA_VERSION}.json")
    assert json.loads(json.dumps(SCHEMA)) == SCHEMA  # plain JSON


@needs_jsonschema
def test_json_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_json_schema_lists_required_fields():
    defs = SCHEMA["$defs"]
    assert SCHEMA["required"] == ["issuer"]
    assert SCHEMA["additionalProperties"] is False
    assert set(defs["Conflict"]["required"]) == {"tool_id", "field", "subject", "claims", "resolution", "policy"}
    assert set(defs["Issuer"]["required"]) == {"org"}
    assert set(defs["ToolEntry"]["required"]) == {"tool_id"}
    assert set(defs["Scenario"]["required"]) == {"text", "support"}
    assert set(defs["WhenNot"]["required"]) == {"text", "support"}
    assert set(defs["Precaution"]["required"]) == {"kind", "text", "support"}
    assert set(defs["Claim"]["required"]) == {"view", "support"}
    assert set(defs["ToolCount"]["required"]) == {"tool", "count"}
    for name, d in defs.items():
        assert d["additionalProperties"] is False, name
    scen = defs["Scenario"]["properties"]
    assert scen["text"]["maxLength"] == MAX_TEXT and scen["text"]["minLength"] == 1
    assert scen["support"]["maximum"] == MAX_COUNT and scen["support"]["minimum"] == 0
    assert scen["variants"]["maxItems"] == MAX_VARIANTS
    assert defs["ToolEntry"]["properties"]["when"]["maxItems"] == MAX_SCENARIOS
    assert defs["ToolEntry"]["properties"]["precautions"]["maxItems"] == MAX_ITEMS
    assert defs["Conflict"]["properties"]["claims"]["minItems"] == 2


@pytest.mark.parametrize("kind", ["org", "global"])
def test_missing_key_is_rejected_by_both_or_neither(kind):
    """Removing any key: pydantic reports it missing exactly when the JSON Schema requires it."""
    base = full_doc(kind)
    for path in object_paths(base):
        obj = get_path(base, path) if path else base
        for key in list(obj):
            doc = copy.deepcopy(base)
            del (get_path(doc, path) if path else doc)[key]
            where = f"{path}.{key}" if path else key
            schema_missing = missing_required(doc) == [where]
            if jsonschema is not None:
                assert schema_missing == any(e.validator == "required" for e in schema_errors(doc))
            try:
                Compendium.model_validate(doc)
                pyd_missing = False
            except ValidationError as exc:
                pyd_missing = any(
                    e["type"] == "missing" and ".".join(map(str, e["loc"])) == where for e in exc.errors()
                )
            assert schema_missing == pyd_missing, where


# A strategy for valid typed compendia.
texts = st.text(min_size=1, max_size=40)
counts = st.floats(min_value=0, max_value=MAX_COUNT)
org_lists = st.lists(good_org_ids, max_size=3, unique=True).map(sorted)


@st.composite
def compendia(draw) -> dict:
    ids = sorted(set(draw(st.lists(good_tool_ids, max_size=4))))
    kind = draw(st.sampled_from(["org", "global"]))

    def scenario(extra: bool = False) -> dict:
        s = {"text": draw(texts), "support": draw(counts)}
        if draw(st.booleans()):
            s["variants"] = draw(st.lists(texts, max_size=MAX_VARIANTS))
            s["orgs"] = draw(org_lists)
        if extra and draw(st.booleans()):
            s["prefer"] = draw(good_tool_ids)
        return s

    tools = []
    for tool_id in ids:
        calls = draw(counts)
        tool: dict[str, Any] = {"tool_id": tool_id}
        if draw(st.booleans()):
            tool.update(
                description=draw(st.text(max_size=50)),
                when=[scenario() for _ in range(draw(st.integers(0, 3)))],
                when_not=[scenario(True) for _ in range(draw(st.integers(0, 3)))],
                precautions=[
                    {"kind": draw(st.sampled_from(["failure_mode", "dissent", "confusion", "low_success"])),
                     "text": draw(texts), "support": draw(counts), "orgs": draw(org_lists)}
                    for _ in range(draw(st.integers(0, 2)))
                ],
                stats={"calls": calls, "successes": calls * draw(st.floats(0, 1))},
                confusions=[{"tool": draw(good_tool_ids), "count": draw(counts)}],
                provenance={"orgs": draw(org_lists), "rounds": draw(st.lists(st.integers(0, 9), max_size=3))},
            )
        tools.append(tool)
    doc: dict[str, Any] = {"issuer": {"org": draw(good_org_ids)}, "kind": kind, "tools": tools}
    if kind == "global" and ids:
        doc["conflicts"] = [
            {
                "tool_id": ids[0],
                "field": draw(st.sampled_from(["when", "stats"])),
                "subject": draw(texts),
                "claims": [
                    {"view": draw(texts), "support": draw(counts), "orgs": draw(org_lists)}
                    for _ in range(draw(st.integers(2, 4)))
                ],
                "resolution": draw(texts),
                "policy": "typed",
            }
        ]
    return doc


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=compendia())
def test_pydantic_valid_documents_satisfy_the_json_schema(doc):
    c = Compendium.model_validate(doc)
    # the input as given (defaults omitted) already has every key the schema requires ...
    assert missing_required(doc) == []
    assert not schema_errors(doc)
    # ... and so does the canonical dump, which round-trips
    dumped = c.model_dump(mode="json")
    assert missing_required(dumped) == []
    assert not schema_errors(dumped)
    assert Compendium.model_validate(dumped) == c
    assert Compendium.model_validate_json(c.model_dump_json()) == c


def test_full_documents_satisfy_the_json_schema():
    for kind in ("org", "global"):
        assert not schema_errors(full_doc(kind))
    assert not schema_errors({"issuer": {"org": "acme"}})
    assert missing_required({}) == ["issuer"]
    assert missing_required({"issuer": {}}) == ["issuer.org"]
    doc = full_doc()
    del doc["conflicts"][0]["claims"][1]["support"]
    del doc["tools"][0]["when_not"][0]["text"]
    assert sorted(missing_required(doc)) == ["conflicts.0.claims.1.support", "tools.0.when_not.0.text"]
    assert schema_rejects({})
