"""The agent CLIs ``draftpen launch`` knows, and the settings that point each at the engine.

Given where the engine is (:class:`Endpoint`), this says one run's command line and
environment (:class:`LaunchPlan`): the settings for this run only, never a change to the
user's own config files. Finding or starting the engine and running the CLI are
app/cli/launch.py's.

Each CLI takes its settings its own way:

- Claude Code (Anthropic Messages, ``/v1/messages``): ``ANTHROPIC_BASE_URL``,
  ``ANTHROPIC_AUTH_TOKEN`` (the key, as a bearer token), ``ANTHROPIC_MODEL`` and the
  small/fast and per-tier model names (the pair),
  ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`` and ``CLAUDE_CODE_ATTRIBUTION_HEADER=0``.
- Codex CLI (OpenAI Responses, ``/v1/responses``): ``-c`` overrides defining a
  ``draftpen`` model provider (``wire_api = "responses"``, its key read from
  ``DRAFTPEN_API_KEY``) and choosing it and the pair.
- opencode (``@ai-sdk/openai-compatible``, i.e. chat completions): a whole config in
  ``OPENCODE_CONFIG_CONTENT``, which opencode layers over the user's own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.client.api_key import API_KEY_ENV
from app.errors import DraftpenError

# Codex and opencode stop waiting for a stream after a few minutes of silence; a CPU
# reading a long agent prompt can be silent that long before its first token.
SLOW_FIRST_TOKEN_MS = 30 * 60 * 1000


@dataclass(frozen=True)
class AgentCli:
    """One agent CLI launch knows: its command, its npm package, the context it needs."""

    name: str  # the word after `draftpen launch`
    title: str  # how its users call it
    executable: str
    npm_package: str
    # Tokens its system prompt, tools and a few turns take (Claude Code's prompt and
    # tools are about 20k tokens; Codex's and opencode's several thousand).
    context: int

    @property
    def install_command(self) -> str:
        """The command that installs it."""
        return f"npm install -g {self.npm_package}"


AGENTS: dict[str, AgentCli] = {
    agent.name: agent
    for agent in (
        AgentCli("claude", "Claude Code", "claude", "@anthropic-ai/claude-code", 32768),
        AgentCli("codex", "Codex CLI", "codex", "@openai/codex", 16384),
        AgentCli("opencode", "opencode", "opencode", "opencode-ai", 16384),
    )
}


@dataclass(frozen=True)
class Endpoint:
    """Where the CLI finds the engine, and what it asks for there."""

    url: str  # http://HOST:PORT, without /v1
    key: str
    pair: str
    context: int


@dataclass(frozen=True)
class LaunchPlan:
    """The CLI's command line and environment for one run."""

    command: list[str]
    environment: dict[str, str]


def agent_plan(
    agent: AgentCli,
    executable: str,
    endpoint: Endpoint,
    arguments: Sequence[str],
    environ: Mapping[str, str],
) -> LaunchPlan:
    """The command and environment that point ``agent`` at ``endpoint`` for one run."""
    environment = dict(environ)
    if agent.name == "claude":
        # A real Anthropic key in the user's environment would make Claude Code ask
        # which key to use; for this run the engine's key is the only one.
        environment.pop("ANTHROPIC_API_KEY", None)
        environment.update(
            {
                "ANTHROPIC_BASE_URL": endpoint.url,
                "ANTHROPIC_AUTH_TOKEN": endpoint.key,
                "ANTHROPIC_MODEL": endpoint.pair,
                "ANTHROPIC_SMALL_FAST_MODEL": endpoint.pair,
                "ANTHROPIC_DEFAULT_OPUS_MODEL": endpoint.pair,
                "ANTHROPIC_DEFAULT_SONNET_MODEL": endpoint.pair,
                "ANTHROPIC_DEFAULT_HAIKU_MODEL": endpoint.pair,
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            }
        )
        # No per-session attribution block at the top of the system prompt: it would
        # make every session read the whole prompt again (the engine drops it too,
        # for Claude Code started by hand).
        environment.setdefault("CLAUDE_CODE_ATTRIBUTION_HEADER", "0")
        environment.setdefault("API_TIMEOUT_MS", str(SLOW_FIRST_TOKEN_MS))
        # Claude Code also drops a stream that sends no event for 5 minutes (SSE
        # comments do not count) and retries without streaming, reading the prompt again.
        environment.setdefault("CLAUDE_STREAM_IDLE_TIMEOUT_MS", str(SLOW_FIRST_TOKEN_MS))
        return LaunchPlan([executable, *arguments], environment)
    if agent.name == "codex":
        environment[API_KEY_ENV] = endpoint.key
        provider = "model_providers.draftpen"
        overrides = {
            f"{provider}.name": "draftpen",
            f"{provider}.base_url": f"{endpoint.url}/v1",
            f"{provider}.wire_api": "responses",
            f"{provider}.env_key": API_KEY_ENV,
            f"{provider}.stream_idle_timeout_ms": SLOW_FIRST_TOKEN_MS,
            "model_provider": "draftpen",
            "model": endpoint.pair,
            "model_context_window": endpoint.context,
        }
        options: list[str] = []
        for key, value in overrides.items():
            # The value is TOML: a JSON string is a TOML basic string, a number a number.
            options += ["-c", f"{key}={json.dumps(value)}"]
        return LaunchPlan([executable, *options, *arguments], environment)
    if agent.name == "opencode":
        environment["OPENCODE_CONFIG_CONTENT"] = json.dumps(opencode_config(endpoint))
        return LaunchPlan([executable, *arguments], environment)
    raise DraftpenError(f"draftpen launch does not know {agent.name!r}.")


def opencode_config(endpoint: Endpoint) -> dict[str, object]:
    """opencode's config for this run: a ``draftpen`` provider and its one model."""
    model = {
        "name": f"{endpoint.pair} (draftpen)",
        "tool_call": True,
        # opencode compacts a session before it outgrows this.
        "limit": {"context": endpoint.context, "output": min(8192, endpoint.context // 4)},
    }
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "draftpen": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "draftpen",
                "options": {
                    "baseURL": f"{endpoint.url}/v1",
                    "apiKey": endpoint.key,
                    # Each is 5 minutes by default; the engine sends no chunk while it
                    # reads the prompt, and on a CPU opencode's 7k tokens can take longer.
                    "timeout": SLOW_FIRST_TOKEN_MS,
                    "headerTimeout": SLOW_FIRST_TOKEN_MS,
                    "chunkTimeout": SLOW_FIRST_TOKEN_MS,
                },
                "models": {endpoint.pair: model},
            }
        },
        "model": f"draftpen/{endpoint.pair}",
        "small_model": f"draftpen/{endpoint.pair}",
        "autoupdate": False,
    }
