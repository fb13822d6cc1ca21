"""The engine's dialects: one module per API it speaks, each a thin adapter.

OpenAI chat (``openai_chat_schema``: the one internal request every chat dialect
becomes; ``openai_chat_format``: its answer), OpenAI text completions
(``openai_completions``), Anthropic Messages (``anthropic_*``) and OpenAI Responses
(``openai_responses``, ``responses_*``). The chat dialects answer through
``respond_chat`` (named by the Protocol in ``responder``; no dialect imports the API).
"""
