"""The evaluation protocol: leak filter, train/test splits and non-IID partitions.

:func:`make_splits` holds out whole tools (the held-out-tool test set) and a
share of every other tool's events (the seen-tool test set); the rest is
training, freed of near duplicates of any test query by :func:`leak_filter`
(exact character 3-gram Jaccard, :func:`near_duplicates`; a wrapper many
texts share, a prompt template around the request, is left out of a second
comparison, :func:`without_wrappers`).
:func:`partition_noniid` spreads experience over organisations, non-IID over
tools.
"""

from __future__ import annotations

import logging
import os
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import scipy.sparse as sp
from numpy.lib.stride_tricks import sliding_window_view

from synapse_flwr.core.catalog import Catalog
from synapse_flwr.core.errors import warn_once
from synapse_flwr.core.experience import Event, TestItem, event_label
from synapse_flwr.core.phrases import normalize_text

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- leak filter


@dataclass(frozen=True)
class LeakReport:
    """What :func:`leak_filter` dropped.

    Parameters
    ----------
    total : int
        Training events in.
    exact : int
        Dropped: same normalised text as a test query.
    near : int
        Dropped: shingle Jaccard with a test query at or above the threshold.
    garbage : int
        Dropped: a tool or gold outside the catalog (a query without a letter or digit never makes an
        :class:`~synapse_flwr.core.experience.Event`).
    kept : int
        Events out.
    """

    total: int
    exact: int
    near: int
    garbage: int
    kept: int


# The l of the l-prefix filter: a candidate pair must share this many shingles
# of the two prefixes. Larger l means longer prefixes (a costlier sparse
# product) but far fewer candidates to verify; 8 is the sweet spot on MetaTool.
_PREFIX_SHARED = 8
# Candidate pairs verified per batch, bounding the memory of the expansion.
_VERIFY_BATCH = 50_000
# Training rows per sparse product, bounding the memory of its result.
_PRODUCT_ROWS = 2048


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + c)`` over the starts and counts."""
    ends = np.cumsum(counts)
    total = int(ends[-1]) if len(ends) else 0
    return np.arange(total) - np.repeat(ends - counts, counts) + np.repeat(starts, counts)


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values (a plain sort: faster here than ``np.unique``)."""
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))]


def _dense_ids(codes: np.ndarray) -> tuple[np.ndarray, int]:
    """Map codes to ids ``0..n-1`` in sorted code order; returns the ids and n."""
    order = np.argsort(codes)
    ordered = codes[order]
    ids = np.empty(len(codes), dtype=np.int64)
    ids[order] = np.cumsum(np.concatenate(([False], ordered[1:] != ordered[:-1])))
    return ids, int(ids[order[-1]]) + 1 if len(codes) else 0


