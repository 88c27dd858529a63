"""The paper's policy: field-wise typed merge with a conflict log."""

from __future__ import annotations

from synapse_flwr.strategies.base import CompendiumStrategy

from synapse_flwr.core.merge import TYPED, merge_typed


class TypedStrategy(CompendiumStrategy):
    """Merge artifacts field by field; disagreements go to the typed conflict log.

    Parameters
    ----------
    **kwargs
        Passed to :class:`~synapse_flwr.strategies.base.CompendiumStrategy`.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(merge_fn=merge_typed, policy=TYPED, **kwargs)
