"""Canonical JSON, content hashes, compression and edge validation of artifacts.

Canonical JSON (sorted keys, no insignificant whitespace, UTF-8) makes equal
compendia byte-identical, so a sha256 of it identifies an artifact. On the wire
an artifact may be gzip-compressed (deterministically: no timestamp).
Decoding is defensive: size limits before and after decompression, JSON
parsing (strict UTF-8, no NaN/Infinity literals, no duplicate keys, a bounded
number of JSON values), the required blocks, strict schema validation, then
the content checks the schema cannot express (duplicate entries inside a tool,
an org artifact attributing items to other organisations, text that is not
valid Unicode or reads as an instruction to an LLM, a line break or other
control character in an org artifact's text), every failure reported as one
:class:`ArtifactError` listing field paths.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.files import write_atomic
from synapse_flwr.core.prototypes import decode_prototype
from synapse_flwr.core.sanitize import control_character, foldable, instruction_like
from synapse_flwr.core.schema import (
    MAX_CONFLICTS,
    MAX_ITEMS,
    MAX_SCENARIOS,
    MAX_TOOLS,
    RESERVED_ORGS,
    Compendium,
    ConflictField,
    FlatCompendium,
)

# Size limits follow from the schema's tool bound: an artifact may take, on average per tool, at
# most MAX_TOOL_BYTES and MAX_TOOL_VALUES JSON values (entry, prototype and its share of the
# conflict log), plus a fixed allowance for the header. The totals bound what is read and
# parsed at all; once parsed, an artifact is held to the budget of the tools it has, before
# validation (the costly part), so a small artifact cannot spend the budget of 20,000 tools.
# Measured (docs/results/perf): ~3 KB and ~150 values per tool for a MetaTool-derived org
# artifact without privacy, ~12 KB per tool for a 5-org global with its conflict log.
MAX_TOOL_BYTES = 16 * 1024
MAX_TOOL_VALUES = 1_000
HEADER_BYTES = 1024 * 1024
HEADER_VALUES = 10_000


def wire_limit(tools: int) -> int:
    """Largest payload (compressed or not) an artifact of ``tools`` tools may take: its header and tool budget."""
    return HEADER_BYTES + tools * MAX_TOOL_BYTES


MAX_WIRE_BYTES = wire_limit(MAX_TOOLS)
MAX_JSON_VALUES = HEADER_VALUES + MAX_TOOLS * MAX_TOOL_VALUES
REQUIRED_BLOCKS = {Compendium: ("schema_version", "kind", "issuer", "privacy", "tools"),
                   FlatCompendium: ("schema_version", "kind", "issuer", "privacy", "texts")}
_GZIP_MAGIC = b"\x1f\x8b"

Artifact = Compendium | FlatCompendium


class ArtifactError(SynapseError):
    """An artifact failed to decode or validate.

    Parameters
    ----------
    errors : list of str
        One line per problem, each naming the field path.
    """

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("; ".join(errors[:5]) + (f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""))


def canonical_json(artifact: BaseModel) -> bytes:
    """Byte-stable JSON of a model: sorted keys, compact separators, UTF-8."""
    return json.dumps(
        artifact.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")


def content_hash(artifact: BaseModel) -> str:
    """sha256 (hex) of the canonical JSON."""
    return hashlib.sha256(canonical_json(artifact)).hexdigest()


def routing_hash(artifact: Compendium | FlatCompendium) -> str:
    """sha256 (hex) of what a router reads of an artifact: its canonical JSON less the issuer's round and the inputs.

    Two globals of one run that differ only there (a round in which no
    organisation released anything new) route every query alike.
    """
    update: dict[str, Any] = {"issuer": artifact.issuer.model_copy(update={"round": 0})}
    if isinstance(artifact, Compendium):
        update["inputs"] = []
    return content_hash(artifact.model_copy(update=update))


def encode(artifact: BaseModel, compress: bool = True) -> bytes:
    """Serialise for the wire: canonical JSON, gzip-compressed unless told not to.

    Parameters
    ----------
    artifact : pydantic.BaseModel
        The artifact (a Compendium or FlatCompendium).
    compress : bool
        Gzip the JSON (level 9, no timestamp: the bytes are stable).

    Returns
    -------
    bytes
        The canonical JSON (sorted keys, compact, UTF-8), gzipped when ``compress``.
    """
    raw = canonical_json(artifact)
    return gzip.compress(raw, compresslevel=9, mtime=0) if compress else raw


def _inflate(data: bytes, max_bytes: int) -> bytes:
    # Bounded decompression: a small bomb must not exhaust memory.
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise ArtifactError([f"(wire): corrupt gzip data: {exc}"]) from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise ArtifactError([f"(wire): decompressed size exceeds the limit of {max_bytes} bytes"])
    if not inflater.eof:
        raise ArtifactError(["(wire): corrupt gzip data: truncated stream"])
    return out


def validation_errors(exc: ValidationError) -> list[str]:
    """One ``path: message`` line per pydantic error."""
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(root)"
        lines.append(f"{path}: {err['msg']}")
    return lines


def _leaves(obj: Any):
    # every scalar of a decoded JSON object with its field path, depth-first, without recursion
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack += [(f"{path}.{k}" if path else str(k), v) for k, v in reversed(value.items())]
        elif isinstance(value, list):
            stack += [(f"{path}.{i}" if path else str(i), v) for i, v in reversed(list(enumerate(value)))]
        else:
            yield path or "(root)", value


def boolean_values(obj: Any) -> list[str]:
    """JSON booleans: no field of the compendium is one, and the schema would read them as 0 or 1."""
    return [f"{path}: a boolean ({value!r}) where the schema has a number or text"
            for path, value in _leaves(obj) if isinstance(value, bool)]


def text_problems(obj: Any, org: bool = True) -> list[str]:
    """Strings that are not valid Unicode (lone surrogates) or read as an instruction to an LLM.

    In an org artifact (``org``), also strings holding a line break or other
    control character: no text an honest builder writes is more than one line
    (catalog text is folded, phrases are words), and one that were could
    imitate the lines of the reranker's prompt. A global's are not refused
    (one merged by an older server may hold them); its renderer puts each
    text on one line.
    """
    lines = []
    for path, text in _leaves(obj):
        if not isinstance(text, str):
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            lines.append(f"{path}: not valid Unicode (lone surrogate)")
            continue
        found = instruction_like(text)
        if found:
            lines.append(f"{path}: instruction-like text quarantined ({found})")
        if org and (char := control_character(text)):
            lines.append(f"{path}: a line break or control character ({char}); an org artifact's text is one line")
    return lines


def _scalars(obj: Any) -> tuple[set[str], bool]:
    # the distinct strings of a decoded JSON object, and whether it holds a boolean; no paths built
    strings: set[str] = set()
    boolean = False
    stack = [obj]
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is dict:
            stack.extend(value.values())
        elif kind is list:
            stack.extend(value)
        elif kind is str:
            strings.add(value)
        elif kind is bool:
            boolean = True
    return strings, boolean


def suspect_scalars(obj: Any, org: bool = True) -> bool:
    """Whether :func:`boolean_values` or :func:`text_problems` (with ``org``) could report anything.

    A fast screen (each distinct string checked once, no field paths): the
    reporting walks, which name every path, run only on artifacts it flags.
    """
    strings, boolean = _scalars(obj)
    text = "\n".join(strings)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    if org and any(control_character(s) for s in strings):
        return True
    # a match inside one string is a match in the joined text (a newline is a word boundary); a match
    # spanning two strings only costs the exact walk. Strings read folded are read one by one: one of
    # them must not make the whole text be read three times.
    folds = [foldable(s) for s in strings]
    if any(folds):
        text = "\n".join(s for s, f in zip(strings, folds, strict=True) if not f)
    return (boolean or instruction_like(text) is not None
            or any(instruction_like(s) for s, f in zip(strings, folds, strict=True) if f))


def _repeated(values: list, path: str) -> list[str]:
    seen: set = set()
    dups = [v for v in values if v in seen or seen.add(v)]
    return [f"{path}: duplicate entry {dups[0]!r}"] if dups else []


def duplicate_entries(art: Compendium) -> list[str]:
    """Entries repeated inside one tool (scenario texts, variants, precautions, tool counts, rounds)."""
    lines = []
    for i, t in enumerate(art.tools):
        at = f"tools.{i}"
        lines += _repeated([s.text for s in t.when], f"{at}.when")
        lines += _repeated([(w.text, w.prefer) for w in t.when_not], f"{at}.when_not")
        for field, scenarios in (("when", t.when), ("when_not", t.when_not)):
            for j, s in enumerate(scenarios):
                lines += _repeated([s.text, *s.variants], f"{at}.{field}.{j}.variants")
        lines += _repeated([(p.kind, p.text) for p in t.precautions], f"{at}.precautions")
        lines += _repeated([c.tool for c in t.confusions], f"{at}.confusions")
        lines += _repeated([c.tool for c in t.next_tools], f"{at}.next_tools")
        lines += _repeated(t.provenance.rounds, f"{at}.provenance.rounds")
    return lines


def _org_lists(art: Compendium) -> Iterator[tuple[str, list[str]]]:
    # every per-item organisation attribution of a compendium, with its field path
    for i, t in enumerate(art.tools):
        for name, items in (("when", t.when), ("when_not", t.when_not), ("precautions", t.precautions)):
            for j, item in enumerate(items):
                yield f"tools.{i}.{name}.{j}.orgs", item.orgs
        yield f"tools.{i}.provenance.orgs", t.provenance.orgs
    for i, c in enumerate(art.conflicts):
        for j, claim in enumerate(c.claims):
            yield f"conflicts.{i}.claims.{j}.orgs", claim.orgs


def foreign_orgs(art: Compendium) -> list[str]:
    """Attributions of an org artifact to anyone but its issuer: each ``orgs`` list must be ``[]`` or ``[issuer.org]``.

    An organisation speaks only for itself; naming others would let one
    organisation back a claim in their name and win a contest decided by how
    many organisations back each side. A global's lists are left alone.
    """
    if art.kind != "org":
        return []
    own = [art.issuer.org]
    return [f"{path}: {orgs} names an organisation other than the issuer; an org artifact may attribute only to "
            f"itself ([] or {own})" for path, orgs in _org_lists(art) if orgs and orgs != own]


def prototype_problems(art: Compendium) -> list[str]:
    """Prototypes longer than a sum of ``count`` unit vectors can be, noise and int8 steps allowed.

    A sum of ``n`` unit vectors has norm at most ``n``; the bound adds six noise
    SDs of the count, the noise norm (``sum_sd * (sqrt(dim) + 6)``) and the
    quantisation error (``scale * sqrt(dim) / 2``).
    """
    lines = []
    for i, t in enumerate(art.tools):
        p = t.prototype
        if p is None:
            continue
        root = math.sqrt(p.dim)
        bound = p.count + 6 * p.count_sd + p.sum_sd * (root + 6) + p.scale * root / 2 + 1e-6
        x = decode_prototype(p)
        norm = math.sqrt(float(x @ x))
        if norm > bound:
            lines.append(f"tools.{i}.prototype: norm {norm:.4g} exceeds {bound:.4g}, "
                         f"the most a sum of {p.count:g} unit vectors can have")
    return lines


_TOP_LISTS = {"tools": MAX_TOOLS, "texts": MAX_TOOLS, "conflicts": MAX_CONFLICTS,
              "conflicts_dropped": MAX_TOOLS * len(ConflictField.__args__)}
_TOOL_LISTS = {"when": MAX_SCENARIOS, "when_not": MAX_SCENARIOS, "precautions": MAX_ITEMS,
               "confusions": MAX_ITEMS, "next_tools": MAX_ITEMS}


def oversized_lists(obj: dict) -> list[str]:
    """Lists over their schema limit, found before validation (which checks a list's length
    only after validating every item, so a huge list would cost its full validation)."""
    lines = [f"{k}: {len(obj[k])} items, at most {n} allowed" for k, n in _TOP_LISTS.items()
             if isinstance(obj.get(k), (list, dict)) and len(obj[k]) > n]
    tools = obj.get("tools")
    if lines or not isinstance(tools, list):
        return lines
    for i, t in enumerate(tools):
        if isinstance(t, dict):
            lines += [f"tools.{i}.{k}: {len(t[k])} items, at most {n} allowed" for k, n in _TOOL_LISTS.items()
                      if isinstance(t.get(k), list) and len(t[k]) > n]
    return lines


def parse_artifact(obj: Any) -> Artifact:
    """Validate a decoded JSON object as a typed or flat compendium.

    Raises
    ------
    ArtifactError
        With one line per missing block, schema violation, duplicate entry or bad text.
    """
    if not isinstance(obj, dict):
        raise ArtifactError(["(root): an artifact must be a JSON object"])
    model = FlatCompendium if "texts" in obj else Compendium
    errors = [f"{name}: required block missing" for name in REQUIRED_BLOCKS[model] if name not in obj]
    if oversized := oversized_lists(obj):
        raise ArtifactError(errors + oversized)
    try:
        art = model.model_validate(obj)
    except ValidationError as exc:
        raise ArtifactError(errors + validation_errors(exc)) from None
    if art.kind == "org" and art.issuer.org in RESERVED_ORGS:
        errors.append(f"issuer.org: {art.issuer.org!r} is reserved, no organisation may issue as it")
    if isinstance(art, Compendium):
        errors += duplicate_entries(art) + foreign_orgs(art) + prototype_problems(art)
    org = art.kind == "org"
    if suspect_scalars(obj, org):
        errors += boolean_values(obj) + text_problems(obj, org)
    if errors:
        raise ArtifactError(errors)
    return art


class _NonFinite:
    # NaN/Infinity literals become a value of no JSON type: the schema rejects it at the field's path
    def __repr__(self) -> str:
        return "NaN/Infinity"


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {dup!r} in one object")
    return obj


def unwrap(data: bytes, max_bytes: int = MAX_WIRE_BYTES) -> bytes:
    """The JSON bytes of a wire payload (gzip inflated), within ``max_bytes`` before and after.

    Raises
    ------
    ArtifactError
        If the payload is oversized or its gzip stream corrupt or truncated.
    """
    if len(data) > max_bytes:
        raise ArtifactError([f"(wire): {len(data)} bytes exceeds the limit of {max_bytes} bytes"])
    return _inflate(data, max_bytes) if data[:2] == _GZIP_MAGIC else data


def parse_json(raw: bytes) -> Any:
    """Parse untrusted JSON bytes: strict UTF-8, bounded size of the tree, no duplicate keys.

    NaN and Infinity literals parse to a non-number marker that schema validation
    rejects at its field path.

    Raises
    ------
    ArtifactError
        If the bytes are not UTF-8, hold too many values, or are not JSON.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError([f"(wire): not valid JSON: invalid UTF-8 at byte {exc.start}"]) from None
    values = json_values(raw)
    if values > MAX_JSON_VALUES:
        raise ArtifactError([f"(wire): about {values} JSON values exceeds the limit of {MAX_JSON_VALUES}"])
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=lambda _: _NonFinite())
    except (ValueError, RecursionError) as exc:  # incl. JSONDecodeError
        raise ArtifactError([f"(wire): not valid JSON: {exc}"]) from None


