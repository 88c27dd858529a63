"""synapse-flwr: typed federated tool-routing compendia for LLM agents, as a Flower plugin."""

__version__ = "0.1.0"
