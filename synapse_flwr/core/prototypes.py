"""Query prototypes: per tool, the noised sum of the unit embeddings of the queries it served.

Privacy model (shared with :mod:`synapse_flwr.core.privacy`)
-----------------------------------------------------------
One record (event) with label ``y`` (its ``gold`` tool, else its tool when
the call succeeded, else none) adds ``c * u`` to tool ``y``'s sum, where ``u``
is the record's L2-normalised query embedding and ``c >= 1`` the prototype
weight, and +1 to ``y``'s prototype count. The sums and counts are released
in the *same* Gaussian release as the builder's other counters, so the L2
sensitivity of the whole release is
``sqrt(max_contributions + PROTOTYPE_COUNTERS + c^2)`` and every coordinate
gets ``N(0, sigma^2)``. Dividing the released sum by ``c`` is
post-processing: the stored sum is in units of queries, with noise
``sigma / c`` per coordinate. ``c`` therefore splits the budget between the
counters (phrases, stats) and the prototypes.

On the wire a sum is int8 with one float step per vector (base64 in JSON);
every tool of the catalog gets a prototype when private (presence is not
revealed), only the tools with experience when not.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence

import numpy as np

from synapse_flwr.core.schema import MAX_COUNT, MAX_SCALE, EmbeddingSpace, Prototype

#: Counters a prototype adds to one record's contribution: its count.
PROTOTYPE_COUNTERS = 1
_INT8_MAX = 127


def prototype_sensitivity(max_contributions: int, weight: float, prototypes: int = 1) -> float:
    """L2 sensitivity of one record's release when it also adds ``weight * u`` to prototypes.

    Parameters
    ----------
    max_contributions : int
        +1 counters one record may touch besides the prototypes.
    weight : float
        Prototype weight ``c``; 0 means no prototypes.
    prototypes : int
        Distinct tools' prototypes one record may add to (each ``c * u`` and
        +1 to its count): 1 for an event, up to the tools of a sequence record.

    Returns
    -------
    float
        ``sqrt(max_contributions + prototypes * (1 + c^2))``, or
        ``sqrt(max_contributions)`` when ``c = 0``.
    """
    extra = prototypes * (PROTOTYPE_COUNTERS + weight * weight) if weight > 0 else 0.0
    return math.sqrt(max_contributions + extra)


def space_of(embedder: object) -> EmbeddingSpace:
    """The :class:`EmbeddingSpace` of an embedder (its ``name`` and ``dim``; rows L2-normalised)."""
    return EmbeddingSpace(model=str(embedder.name)[:128], dim=int(embedder.dim), normalization="l2")  # type: ignore[attr-defined]


def space_mismatch(space: EmbeddingSpace | None, embedder: object) -> str | None:
    """Why prototypes in ``space`` cannot be compared with ``embedder``'s vectors, or None if they can."""
    if space is None:
        return "the compendium names no embedding space"
    name, dim = getattr(embedder, "name", None), getattr(embedder, "dim", None)
    if space.model != name or space.dim != dim:
        return f"prototypes are in {space.model!r} ({space.dim} dims), the router embeds with {name!r} ({dim} dims)"
    return None


