"""shmsched for Python: one concurrency budget, one byte-rate budget and one
fair-share ceiling shared by many processes (in any language) through a
memory-mapped region.

A ``ctypes`` binding of ``libshmsched.so`` (the C ABI, built from ``ffi/``
and installed inside this package by ``pip install``)::

    import shmsched

    region = shmsched.Region.open_or_create("pool")      # /dev/shm/shmsched.pool
    sched = shmsched.Scheduler.shared(region, 8, low=2)   # 8 at once, low at most 2
    with sched.acquire("high"):                           # blocks; released on exit
        ...

    async with sched.acquire_async("high"):               # asyncio: no thread per wait
        ...

    lim = shmsched.Limiter.shared(shmsched.Region.open_or_create("bytes"), 16_000_000)
    with lim.open("/var/log/syslog", "rb", priority="low") as f:
        data = f.read()                                   # at most 16 MB/s across processes

Errors raise :class:`Error` subclasses carrying the library's status code
and message (the same text a Rust caller sees); a bad argument is refused
before the library sees it (see :mod:`shmsched._args` for the rules: no
integer is ever truncated, a bool or a float is not a count, a NUL is not
part of a name). Blocking calls release the GIL while they wait.

The library is found through the ``SHMSCHED_LIB`` environment variable (a
path to ``libshmsched.so``), else the copy inside this package, else
``target/release`` then ``target/debug`` of the source tree this package
sits in, else the system's library path.

Fork: a :class:`Region` and a :class:`FairShare` work in a forked child
(``multiprocessing`` with the ``fork`` start method); a :class:`Scheduler`,
a :class:`Limiter` and a :class:`Permit` belong to the process that made
them: make new ones from the region in the child.
"""

from __future__ import annotations

import ctypes
import datetime
import io
import json
import os
import threading
import warnings
from typing import (
    Any,
    Awaitable,
    BinaryIO,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    TYPE_CHECKING,
    Tuple,
    TypeVar,
    Union,
    cast,
)

from . import _args
from ._args import PRIORITIES
from ._errors import *  # noqa: F401,F403 (the exceptions are part of the API)
from ._errors import Error, InvalidArgument
from ._errors import __all__ as _error_names
# SIGNATURES: the table of every bound C function (name -> prototype).
from ._ffi import ABI_VERSION, LIBRARY_PATH, SIGNATURES  # noqa: F401
from . import _ffi

if TYPE_CHECKING:  # pragma: no cover
    from ._aio import AsyncAcquire

__version__ = "0.1.0"

__all__ = [
    "ABI_VERSION",
    "LIBRARY_PATH",
    "PRIORITIES",
    "FairShare",
    "Grant",
    "Lease",
    "Limiter",
    "LimiterSnapshot",
    "Permit",
    "Refusal",
    "Region",
    "Scheduler",
    "SchedulerSnapshot",
    "ThrottledFile",
    "Completion",
    "Waitset",
    "abi_version",
    "layout_version",
    "monotonic_ms",
    "priority_value",
    "strerror",
    *_error_names,
]

#: A priority: a name (``"high"``, case-insensitive), an integer -3..3, or
#: the text of one.
PriorityLike = Union[str, int]
#: A timeout in seconds; ``None`` (or ``math.inf``) waits for ever.
TimeoutLike = Union[None, int, float, "datetime.timedelta"]
#: A region name or path.
PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

_T = TypeVar("_T")

_lib = _ffi.lib
_check = _ffi.check
_byref = ctypes.byref
# The hot calls, bound once.
_acquire = _lib.shmsched_scheduler_acquire
_acquire_timeout = _lib.shmsched_scheduler_acquire_timeout
_release = _lib.shmsched_permit_release
_try_acquire = _lib.shmsched_scheduler_try_acquire
_PRIO_FAST: Dict[Any, int] = dict(PRIORITIES)
for _name, _v in PRIORITIES.items():
    _PRIO_FAST[_v] = _v

# This process's pid, which a permit is checked against when it is
# garbage-collected (kept current in a forked child).
_pid = os.getpid()


def _after_fork() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def abi_version() -> int:
    """The C ABI version of the loaded library."""
    return _lib.shmsched_abi_version()


def layout_version() -> int:
    """The region layout version the loaded library reads and writes."""
    return _lib.shmsched_layout_version()


def monotonic_ms() -> int:
    """``CLOCK_MONOTONIC`` in milliseconds: the clock of the fair-share calls
    with ``now_ms=None``."""
    return _lib.shmsched_monotonic_ms()


def strerror(status: int) -> str:
    """The library's generic description of a status code."""
    return _lib.shmsched_strerror(_args.u32(status, "status")).decode()


def priority_value(priority: PriorityLike) -> int:
    """A priority as its integer value -3..3: a name (case-insensitive), an
    integer -3..3, or the text of one. Anything else raises
    :class:`InvalidPriority` (a ``ValueError``) or, for another type,
    :class:`ArgumentTypeError` (a ``TypeError``)."""
    return _args.priority(priority)


def _prio(priority: Any) -> int:
    # The common cases (a name or an int in range) without the parser; a
    # bool is a key of _PRIO_FAST (True == 1), so it is excluded by type.
    if type(priority) is str or type(priority) is int:
        p = _PRIO_FAST.get(priority)
        if p is not None:
            return p
    return _args.priority(priority)


