"""The noise an artifact claims, held to what its federation's calibration allows.

A prototype's ``sum_sd`` and ``count_sd``, the fusion votes' ``sd`` and the
privacy block's ``sigma`` say how much noise the released values carry. The
merge adds the SDs in quadrature and the router reads a prototype only above
its noise, so one organisation claiming huge SDs would make every merged
prototype of the federation read as noise, and the votes choose the
documentation, under every merge policy (security audit, 2026-12-05); the
merged block keeps the smallest ``sigma``, so one claiming none would have
every noised count read as evidence. An honest organisation's claims are
one release window's SDs (its records kept a share of their budget for a
fusion vote, or not) times the square root of the windows that hold the
value, and a run caps the windows a release cache may hold (run config
``max-windows``): other claims are refused at the server's edge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from synapse_flwr.core.schema import Compendium

# each SD travels rounded to 6 decimals, and each window combined into a cache rounds it again
_RELATIVE = 1e-6
_PER_WINDOW = 1e-6


@dataclass(frozen=True)
class NoiseBound:
    """The noise an organisation's artifact may claim in a run.

    Parameters
    ----------
    sigma : tuple of float
        One window's count SD ``(low, high)``: its records kept no share of
        their budget for a vote, or kept one (the larger); ``(0, 0)`` without
        privacy.
    prototype_weight : float
        ``c``: a prototype's sum carries ``sigma / c``; 0 without prototypes.
    vote_sd : float
        One window's vote SD; 0 without privacy or votes.
    windows : int
        The release windows a cache may hold (run config ``max-windows``).
    """

    sigma: tuple[float, float]
    prototype_weight: float
    vote_sd: float
    windows: int


def _outside(value: float, low: float, high: float, windows: int) -> bool:
    """Whether ``value`` lies outside ``[low, high]``, beyond what rounding over ``windows`` windows moves."""
    slack = windows * _PER_WINDOW
    return value < low * (1 - _RELATIVE) - slack or value > high * (1 + _RELATIVE) + slack


def _range(low: float, high: float, bound: NoiseBound) -> tuple[float, float]:
    """One window's ``low`` up to ``max-windows`` windows of ``high``."""
    return low, high * math.sqrt(bound.windows)


def block_problem(art: Compendium, bound: NoiseBound) -> str | None:
    """Why ``art``'s privacy block claims another mechanism or ``sigma`` than the run's, or None."""
    low, high = bound.sigma
    mechanism = "gaussian" if high > 0 else "none"
    if art.privacy.mechanism != mechanism:
        return f"privacy.mechanism {art.privacy.mechanism!r} is not the run's {mechanism!r}"
    if _outside(art.privacy.sigma, low, high, 1):
        return f"privacy.sigma {art.privacy.sigma:g} is not one release window's of the run ({low:g} to {high:g})"
    return None


def noise_claim_problem(art: Compendium, bound: NoiseBound | None) -> str | None:
    """Why ``art`` claims other noise than ``bound`` allows, or None (never raises).

    Parameters
    ----------
    art : Compendium
        An organisation's artifact.
    bound : NoiseBound or None
        The run's bound (None: no check).

    Returns
    -------
    str or None
        The first claim outside the run's range, with the range and how many
        more are; None when every claim is within it.
    """
    if bound is None:
        return None
    if problem := block_problem(art, bound):
        return problem
    c = bound.prototype_weight
    low, high = bound.sigma
    sums = _range(low / c, high / c, bound) if c else (0.0, 0.0)
    limits = (("sum_sd", *sums), ("count_sd", *_range(low, high, bound)))
    outside = [(t.tool_id, name, value, lo, hi) for t in art.tools if t.prototype is not None
               for name, lo, hi in limits
               if _outside(value := getattr(t.prototype, name), lo, hi, bound.windows)]
    where = f"the run's range for 1 to {bound.windows} release windows (run config max-windows)"
    if outside:
        tool, name, value, lo, hi = outside[0]
        more = f" (and {len(outside) - 1} more)" if len(outside) > 1 else ""
        return f"tools[{tool!r}].prototype.{name} {value:g} is outside {lo:g} to {hi:g}, {where}{more}"
    votes = _range(bound.vote_sd, bound.vote_sd, bound)
    if art.votes is not None and _outside(art.votes.sd, *votes, bound.windows):
        return f"votes.sd {art.votes.sd:g} is outside {votes[0]:g} to {votes[1]:g}, {where}"
    return None
