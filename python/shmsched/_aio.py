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
descriptor (the library wakes waits from the one helper thread it keeps per
process while async waiters are queued). A wait that can go at once (a free
slot, nobody queued at its priority; tokens in the bucket) is granted on the
spot, without the waitset.

# Cancellation

Cancelling the awaiting task (``task.cancel()``, ``asyncio.timeout``,
``asyncio.wait_for``) cancels the future and asks the waitset to cancel the
wait: the library removes the waiter (its queued place, its count in the
region) and reports the wait as cancelled. If the grant won the race (the
completion was already on its way), the reader callback finds the future
cancelled and releases the permit at once. Either way nothing stays held and
no waiter stays queued. The C calls are :class:`~shmsched.Waitset`'s (a
public class, for ``selectors`` or a thread); this module is the asyncio
around it.

# Lifetime

The loop owns its waits' state (through its reader callback), not the
reverse: a finished loop is collected, and its waitset is closed with it,
which cancels whatever is still pending.

# Fork

A waitset belongs to the process that made it; a forked child that runs an
event loop gets a waitset of its own on its first wait.
"""

from __future__ import annotations

import asyncio
import sys
import weakref
from typing import TYPE_CHECKING, Any, Coroutine, Dict, Generator, Optional, Tuple

from ._errors import Error

# The package (loaded before this module): its `_pid` is kept current in a
# forked child.
_pkg = sys.modules[__name__.rpartition(".")[0]]

if TYPE_CHECKING:  # pragma: no cover
    from . import Grant, Limiter, Permit, PriorityLike, Scheduler


class _LoopWaits:
    """The waits of one event loop: its :class:`~shmsched.Waitset`, the
    reader on its descriptor, and the future of each wait in flight (by
    tag)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        from . import Waitset

        # Weak: the loop owns this (through its reader), not the reverse, so
        # that a finished loop is collected and its waitset closed with it.
        self.loop = weakref.ref(loop)
        self.pid = _pkg._pid
        self.ws = Waitset()
        self.fd = self.ws.fileno()
        self.futures: Dict[int, "asyncio.Future[Any]"] = {}
        self.next_tag = 1
        loop.add_reader(self.fd, self._ready)

    def start_acquire(self, sched: "Scheduler", p: int, priority: "PriorityLike", units: int,
                      ns: Optional[int]) -> Tuple[int, "asyncio.Future[Any]", int]:
        tag = self._tag()
        wait_id = self.ws._start_acquire(sched, p, priority, units, ns, tag)
        return tag, self._future(tag), wait_id

    def start_consume(self, lim: "Limiter", n: int, p: int,
                      ns: Optional[int]) -> Tuple[int, "asyncio.Future[Any]", int]:
        tag = self._tag()
        wait_id = self.ws._start_consume(lim, n, p, ns, tag)
        return tag, self._future(tag), wait_id

    def _tag(self) -> int:
        tag = self.next_tag
        self.next_tag += 1
        return tag

    def _future(self, tag: int) -> "asyncio.Future[Any]":
        fut = asyncio.get_running_loop().create_future()
        self.futures[tag] = fut
        return fut

    def cancel(self, tag: int, wait_id: int) -> None:
        # The future goes now (nothing pending keeps the loop alive); the
        # completion, when taken, finds none and gives back what it holds.
        self.futures.pop(tag, None)
        try:
            self.ws.cancel(wait_id)
        except Error:
            pass  # already taken: the reader gave back what it held

    def _ready(self) -> None:
        while True:
            done = self.ws.take()
            for c in done:
                fut = self.futures.pop(c.tag, None)
                if fut is None or fut.done():
                    # Cancelled while the grant was on its way: give it back.
                    if c.permit is not None:
                        c.permit.release()
                    continue
                if c.error is None:
                    fut.set_result(c.permit if c.permit is not None else c.grant)
                elif c.cancelled:
                    fut.cancel()
                else:
                    fut.set_exception(c.error)
            if len(done) < 256:
                return

    def close(self) -> None:
        loop = self.loop()
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self.fd)
        self.ws.close()


_by_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaits]" = (
    weakref.WeakKeyDictionary()
)


def _waits() -> _LoopWaits:
    loop = asyncio.get_running_loop()
    w = _by_loop.get(loop)
    if w is None or w.pid != _pkg._pid:
        w = _LoopWaits(loop)
        _by_loop[loop] = w
        # When the loop is collected, the waitset is closed (which cancels
        # any wait still pending and gives back what it held).
        weakref.finalize(loop, w.ws.close)
    return w


async def _wait(w: _LoopWaits, tag: int, fut: "asyncio.Future[Any]", wait_id: int) -> Any:
    try:
        return await fut
    except asyncio.CancelledError:
        if fut.done() and not fut.cancelled():
            # The grant arrived, then the task was cancelled before it ran.
            result = fut.result()
            if hasattr(result, "release"):
                result.release()
        else:
            w.cancel(tag, wait_id)
        raise


async def _acquire(sched: "Scheduler", p: int, priority: "PriorityLike", units: int,
                   ns: Optional[int]) -> "Permit":
    # A free slot with nobody queued at this priority is taken at once.
    now = sched._try_take(p, priority, units)
    if now is not None:
        return now
    w = _waits()
    permit: "Permit" = await _wait(w, *w.start_acquire(sched, p, priority, units, ns))
    return permit


async def _consume(lim: "Limiter", n: int, p: int, ns: Optional[int]) -> "Grant":
    from . import Grant

    # At the caller's priority, so the stats count it there.
    if lim._try_at(n, p):
        return Grant(True, False)
    w = _waits()
    grant: "Grant" = await _wait(w, *w.start_consume(lim, n, p, ns))
    return grant


def consume(lim: "Limiter", n: int, p: int, ns: Optional[int]) -> Coroutine[Any, Any, "Grant"]:
    return _consume(lim, n, p, ns)


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
