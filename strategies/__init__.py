"""Flower strategies, one merge policy each, selectable by name (run config ``policy``)."""

from __future__ import annotations

from synapse_flwr.strategies.base import CompendiumStrategy
from synapse_flwr.strategies.flat_majority import FlatMajorityStrategy
from synapse_flwr.strategies.robust import RobustStrategy
from synapse_flwr.strategies.support_weighted import SupportWeightedStrategy
from synapse_flwr.strategies.typed import TypedStrategy

from synapse_flwr.core.merge import FLAT_MAJORITY, ROBUST, SUPPORT_WEIGHTED, TYPED

STRATEGIES: dict[str, type[CompendiumStrategy]] = {
    TYPED: TypedStrategy,
    SUPPORT_WEIGHTED: SupportWeightedStrategy,
    ROBUST: RobustStrategy,
    FLAT_MAJORITY: FlatMajorityStrategy,
}


def make_strategy(policy: str, **kwargs) -> CompendiumStrategy:
    """Instantiate the strategy for a merge policy.

    Parameters
    ----------
    policy : str
        One of :data:`STRATEGIES`.
    **kwargs
        Passed to the strategy.

    Raises
    ------
    ValueError
        For an unknown policy, listing the valid ones.
    """
    try:
        cls = STRATEGIES[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(STRATEGIES)}") from None
    return cls(**kwargs)