def json_values(raw: bytes) -> int:
    """An upper bound on the JSON values in ``raw``, counted in C."""
    return raw.count(b",") + raw.count(b"{") + raw.count(b"[") + 1


def over_budget(raw: bytes, obj: Any) -> list[str]:
    """Bytes or JSON values beyond what the artifact's own number of tools allows (see MAX_TOOL_BYTES)."""
    items = obj.get("tools", obj.get("texts")) if isinstance(obj, dict) else None
    return budget_problems(raw, len(items) if isinstance(items, (list, dict)) else 0)


def budget_problems(raw: bytes, tools: int) -> list[str]:
    """Bytes or JSON values of ``raw`` beyond the budget of an artifact of ``tools`` tools."""
    limits = (("bytes", len(raw), wire_limit(tools)),
              ("JSON values", json_values(raw), HEADER_VALUES + tools * MAX_TOOL_VALUES))
    return [f"(wire): {n} {what} for {tools} tools exceeds the budget of {limit} "
            f"({MAX_TOOL_BYTES if what == 'bytes' else MAX_TOOL_VALUES} per tool on average)"
            for what, n, limit in limits if n > limit]


def decode(data: bytes, max_bytes: int = MAX_WIRE_BYTES) -> Artifact:
    """Decode and validate bytes from the wire (gzip or plain JSON).

    Parameters
    ----------
    data : bytes
        What the client sent.
    max_bytes : int
        Limit on both the received and the decompressed size.

    Raises
    ------
    ArtifactError
        If the artifact is oversized, corrupt, not JSON, or not schema-valid.
    """
    return parse_body(unwrap(data, max_bytes))


