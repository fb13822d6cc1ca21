"""What the Responses API tests share: the tools and questions they ask, and reading a
stream's event kinds.
"""

from __future__ import annotations

import socket

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]
HELLO = "Hello! How can I help?"


# -- over TCP -------------------------------------------------------------------------


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
