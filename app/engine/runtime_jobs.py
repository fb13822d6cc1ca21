"""A job as the engine's front holds it while its runtime process works on it.

:class:`TrackedJob` wraps the handler's :class:`~app.engine.jobs.EngineJob`: whether it
was sent to the runtime and taken by its worker (from then on, a death of the runtime
costs its reply), the message that sends it (its runtime half only), and how each item
the runtime sends back reaches the handler: the prepared inputs become the answer's
format here (``JobPreparer.answer``), with a token's bytes from what the runtime sends
along for logprobs; events and errors pass as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.generation_run import END, cancelled_event
from app.engine.job_requests import JobPreparer, PreparedGeneration
from app.engine.jobs import EngineJob, Prepared
from app.engine.runtime_wire import JobEnd, SubmitJob, TokenBytes
from backends.generation_events import FINISH_CANCELLED, GenerationEvent

COMPLETED, CANCELLED, FAILED = "completed", "cancelled", "failed"


@dataclass(eq=False)
class TrackedJob:
    """A job the front holds until its end: sent to the runtime yet, taken by it yet."""

    job: EngineJob
    sent: bool = False
    taken: bool = False
    # The bytes of the tokens its logprobs name, sent by the runtime (logprobs only).
    token_bytes: dict[int, bytes] | None = None
    finish_reason: str | None = None
    failed: bool = False

    def submit_message(self) -> SubmitJob:
        """The job's runtime half, to send (marks it sent)."""
        job = self.job
        generation = job.prepare.generation if isinstance(job.prepare, JobPreparer) else None
        if job.prepare is not None and generation is None:
            raise TypeError("a job for a runtime process needs a JobPreparer")
        self.sent = True
        return SubmitJob(
            id=job.id,
            pair=job.pair,
            kind=job.kind,
            generation=generation,
            load_options=job.load_options,
            inspect=job.inspect,
            command_line_pair=job.command_line_pair,
        )

    def deliver(self, item: object) -> None:
        """Hand one of the runtime's items for this job to its handler."""
        job = self.job
        if isinstance(item, JobEnd):
            job.post(END)
        elif isinstance(item, TokenBytes):
            if self.token_bytes is None:
                self.token_bytes = {}
            self.token_bytes.update(item.table)
        elif isinstance(item, PreparedGeneration):
            job.prompt_tokens = len(item.request.prompt_tokens)
            job.post(self._prepared(item))
        else:
            if isinstance(item, GenerationEvent) and item.finish_reason is not None:
                self.finish_reason = item.finish_reason
            elif isinstance(item, BaseException):
                self.failed = True
            job.post(item)

    def outcome(self) -> str:
        """How the job ended, once it has: completed, cancelled or failed."""
        if self.failed:
            return FAILED
        return CANCELLED if self.finish_reason == FINISH_CANCELLED else COMPLETED

    def end_with(self, error: BaseException) -> None:
        """End the job here with ``error`` (the runtime that had it is gone)."""
        self.job.post(error)
        self.job.post(END)

    def end_cancelled(self) -> None:
        """End the job here as cancelled (it was cancelled before it ran)."""
        if self.job.prepare is not None:
            self.job.post(cancelled_event(self.job.prompt_tokens))
        self.job.post(END)

    def _prepared(self, prepared: PreparedGeneration) -> Prepared:
        """The job's request with its answer's format, made here from the runtime's
        inputs (a token's bytes from what the runtime sends along, for logprobs)."""
        preparer = self.job.prepare
        assert isinstance(preparer, JobPreparer)
        token_bytes = None
        if prepared.inputs.logprobs:
            table = self.token_bytes = self.token_bytes or {}
            token_bytes = table.__getitem__
        return Prepared(prepared.request, preparer.answer(prepared.inputs, token_bytes))
