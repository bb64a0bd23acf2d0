"""asyncio without a thread per wait.

# How it works

Each event loop gets one *waitset* of the C library (created on the first
wait in that loop): a set of pending waits whose completions are reported
through one file descriptor, readable while completions are ready. The loop
watches that descriptor with ``loop.add_reader``; a wait is started with
``shmsched_scheduler_acquire_start`` / ``shmsched_limiter_consume_start``
(the library queues it as a real waiter in the region, so priorities and
FIFO order hold across processes exactly as for a blocking call), tagged
with a number that maps to an asyncio future. When the descriptor is
readable, the reader callback takes every ready completion (without
blocking) and resolves the futures. No thread is started per wait, and none
is blocked in Python: 5,000 pending waits cost 5,000 futures and one
descriptor.

# Cancellation

Cancelling the awaiting task (``task.cancel()``, ``asyncio.timeout``,
``asyncio.wait_for``) cancels the future and asks the waitset to cancel the
wait: the library removes the waiter (its queued place, its count in the
region) and reports the wait as cancelled. If the grant won the race (the
completion was already on its way), the reader callback finds the future
cancelled and releases the permit at once. Either way nothing stays held and
no waiter stays queued. Only the waitset glue (:class:`_Waitset`) knows the
C calls; the rest is asyncio.

# Fork

A waitset belongs to the process that made it; a forked child that runs an
event loop gets a waitset of its own on its first wait.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import TYPE_CHECKING, Any, Coroutine, Dict, Generator, Optional, Tuple

from . import _args, _ffi
from ._errors import Error

if TYPE_CHECKING:  # pragma: no cover
    from . import Grant, Limiter, Permit, PriorityLike, Scheduler

_lib = _ffi.lib


class _Waitset:
    """The C waitset: the only part of this module that knows its calls."""

    def __init__(self) -> None:
        raise Error(24, "the loaded libshmsched has no waitset (shmsched_waitset_create)")


class _LoopWaits:
    """The waits of one event loop: its waitset, its reader, and the futures
    of the waits in flight (by tag)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pid = os.getpid()
        self.ws = _Waitset()
        self.pending: Dict[int, Tuple["asyncio.Future[Any]", str, Any]] = {}
        self.next_tag = 1
        loop.add_reader(self.ws.fd, self._ready)

    def start(self, kind: str, obj: Any, *args: Any) -> Tuple["asyncio.Future[Any]", int]:
        tag = self.next_tag
        self.next_tag += 1
        fut = self.loop.create_future()
        if kind == "acquire":
            wait_id = self.ws.acquire_start(obj, tag, *args)
        else:
            wait_id = self.ws.consume_start(obj, tag, *args)
        # The handle stays referenced (and so open) until the completion.
        self.pending[tag] = (fut, kind, obj)
        return fut, wait_id

    def cancel(self, wait_id: int) -> None:
        self.ws.cancel(wait_id)

    def _ready(self) -> None:
        for tag, status, permit, grant, message in self.ws.take():
            entry = self.pending.pop(tag, None)
            if entry is None:
                continue
            fut, kind, _obj = entry
            if fut.done():
                # Cancelled while the grant was on its way: give it back.
                if status == _ffi.OK and kind == "acquire":
                    _lib.shmsched_permit_release(permit)
                continue
            if status == _ffi.OK:
                fut.set_result(permit if kind == "acquire" else grant)
            elif self.ws.is_cancelled(status):
                fut.cancel()
            else:
                fut.set_exception(_ffi.error(status, message))

    def close(self) -> None:
        try:
            self.loop.remove_reader(self.ws.fd)
        except Exception:
            pass
        self.ws.close()


_by_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaits]" = (
    weakref.WeakKeyDictionary()
)


def _waits() -> _LoopWaits:
    loop = asyncio.get_running_loop()
    w = _by_loop.get(loop)
    if w is None or w.pid != os.getpid():
        w = _LoopWaits(loop)
        _by_loop[loop] = w
        weakref.finalize(loop, _LoopWaits.close, w)
    return w


async def _wait(kind: str, obj: Any, *args: Any) -> Any:
    w = _waits()
    fut, wait_id = w.start(kind, obj, *args)
    try:
        return await fut
    except asyncio.CancelledError:
        if fut.done() and not fut.cancelled():
            # The grant arrived, then the task was cancelled before it ran.
            if kind == "acquire":
                _lib.shmsched_permit_release(fut.result())
        else:
            w.cancel(wait_id)
        raise


async def _acquire(sched: "Scheduler", p: int, priority: "PriorityLike", units: int,
                   ns: Optional[int]) -> "Permit":
    from . import Permit

    # A free slot with nobody queued at this priority is taken at once.
    now = sched.try_acquire_many(units, p) if units != 1 else sched.try_acquire(p)
    if now is not None:
        now.priority = priority
        return now
    token = await _wait("acquire", sched, p, units, _args.FOREVER_NS if ns is None else ns)
    return Permit(token, priority, units)


async def _consume(lim: "Limiter", n: int, p: int, ns: Optional[int]) -> "Grant":
    from . import Grant

    if lim.try_consume(n):
        return Grant(True, False)
    g = await _wait("consume", lim, n, p, _args.FOREVER_NS if ns is None else ns)
    return Grant(g.immediate, g.forced)


def consume(lim: "Limiter", n: int, p: int, ns: Optional[int]) -> "asyncio.Future[Grant]":
    return _consume(lim, n, p, ns)  # type: ignore[return-value]


class AsyncAcquire(Coroutine[Any, Any, "Permit"]):
    """What :meth:`Scheduler.acquire_async` returns: await it for a
    :class:`~shmsched.Permit` (it is a coroutine: ``asyncio.create_task``,
    ``wait_for`` and ``gather`` take it), or use it as an async context
    manager, which releases the permit on exit."""

    __slots__ = ("_args", "_coro", "_permit")

    def __init__(self, sched: "Scheduler", p: int, priority: "PriorityLike", units: int,
                 ns: Optional[int]) -> None:
        self._args = (sched, p, priority, units, ns)
        self._coro: Optional[Any] = None
        self._permit: Optional["Permit"] = None

    def _inner(self) -> Any:
        if self._coro is None:
            self._coro = _acquire(*self._args)
        return self._coro

    def __await__(self) -> Generator[Any, None, "Permit"]:
        return self._inner().__await__()

    def send(self, value: Any) -> Any:
        return self._inner().send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if val is None and tb is None:
            return self._inner().throw(typ)
        return self._inner().throw(typ, val, tb)

    def close(self) -> None:
        if self._coro is not None:
            self._coro.close()

    async def __aenter__(self) -> "Permit":
        self._permit = await _acquire(*self._args)
        return self._permit

    async def __aexit__(self, *exc: Any) -> None:
        permit, self._permit = self._permit, None
        if permit is not None and not permit.released:
            permit.release()
