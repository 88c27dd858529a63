"""The noise an artifact claims, held to what its federation's calibration allows.

A prototype's ``sum_sd`` and ``count_sd`` and the fusion votes' ``sd`` say how
much noise a released value carries. The merge adds them in quadrature and the
router reads a prototype only above its noise, so one organisation claiming
huge SDs would make every merged prototype of the federation read as noise,
and the votes choose the documentation, under every merge policy (security
audit, 2026-12-05). An honest organisation's SDs are one release window's
times the square root of its windows, and a run caps the windows a release
cache may hold (run config ``max-windows``): claims above that are refused at
the server's edge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from synapse_flwr.core.schema import Compendium

# the SDs travel rounded to 6 decimals (prototypes.encode_prototype)
_ROUNDING = 1e-6


@dataclass(frozen=True)
class NoiseBound:
    """The largest noise SDs an organisation's artifact may claim in a run.

    Parameters
    ----------
    sum_sd : float
        Of a prototype's sum (per coordinate); 0 without privacy.
    count_sd : float
        Of a prototype's count; 0 without privacy.
    vote_sd : float
        Of the fusion votes' sums; 0 without privacy or votes.
    windows : int
        The release windows these SDs allow (named in the reasons).
    """

    sum_sd: float
    count_sd: float
    vote_sd: float
    windows: int

    @classmethod
    def of_windows(cls, sum_sd: float, count_sd: float, vote_sd: float, windows: int) -> NoiseBound:
        """The bound of ``windows`` windows of one window's SDs (independent draws add in quadrature)."""
        root = math.sqrt(windows)
        return cls(sum_sd * root, count_sd * root, vote_sd * root, windows)


def _over(claimed: float, bound: float) -> bool:
    return claimed > bound * (1 + _ROUNDING) + _ROUNDING


def noise_claim_problem(art: Compendium, bound: NoiseBound | None) -> str | None:
    """Why ``art`` claims more noise than ``bound`` allows, or None (never raises).

    Parameters
    ----------
    art : Compendium
        An organisation's artifact.
    bound : NoiseBound or None
        The run's bound (None: no check).
    """
    if bound is None:
        return None
    where = f"the run's bound for {bound.windows} release windows (run config max-windows)"
    over = [(t.tool_id, name, value, limit) for t in art.tools if t.prototype is not None
            for name, value, limit in (("sum_sd", t.prototype.sum_sd, bound.sum_sd),
                                       ("count_sd", t.prototype.count_sd, bound.count_sd))
            if _over(value, limit)]
    if over:
        tool, name, value, limit = over[0]
        more = f" (and {len(over) - 1} more)" if len(over) > 1 else ""
        return f"tools[{tool!r}].prototype.{name} {value:g} exceeds {limit:g}, {where}{more}"
    if art.votes is not None and _over(art.votes.sd, bound.vote_sd):
        return f"votes.sd {art.votes.sd:g} exceeds {bound.vote_sd:g}, {where}"
    return None
