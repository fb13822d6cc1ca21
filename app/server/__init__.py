"""The agent server: an OpenAI-compatible API over a Unix socket (``draftpen serve``).

``api`` holds the routes; ``schema`` validates requests; ``chunks`` shapes responses and
stream chunks; ``tally`` sums a generation's events; ``queue`` runs one generation at a
time; ``unix_socket`` owns the socket file; ``runner`` starts and stops the server.

May import: ``app.models``, ``app.chats``, ``app.settings``, ``app.errors``, ``backends``.
Never another front end (``tui``, ``cli``).
"""
