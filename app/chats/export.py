"""Chats as Markdown: export a whole conversation, find a reply's last code block."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from app.chats.history import INTERRUPTED, STOPPED, Chat, StoredMessage

_FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_ROLE_HEADINGS = {"system": "System", "user": "You", "assistant": "Assistant"}
_STATE_NOTES = {STOPPED: "stopped by the user", INTERRUPTED: "interrupted"}


def last_code_block(markdown: str) -> str | None:
    """The body of the last fenced code block in ``markdown``, or None if it has none.

    An unclosed fence at the end (a reply stopped mid-block) counts as a block.
    """
    last: list[str] | None = None
    body: list[str] | None = None
    fence = ""
    for line in markdown.splitlines():
        if body is None:
            opening = _FENCE_OPEN.match(line)
            if opening:
                fence, body = opening.group(1), []
        elif line.strip().startswith(fence) and not line.strip().strip(fence[0]):
            last, body = body, None
        else:
            body.append(line)
    if body is not None:
        last = body
    return None if last is None else "\n".join(last) + ("\n" if last else "")


def chat_to_markdown(chat: Chat, messages: Sequence[StoredMessage]) -> str:
    """A chat as a Markdown document: title, date, then each message under its role."""
    created = datetime.fromtimestamp(chat.created_at).strftime("%Y-%m-%d %H:%M")
    lines = [f"# {chat.title}", "", f"*draftpen chat, started {created}*", ""]
    for message in messages:
        heading = _ROLE_HEADINGS.get(message.role, message.role.title())
        note = _STATE_NOTES.get(message.state)
        lines.append(f"## {heading}" + (f" ({note})" if note else ""))
        lines.append("")
        if message.reasoning:
            # Folded, as the chat app shows it: GitHub and most viewers render <details>.
            lines += ["<details><summary>Reasoning</summary>", ""]
            lines += [message.reasoning.rstrip("\n"), "", "</details>", ""]
        lines.append(message.content.rstrip("\n"))
        lines.append("")
    return "\n".join(lines)


def export_path(directory: Path, chat: Chat) -> Path:
    """A file name for a chat's export: its title made safe, and its id (never clashes)."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", chat.title).strip("-").lower()[:48] or "chat"
    return directory / f"{slug}-{chat.id}.md"
