"""Chats: the conversation sent to a model, history in SQLite, export to Markdown.

May import: ``app.settings``, ``app.errors``, ``backends``. Never a front end.
"""
