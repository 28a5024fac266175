"""An MCP server for Granule's tests, written with the official `mcp` Python SDK.

    python3 mcp_test_server.py stdio
    python3 mcp_test_server.py http PORT     (streamable HTTP at http://127.0.0.1:PORT/mcp)

Its tools: add (two integers), weather (a fixed report for a city), fail (the tool reports an
error), sleep (waits, for timeouts), hang (waits a minute) and crash (the server process
exits).
"""
import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("granule-test-server")


@server.tool(description="Adds two integers.")
def add(a: int, b: int) -> str:
    return str(a + b)


@server.tool(description="The current weather in a city.")
def weather(city: str) -> str:
    return f"{city}: 21 °C, light wind, clear sky"


@server.tool(description="Always fails.")
def fail(reason: str = "broken on purpose") -> str:
    raise ToolError(reason)


@server.tool(description="Waits for the given seconds, then says so.")
def sleep(seconds: float) -> str:
    time.sleep(seconds)
    return f"slept {seconds} s"


@server.tool(description="Never answers in time: waits a minute.")
def hang() -> str:
    time.sleep(60)
    return "too late"


@server.tool(description="Ends the server's process.")
def crash() -> str:
    sys.stderr.write("crashing on purpose\n")
    sys.stderr.flush()
    os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
