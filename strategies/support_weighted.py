"""Typed merge robust to one loud organisation (per-org support caps)."""

from __future__ import annotations

from synapse_flwr.strategies.base import CompendiumStrategy

from synapse_flwr.core.merge import SUPPORT_WEIGHTED, merge_support_weighted


class SupportWeightedStrategy(CompendiumStrategy):
    """Typed merge after capping each org's support mass at the (lower) median org's.

    Parameters
    ----------
    **kwargs
        Passed to :class:`~synapse_flwr.strategies.base.CompendiumStrategy`.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(merge_fn=merge_support_weighted, policy=SUPPORT_WEIGHTED, **kwargs)