class _Handle:
    """An owned C handle, closed once (explicitly, on ``with`` exit, or when
    garbage-collected)."""

    _close: str = ""
    _ptr: Optional[int]

    def __init__(self, ptr: Optional[int]) -> None:
        self._ptr = ptr

    @property
    def _h(self) -> int:
        if self._ptr is None:
            raise InvalidArgument(1, f"this {type(self).__name__} is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        """True once closed."""
        return self._ptr is None

    def close(self) -> None:
        """Closes the handle (idempotent)."""
        ptr, self._ptr = getattr(self, "_ptr", None), None
        if ptr is not None and _lib is not None:
            getattr(_lib, self._close)(ptr)

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


_aio_module: Any = None


def _asyncio() -> Any:
    """The asyncio layer, imported on first use (it imports asyncio)."""
    global _aio_module
    if _aio_module is None:
        from . import _aio

        _aio_module = _aio
    return _aio_module


def _out_handle(fn: Callable[..., int], *args: Any) -> int:
    out = ctypes.c_void_p()
    _check(fn(*args, _byref(out)))
    assert out.value is not None
    return out.value


def _handle_of(obj: Any, cls: type, what: str) -> int:
    if not isinstance(obj, cls):
        raise _args.type_error(what, f"a shmsched.{cls.__name__}", obj)
    h: int = getattr(obj, "_h")
    return h


# --------------------------------------------------------------------------
# Regions


class Region(_Handle):
    """A shared region file (named) or memfd (anonymous) holding one object.

    A name without ``/`` maps to ``/dev/shm/shmsched.<name>``; anything with
    ``/`` is a path. Works in a forked child.
    """

    _close = "shmsched_region_close"

    @classmethod
    def create(cls, name: PathLike, mode: int = 0o600, process_slots: int = 128) -> "Region":
        """Creates a new region file (it must not exist). ``mode`` is at most
        ``0o660`` (never world-writable); ``process_slots`` is 1..4096."""
        return cls(
            _out_handle(
                _lib.shmsched_region_create,
                _args.path(name),
                _mode(mode),
                _slots(process_slots),
            )
        )

    @classmethod
    def open(cls, name: PathLike) -> "Region":
        """Opens an existing region file."""
        return cls(_out_handle(_lib.shmsched_region_open, _args.path(name)))

    @classmethod
    def open_or_create(
        cls, name: PathLike, mode: int = 0o600, process_slots: int = 128
    ) -> "Region":
        """Opens the region file, creating it if missing (race-free)."""
        return cls(
            _out_handle(
                _lib.shmsched_region_open_or_create,
                _args.path(name),
                _mode(mode),
                _slots(process_slots),
            )
        )

    @classmethod
    def anonymous(cls, process_slots: int = 128) -> "Region":
        """An anonymous region (memfd): share it with forked children, or
        pass :meth:`dup_fd` to an exec'ed program."""
        return cls(_out_handle(_lib.shmsched_region_anonymous, _slots(process_slots)))

    @classmethod
    def open_fd(cls, fd: int) -> "Region":
        """Opens the region behind a descriptor (the caller keeps ``fd``)."""
        fd = _args.integer(
            fd,
            "descriptor",
            0,
            _args.I32_MAX,
            "descriptor {v} is out of range: expected an open descriptor of a region file "
            "(0..={hi})",
        )
        return cls(_out_handle(_lib.shmsched_region_open_fd, fd))

    def dup_fd(self) -> int:
        """A new inheritable descriptor of an anonymous region, owned by the
        caller (pass it to a child with ``pass_fds``; close it afterwards)."""
        fd = ctypes.c_int32(-1)
        _check(_lib.shmsched_region_dup_fd(self._h, _byref(fd)))
        return fd.value

    @staticmethod
    def remove(name: PathLike) -> None:
        """Removes a named region's file."""
        _check(_lib.shmsched_region_remove(_args.path(name)))

    def info(self) -> Dict[str, Any]:
        """The region's header: kind, layout version, process slots, … (kind
        is None before an object was created in it)."""
        i = _ffi.RegionInfo()
        i.size = ctypes.sizeof(i)
        _check(_lib.shmsched_region_get_info(self._h, _byref(i)))
        kinds = {0: None, 1: "scheduler", 2: "limiter", 3: "fair-share"}
        return {
            "kind": kinds.get(i.kind, i.kind),
            "layout_version": i.layout_version,
            "process_slots": i.process_slots,
            "total_size": i.total_size,
            "created_at_unix_ms": i.created_at_unix_ms,
            "created_pid": i.created_pid,
        }

    def __repr__(self) -> str:
        return f"<shmsched.Region {'closed' if self._ptr is None else 'open'}>"


def _mode(mode: Any) -> int:
    return _args.integer(mode, "mode", 0, 0o777, "mode {v:#o} has bits outside 0o777")


def _slots(n: Any) -> int:
    return _args.integer(
        n,
        "process_slots",
        1,
        _args.MAX_PROCESS_SLOTS,
        "process_slots {v} out of range 1..={hi}",
    )


# --------------------------------------------------------------------------
# Scheduler


def _concurrency(max: Optional[int], caps: Mapping[str, Optional[int]], shared: bool) -> Any:
    if max is None:
        if shared:
            raise _args.type_error("max", "an int (a shared scheduler needs one)", max)
        m = _ffi.UNLIMITED
    elif shared:
        m = _args.integer(
            max,
            "max",
            0,
            _args.MAX_SHARED_SLOTS,
            "a shared scheduler's max {v} is out of range 0..={hi} (one owner cell per slot)",
        )
    else:
        m = _args.integer(
            max, "max", 0, _args.MAX_COUNT, "concurrency max {v} is out of range 0..={hi}"
        )
    c = _lib.shmsched_concurrency_max(m)
    for name, cap in caps.items():
        p = _args.priority(name)
        v = (
            _ffi.CAP_UNSET
            if cap is None
            else _args.integer(
                cap,
                f"cap of {name}",
                0,
                _args.MAX_COUNT,
                f"concurrency cap {{v}} for priority {name} is out of range 0..={{hi}}",
            )
        )
        _check(_lib.shmsched_concurrency_set_cap(_byref(c), p, v))
    return c


class Permit:
    """The right to run (``units`` of) one task; release it exactly once (a
    ``with`` block does). Belongs to the process that acquired it.

    A permit garbage-collected while still held gives its units back and
    emits a :class:`ResourceWarning` (shown with ``python -X dev`` or
    ``-W default``): release it, or use ``with``.
    """

    __slots__ = ("_permit", "priority", "units", "_released")

    def __init__(self, permit: Any, priority: PriorityLike, units: int = 1) -> None:
        self._permit = permit
        self.priority = priority
        self.units = units
        self._released = False

    @property
    def released(self) -> bool:
        """True once :meth:`release` succeeded."""
        return self._released

    @property
    def token(self) -> Tuple[int, int]:
        """The C token ``(process, serial)``."""
        return (self._permit.process, self._permit.serial)

    def release(self) -> None:
        """Gives the units back. Raises :class:`AlreadyReleased` the second
        time, :class:`ForeignPermit` in another process (a forked child)."""
        st = _release(self._permit)
        if st:
            _check(st)
        self._released = True

    def __enter__(self) -> "Permit":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._released:
            self.release()

    def __del__(self) -> None:
        # The token's process tag holds the acquiring process's pid in its
        # low 32 bits: a forked child's copy is not the child's to release.
        if self._released or self._permit.process & 0xFFFFFFFF != _pid:
            return
        try:
            if _release(self._permit) == 0:
                self._released = True
                warnings.warn(
                    f"a shmsched.Permit ({self.priority}, {self.units} unit"
                    f"{'s' if self.units != 1 else ''}) was garbage-collected without "
                    f"release(); its units were given back now. Release permits "
                    f"explicitly, or use `with`.",
                    ResourceWarning,
                    stacklevel=2,
                )
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        units = f" x{self.units}" if self.units != 1 else ""
        return f"<Permit {self.priority}{units} {state}>"


def _plain(x: Any) -> Any:
    """A ctypes struct as plain Python: dicts, lists, ints."""
    if isinstance(x, ctypes.Structure):
        return {k: _plain(getattr(x, k)) for k, *_ in x._fields_}
    if isinstance(x, ctypes.Array):
        return [_plain(v) for v in x]
    return x


class _Snapshot:
    """What both stats snapshots have."""

    __slots__ = ("pending", "stall_ns", "total", "queues", "shared", "_d")

    pending: int
    stall_ns: int
    total: Dict[str, int]
    #: Per priority, index = priority + 3.
    queues: List[Dict[str, int]]
    #: The region-wide figures (waiters per priority, processes, …), or
    #: None for a level not shared through a region.
    shared: Optional[Dict[str, Any]]

    def __init__(self, s: Any) -> None:
        d: Dict[str, Any] = _plain(s)
        self.pending = d["pending"]
        self.stall_ns = d["stall_ns"]
        self.total = d["total"]
        self.queues = d["queues"]
        self.shared = d["region"] if s.has_region else None
        self._d = d


class SchedulerSnapshot(_Snapshot):
    """The scheduler's gauges and counters read through the C struct (no
    JSON): the same figures as :meth:`Scheduler.stats`."""

    __slots__ = ("concurrency", "running")

    def __init__(self, s: Any) -> None:
        super().__init__(s)
        d = self._d
        self.concurrency: Optional[int] = None if s.concurrency == _ffi.UNLIMITED else s.concurrency
        self.running: int = d["running"]

    def __repr__(self) -> str:
        return (
            f"<SchedulerSnapshot running={self.running} pending={self.pending} "
            f"shared={self.shared}>"
        )


class Scheduler(_Handle):
    """A concurrency budget: at most ``max`` tasks at once across every
    process sharing the region, seven priorities, per-priority caps."""

    _close = "shmsched_scheduler_close"

    @classmethod
    def shared(cls, region: Region, max: int, **caps: Optional[int]) -> "Scheduler":
        """Binds the scheduler in ``region`` with a global ``max``
        (0..65536); keyword caps per priority name (``low=2``) apply to
        this handle's tasks."""
        r = _handle_of(region, Region, "region")
        c = _concurrency(max, caps, shared=True)
        if not caps:
            return cls(_out_handle(_lib.shmsched_scheduler_shared, r, c.max))
        return cls(_out_handle(_lib.shmsched_scheduler_shared_with, r, _byref(c)))

    @classmethod
    def attach(cls, region: Region) -> "Scheduler":
        """Joins the scheduler in ``region``, whatever its max."""
        return cls(
            _out_handle(_lib.shmsched_scheduler_attach, _handle_of(region, Region, "region"))
        )

    def child(self, max: Optional[int] = None, **caps: Optional[int]) -> "Scheduler":
        """A child scheduler: a local cap on top of this one (``max=None``
        for no overall local cap)."""
        c = _concurrency(max, caps, shared=False)
        if not caps:
            return Scheduler(_out_handle(_lib.shmsched_scheduler_child, self._h, c.max))
        return Scheduler(_out_handle(_lib.shmsched_scheduler_child_with, self._h, _byref(c)))

    def acquire(self, priority: PriorityLike = "normal", timeout: TimeoutLike = None) -> Permit:
        """Blocks until a slot is free (at most ``timeout`` seconds, then
        :class:`Timeout`); returns a :class:`Permit`, usable in ``with``."""
        p = _prio(priority)
        h = self._ptr
        if h is None:
            h = self._h  # raises: closed
        permit = _ffi.Permit()
        if timeout is None:
            st = _acquire(h, p, _byref(permit))
        else:
            ns = _args.timeout_ns(timeout)
            if ns is None:
                st = _acquire(h, p, _byref(permit))
            else:
                st = _acquire_timeout(h, p, ns, _byref(permit))
        if st:
            _check(st)
        return Permit(permit, priority)

    def acquire_many(
        self, n: int, priority: PriorityLike = "normal", timeout: TimeoutLike = None
    ) -> Permit:
        """A weighted acquire: blocks until ``n`` units are free at once and
        takes them all (never some of them); one :class:`Permit` gives them
        all back. ``n`` is 1..max, and at most the priority's cap when that
        cap is below the max."""
        units = _args.u32(n, "n")
        p = _prio(priority)
        ns = _args.timeout_ns(timeout)
        permit = _ffi.Permit()
        if ns is None:
            st = _lib.shmsched_scheduler_acquire_many(self._h, p, units, _byref(permit))
        else:
            st = _lib.shmsched_scheduler_acquire_many_timeout(
                self._h, p, units, ns, _byref(permit)
            )
        _check(st)
        return Permit(permit, priority, units)

    def try_acquire(self, priority: PriorityLike = "normal") -> Optional[Permit]:
        """A :class:`Permit` if a slot is free now (and nobody waits at this
        priority), else None."""
        return self._try_take(_prio(priority), priority, 1)

    def _try_take(self, p: int, priority: PriorityLike, units: int) -> Optional[Permit]:
        # The arguments are checked.
        permit = _ffi.Permit()
        if units == 1:
            st = _try_acquire(self._h, p, _byref(permit))
        else:
            st = _lib.shmsched_scheduler_try_acquire_many(self._h, p, units, _byref(permit))
        if st == _ffi.WOULD_BLOCK:
            return None
        _check(st)
        return Permit(permit, priority, units)

    def try_acquire_many(self, n: int, priority: PriorityLike = "normal") -> Optional[Permit]:
        """A :class:`Permit` for ``n`` units (1..max) if they are all free
        now (and nobody waits at this priority or above), else None."""
        return self._try_take(_prio(priority), priority, _args.u32(n, "n"))

    def acquire_async(
        self,
        priority: PriorityLike = "normal",
        timeout: TimeoutLike = None,
    ) -> "AsyncAcquire":
        """asyncio: waits for a slot without blocking the event loop and
        without a thread per wait. Await it for a :class:`Permit`, or use it
        as ``async with sched.acquire_async("high"):`` (released on exit).
        Cancelling the waiting task (``task.cancel()``,
        ``asyncio.timeout``, ``asyncio.wait_for``) takes nothing and leaves
        no waiter behind. Bad arguments raise here, at the call."""
        return self.acquire_many_async(1, priority, timeout)

    def acquire_many_async(
        self,
        n: int,
        priority: PriorityLike = "normal",
        timeout: TimeoutLike = None,
    ) -> "AsyncAcquire":
        """asyncio: :meth:`acquire_many` without blocking the event loop
        (see :meth:`acquire_async`)."""
        units = _args.u32(n, "n")
        p = _prio(priority)
        ns = _args.timeout_ns(timeout)
        self._h  # raises if closed
        return _asyncio().AsyncAcquire(self, p, priority, units, ns)

    def acquire_with_callback(
        self,
        callback: Callable[[Optional[Permit], Optional[Error]], None],
        priority: PriorityLike = "normal",
        timeout: TimeoutLike = None,
    ) -> None:
        """Starts an acquire that waits on a thread of the library and calls
        ``callback(permit, None)`` when granted or ``callback(None, error)``
        on failure or timeout, on that thread (for thread-based code; asyncio
        code uses :meth:`acquire_async`, which takes no thread per wait)."""
        if not callable(callback):
            raise _args.type_error("callback", "callable", callback)
        p = _prio(priority)
        ns = _args.timeout_ns(timeout)
        _Callbacks.start_acquire(self, callback, p, priority, ns)

    def run(self, fn: Callable[..., _T], *args: Any, priority: PriorityLike = "normal",
            **kwargs: Any) -> _T:
        """Acquires, runs ``fn(*args, **kwargs)``, releases."""
        with self.acquire(priority):
            return fn(*args, **kwargs)

    def dispose(self) -> None:
        """Disposes this handle (and its children): waiters get
        :class:`Disposed`."""
        _check(_lib.shmsched_scheduler_dispose(self._h))

    @property
    def disposed(self) -> bool:
        """True once disposed."""
        b = ctypes.c_bool(False)
        _check(_lib.shmsched_scheduler_is_disposed(self._h, _byref(b)))
        return b.value

    def reap(self) -> Tuple[int, int]:
        """Gives back now the slots of dead processes: ``(processes, slots)``."""
        procs, slots = ctypes.c_uint32(0), ctypes.c_uint64(0)
        _check(_lib.shmsched_scheduler_reap(self._h, _byref(procs), _byref(slots)))
        return procs.value, slots.value

    @property
    def global_running(self) -> int:
        """Slots held now across every process."""
        n = ctypes.c_uint32(0)
        _check(_lib.shmsched_scheduler_global_running(self._h, _byref(n)))
        return n.value

    @property
    def concurrency(self) -> Optional[int]:
        """This level's max, None when unlimited."""
        n = ctypes.c_uint32(0)
        _check(_lib.shmsched_scheduler_concurrency(self._h, _byref(n)))
        return None if n.value == _ffi.UNLIMITED else n.value

    @property
    def ceiling(self) -> Optional[int]:
        """The effective ceiling: the region's (see :meth:`set_ceiling`) for
        a shared scheduler, else this level's max (None when unlimited)."""
        n = ctypes.c_uint32(0)
        _check(_lib.shmsched_scheduler_ceiling(self._h, _byref(n)))
        return None if n.value == _ffi.UNLIMITED else n.value

    def set_ceiling(self, target: int) -> bool:
        """Moves the ceiling of a shared scheduler to ``target`` (at most the
        region's max) for every process: from now on at most ``target``
        slots are held at once. Lowering it revokes nothing (releases go to
        the ceiling until it is reached); raising it serves waiters at once.
        Returns whether the ceiling is in force now."""
        reached = ctypes.c_bool(False)
        _check(
            _lib.shmsched_scheduler_set_ceiling(
                self._h, _args.u32(target, "ceiling"), _byref(reached)
            )
        )
        return reached.value

    def set_lottery(self, seed: int = 0, enabled: bool = True) -> None:
        """Reseeds the starvation lottery (0 keeps the generator) or turns it
        off (strict priority; for tests)."""
        _check(
            _lib.shmsched_scheduler_set_lottery(
                self._h, _args.u64(seed, "seed"), _args.boolean(enabled, "enabled")
            )
        )

    def stats(self) -> Dict[str, Any]:
        """Gauges and counters as a dict (``shared`` holds the region-wide
        figures)."""
        return json.loads(_ffi.text_out(_lib.shmsched_scheduler_stats_json, self._h))

    def snapshot(self) -> SchedulerSnapshot:
        """The same figures as :meth:`stats`, read through the C struct
        (cheaper: no JSON)."""
        s = _ffi.SchedulerStats()
        s.size = ctypes.sizeof(s)
        _check(_lib.shmsched_scheduler_get_stats(self._h, _byref(s)))
        return SchedulerSnapshot(s)

    def detach(self) -> None:
        """Leaves the region's process table now and closes the handle."""
        ptr, self._ptr = self._h, None  # closed whatever the outcome
        _check(_lib.shmsched_scheduler_detach(ptr))

    def __repr__(self) -> str:
        if self._ptr is None:
            return "<shmsched.Scheduler closed>"
        return f"<shmsched.Scheduler max={self.concurrency}>"


# --------------------------------------------------------------------------
# Limiter


class Grant(Tuple[bool, bool]):
    """How a consume went: ``(immediate, forced)``."""

    __slots__ = ()

    def __new__(cls, immediate: bool, forced: bool) -> "Grant":
        return super().__new__(cls, (immediate, forced))

    @property
    def immediate(self) -> bool:
        """Charged at once, without queueing."""
        return self[0]

    @property
    def forced(self) -> bool:
        """It left the bucket in debt (the anti-starvation force-through, or
        a request above the capacity admitted on a full bucket)."""
        return self[1]


class LimiterSnapshot(_Snapshot):
    """The limiter's gauges and counters read through the C struct (no
    JSON): the same figures as :meth:`Limiter.stats`."""

    __slots__ = ("tokens_per_second", "tokens", "forced", "clock", "consumed", "refunded")

    def __init__(self, s: Any) -> None:
        super().__init__(s)
        d = self._d
        self.tokens_per_second: int = d["tokens_per_second"]
        self.tokens: int = d["tokens"]
        self.forced: int = d["forced"]
        self.clock: int = d["clock"]
        #: Tokens charged per priority (index = priority + 3) through this
        #: handle at this level (``try_consume`` counts at normal). The
        #: region's, by every process, are ``shared["consumed"]``.
        self.consumed: List[int] = d["consumed"]
        #: Tokens given back per priority through this handle at this level
        #: (a consume that gave up after this level charged it, a waitset
        #: completion cancelled before it was taken); the region's are
        #: ``shared["refunded"]``.
        self.refunded: List[int] = d["refunded"]

    def __repr__(self) -> str:
        return (
            f"<LimiterSnapshot rate={self.tokens_per_second} tokens={self.tokens} "
            f"pending={self.pending}>"
        )


class Limiter(_Handle):
    """A byte-rate budget: a token bucket of ``tokens_per_second`` shared by
    every process bound to the region."""

    _close = "shmsched_limiter_close"

    @classmethod
    def shared(
        cls, region: Region, tokens_per_second: int, capacity: Optional[int] = None
    ) -> "Limiter":
        """Binds the limiter in ``region`` (a new bucket starts full).
        ``capacity`` is the bucket's size (the largest burst), one second
        of rate by default."""
        r = _handle_of(region, Region, "region")
        rate = _args.tokens_per_second(tokens_per_second)
        if capacity is None:
            return cls(_out_handle(_lib.shmsched_limiter_shared, r, rate))
        cap = _args.capacity(capacity)
        return cls(_out_handle(_lib.shmsched_limiter_shared_with_capacity, r, rate, cap))

    @classmethod
    def attach(cls, region: Region) -> "Limiter":
        """Joins the limiter in ``region``, whatever its rate."""
        return cls(
            _out_handle(_lib.shmsched_limiter_attach, _handle_of(region, Region, "region"))
        )

    def child(self, tokens_per_second: int, capacity: Optional[int] = None) -> "Limiter":
        """A child limiter: this process's own bucket on top of this one."""
        rate = _args.tokens_per_second(tokens_per_second)
        if capacity is None:
            return Limiter(_out_handle(_lib.shmsched_limiter_child, self._h, rate))
        cap = _args.capacity(capacity)
        return Limiter(
            _out_handle(_lib.shmsched_limiter_child_with_capacity, self._h, rate, cap)
        )

    def consume(
        self, n: int, priority: PriorityLike = "normal", timeout: TimeoutLike = None
    ) -> Grant:
        """Blocks until ``n`` tokens (0..2147483647) are charged (at most
        ``timeout`` seconds, then :class:`Timeout`); returns a
        :class:`Grant`."""
        n = _args.tokens(n)
        p = _prio(priority)
        ns = _args.timeout_ns(timeout)
        g = _ffi.Grant()
        if ns is None:
            st = _lib.shmsched_limiter_consume(self._h, n, p, _byref(g))
        else:
            st = _lib.shmsched_limiter_consume_timeout(self._h, n, p, ns, _byref(g))
        _check(st)
        return Grant(g.immediate, g.forced)

    def consume_async(
        self, n: int, priority: PriorityLike = "normal", timeout: TimeoutLike = None
    ) -> Awaitable[Grant]:
        """asyncio: :meth:`consume` without blocking the event loop and
        without a thread per wait (``await lim.consume_async(n)``).
        Cancelling the waiting task charges nothing and leaves no waiter.
        Bad arguments raise here, at the call."""
        n = _args.tokens(n)
        p = _prio(priority)
        ns = _args.timeout_ns(timeout)
        self._h  # raises if closed
        return _asyncio().consume(self, n, p, ns)

    def consume_with_callback(
        self,
        callback: Callable[[Optional[Grant], Optional[Error]], None],
        n: int,
        priority: PriorityLike = "normal",
        timeout: TimeoutLike = None,
    ) -> None:
        """Starts a consume that waits on a thread of the library and calls
        ``callback(grant, None)`` or ``callback(None, error)`` on that
        thread (asyncio code uses :meth:`consume_async`)."""
        if not callable(callback):
            raise _args.type_error("callback", "callable", callback)
        n = _args.tokens(n)
        p = _prio(priority)
        ns = _args.timeout_ns(timeout)
        _Callbacks.start_consume(self, callback, n, p, ns)

    def try_consume(self, n: int) -> bool:
        """Consumes ``n`` only if available now (and nobody waits); True if
        it did. Counted at normal in the stats (see :meth:`try_consume_at`)."""
        st = _lib.shmsched_limiter_try_consume(self._h, _args.tokens(n))
        if st == _ffi.WOULD_BLOCK:
            return False
        _check(st)
        return True

    def try_consume_at(self, n: int, priority: PriorityLike) -> bool:
        """:meth:`try_consume`, counted at ``priority`` in the stats'
        ``consumed`` (the rule is the same: it refuses while anything waits
        at any priority, so it never overtakes a waiter)."""
        return self._try_at(_args.tokens(n), _prio(priority))

    def _try_at(self, n: int, p: int) -> bool:
        # ``n`` and ``p`` already checked (the async consume's first try).
        st = _lib.shmsched_limiter_try_consume_at(self._h, n, p)
        if st == _ffi.WOULD_BLOCK:
            return False
        _check(st)
        return True

    @property
    def tokens(self) -> int:
        """The balance now (negative while in debt)."""
        v = ctypes.c_int64(0)
        _check(_lib.shmsched_limiter_tokens(self._h, _byref(v)))
        return v.value

    @property
    def tokens_per_second(self) -> int:
        """The rate in force."""
        v = ctypes.c_uint32(0)
        _check(_lib.shmsched_limiter_tokens_per_second(self._h, _byref(v)))
        return v.value

    @property
    def capacity(self) -> int:
        """The capacity (burst) in force, in tokens."""
        v = ctypes.c_uint32(0)
        _check(_lib.shmsched_limiter_capacity(self._h, _byref(v)))
        return v.value

    def set_rate(self, tokens_per_second: int) -> None:
        """Changes the rate from now on (for a shared limiter, for every
        process at once); tokens already refilled are kept."""
        _check(
            _lib.shmsched_limiter_set_rate(self._h, _args.tokens_per_second(tokens_per_second))
        )

    def set_capacity(self, capacity: int) -> None:
        """Changes the capacity (burst) from now on (for a shared limiter,
        for every process)."""
        _check(_lib.shmsched_limiter_set_capacity(self._h, _args.capacity(capacity)))

    def reap(self) -> int:
        """Frees the entries of dead processes; returns how many."""
        v = ctypes.c_uint32(0)
        _check(_lib.shmsched_limiter_reap(self._h, _byref(v)))
        return v.value

    def stats(self) -> Dict[str, Any]:
        """Gauges and counters as a dict."""
        return json.loads(_ffi.text_out(_lib.shmsched_limiter_stats_json, self._h))

    def snapshot(self) -> LimiterSnapshot:
        """The same figures as :meth:`stats`, read through the C struct."""
        s = _ffi.LimiterStats()
        s.size = ctypes.sizeof(s)
        _check(_lib.shmsched_limiter_get_stats(self._h, _byref(s)))
        return LimiterSnapshot(s)

    def detach(self) -> None:
        """Leaves the region's process table now and closes the handle."""
        ptr, self._ptr = self._h, None  # closed whatever the outcome
        _check(_lib.shmsched_limiter_detach(ptr))

    def wrap(self, raw: BinaryIO, priority: PriorityLike = "normal") -> "ThrottledFile":
        """A :class:`ThrottledFile` over the binary file object ``raw``."""
        return ThrottledFile(raw, self, priority)

    def open(
        self,
        file: Union[str, bytes, "os.PathLike[str]", int],
        mode: str = "rb",
        priority: PriorityLike = "normal",
        buffering: int = -1,
    ) -> BinaryIO:
        """Opens ``file`` (binary modes) with every byte read or written
        charged to this limiter. Returns a buffered binary file (or the raw
        :class:`ThrottledFile` with ``buffering=0``)."""
        if not isinstance(mode, str):
            raise _args.type_error("mode", "a str", mode)
        if "b" not in mode:
            raise InvalidArgument(2, f"mode {mode!r}: throttled files are binary (add 'b')")
        buffering = _args.integer(buffering, "buffering", -1, 2**31 - 1)
        p = _args.priority(priority)
        raw = ThrottledFile(io.open(file, mode, buffering=0), self, p)
        if buffering == 0:
            return cast(BinaryIO, raw)
        size = io.DEFAULT_BUFFER_SIZE if buffering in (-1, 1) else buffering
        if raw.readable() and raw.writable():
            return io.BufferedRandom(raw, size)
        if raw.writable():
            return io.BufferedWriter(raw, size)
        return io.BufferedReader(raw, size)

    def __repr__(self) -> str:
        if self._ptr is None:
            return "<shmsched.Limiter closed>"
        return f"<shmsched.Limiter rate={self.tokens_per_second}>"


class ThrottledFile(io.RawIOBase):
    """A raw binary file whose reads and writes are charged to a
    :class:`Limiter`, byte for byte: a read is charged for what it returned
    (after reading, so the end of a file costs nothing), a write before it
    is written. Chunks above the limiter's largest consume are split."""

    _MAX = _args.MAX_COUNT

    def __init__(self, raw: Any, limiter: Any, priority: PriorityLike = "normal") -> None:
        super().__init__()
        self.raw = raw
        self.limiter = limiter
        self.priority = _args.priority(priority)

    def _charge(self, n: int) -> None:
        while n > 0:
            k = min(n, self._MAX)
            self.limiter.consume(k, self.priority)
            n -= k

    def readable(self) -> bool:
        return self.raw.readable()

    def writable(self) -> bool:
        return self.raw.writable()

    def seekable(self) -> bool:
        return self.raw.seekable()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def fileno(self) -> int:
        return self.raw.fileno()

    def readinto(self, b: Any) -> Optional[int]:
        n = self.raw.readinto(b)
        if n:
            self._charge(n)
        return n

    def write(self, b: Any) -> int:
        n = len(memoryview(b).cast("B"))
        self._charge(n)
        return self.raw.write(b)

    def close(self) -> None:
        if not self.closed:
            try:
                self.raw.close()
            finally:
                super().close()


# --------------------------------------------------------------------------
# Thread-based callbacks (shmsched_*_async)


class _Callbacks:
    """Keeps each ctypes callback of a started ``*_async`` wait alive until
    the library has called it (exactly once)."""

    _lock = threading.Lock()
    _live: Dict[int, Tuple[Any, Any]] = {}
    _next = 0

    @classmethod
    def _keep(cls, obj: Any, owner: Any) -> int:
        with cls._lock:
            cls._next += 1
            key = cls._next
            cls._live[key] = (obj, owner)
            return key

    @classmethod
    def _drop(cls, key: int) -> None:
        with cls._lock:
            cls._live.pop(key, None)

    @classmethod
    def _start(
        cls,
        owner: Any,
        ctype: Any,
        convert: Callable[[Any], Any],
        callback: Callable[..., None],
        call: Callable[[Any], int],
    ) -> None:
        """Starts a wait with ``call(c_callback)``; its outcome goes to
        ``callback(convert(value), None)`` or ``callback(None, error)``."""
        key = 0

        def done(_ctx: Any, status: int, value: Any, message: Optional[bytes]) -> None:
            try:
                if status == 0:
                    callback(convert(value), None)
                else:
                    text = (message or b"").decode("utf-8", "replace")
                    callback(None, _ffi.error(status, text))
            finally:
                cls._drop(key)

        cb = ctype(done)
        key = cls._keep(cb, owner)
        st = call(cb)
        if st:
            cls._drop(key)
            _check(st)

    @classmethod
    def start_acquire(cls, sched: Scheduler, callback: Callable[..., None], p: int,
                      priority: PriorityLike, ns: Optional[int]) -> None:
        cls._start(
            sched,
            _ffi.ACQUIRE_CALLBACK,
            lambda t: Permit(_ffi.Permit(t.process, t.serial), priority),
            callback,
            lambda cb: _lib.shmsched_scheduler_acquire_async(
                sched._h, p, _args.FOREVER_NS if ns is None else ns, cb, None
            ),
        )

    @classmethod
    def start_consume(cls, lim: Limiter, callback: Callable[..., None], n: int, p: int,
                      ns: Optional[int]) -> None:
        cls._start(
            lim,
            _ffi.CONSUME_CALLBACK,
            lambda g: Grant(g.immediate, g.forced),
            callback,
            lambda cb: _lib.shmsched_limiter_consume_async(
                lim._h, n, p, _args.FOREVER_NS if ns is None else ns, cb, None
            ),
        )


# --------------------------------------------------------------------------
# Waitsets


class Completion:
    """A finished wait of a :class:`Waitset`: ``tag`` and ``id`` as given by
    the start call, and either ``permit`` (an acquire), ``grant`` (a
    consume) or ``error`` (why it ended without one: :class:`Timeout`,
    :class:`Disposed`, …; ``cancelled`` is True for a cancelled wait)."""

    __slots__ = ("tag", "id", "permit", "grant", "error", "cancelled")

    def __init__(
        self,
        tag: int,
        id: int,
        permit: Optional[Permit],
        grant: Optional[Grant],
        error: Optional[Error],
    ) -> None:
        self.tag = tag
        self.id = id
        self.permit = permit
        self.grant = grant
        self.error = error
        self.cancelled = error is not None and error.status == _ffi.CANCELLED

    def __repr__(self) -> str:
        what = self.permit or self.grant or self.error
        return f"<Completion tag={self.tag} {what!r}>"


class Waitset(_Handle):
    """Many pending waits without a thread each: acquires and consumes
    started here are real waiters in the region (served in the region's
    order across processes), and their completions are collected with
    :meth:`take`. :meth:`fileno` is readable while completions are ready
    (for ``selectors`` or an event loop: the asyncio API is built on it);
    :meth:`wait` blocks a thread until then (one thread serving every
    pending wait). Closing it cancels every pending wait and gives back
    what untaken completions hold. Belongs to the process that made it.

    A permit or grant in a completion is the caller's once taken. The
    scheduler and limiter of a pending wait are kept open by the waitset.
    """

    _close = "shmsched_waitset_close"

    def __init__(self) -> None:
        super().__init__(_out_handle(_lib.shmsched_waitset_create))
        self._buf = (_ffi.Completion * 256)()
        # Handles of the pending waits (kept open until their completion).
        self._owners: Dict[int, Tuple[Any, PriorityLike, int]] = {}

    def fileno(self) -> int:
        """The descriptor, readable while completions are ready (it stays
        the waitset's: never close it)."""
        fd = ctypes.c_int32(-1)
        _check(_lib.shmsched_waitset_fd(self._h, _byref(fd)))
        return fd.value

    def start_acquire(
        self,
        sched: Scheduler,
        priority: PriorityLike = "normal",
        n: int = 1,
        timeout: TimeoutLike = None,
        tag: int = 0,
    ) -> int:
        """Starts an acquire of ``n`` units; returns the wait's id."""
        _handle_of(sched, Scheduler, "sched")
        return self._start_acquire(
            sched,
            _prio(priority),
            priority,
            _args.u32(n, "n"),
            _args.timeout_ns(timeout),
            _args.u64(tag, "tag"),
        )

    def _start_acquire(
        self,
        sched: Scheduler,
        p: int,
        priority: PriorityLike,
        units: int,
        ns: Optional[int],
        tag: int,
    ) -> int:
        # The arguments are checked.
        wait_id = ctypes.c_uint64(0)
        _check(
            _lib.shmsched_scheduler_acquire_start(
                sched._h,
                p,
                units,
                _args.FOREVER_NS if ns is None else ns,
                self._h,
                tag,
                _byref(wait_id),
            )
        )
        self._owners[wait_id.value] = (sched, priority, units)
        return wait_id.value

    def start_consume(
        self,
        lim: Limiter,
        n: int,
        priority: PriorityLike = "normal",
        timeout: TimeoutLike = None,
        tag: int = 0,
    ) -> int:
        """Starts a consume of ``n`` tokens; returns the wait's id."""
        _handle_of(lim, Limiter, "lim")
        return self._start_consume(
            lim,
            _args.tokens(n),
            _prio(priority),
            _args.timeout_ns(timeout),
            _args.u64(tag, "tag"),
        )

    def _start_consume(
        self, lim: Limiter, n: int, p: int, ns: Optional[int], tag: int
    ) -> int:
        # The arguments are checked.
        wait_id = ctypes.c_uint64(0)
        _check(
            _lib.shmsched_limiter_consume_start(
                lim._h,
                n,
                p,
                _args.FOREVER_NS if ns is None else ns,
                self._h,
                tag,
                _byref(wait_id),
            )
        )
        self._owners[wait_id.value] = (lim, "normal", 0)
        return wait_id.value

    def cancel(self, wait_id: int) -> None:
        """Cancels a pending wait: it completes as cancelled, holding
        nothing. :class:`AlreadyReleased` if it was already taken."""
        _check(_lib.shmsched_waitset_cancel(self._h, _args.u64(wait_id, "wait id")))

    def take(self, max: int = 256) -> List[Completion]:
        """The completions ready now (at most ``max``), without blocking."""
        cap = _args.integer(max, "max", 1, len(self._buf))
        n = ctypes.c_size_t(0)
        _check(_lib.shmsched_waitset_take(self._h, self._buf, cap, _byref(n)))
        out = []
        for c in self._buf[: n.value]:
            owner = self._owners.pop(c.id, None)
            priority, units = (owner[1], owner[2]) if owner else ("normal", 1)
            if c.status != _ffi.OK:
                text = c.message.decode("utf-8", "replace")
                out.append(Completion(c.tag, c.id, None, None, _ffi.error(c.status, text)))
            elif c.kind == _ffi.WAIT_ACQUIRE:
                kept = _ffi.Permit(c.permit.process, c.permit.serial)
                out.append(Completion(c.tag, c.id, Permit(kept, priority, units), None, None))
            else:
                grant = Grant(c.grant.immediate, c.grant.forced)
                out.append(Completion(c.tag, c.id, None, grant, None))
        return out

    def wait(self, timeout: TimeoutLike = None) -> int:
        """Blocks (without the GIL) until something is ready to take, the
        timeout passes (0 then) or :meth:`interrupt` is called; returns how
        many waits have something to collect (an upper bound). Use either
        this or :meth:`fileno` on one waitset, not both."""
        ns = _args.timeout_ns(timeout)
        ready = ctypes.c_size_t(0)
        st = _lib.shmsched_waitset_wait(
            self._h, _args.FOREVER_NS if ns is None else ns, _byref(ready)
        )
        if st == 14:  # TIMEOUT: nothing came
            return 0
        _check(st)
        return ready.value

    def interrupt(self) -> None:
        """Makes a :meth:`wait` in another thread return now."""
        _check(_lib.shmsched_waitset_interrupt(self._h))

    @property
    def pending(self) -> int:
        """Waits started and not yet taken."""
        n = ctypes.c_size_t(0)
        _check(_lib.shmsched_waitset_pending(self._h, _byref(n)))
        return n.value

    def close(self) -> None:
        """Cancels every pending wait (nothing stays held) and closes the
        waitset (idempotent)."""
        super().close()
        self._owners = {}


# --------------------------------------------------------------------------
# FairShare


class Lease(Tuple[str, int]):
    """A granted fair-share lease: ``(id, deadline_ms)``."""

    __slots__ = ()
    granted = True

    def __new__(cls, id: str, deadline_ms: int) -> "Lease":
        return super().__new__(cls, (id, deadline_ms))

    @property
    def id(self) -> str:
        """The lease id to release it by."""
        return self[0]

    @property
    def deadline_ms(self) -> int:
        """``now + hold_ms``: the declared release deadline."""
        return self[1]

    def __bool__(self) -> bool:
        return True


class Refusal(Tuple[str, Optional[int], str]):
    """A refused acquire (an answer, not an error): ``(reason,
    retry_after_ms, explanation)``; ``retry_after_ms`` is None when no time
    can be promised. False in a boolean context."""

    __slots__ = ()
    granted = False

    def __new__(cls, reason: str, retry_after_ms: Optional[int], explanation: str) -> "Refusal":
        return super().__new__(cls, (reason, retry_after_ms, explanation))

    @property
    def reason(self) -> str:
        """The seed's name for the reason (``guarantee_on_loan``, …)."""
        return self[0]

    @property
    def retry_after_ms(self) -> Optional[int]:
        """When retrying unchanged can succeed, or None."""
        return self[1]

    @property
    def explanation(self) -> str:
        """A full sentence with the numbers."""
        return self[2]

    def __bool__(self) -> bool:
        return False


class FairShare(_Handle):
    """A fair-share ceiling split between weighted tenants, shared through a
    region. Every call takes ``now_ms`` (explicit time, so a trace replays),
    or reads the shared clock when it is None."""

    _close = "shmsched_fair_close"

    @classmethod
    def shared(
        cls, region: Region, config: Union[Mapping[str, Any], str], lease_capacity: int = 0
    ) -> "FairShare":
        """Binds the ledger in ``region`` with ``config`` (a dict or JSON
        text: ceiling, fairness_unit, tenants, reclaim_horizon_ms,
        idle_after_ms, started_at_ms); ``lease_capacity`` 0 is the default
        (4096 leases)."""
        r = _handle_of(region, Region, "region")
        if isinstance(config, str):
            text = config
        elif isinstance(config, Mapping):
            try:
                text = json.dumps(dict(config), allow_nan=True)
            except (TypeError, ValueError) as e:
                raise InvalidArgument(2, f"config is not JSON-serialisable: {e}") from None
        else:
            raise _args.type_error("config", "a dict or a JSON str", config)
        return cls(
            _out_handle(
                _lib.shmsched_fair_shared,
                r,
                _args.text(text, "config"),
                _args.u32(lease_capacity, "lease_capacity"),
            )
        )

    @classmethod
    def attach(cls, region: Region) -> "FairShare":
        """Joins the ledger stored in ``region``."""
        return cls(_out_handle(_lib.shmsched_fair_attach, _handle_of(region, Region, "region")))

    @staticmethod
    def monotonic_ms() -> int:
        """The clock the ``now_ms=None`` calls read (CLOCK_MONOTONIC ms)."""
        return _lib.shmsched_monotonic_ms()

    def acquire(
        self, tenant: str, cost: float, hold_ms: int, now_ms: Optional[int] = None
    ) -> Union[Lease, Refusal]:
        """A :class:`Lease`, or a :class:`Refusal` (falsy)."""
        t = _args.text(tenant, "tenant")
        c = _args.real(cost, "cost")
        hold = _args.u64(hold_ms, "hold_ms")
        o = _ffi.FairOutcome()
        why = ctypes.create_string_buffer(16384)
        if now_ms is None:
            st = _lib.shmsched_fair_acquire_now(self._h, t, c, hold, _byref(o), why, len(why))
        else:
            now = _args.u64(now_ms, "now_ms")
            st = _lib.shmsched_fair_acquire(self._h, t, c, hold, now, _byref(o), why, len(why))
        _check(st)
        if o.granted:
            return Lease(o.lease_id.decode("utf-8"), o.deadline_ms)
        reason = _lib.shmsched_refusal_reason_name(o.reason).decode()
        retry = None if o.retry_after_ms < 0 else o.retry_after_ms
        return Refusal(reason, retry, why.value.decode("utf-8", "replace"))

    def release(self, lease: Union[Lease, str], now_ms: Optional[int] = None) -> None:
        """Releases a lease (a :class:`Lease` or its id)."""
        lease_id = _args.text(lease.id if isinstance(lease, Lease) else lease, "lease")
        if now_ms is None:
            _check(_lib.shmsched_fair_release_now(self._h, lease_id))
        else:
            _check(_lib.shmsched_fair_release(self._h, lease_id, _args.u64(now_ms, "now_ms")))

    def stats(self, now_ms: Optional[int] = None) -> Dict[str, Any]:
        """Per-tenant stats as a dict."""
        if now_ms is None:
            return json.loads(_ffi.text_out(_lib.shmsched_fair_stats_json_now, self._h))
        return json.loads(
            _ffi.text_out(_lib.shmsched_fair_stats_json, self._h, _args.u64(now_ms, "now_ms"))
        )

    def reap(self) -> Tuple[int, int]:
        """Releases the leases of dead processes: ``(processes, leases)``."""
        procs, leases = ctypes.c_uint32(0), ctypes.c_uint64(0)
        _check(_lib.shmsched_fair_reap(self._h, _byref(procs), _byref(leases)))
        return procs.value, leases.value


def _debug_panic() -> None:
    """For tests: the library panics; the boundary turns it into an error."""
    _check(_lib.shmsched_debug_panic())


def __getattr__(name: str) -> Any:
    # The asyncio layer is imported on first use (it imports asyncio).
    if name == "AsyncAcquire":
        from ._aio import AsyncAcquire

        return AsyncAcquire
    raise AttributeError(f"module 'shmsched' has no attribute {name!r}")