def sum_prototypes(
    labels: Sequence[str | None], vectors: np.ndarray, tool_ids: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Exact per-tool sums of L2-normalised query vectors, and their counts.

    Parameters
    ----------
    labels : sequence of str or None
        Per record, the tool it serves (None: the record adds nothing).
    vectors : numpy.ndarray
        ``(len(labels), dim)`` query embeddings; rows are re-normalised, so
        each record adds a unit vector (the sensitivity bound needs it).
    tool_ids : sequence of str
        The tools, in output row order.

    Returns
    -------
    sums, counts : numpy.ndarray
        ``(len(tool_ids), dim)`` float64 and ``(len(tool_ids),)`` float64.
    """
    vectors = np.asarray(vectors, dtype=np.float64)
    if len(labels) != len(vectors):
        raise ValueError(f"{len(labels)} labels but {len(vectors)} vectors")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = np.where(norms > 0, vectors / np.maximum(norms, 1e-12), 0.0)
    row = {t: i for i, t in enumerate(tool_ids)}
    sums = np.zeros((len(tool_ids), vectors.shape[1]))
    counts = np.zeros(len(tool_ids))
    for label, u in zip(labels, unit):
        if label is not None and label in row:
            sums[row[label]] += u
            counts[row[label]] += 1.0
    return sums, counts


def noise_prototypes(
    sums: np.ndarray, counts: np.ndarray, weight: float, sigma: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian release of ``weight * sums`` and ``counts``, returned in units of queries.

    Parameters
    ----------
    sums, counts : numpy.ndarray
        Exact sums ``(n_tools, dim)`` and counts ``(n_tools,)``.
    weight : float
        Prototype weight ``c > 0``.
    sigma : float
        Noise SD of the release (calibrated to :func:`prototype_sensitivity`).
    rng : numpy.random.Generator
        Source of noise.

    Returns
    -------
    sums, counts : numpy.ndarray
        ``(c * sums + N(0, sigma^2)) / c`` (noise ``sigma / c``) and
        ``max(counts + N(0, sigma^2), 0)``.
    """
    if not weight > 0 or not math.isfinite(weight):
        raise ValueError(f"prototype weight must be finite and > 0, got {weight!r}")
    if not math.isfinite(sigma) or sigma < 0:
        raise ValueError(f"sigma must be finite and >= 0, got {sigma!r}")
    if sigma == 0:
        return np.asarray(sums, np.float64).copy(), np.asarray(counts, np.float64).copy()
    noised = (weight * sums + rng.normal(0.0, sigma, size=sums.shape)) / weight
    return noised, np.maximum(counts + rng.normal(0.0, sigma, size=counts.shape), 0.0)


def encode_prototype(vector: np.ndarray, count: float, sum_sd: float, count_sd: float) -> Prototype:
    """Quantise a sum to int8 with one float step (max |x| / 127) and wrap it as a :class:`Prototype`."""
    vector = np.asarray(vector, dtype=np.float64)
    if not np.isfinite(vector).all():
        raise ValueError("prototype sum has non-finite values")
    peak = float(np.abs(vector).max()) if vector.size else 0.0
    scale = peak / _INT8_MAX
    q = np.zeros(vector.shape, np.int8) if scale == 0 else np.clip(
        np.rint(vector / scale), -_INT8_MAX, _INT8_MAX).astype(np.int8)
    return Prototype(count=round(max(count, 0.0), 4), scale=scale, data=base64.b64encode(q.tobytes()).decode(),
                     sum_sd=round(sum_sd, 6), count_sd=round(count_sd, 6))


def decode_prototype(p: Prototype) -> np.ndarray:
    """The float64 sum a :class:`Prototype` stores."""
    return np.frombuffer(base64.b64decode(p.data), dtype=np.int8).astype(np.float64) * p.scale


def merge_prototypes(protos: Sequence[Prototype]) -> Prototype:
    """Sum several orgs' prototypes of one tool: sums and counts add, noise SDs add in quadrature.

    Coordinates are summed with :func:`math.fsum` (exactly rounded), so the
    result does not depend on the order of ``protos``. Inputs each within the
    schema's bounds may sum past them: a count or SD past
    :data:`~synapse_flwr.core.schema.MAX_COUNT` saturates there, and a sum
    whose largest coordinate passes the int8 range (``127 * MAX_SCALE``) is
    shrunk whole, its direction kept, rather than fail the merge.
    """
    if not protos:
        raise ValueError("no prototypes to merge")
    stacked = np.stack([decode_prototype(p) for p in protos])
    total = np.array(list(map(math.fsum, stacked.T.tolist())))
    peak = float(np.abs(total).max())
    top = _INT8_MAX * MAX_SCALE * (1 - 1e-9)  # the margin keeps the step (peak / 127) within MAX_SCALE once rounded
    if peak > top:
        total = total * (top / peak)
    return encode_prototype(
        total,
        min(math.fsum(p.count for p in protos), MAX_COUNT),
        min(math.sqrt(math.fsum(p.sum_sd**2 for p in protos)), MAX_COUNT),
        min(math.sqrt(math.fsum(p.count_sd**2 for p in protos)), MAX_COUNT),
    )


def scale_prototype(p: Prototype, factor: float) -> Prototype:
    """A prototype weighted by ``factor`` (sum, count and their noise SDs)."""
    return encode_prototype(decode_prototype(p) * factor, p.count * factor, p.sum_sd * factor, p.count_sd * factor)


def signal_energy(p: Prototype) -> tuple[float, float]:
    """Noise-corrected squared norm of a prototype's true sum, and that estimate's noise SD.

    ``|S|^2 - dim * sd^2`` is unbiased for the true ``|S|^2``; under noise
    alone it has SD ``sqrt(2 * dim) * sd^2``. Without noise: ``(|S|^2, 0)``.
    """
    x = decode_prototype(p)
    return float(x @ x) - x.size * p.sum_sd**2, math.sqrt(2 * x.size) * p.sum_sd**2


def stacked_prototypes(protos: Sequence[Prototype | None], dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sums ``(n, dim)``, noise SDs and counts of ``protos`` as arrays (zeros for a missing one)."""
    sums = np.stack([decode_prototype(p) if p is not None else np.zeros(dim) for p in protos])
    sds = np.array([p.sum_sd if p is not None else 0.0 for p in protos])
    counts = np.array([p.count if p is not None else 0.0 for p in protos])
    return sums, sds, counts


def signal_energies(sums: np.ndarray, sds: np.ndarray) -> np.ndarray:
    """Per row of noised sums, :func:`signal_energy`'s estimate ``|S|^2 - dim * sd^2`` (may be negative)."""
    return np.einsum("ij,ij->i", sums, sums) - sums.shape[1] * sds**2


def shrunk_directions(sums: np.ndarray, sds: np.ndarray, shrink: float) -> tuple[np.ndarray, np.ndarray]:
    """Per row of noised sums: its direction and noise shrinkage, as a router reads a prototype.

    The direction is the sum over the noise-corrected norm of the true sum
    (:func:`signal_energy`, ``A``); the shrinkage is ``A^2 / (A^2 + shrink * sd^2)``.
    A row with no signal left above its noise gets a zero direction and shrinkage 0.

    Parameters
    ----------
    sums : numpy.ndarray
        ``(n, dim)`` float64 sums in units of queries.
    sds : numpy.ndarray
        ``(n,)`` noise SD per coordinate of each sum.
    shrink : float
        ``k`` of the shrinkage.
    """
    signal = signal_energies(sums, sds)
    alive = signal > 0
    safe = np.where(alive, signal, 1.0)
    dirs = np.where(alive[:, None], sums / np.sqrt(safe)[:, None], 0.0)
    return dirs, np.where(alive, safe / (safe + shrink * sds**2), 0.0)


def noise_pvalue(p: Prototype) -> float:
    """The probability that noise alone gives a sum at least as long as ``p``'s.

    Under noise alone ``|x|^2 / sum_sd^2`` is chi-square with ``dim`` degrees
    of freedom (its right tail is heavier than a normal one: 3 normal SDs
    above its mean has 0.23%, not 0.13%, at 384 dimensions). Without noise:
    0 for any non-zero sum, 1 for a zero one.
    """
    x = decode_prototype(p)
    energy = float(x @ x)
    if p.sum_sd == 0:
        return 0.0 if energy > 0 else 1.0
    from scipy.stats import chi2

    return float(chi2.sf(energy / p.sum_sd**2, x.size))


def readable(protos: Sequence[Prototype | None], alpha: float, count_sds: float = 0.0) -> list[bool]:
    """Which prototypes a router reads: those noise alone would make as long with probability ``<= alpha / n``,
    whose released count also exceeds ``count_sds`` of its noise SDs.

    ``n`` counts the noised prototypes (Bonferroni over the catalog, so
    noise alone passes the length test on any of them with probability at
    most ``alpha``; the count's noise is independent of the sum's, so the
    count test multiplies that chance by how often noise alone clears it:
    ``P(N(0, 1) > count_sds)`` for one release, more for a merged count,
    whose parts were each clipped at 0); a prototype without noise is read
    when its sum is not zero.
    """
    noised = sum(p is not None and p.sum_sd > 0 for p in protos)
    level = alpha / max(noised, 1)
    return [p is not None and signal_energy(p)[0] > 0 and noise_pvalue(p) <= level
            and p.count > count_sds * p.count_sd for p in protos]


def along_documentation(protos: Sequence[Prototype | None], docs: np.ndarray, sds: float | None) -> list[bool]:
    """Which prototypes point along their tool's public documentation vector by more than ``sds`` noise SDs.

    The projection of a released sum on a fixed public unit vector ``d`` is
    the true projection plus ``N(0, sum_sd^2)`` exactly (a merge adds the
    organisations' sums, whose noise is never clipped), so for a tool no
    record teaches ``S . d > sds * sum_sd`` holds with probability
    ``P(N(0, 1) > sds)``. Among the noise-only prototypes long enough to pass
    :func:`readable`'s length test the projection is a little wider
    (``|x|^2 / (dim * sum_sd^2)`` times the variance, about 1.2 at 384
    dimensions), so noise passes both somewhat more often than the product
    of the two rates. A real tool's queries point along its documentation
    (its prototype's projection is the sum of their cosines with ``d``), so
    only a tool whose traffic is unlike its own documentation loses its
    prototype to this test. A prototype without noise, or ``sds`` None,
    passes.

    Parameters
    ----------
    protos : sequence of Prototype or None
        One per tool (None: nothing to read, False).
    docs : numpy.ndarray
        ``(len(protos), dim)`` the tools' unit documentation vectors, in the prototypes' space.
    sds : float or None
        Noise SDs the projection must clear; None: no test.
    """
    docs = np.asarray(docs, np.float64)
    return [p is not None and (sds is None or p.sum_sd == 0 or float(decode_prototype(p) @ d) > sds * p.sum_sd)
            for p, d in zip(protos, docs, strict=True)]


def gate_reads(
    protos: Sequence[Prototype | None], docs: np.ndarray, alpha: float, count_sds: float, doc_sds: float | None
) -> list[bool]:
    """The prototypes a router reads: :func:`readable`, and then either along the documentation or longer still.

    A prototype that passes the length and count tests is read when it also
    points along its tool's documentation (:func:`along_documentation`), or
    when it passes the length test at ``alpha * P(N(0, 1) > doc_sds)``: a
    tool whose traffic is unlike its documentation keeps a prototype that
    is clearly not noise. Noise alone then passes with probability about
    ``alpha * (P(z > doc_sds | long) + P(N(0, 1) > doc_sds))``, where
    ``z`` is the projection's SD count among the sums long enough for the
    length test (``alpha * 0.061`` at 2 SDs, 199 tools, 384 dimensions:
    16 times fewer than the length test alone).

    Parameters
    ----------
    protos : sequence of Prototype or None
        One per tool.
    docs : numpy.ndarray
        ``(len(protos), dim)`` the tools' unit documentation vectors.
    alpha : float
        The length test's level over the catalog (:func:`readable`).
    count_sds : float
        Count SDs the released count must clear.
    doc_sds : float or None
        Noise SDs along the documentation; None: :func:`readable` alone.
    """
    loose = readable(protos, alpha, count_sds)
    if doc_sds is None:
        return loose
    strict = readable(protos, alpha * 0.5 * math.erfc(doc_sds / math.sqrt(2)), count_sds)
    along = along_documentation(protos, docs, doc_sds)
    return [s or (lo and a) for lo, s, a in zip(loose, strict, along)]


def above_noise(p: Prototype, sds: float) -> bool:
    """Whether a prototype's count clears ``sds`` noise SDs (any positive count without noise)."""
    return p.count > 0 and p.count > sds * p.count_sd


def prototype_cosine(a: Prototype, b: Prototype) -> float:
    """Cosine between two prototypes' true sums, estimated from their noised ones.

    Independent noise leaves the inner product unbiased but inflates each
    squared norm by ``dim * sum_sd^2``; that inflation is subtracted, so
    agreeing prototypes do not look dissimilar merely for being noisy.
    Returns 0 when either has no signal left above its noise.
    """
    x, y = decode_prototype(a), decode_prototype(b)
    xx = float(x @ x) - x.size * a.sum_sd**2
    yy = float(y @ y) - y.size * b.sum_sd**2
    if xx <= 0 or yy <= 0:
        return 0.0
    return float(np.clip(float(x @ y) / math.sqrt(xx * yy), -1.0, 1.0))
