"""synapse-flwr: typed federated tool-routing compendia for LLM agents, as a Flower plugin."""

import os as _os

__version__ = "0.1.0"

# strategies/ and simulations/ are top-level folders of the repository that
# install as synapse_flwr.strategies and synapse_flwr.simulations (pyproject's
# package-dir). Where the package runs from the repository itself (a checkout
# first on sys.path, or the Flower app bundle made from it), find them there.
_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_ROOT, "strategies", "__init__.py")):
    __path__.append(_ROOT)  # type: ignore[name-defined]
