"""The paper's untyped baseline: majority over flat strings."""

from __future__ import annotations

from synapse_flwr.strategies.base import CompendiumStrategy

from synapse_flwr.core.merge import FLAT_MAJORITY, merge_flat_majority


class FlatMajorityStrategy(CompendiumStrategy):
    """Flatten each artifact to one string per tool; clashes go to the majority.

    Parameters
    ----------
    **kwargs
        Passed to :class:`~synapse_flwr.strategies.base.CompendiumStrategy`.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(merge_fn=merge_flat_majority, policy=FLAT_MAJORITY, **kwargs)