def parse_body(raw: bytes) -> Artifact:
    """Parse and validate unwrapped JSON bytes, held to the budget of their tools before validation.

    Raises
    ------
    ArtifactError
        As :func:`parse_json`, :func:`over_budget` and :func:`parse_artifact` report.
    """
    obj = parse_json(raw)
    if over := over_budget(raw, obj):
        raise ArtifactError((oversized_lists(obj) if isinstance(obj, dict) else []) + over)
    return parse_artifact(obj)


def load_artifact(path: str | Path, max_bytes: int = MAX_WIRE_BYTES) -> Artifact:
    """Read and validate an artifact file (plain or gzipped JSON).

    Parameters
    ----------
    path : str or Path
        The artifact's file (gzip is recognised by its content, not its name).
    max_bytes : int
        Limit on both the file's and the decompressed size.

    Returns
    -------
    Compendium or FlatCompendium
        The validated artifact.

    Raises
    ------
    ArtifactError
        If the file is missing or unreadable, oversized, corrupt, not JSON or
        not schema-valid, with one line per problem.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ArtifactError([f"(file): cannot read {path}: {exc.strerror or exc}"]) from None
    return decode(data, max_bytes)


def save_artifact(path: str | Path, artifact: BaseModel) -> Path:
    """Write an artifact atomically; gzip when the name ends in ``.gz``.

    Parameters
    ----------
    path : str or Path
        Destination file; its folder is created if needed.
    artifact : pydantic.BaseModel
        The artifact to write (serialised by :func:`encode`).

    Returns
    -------
    Path
        The path written.

    Raises
    ------
    InputError
        If ``path`` is a folder or cannot be written
        (:func:`~synapse_flwr.core.files.write_atomic`).
    """
    path = Path(path)
    return write_atomic(path, encode(artifact, compress=path.suffix == ".gz"))