def _shingle_codes(keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Row and code of every character 3-gram of every text (vectorised).

    A text shorter than 3 characters is padded with NUL, so it is one shingle.
    """
    padded = [k.ljust(3, "\0") for k in keys]
    lens = np.fromiter(map(len, padded), dtype=np.int64, count=len(padded))
    points = np.frombuffer("".join(padded).encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    # Code points are below 2**21, so three of them pack into one uint64.
    codes = (points[:-2] << np.uint64(42)) | (points[1:-1] << np.uint64(21)) | points[2:]
    n = lens - 2
    rows = np.repeat(np.arange(len(keys)), n)
    return rows, codes[_ranges(np.cumsum(lens) - lens, n)]


def _prefix_matrix(
    rows: np.ndarray,
    ids: np.ndarray,
    size: np.ndarray,
    rank: np.ndarray,
    threshold: float,
    vocab: int,
) -> tuple[sp.csr_matrix, np.ndarray]:
    """Sparse matrix of each set's l-prefix (rarest shingles first) and its required share.

    A partner that passes the size filter overlaps a set of size n in at least
    ``alpha = ceil(t * n)`` shingles; the l-prefix lemma then guarantees
    ``min(l, alpha)`` shared shingles within the first ``n - alpha + min(l, alpha)``.
    """
    # The epsilon keeps t*n that is an integer in exact arithmetic from rounding up.
    alpha = np.ceil(threshold * size - 1e-9).astype(np.int64)
    need = np.minimum(_PREFIX_SHARED, alpha)
    order = np.lexsort((rank[ids], rows))
    rows_s, ids_s = rows[order], ids[order]
    position = np.arange(len(rows_s)) - (np.cumsum(size) - size)[rows_s]
    keep = position < (size - alpha + need)[rows_s]
    matrix = sp.csr_matrix(
        (np.ones(int(keep.sum()), dtype=np.int32), (rows_s[keep], ids_s[keep])),
        shape=(len(size), vocab),
    )
    return matrix, need


def near_duplicates(keys: Sequence[str], reference: Sequence[str], threshold: float) -> np.ndarray:
    """Whether each text has a reference text with shingle Jaccard >= threshold.

    Exact: candidates come from the l-prefix filter (sets ordered rarest
    shingle first must share ``min(l, ceil(t*n))`` shingles of their prefixes,
    computed as one sparse product per block of rows), pass a size filter,
    and are then verified by their full shingle overlap.

    Parameters
    ----------
    keys : sequence of str
        Normalised texts to test.
    reference : sequence of str
        Normalised texts to compare against.
    threshold : float
        Character 3-gram Jaccard similarity in (0, 1].

    Returns
    -------
    numpy.ndarray of bool
        One flag per text of ``keys``.
    """
    found = np.zeros(len(keys), dtype=bool)
    if not keys or not reference:
        return found
    rows_a, codes_a = _shingle_codes(keys)
    rows_b, codes_b = _shingle_codes(reference)
    inverse, vocab = _dense_ids(np.concatenate([codes_a, codes_b]))
    # Distinct (row, shingle) keys, sorted by row then shingle.
    pairs_a = _sorted_unique(rows_a * vocab + inverse[: len(codes_a)])
    pairs_b = _sorted_unique(rows_b * vocab + inverse[len(codes_a) :])
    rows_a, ids_a = np.divmod(pairs_a, vocab)
    rows_b, ids_b = np.divmod(pairs_b, vocab)
    size_a = np.bincount(rows_a, minlength=len(keys))
    size_b = np.bincount(rows_b, minlength=len(reference))
    start_a = np.cumsum(size_a) - size_a
    freq = np.bincount(ids_a, minlength=vocab) + np.bincount(ids_b, minlength=vocab)
    rank = np.empty(vocab, dtype=np.int64)
    rank[np.lexsort((np.arange(vocab), freq))] = np.arange(vocab)
    prefix_a, need_a = _prefix_matrix(rows_a, ids_a, size_a, rank, threshold, vocab)
    prefix_b, need_b = _prefix_matrix(rows_b, ids_b, size_b, rank, threshold, vocab)
    prefix_bt = prefix_b.T.tocsr()
    for lo in range(0, len(keys), _PRODUCT_ROWS):
        shared = (prefix_a[lo : lo + _PRODUCT_ROWS] @ prefix_bt).tocoo()
        i, j = shared.row.astype(np.int64) + lo, shared.col.astype(np.int64)
        na, nb = size_a[i], size_b[j]
        ok = (shared.data >= np.minimum(need_a[i], need_b[j])) & (
            threshold * np.maximum(na, nb) <= np.minimum(na, nb) + 1e-9
        )
        i, j = i[ok & ~found[i]], j[ok & ~found[i]]
        for b in range(0, len(i), _VERIFY_BATCH):
            bi, bj = i[b : b + _VERIFY_BATCH], j[b : b + _VERIFY_BATCH]
            # Look every shingle of the candidate up among the reference's (row, shingle) keys.
            owner = np.repeat(np.arange(len(bi)), size_a[bi])
            probe = bj[owner] * vocab + ids_a[_ranges(start_a[bi], size_a[bi])]
            at = np.minimum(np.searchsorted(pairs_b, probe), len(pairs_b) - 1)
            inter = np.bincount(owner, weights=pairs_b[at] == probe, minlength=len(bi))
            union = size_a[bi] + size_b[bj] - inter
            found[bi[inter >= threshold * union - 1e-9]] = True
    return found


# A word prefix (or suffix) that at least this share of all texts, and at least _WRAPPER_TEXTS of them, open
# (or close) with, over _WRAPPER_CHARS characters or more, is a template's wrapper: prompts written as "Hi
# there. I have a situation... {request}. Please keep in mind..." share it whatever the request, and an agent
# prompt of a few hundred words around each request is one too.
_WRAPPER_SHARE = 0.01
_WRAPPER_TEXTS = 5
_WRAPPER_CHARS = 30
#: A wrapper of this many words is a template a converter should strip, said in a warning: it weighs on every
#: text's embedding (a short shared opening, "can you please provide me with", is phrasing, said at INFO)
TEMPLATE_WORDS = 32


def _wrapper_words(texts: Sequence[list[str]]) -> list[int]:
    """Per text (as words), how many of its first words are a wrapper prefix many texts share (0: none).

    The texts that share a prefix with a text lie next to it in sorted order,
    so the longest prefix it shares with ``need`` texts (itself among them) is
    the best, over the runs of ``need`` sorted neighbours holding it, of the
    shortest common prefix of adjacent texts in the run. Exact at any length:
    a word-by-word trie walked only a prompt's first 64 words, and the rest of
    a longer template made every pair of its requests near duplicates. At
    least one word is left to the request.
    """
    need = max(_WRAPPER_TEXTS, int(np.ceil(_WRAPPER_SHARE * len(texts))))
    if len(texts) < need:
        return [0] * len(texts)
    # joined text sorts like the word lists do here: texts sharing a word prefix are contiguous either way
    order = sorted(range(len(texts)), key=lambda i: " ".join(texts[i]))
    adjacent = np.array([len(os.path.commonprefix([texts[a], texts[b]])) for a, b in pairwise(order)], np.int64)
    run = sliding_window_view(adjacent, need - 1).min(axis=1)  # words shared by sorted texts s .. s + need - 1
    pad = np.zeros(need - 1, np.int64)
    shared = sliding_window_view(np.concatenate([pad, run, pad]), need).max(axis=1)  # per sorted position
    out = [0] * len(texts)
    for k, i in enumerate(order):
        n = min(int(shared[k]), len(texts[i]) - 1)
        out[i] = n if len(" ".join(texts[i][:n])) >= _WRAPPER_CHARS else 0
    return out


def without_wrappers(keys: Sequence[str]) -> list[str]:
    """Each normalised text without the wrapper prefix and suffix it shares with many others (see above).

    A text without one is returned as it is.
    """
    words = [k.split() for k in keys]
    head = _wrapper_words(words)
    rest = [w[h:] for w, h in zip(words, head)]
    tail = _wrapper_words([r[::-1] for r in rest])
    return [k if not (h or t) else " ".join(r[: len(r) - t]) for k, r, h, t in zip(keys, rest, head, tail)]


def leak_key(text: str) -> str:
    """The form a text is compared in by the leak filter: Unicode-composed and case-folded, then normalised.

    Text that reads alike compares alike: a decomposed accent (macOS writes "Zu\u0308rich") split its word in two,
    and fullwidth letters, "ß" against "SS", passed both the exact and the near-duplicate test; so did a
    typographic apostrophe or hyphen ("what\u2019s" against "what's"), which NFKC leaves as it is.
    """
    return normalize_text(unicodedata.normalize("NFKC", text).casefold().translate(_TYPOGRAPHIC))


# apostrophes and hyphens as word processors and phones type them, read as the ASCII ones words are joined by
_TYPOGRAPHIC = str.maketrans(dict.fromkeys("\u2018\u2019\u02bc\u0060", "'")
                             | dict.fromkeys("\u2010\u2011\u2012\u2013\u2212", "-"))


def _wrapped_words(keys: Sequence[str], cores: Sequence[str] | None = None) -> list[int]:
    """Per text, how many of its words are a wrapper (:func:`without_wrappers`; ``cores``: its result, if known)."""
    cores = without_wrappers(keys) if cores is None else cores
    return [len(k.split()) - len(c.split()) for c, k in zip(cores, keys, strict=True)]


def leak_filter(
    train: Sequence[Event],
    test_queries: Sequence[str],
    jaccard: float = 0.8,
    catalog: Catalog | None = None,
    source: str = "the training events",
) -> tuple[list[Event], LeakReport]:
    """Drop training events that leak test queries, and garbage (events of tools outside ``catalog``).

    Parameters
    ----------
    train : sequence of Event
        Training events.
    test_queries : sequence of str
        Every test query (all test sets together).
    jaccard : float
        Character 3-gram shingle Jaccard at which a training query counts as a
        near duplicate of a test query.
    catalog : Catalog or None
        When given, events whose tool or gold is not in it are garbage.
    source : str
        What ``train`` is (a log's path), for the log line.

    Returns
    -------
    (list of Event, LeakReport)
        Kept events in input order, and the counts.
    """
    if not 0 < jaccard <= 1:
        raise ValueError(f"jaccard must be in (0, 1], not {jaccard}")
    test_keys = [k for k in (leak_key(q) for q in test_queries) if k]
    exact_keys = set(test_keys)
    garbage = exact = 0
    candidates: list[tuple[Event, str]] = []
    for event in train:
        known = catalog is None or all(
            catalog.resolve(name) is not None for name in (event.tool, event.gold) if name
        )
        if not known:  # an Event's query has a word already (experience.Query)
            garbage += 1
        elif (key := leak_key(event.query)) in exact_keys:
            exact += 1
        else:
            candidates.append((event, key))
    # texts are compared without a wrapper many share (a prompt template around the request): with it two
    # requests in one template are near duplicates, and a request is not near its own copy in a template
    keys = [k for _, k in candidates]
    cores = without_wrappers([*keys, *test_keys])
    near_flags = near_duplicates(cores[: len(keys)], cores[len(keys):], jaccard)
    words = _wrapped_words([*keys, *test_keys], cores)
    # named where they are (a wrapper on the test queries alone was blamed on every organisation's log too); the
    # test set's from its own texts, so that every organisation's call says the same, once
    for where, part in ((source, words[: len(keys)]), ("the test set", _wrapped_words(test_keys))):
        if long := sum(w >= TEMPLATE_WORDS for w in part):
            # not stripped where queries are embedded: the wrapper's words are a private record's, and what counts
            # as one depends on the other records, which would tie each record's prototype to the others
            warn_once(log, f"{where}: {long} of {len(part)} texts open or close with a wrapper of {TEMPLATE_WORDS} "
                           f"words or more that many share (a prompt template, {max(part)} words at most); every "
                           "arm embeds it with the request, and MiniLM reads a text's first 256 tokens only, so a "
                           "request after a long one is not read: write the requests alone")
    if max(words, default=0) < TEMPLATE_WORDS and (wrapped := sum(w > 0 for w in words)):
        log.info("leak filter, %s: %d of %d texts (training records and test queries) open or close with a wrapper "
                 "many share (a prompt template around the request); they are compared without it", source,
                 wrapped, len(words))
    kept = [event for (event, _), near in zip(candidates, near_flags, strict=True) if not near]
    report = LeakReport(
        total=len(train), exact=exact, near=int(near_flags.sum()), garbage=garbage, kept=len(kept)
    )
    log.info("leak filter, %s: of %d records %d equal a test query, %d nearly do and %d name a tool outside the "
             "catalog: dropped; %d kept", source, report.total, report.exact, report.near, report.garbage, report.kept)
    return kept, report


# --------------------------------------------------------------------------- splits


@dataclass(frozen=True)
class Splits:
    """Train events and the two test sets of the evaluation protocol.

    Parameters
    ----------
    train : list of Event
        Experience of the seen tools, leak-filtered.
    seen_test : list of TestItem
        Held-out queries of tools that have training experience.
    heldout_test : list of TestItem
        Queries of the held-out tools, which have no experience at all.
    heldout_tools : tuple of str
        Ids of the held-out tools, sorted.
    leak : LeakReport
        What the leak filter removed from train.
    """

    train: list[Event]
    seen_test: list[TestItem]
    heldout_test: list[TestItem]
    heldout_tools: tuple[str, ...]
    leak: LeakReport


def _test_items(events: Iterable[tuple[Event, str]]) -> list[TestItem]:
    """Test items, one per distinct normalised query, all its labels acceptable."""
    by_key: dict[str, tuple[str, list[str]]] = {}
    for event, label in events:
        query, golds = by_key.setdefault(normalize_text(event.query), (event.query, []))
        if label not in golds:
            golds.append(label)
    return [TestItem(query=q, gold=tuple(g)) for q, g in by_key.values()]


def _by_label(events: Sequence[Event], catalog: Catalog) -> tuple[dict[str, list[Event]], list[Event]]:
    """Events grouped by their label's tool id, and the events without a label, in order."""
    by_tool: dict[str, list[Event]] = defaultdict(list)
    unlabelled: list[Event] = []
    for event in events:
        tool_id = event_label(event, catalog)
        if tool_id is None:
            unlabelled.append(event)
        else:
            by_tool[tool_id].append(event)
    return by_tool, unlabelled


def _divide(
    by_tool: dict[str, list[Event]], heldout: set[str], rng: np.random.Generator, test_per_tool: int | None,
    test_frac: float,
) -> tuple[list[Event], list[tuple[Event, str]], list[tuple[Event, str]]]:
    """Training events and (event, tool) test pairs of seen and held-out tools (see :func:`make_splits`).

    Tools are visited in sorted order and each draws one permutation of its
    events from ``rng``, so equal seeds give equal splits.
    """
    seen_pairs: list[tuple[Event, str]] = []
    heldout_pairs: list[tuple[Event, str]] = []
    train: list[Event] = []
    for tool_id in sorted(by_tool):
        group = by_tool[tool_id]
        order = rng.permutation(len(group))
        if tool_id in heldout:
            take = len(group) if test_per_tool is None else min(test_per_tool, len(group))
            heldout_pairs.extend((group[i], tool_id) for i in order[:take])
            continue
        n = len(group)
        n_test = 0 if test_frac == 0 or n < 2 else min(n - 1, max(1, round(test_frac * n)))
        if test_per_tool is not None:
            n_test = min(n_test, test_per_tool)
        seen_pairs.extend((group[i], tool_id) for i in order[:n_test])
        train.extend(group[i] for i in sorted(order[n_test:]))
    return train, seen_pairs, heldout_pairs


def make_splits(
    catalog: Catalog,
    events: Sequence[Event],
    seed: int,
    heldout_frac: float = 0.2,
    test_per_tool: int | None = None,
    test_frac: float = 0.2,
    jaccard: float = 0.8,
) -> Splits:
    """Split labelled events into train, seen-tool test and held-out-tool test.

    A fraction of the labelled tools is held out: all their events (or at most
    ``test_per_tool`` of each, sampled) form the held-out test set, and they
    appear in no training event in any role (tool, gold or prev_tool). Of every
    other tool a fraction of events (at least one when it has two or more, and
    at most ``test_per_tool``) forms the seen-tool test set. The rest is
    training, leak-filtered against both test sets. Test items with the same
    normalised query are merged, all their labels acceptable.

    Parameters
    ----------
    catalog : Catalog
        Resolves labels; events whose label is not in it are garbage.
    events : sequence of Event
        Labelled events (``gold``, or ``tool`` of a successful event).
    seed : int
        Seed of the numpy Generator; equal seeds give equal splits.
    heldout_frac : float
        Fraction of labelled tools held out (rounded to the nearest count).
    test_per_tool : int or None
        Cap on test items per tool in either test set; None for no cap.
    test_frac : float
        Fraction of each seen tool's events held out for testing.
    jaccard : float
        Near-duplicate threshold of the leak filter.

    Returns
    -------
    Splits
    """
    if not 0 <= heldout_frac < 1 or not 0 <= test_frac < 1:
        raise ValueError("heldout_frac and test_frac must be in [0, 1)")
    rng = np.random.default_rng(seed)
    by_tool, unlabelled = _by_label(events, catalog)
    tools = sorted(by_tool)
    n_heldout = round(heldout_frac * len(tools))
    heldout = (
        tuple(sorted(rng.choice(tools, size=n_heldout, replace=False).tolist()))
        if n_heldout
        else ()
    )
    heldout_set = set(heldout)

    train, seen_pairs, heldout_pairs = _divide(by_tool, heldout_set, rng, test_per_tool, test_frac)
    # Unlabelled events still count as experience; the leak filter drops the
    # ones whose tools are unknown.
    pool = [
        e
        for e in [*train, *unlabelled]
        if not {catalog.resolve(n) for n in (e.tool, e.gold, e.prev_tool) if n} & heldout_set
    ]
    seen_test, heldout_test = _test_items(seen_pairs), _test_items(heldout_pairs)
    kept, leak = leak_filter(pool, [t.query for t in (*seen_test, *heldout_test)], jaccard, catalog)
    log.info(
        "splits(seed=%d): %d held-out tools, train %d, seen test %d, held-out test %d",
        seed,
        len(heldout),
        len(kept),
        len(seen_test),
        len(heldout_test),
    )
    return Splits(kept, seen_test, heldout_test, heldout, leak)


def partition_noniid(events: Sequence[Event], k: int, alpha: float, seed: int) -> list[list[Event]]:
    """Split events across ``k`` organisations, non-IID over tools.

    For every tool (label: ``gold``, else ``tool``) its events are shuffled and
    cut into ``k`` shares with proportions drawn from ``Dirichlet(alpha)``;
    small ``alpha`` concentrates each tool in few organisations.

    Parameters
    ----------
    events : sequence of Event
        Events to distribute.
    k : int
        Number of organisations (``org0`` .. ``org{k-1}``).
    alpha : float
        Dirichlet concentration (> 0).
    seed : int
        Seed of the numpy Generator; equal seeds give equal partitions.

    Returns
    -------
    list of list of Event
        ``k`` lists covering every event exactly once, each event carrying
        ``org=f"org{i}"``, in input order within each list.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    if alpha <= 0:
        raise ValueError(f"alpha must be positive, not {alpha}")
    rng = np.random.default_rng(seed)
    by_tool: dict[str, list[int]] = defaultdict(list)
    for i, event in enumerate(events):
        by_tool[event.gold or event.tool].append(i)
    owner = np.empty(len(events), dtype=np.int64)
    for tool in sorted(by_tool):
        idx = np.asarray(by_tool[tool])[rng.permutation(len(by_tool[tool]))]
        shares = rng.dirichlet(np.full(k, alpha))
        cuts = np.floor(np.cumsum(shares)[:-1] * len(idx)).astype(np.int64)
        for org, part in enumerate(np.split(idx, cuts)):
            owner[part] = org
    parts: list[list[Event]] = [[] for _ in range(k)]
    for i, event in enumerate(events):
        parts[owner[i]].append(event.model_copy(update={"org": f"org{owner[i]}"}))
    return parts
