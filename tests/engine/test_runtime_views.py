"""What the front says of the runtime's pair agrees across its endpoints: once a fresh
answer from the runtime (``GET /health``'s) finds nothing loaded, ``/v1/models`` (which
reads the runtime's last state) does not say loaded, even where the state that follows
the answer in the same batch has not been read yet (a pair unloaded by keep-alive).
"""

from __future__ import annotations

from types import SimpleNamespace

from app.engine.jobs import QueueState
from app.engine.runtime_supervisor import RuntimeSupervisor
from app.engine.runtime_wire import RuntimeState, SnapshotAnswer
from app.engine.scheduler import LoadOptions, SchedulerSnapshot

OPTIONS = LoadOptions(context_length=4096, exact=False)
IDLE = QueueState(
    running=None,
    running_label=None,
    running_count=0,
    parallel=1,
    parallel_refusal=None,
    waiting=0,
    limit=8,
    completed=1,
    cancelled=0,
    failed=0,
    accepting=True,
    idle_since=0.0,
)


def test_a_fresh_answer_that_finds_no_pair_is_what_every_view_says() -> None:
    spec = SimpleNamespace(keep_alive=1.0, defaults=OPTIONS)
    supervisor = RuntimeSupervisor(spec, max_waiting=8)  # type: ignore[arg-type]
    held = RuntimeState(queue=IDLE, held=("starter", OPTIONS), loading=None, remembered={}, loads=1)
    supervisor._receive(None, held)  # type: ignore[arg-type]
    assert supervisor.loaded_name() == "starter"
    # A fresh answer that still finds it changes nothing.
    still = SchedulerSnapshot(loaded=(object(),), loading=None)  # type: ignore[arg-type]
    supervisor._receive(None, SnapshotAnswer(0, still))  # type: ignore[arg-type]
    assert supervisor.loaded_name() == "starter"
    supervisor._receive(None, SnapshotAnswer(1, SchedulerSnapshot((), None)))  # type: ignore[arg-type]
    assert supervisor.loaded_name() is None
