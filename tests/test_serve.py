"""`synapse serve`: a real MCP client talks to the server over stdio and over streamable HTTP."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the mcp package is not installed")

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

SYNAPSE = Path(sys.executable).parent / "synapse"


async def _call(catalog: Path, query: str) -> tuple[list[str], dict]:
    params = StdioServerParameters(
        command=str(SYNAPSE), args=["serve", "--catalog", str(catalog), "--embedder", "tfidf"]
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = [t.name for t in (await session.list_tools()).tools]
            result = await session.call_tool("route", {"query": query})
            return tools, json.loads(result.content[0].text)


@pytest.mark.slow
def test_mcp_client_routes_through_the_server(tmp_path):
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps([
        {"name": "get_weather", "description": "Weather forecast: rain, snow, temperature."},
        {"name": "book_hotel", "description": "Book a hotel room for given dates."},
    ]))
    tools, answer = asyncio.run(asyncio.wait_for(_call(catalog, "will it rain in Oslo?"), 120))
    assert tools == ["route"]
    assert answer["tool"] == "get_weather"
    assert [c["tool"] for c in answer["candidates"]][0] == "get_weather"


async def _call_http(url: str, query: str) -> dict:
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return json.loads((await session.call_tool("route", {"query": query})).content[0].text)


@pytest.mark.slow
def test_mcp_client_routes_over_streamable_http_on_the_port_given(tmp_path):
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps([
        {"name": "Get Weather", "description": "Weather forecast: rain, snow, temperature."},
        {"name": "book_hotel", "description": "Book a hotel room for given dates."},
    ]))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    server = subprocess.Popen([str(SYNAPSE), "serve", "--catalog", str(catalog), "--embedder", "tfidf",
                               "--transport", "streamable-http", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stderr.read().decode()
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the server never listened"
            time.sleep(0.2)
        answer = asyncio.run(asyncio.wait_for(_call_http(f"http://127.0.0.1:{port}/mcp", "will it rain in Oslo?"), 60))
        assert answer["tool"] == "Get Weather" and answer["tool_id"] == "get_weather"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_an_address_serve_cannot_listen_on_is_refused_with_the_reason():
    from synapse_flwr.core.errors import SynapseError
    from synapse_flwr.serve import check_listen

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SynapseError, match=rf"cannot listen on 127\.0\.0\.1:{port} \(Address already in use\)"):
            check_listen("127.0.0.1", port)
    check_listen("127.0.0.1", port)  # free again once the other server is gone
    with pytest.raises(SynapseError, match=r"'no-such-host\.invalid' does not resolve"):
        check_listen("no-such-host.invalid", 8000)


def test_a_query_the_router_refuses_is_a_tool_error_with_its_reason():
    """Regression: an empty query returned "Error executing tool route" and logged a traceback."""
    from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError

    from synapse_flwr.core.catalog import ToolDoc, make_catalog
    from synapse_flwr.core.router import Router
    from synapse_flwr.serve import build_server

    catalog = make_catalog([ToolDoc("get_weather", "get_weather", "Weather forecast: rain, snow, temperature."),
                            ToolDoc("book_hotel", "book_hotel", "Book a hotel room for given dates.")])
    server = build_server(Router(None, catalog, embedder="static"))
    answer = asyncio.run(server.call_tool("route", {"query": "will it rain in Oslo?"}))
    assert answer is not None  # a routable query still routes
    for query, reason in (("", "query is empty"), ("   ", "query is empty"), ("...", "query has no letter or digit"),
                          ("rain \ud800", "query is not UTF-8 text")):
        with pytest.raises(ToolError) as caught:
            asyncio.run(server.call_tool("route", {"query": query}))
        assert not isinstance(caught.value, UnexpectedToolError)  # anticipated: no traceback in the log
        assert str(caught.value).startswith(f"Error executing tool route: {reason}")
