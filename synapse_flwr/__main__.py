"""``python -m synapse_flwr ...`` is the ``synapse`` command."""

from synapse_flwr.cli import main

main()
