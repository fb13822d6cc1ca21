"""The engine's wire: what draftpen's engine and its clients say to each other.

Defined once and imported by both ends (``app.engine`` builds these shapes, ``app.client``
reads them), so the two cannot drift apart. The API is OpenAI's chat-completions API;
draftpen's additions live in one ``draftpen`` object: in a request, the options a
draftpen client asks for (:class:`DraftpenRequestOptions`); in every stream chunk, the
running statistics plus, on request, provenance segments, queue and loading notices.

A plain OpenAI client never sends ``draftpen`` and so never sees a notice chunk; it
sees the statistics field, which it ignores.

Stream chunk additions (all inside ``chunk["draftpen"]``):

- ``segments``: ``[[text, from_draft], ...]``, an event's own text (``provenance``), on
  exactly one chunk per event, with ``reasoning``: how the reply marks a thinking
  model's reasoning (``{"start", "end", "starts_inside"}``, or null);
- ``queue``: ``{"position": N, "ahead": ["chat (smollm2)", ...]}`` while the request
  waits behind others (``progress``), sent again whenever it moves up;
- ``loading``: a line of text while the engine loads the pair (``progress``);
- ``left_out_messages``: how many of the oldest messages ``fit_context`` left out of
  the prompt so that it fits the context (on every chunk of the reply; absent when none);
- everything :meth:`~backends.generation_events.SpeculativeStats.as_dict` holds, and
  ``drafter``, ``draft_length``, ``estimated_speedup``, ``decision`` (the latest
  round's), and ``drafted_by`` (``{drafter: {"drafted", "accepted"}}`` so far);
- ``costs_note``: how `auto` corrected its stored figures during this reply, in words
  (absent when it did not).
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.settings import runtime_dir
from backends.generation_events import SpeculativeStats, TextSegment
from backends.output.reasoning import ReasoningFormat

# Bumped whenever a change on one end breaks the other; a client refuses an engine
# that speaks another version (and says how to replace it).
API_VERSION = 1
# What ``GET /health`` says it is: a socket whose health lacks it is not an engine.
SERVICE = "draftpen"
SOCKET_NAME = "draftpen.sock"
# Where both ends look for the socket instead of the default (tests, two engines).
SOCKET_ENV = "DRAFTPEN_SOCKET"

ClientKind = Literal["chat", "agent"]
# How a request shows in other requests' queue notices.
KIND_LABELS: dict[str, str] = {"chat": "chat", "agent": "agent request", "load": "loading"}


def default_socket_path() -> Path:
    """``$DRAFTPEN_SOCKET`` if set, else ``$XDG_RUNTIME_DIR/draftpen/draftpen.sock`` (or
    the same name in a private directory under draftpen's cache)."""
    override = os.environ.get(SOCKET_ENV, "").strip()
    if override:
        return Path(override).expanduser().absolute()
    return runtime_dir() / SOCKET_NAME


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class _Lenient(BaseModel):
    # What the engine reports: a newer engine of the same API version may add fields.
    model_config = ConfigDict(extra="ignore", frozen=True)


class DraftpenRequestOptions(_Strict):
    """A request's ``draftpen`` field: what a draftpen client wants in the stream."""

    provenance: bool = Field(
        False, description="segments [[text, from_draft], ...] with each chunk's text"
    )
    progress: bool = Field(
        False, description="queue and loading notice chunks while the request waits"
    )
    fit_context: bool = Field(
        False,
        description="leave out the oldest turns that do not fit the context (the history "
        "keeps them) instead of answering 400",
    )
    client: ClientKind = Field("agent", description="what the request is, in queue notices")


class PairFiles(_Strict):
    """The files of a pair given on a client's command line (``--target``/``--draft``):
    absolute paths on the engine's machine (hub files already pulled there)."""

    target: str = Field(min_length=1)
    draft: str | None = None


class LoadRequest(_Strict):
    """``POST /draftpen/load``: load a pair, or reload it with other settings.

    With ``files``, ``pair`` names a pair the client made from ``--target``/``--draft``:
    the engine makes those files a pair of that name first (the engine never saw the
    client's command line)."""

    pair: str = Field(min_length=1)
    files: PairFiles | None = None
    context_length: int | None = Field(None, ge=16)
    exact: bool | None = None
    # HOST:PORT of each worker to split the target over ([]: none, this machine alone);
    # absent: the workers the engine was started with.
    workers: list[str] | None = None


class ConversationCacheReport(_Lenient):
    """The loaded pair's kept conversations (``backends.caches.conversation_cache``'s figures)."""

    budget_bytes: int
    used_bytes: int
    entries: int
    saved: int
    restored: int
    restored_tokens: int
    evicted: int
    failed: int
    save_seconds: float = 0.0
    restore_seconds: float = 0.0


class LoadedPairReport(_Lenient):
    """A pair the engine holds in memory."""

    pair: str
    target: str
    draft: str | None
    context_length: int
    # The target's draft heads ("mtp", "eagle3", "dflash", "dspark"), where it drafts
    # with one instead of (or beside) a draft model.
    heads: list[str] = []
    exact: bool
    idle_seconds: float
    # Seconds until keep-alive unloads it while idle; None: it stays.
    unloads_in: float | None = None
    # None when the engine keeps no conversations (--conversation-cache 0).
    conversation_cache: ConversationCacheReport | None = None
    # Where the target's and the draft's layers are ("this machine", or the split over
    # workers: "10 layers on this CPU, ~10 on 10.0.0.2:50052"); None: not said (MLX).
    target_placement: str | None = None
    draft_placement: str | None = None
    # Whether greedy draft-model rounds draft the next round during the workers' verify
    # (a split target, a draft model, one sequence at a time); the overlap_drafting
    # setting may still turn it off.
    overlap_drafting: bool = False


class QueueReport(_Lenient):
    """What the engine's queue is doing."""

    running: str | None = None  # what runs, as in queue notices: "chat (smollm2)"
    running_id: str | None = None
    waiting: int = 0
    limit: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    running_count: int = 0  # generations running at once
    parallel: int = 1  # how many may (serve --parallel, as the loaded pair allows)
    parallel_refusal: str | None = None  # why the pair runs fewer than asked


class PreviousCrashReport(_Lenient):
    """The engine before this one on the socket, which died by a fatal signal."""

    signal: str  # "SIGSEGV"
    doing: str | None = None  # "loading", "generating", "idle"
    pair: str | None = None
    message: str  # what a person is told: the signal, the pair, `draftpen doctor`


class RuntimeReport(_Lenient):
    """The engine's runtime process (the loaded pair and the loop), as its front sees it.

    ``state``: ``starting``, ``running``, ``restarting`` (it died: the replies in flight
    ended with an error, queued requests wait for it) or ``stopped`` (it died too often
    in a short time: ``stopped_reason`` says why and what to do)."""

    state: str
    pid: int | None = None
    restarts: int = 0  # times it was started again after it died
    last_death: str | None = None  # why it last died, as replies in flight were told
    stopped_reason: str | None = None


class HealthReport(_Lenient):
    """``GET /health``: who answers, what it holds, what it is doing."""

    service: str
    status: str
    version: str
    api_version: int
    pid: int
    loaded: list[LoadedPairReport] = []
    loading: str | None = None
    loads: int = 0  # pairs loaded since the engine started (reloads included)
    queue: QueueReport = QueueReport()
    attached_clients: int = 0
    keep_alive_seconds: float | None = None
    idle_exit: bool = False
    # http://HOST:PORT when the engine also listens on TCP (serve --tcp), for clients
    # that speak only HTTP (draftpen launch); None on the Unix socket alone.
    tcp: str | None = None
    # Where the engine before this one on the socket crashed (an API client saw only its
    # connection cut, and asks here why); None when it stopped cleanly or there was none.
    previous_crash: PreviousCrashReport | None = None
    # The runtime process, where the engine runs its runtime in one (draftpen serve);
    # None where the runtime runs inside the engine's own process (tests, embedding).
    runtime: RuntimeReport | None = None


class PairCard(_Lenient):
    """One entry of ``GET /v1/models``: a downloaded pair, and whether it is loaded."""

    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = "draftpen"
    loaded: bool = False
    target: str | None = None
    draft: str | None = None


class QueueNotice(_Lenient):
    """``draftpen.queue``: where a waiting request stands.

    ``position`` is how many requests run or wait ahead of it (1: it runs next), and
    ``ahead`` says what each is, the running one first.
    """

    position: int
    ahead: list[str]


def waiting_label(kind: str, pair: str) -> str:
    """How a request shows in another's queue notice: ``"agent request (starter)"``."""
    return f"{KIND_LABELS.get(kind, kind)} ({pair})"


def encode_segments(segments: tuple[TextSegment, ...]) -> list[list[Any]]:
    """Segments as JSON: ``[[text, from_draft], ...]``."""
    return [[segment.text, segment.from_draft] for segment in segments]


def decode_segments(data: object) -> tuple[TextSegment, ...]:
    """:func:`encode_segments` read back; anything malformed raises ValueError."""
    if not isinstance(data, list):
        raise ValueError("segments must be a list")
    segments = []
    for item in data:
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], bool)
        ):
            raise ValueError(f"a segment must be [text, from_draft], not {item!r}")
        segments.append(TextSegment(item[0], item[1]))
    return tuple(segments)


