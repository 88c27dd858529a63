"""Readable ``when`` scenarios: public example requests, with supports read off a released prototype.

A private build releases no phrases (they vanish under the selection
threshold), so its ``when`` list would be empty: nothing a model can read
says what real traffic asks of a tool. The catalog's example requests
(:mod:`synapse_flwr.core.examples`) are public sentences; what is private is
*which* of them the traffic resembles. That is read off the tool's released
query prototype ``S`` (the noised sum of its queries' unit embeddings) by
projection: the support of request ``e`` with unit embedding ``u_e`` is
``S . u_e``, the sum over the tool's queries of their cosine similarity to
``e`` (a similarity-weighted query count: ``n`` when all ``n`` queries read
like ``e``). It is post-processing of the prototype release, so it costs no
privacy, and it is linear in ``S``: merging sums supports exactly as it sums
prototypes. Its noise SD is the prototype's ``sum_sd`` (``u_e`` is a unit
vector); a request is kept only above ``sds`` of them, and only for a tool
whose prototype count clears the noise itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from synapse_flwr.core.prototypes import above_noise, decode_prototype
from synapse_flwr.core.schema import Prototype, Scenario

#: Noise SDs a request's support must clear (and the prototype's count too).
SUPPORT_SDS = 3.0
#: Requests kept per tool in one organisation's artifact (wire size; the shipped tables hold 6).
MAX_SUPPORTED = 6


def split_when(when: Iterable[Scenario], examples: Iterable[str]) -> tuple[list[Scenario], list[Scenario]]:
    """A ``when`` list as (the tool's public example requests it lists, its other scenarios), in order."""
    public = set(examples)
    requests, others = [], []
    for s in when:
        (requests if s.text in public else others).append(s)
    return requests, others


def request_supports(proto: Prototype, vectors: np.ndarray) -> np.ndarray:
    """``S . u_e`` for each row ``u_e`` of ``vectors`` (L2-normalised request embeddings)."""
    return np.asarray(vectors, np.float64) @ decode_prototype(proto)


def supported_requests(
    proto: Prototype | None,
    requests: Sequence[str],
    vectors: np.ndarray,
    sds: float = SUPPORT_SDS,
    limit: int = MAX_SUPPORTED,
) -> list[tuple[str, float]]:
    """The requests the tool's experience supports, best first, with their supports.

    Parameters
    ----------
    proto : Prototype or None
        The tool's released prototype (None: no experience, nothing supported).
    requests : sequence of str
        The tool's public example requests.
    vectors : numpy.ndarray
        ``(len(requests), dim)`` their L2-normalised embeddings, in the prototype's space.
    sds : float
        Noise SDs the prototype's count and each support must clear; without
        noise any positive support is kept.
    limit : int
        Requests kept at most.
    """
    if proto is None or not requests or not above_noise(proto, sds):
        return []
    supports = request_supports(proto, vectors)
    floor = sds * proto.sum_sd
    kept = [(r, float(s)) for r, s in zip(requests, supports) if s > floor and s > 0]
    return sorted(kept, key=lambda rs: (-rs[1], rs[0]))[:limit]
