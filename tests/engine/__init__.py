"""The engine and its dialects: the server, OpenAI chat and Responses, Anthropic Messages,
the queue and scheduler, clients of a running engine, tool calls, reasoning, and the
conversation and prefix caches."""