def encode_reasoning(reasoning: ReasoningFormat | None) -> dict[str, Any] | None:
    """How a reply marks reasoning, as JSON (None: the model does not think aloud)."""
    if reasoning is None:
        return None
    return {
        "start": reasoning.start,
        "end": reasoning.end,
        "starts_inside": reasoning.starts_inside,
    }


def decode_reasoning(data: object) -> ReasoningFormat | None:
    """:func:`encode_reasoning` read back; anything malformed raises ValueError."""
    if data is None:
        return None
    if not (
        isinstance(data, dict)
        and isinstance(data.get("start"), str)
        and isinstance(data.get("end"), str)
        and isinstance(data.get("starts_inside"), bool)
    ):
        raise ValueError(f"reasoning must be {{start, end, starts_inside}}, not {data!r}")
    return ReasoningFormat(data["start"], data["end"], data["starts_inside"])


_STATS_FIELDS = {field.name: field.type for field in fields(SpeculativeStats)}


def stats_from_wire(data: dict[str, Any]) -> SpeculativeStats:
    """The statistics of a chunk's ``draftpen`` object (derived rates are recomputed)."""
    values: dict[str, Any] = {}
    for name in _STATS_FIELDS:
        if name not in data:
            continue
        value = data[name]
        values[name] = tuple(value) if name == "accepted_length_histogram" else value
    return SpeculativeStats(**values)
