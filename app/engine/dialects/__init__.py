"""The engine's dialects besides OpenAI chat: each one adapts its requests to ``respond_chat``."""
