"""Chat history in SQLite: migrations, crash-safe replies, damaged files; Markdown export."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from app.chats.export import chat_to_markdown, last_code_block
from app.chats.history import MIGRATIONS, WRITING, History
from app.errors import HistoryError
from app.rates import RollingRate


def test_a_new_file_gets_every_migration_in_order(tmp_path: Path) -> None:
    history = History(tmp_path / "h.sqlite3")
    assert history.applied_migrations() == [name for name, _ in MIGRATIONS]
    assert [name for name, _ in MIGRATIONS] == sorted(name for name, _ in MIGRATIONS)


def test_an_old_file_is_migrated_and_keeps_its_chats(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    # A file as the first release wrote it: only the first migration.
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL)")
    db.executescript(MIGRATIONS[0][1])
    db.execute("INSERT INTO migrations VALUES (?, 0)", (MIGRATIONS[0][0],))
    db.execute("INSERT INTO chats (title, created_at, updated_at) VALUES ('old', 1, 1)")
    db.execute(
        "INSERT INTO messages (chat_id, role, content, created_at) VALUES (1, 'user', 'hi', 1)"
    )
    db.commit()
    db.close()
    history = History(path)
    assert history.applied_migrations() == [name for name, _ in MIGRATIONS]
    [chat] = history.chats()
    assert chat.title == "old" and chat.pair is None
    [message] = history.messages(chat.id)
    assert (message.content, message.segments, message.stats) == ("hi", (), None)


def test_a_file_from_before_reasoning_upgrades_and_stores_reasoning_apart(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    # A file as draftpen wrote it before 0003: the first two migrations and a reply.
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL)")
    for name, sql in MIGRATIONS[:2]:
        db.executescript(sql)
        db.execute("INSERT INTO migrations VALUES (?, 0)", (name,))
    db.execute("INSERT INTO chats (title, created_at, updated_at) VALUES ('old', 1, 1)")
    db.execute(
        "INSERT INTO messages (chat_id, role, content, created_at) VALUES (1, 'assistant', 'a', 1)"
    )
    db.commit()
    db.close()
    history = History(path)
    assert "0003_message_reasoning" in history.applied_migrations()
    [old] = history.messages(1)
    assert (old.content, old.reasoning) == ("a", "")
    reply = history.add_message(1, "assistant", "", state=WRITING)
    history.update_message(reply.id, content="4", reasoning="2 + 2 is 4.")
    # Saving the answer again without reasoning leaves the stored reasoning alone.
    history.update_message(reply.id, content="It is 4.", state="complete")
    history.close()
    again = History(path)
    stored = again.message(reply.id)
    assert (stored.content, stored.reasoning) == ("It is 4.", "2 + 2 is 4.")
    # The export folds the reasoning above the answer it led to.
    exported = chat_to_markdown(again.chat(1), again.messages(1))
    assert exported.endswith(
        "<details><summary>Reasoning</summary>\n\n2 + 2 is 4.\n\n</details>\n\nIt is 4.\n"
    )


def test_a_file_from_a_newer_draftpen_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    History(path).close()
    db = sqlite3.connect(path)
    db.execute("INSERT INTO migrations VALUES ('9999_from_the_future', 0)")
    db.commit()
    db.close()
    with pytest.raises(HistoryError, match="newer draftpen"):
        History(path)


def test_a_damaged_file_says_how_to_start_fresh_and_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(HistoryError, match="Move the file aside"):
        History(path)
    assert path.read_bytes() == b"this is not a database" * 100


def test_a_reply_cut_off_by_a_crash_reads_back_as_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    history = History(path)
    chat = history.create_chat("c")
    reply = history.add_message(chat.id, "assistant", "", state=WRITING)
    history.update_message(reply.id, content="Half a", segments=[("Half", False), (" a", True)])
    # No clean close: a second connection sees what a restarted app would.
    [stored] = History(path).messages(chat.id)
    assert (stored.content, stored.state) == ("Half a", "interrupted")
    assert stored.segments == (("Half", False), (" a", True))


def test_deleting_a_chat_deletes_its_messages(tmp_path: Path) -> None:
    history = History(tmp_path / "h.sqlite3")
    chat = history.create_chat("c")
    history.add_message(chat.id, "user", "hi")
    history.delete_chat(chat.id)
    count = history._db.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    assert history.chats() == [] and count == 0


def test_markdown_export_marks_stopped_and_interrupted_replies(tmp_path: Path) -> None:
    history = History(tmp_path / "h.sqlite3")
    chat = history.create_chat("Shell help")
    history.add_message(chat.id, "user", "How?")
    history.add_message(chat.id, "assistant", "Like this", state="stopped")
    history.add_message(chat.id, "user", "And?")
    history.add_message(chat.id, "assistant", "Then", state=WRITING)
    text = chat_to_markdown(chat, history.messages(chat.id))
    assert text.splitlines()[0] == "# Shell help"
    assert "## Assistant (stopped by the user)\n\nLike this\n" in text
    assert "## Assistant (interrupted)\n\nThen\n" in text


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("no code", None),
        ("```py\na = 1\n```\ntext\n~~~\nb = 2\n~~~\n", "b = 2\n"),
        ("```\nfirst\n```\n```sh\nsecond\nline\n```", "second\nline\n"),
        ("```\nclosed\n```\n```python\nstopped mid-blo", "stopped mid-blo\n"),
        ("````md\n```\ninner\n```\n````", "```\ninner\n```\n"),
    ],
)
def test_last_code_block(markdown: str, expected: str | None) -> None:
    assert last_code_block(markdown) == expected


def test_rolling_rate_covers_the_last_second_and_decays_when_tokens_stop() -> None:
    now = [0.0]
    rate = RollingRate(window_seconds=1.0, clock=lambda: now[0])
    for step in range(21):  # 10 tokens a second for 2 seconds...
        now[0] = step * 0.1
        rate.add(step)
    assert rate.rate() == pytest.approx(10.0, rel=0.02)
    for step in range(21, 31):  # ...then a burst: 50 tokens in the next second
        now[0] = step * 0.1
        rate.add(20 + (step - 20) * 5)
    assert rate.rate() == pytest.approx(50.0, rel=0.1)
    now[0] += 2.0  # nothing for two seconds: the burst's 50 over the 2 s waited
    assert rate.rate() == pytest.approx(25.0, rel=0.1)
    now[0] += 8.0  # nothing for ten
    assert rate.rate() < 6.0


def test_rolling_rate_of_rounds_slower_than_its_window_never_reads_zero() -> None:
    # A big target on a CPU: a round of the loop every 1.5 s writes 4 tokens, and the
    # chat's timer records the same count 15 times in between. The rate between two
    # rounds is the rounds' own (it read 0.0 half the time when every tick was a sample).
    now = [0.0]
    rate = RollingRate(window_seconds=1.0, clock=lambda: now[0])
    shown: list[float] = []
    for tick in range(1, 91):  # 9 seconds of 0.1 s ticks
        now[0] = tick * 0.1
        rate.add(4 * (tick // 15))
        if tick >= 30:
            shown.append(rate.rate())
    assert min(shown) == pytest.approx(4 / 1.5, rel=0.05)
    assert max(shown) == pytest.approx(4 / 1.5, rel=0.05)
    now[0] += 6.0  # then the engine stops writing: the figure decays
    assert rate.rate() < 1.0
