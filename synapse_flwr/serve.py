"""Expose routing to agents as an MCP server (``synapse serve``).

An agent connected over MCP calls the ``route`` tool with its user's request
and gets back the tool to call, the ranked candidates and the fields that
decided. The router (compendium, catalog, embedder) is built once at start.
"""

from __future__ import annotations

from typing import Any

from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.router import Router
from synapse_flwr.flower.processes import bind_problem

INSTRUCTIONS = (
    "Before calling one of your tools for a user request, call `route` with the request: "
    "it answers which tool fits, using knowledge federated across organisations."
)


def build_server(router: Router, name: str = "synapse-router") -> Any:
    """An MCP server with one ``route`` tool backed by ``router``.

    Parameters
    ----------
    router : Router
        The router to serve.
    name : str
        Server name announced to clients.
    """
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer(name=name, instructions=INSTRUCTIONS)

    @server.tool(name="route", description="Pick the tool that should answer a user request.")
    def route(query: str) -> dict:
        """Route ``query``; returns the chosen tool, ranked candidates and deciding fields."""
        try:
            return router.route(query).to_dict(router.names)
        except (ValueError, TypeError) as exc:
            # a query the router refuses (empty, unencodable) is the caller's to fix: its reason, no traceback
            raise ToolError(str(exc)) from exc

    return server


def check_listen(host: str, port: int) -> None:
    """Refuse, before the router loads, an address an HTTP transport could not listen on.

    Parameters
    ----------
    host : str
        Address to listen on.
    port : int
        TCP port.

    Raises
    ------
    SynapseError
        If the address does not resolve or the port is taken or not allowed.
    """
    if problem := bind_problem(host, port):
        raise SynapseError(f"cannot listen on {host}:{port} ({problem}); choose another --host or --port")
