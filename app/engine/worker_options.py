"""``serve --workers``: other machines that hold part of the target's layers.

The workers come from ``--workers`` (else the ``workers`` setting), their shares from
``--worker-split`` (else ``worker_split``; default: by free memory). They are asked at
start, so a wrong address is said at once; a worker that is down then is a warning, and
each load asks them again (``app.loading``), failing with the worker's name. A load
request may name other workers, or none (``"workers": []``), to load without one that
has gone.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from app.engine import crash_record
from app.engine.schema import ApiError
from app.errors import DraftpenError
from app.settings import Settings
from backends.errors import BackendError
from backends.workers import keepalive, watchdog
from backends.workers.cluster import Workers
from backends.workers.endpoints import Endpoint, WorkerAddressError
from backends.workers.wire import probe, unreachable

logger = logging.getLogger("draftpen.server")
# How long an abort looks for the worker that went (see watch_runtime_aborts).
ABORT_LOOK_SECONDS = 1.5


def add_worker_options(serve: argparse.ArgumentParser) -> None:
    """Add ``--workers``, ``--worker-split``, ``--worker-timeout`` and
    ``--overlap-drafting`` to ``serve``."""
    serve.add_argument(
        "--workers",
        default=None,
        metavar="HOST:PORT,...",
        help="split the target's layers over this machine and these `draftpen worker`s "
        "(llama.cpp RPC; the draft stays here); '' for none (default: the workers setting)",
    )
    serve.add_argument(
        "--worker-split",
        default=None,
        metavar="W,W,...",
        help="the layers' shares: this machine's weight, then each worker's in --workers "
        "order, e.g. 2,1,1 (default: the worker_split setting, else by free memory)",
    )
    serve.add_argument(
        "--worker-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the least a forward pass waits on a silent worker before it is called hung "
        "and the engine ends naming it; 0 waits forever (default: the worker_timeout "
        "setting, 30)",
    )
    serve.add_argument(
        "--overlap-drafting",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with workers, draft the next round while they verify this one (greedy, "
        "draft model; default: the overlap_drafting setting, on)",
    )


def workers_from(args: argparse.Namespace, settings: Settings) -> Workers | None:
    """The workers ``serve`` was asked to use (None: none), each asked once now."""
    addresses = settings.workers if args.workers is None else args.workers
    split = settings.worker_split if args.worker_split is None else args.worker_split
    if not addresses.strip():
        if args.worker_split:
            raise DraftpenError("--worker-split needs --workers (or the workers setting).")
        return None
    try:
        workers = Workers.parse(addresses, split or None)
    except WorkerAddressError as error:
        raise DraftpenError(str(error)) from None
    for endpoint in workers.endpoints:
        try:
            info = probe(endpoint)
        except BackendError as error:
            # Not fatal: the worker may start later; each load asks again and says so.
            logger.warning("%s", error)
            continue
        logger.info(
            "worker %s: protocol %s, %d device(s), %.1f GiB free",
            endpoint,
            ".".join(map(str, info.protocol)),
            len(info.devices),
            info.free_bytes / (1 << 30),
        )
    return workers


def workers_named(addresses: list[str]) -> Workers | None:
    """A load request's ``workers`` ([] for none); a bad address is a 400."""
    if not addresses:
        return None
    try:
        return Workers.parse(",".join(addresses))
    except WorkerAddressError as error:
        raise ApiError(400, str(error), param="workers", code="invalid_value") from None


def watch_runtime_aborts() -> None:
    """When llama.cpp aborts the engine (a worker lost mid-reply ends in GGML_ABORT), say
    which workers are gone, in the log and the crash record, before the process dies."""
    from backends.llamacpp import ggml_devices

    def on_abort(message: str) -> None:
        # A worker killed a moment ago may still hold its listening socket while its
        # connection to us is already gone (its descriptors close one by one as it
        # exits): look again for a little while before saying no worker is gone.
        deadline = time.monotonic() + ABORT_LOOK_SECONDS
        # A worker the watchdog found hung still listens: its verdict names it.
        hung = watchdog.verdicts()
        while True:
            lost = [(str(endpoint), why) for endpoint, why in hung.items()]
            for endpoint in ggml_devices.workers_in_use():
                if endpoint in hung:
                    continue
                why = unreachable(endpoint)
                if why is not None:
                    lost.append((str(endpoint), why))
            if lost or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        crash_record.note_runtime_abort(message, lost)
        print(f"llama.cpp aborted: {message}", file=sys.stderr, flush=True)
        for worker, why in lost:
            print(f"worker {worker} is gone: {why}", file=sys.stderr, flush=True)

    try:
        ggml_devices.on_abort(on_abort)
    except (BackendError, OSError, AttributeError) as error:
        # Only the words of a crash depend on it: serving goes on without.
        logger.warning("cannot watch llama.cpp's aborts (%s): a lost worker is not named", error)


def keep_worker_connections_alive() -> None:
    """Keepalive on this engine's connections to its workers, so a worker machine that
    vanishes mid-reply ends the wait (and the engine, with the worker named) within about
    20 seconds instead of never (``backends/workers/keepalive.py``)."""
    from backends.llamacpp import ggml_devices

    locate = worker_locator()
    keepalive.watch(
        lambda local, remote: locate(remote) is not None,
        active=lambda: bool(ggml_devices.workers_in_use()),
    )


def worker_locator() -> watchdog.Locator:
    """The registered worker a remote address belongs to (names resolved once each)."""
    from backends.llamacpp import ggml_devices

    resolved: dict[Endpoint, set[str]] = {}

    def locate(remote: tuple[str, int]) -> Endpoint | None:
        for endpoint in ggml_devices.registered_workers():
            if endpoint not in resolved:
                resolved[endpoint] = keepalive.addresses_of(endpoint.host)
            if remote[1] == endpoint.port and remote[0] in resolved[endpoint]:
                return endpoint
        return None

    return locate


def worker_timeout_from(args: argparse.Namespace, settings: Settings) -> float:
    """``--worker-timeout``, else the ``worker_timeout`` setting (0: wait forever)."""
    seconds = settings.worker_timeout if args.worker_timeout is None else args.worker_timeout
    if not seconds >= 0:
        raise DraftpenError("--worker-timeout must be 0 or more seconds (0 waits forever).")
    return float(seconds)


def watch_for_hung_workers(floor: float) -> None:
    """Break the connection to a worker that stops answering mid-forward (its process
    hung while its machine still answers TCP), so the engine ends naming it instead of
    waiting forever (``backends/workers/watchdog.py``). ``floor``: 0 turns it off."""
    if floor <= 0:
        return
    from backends.llamacpp import ggml_devices

    # While the workers are registered: a load that hangs on one is a wait too.
    watchdog.watch(worker_locator(), floor, active=ggml_devices.workers_registered)
