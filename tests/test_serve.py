"""`synapse serve`: a real MCP client talks to the server over stdio."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the mcp package is not installed")

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

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
