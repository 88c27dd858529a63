"""Typed merge that bounds every organisation's influence (against a poisoning org)."""

from __future__ import annotations

from synapse_flwr.strategies.base import CompendiumStrategy

from synapse_flwr.core.merge import ROBUST, merge_robust


class RobustStrategy(CompendiumStrategy):
    """Typed merge with per-org caps; a claim only one org makes cannot displace one backed by several.

    Parameters
    ----------
    **kwargs
        Passed to :class:`~synapse_flwr.strategies.base.CompendiumStrategy`.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(merge_fn=merge_robust, policy=ROBUST, **kwargs)
