"""shmsched for Python: one concurrency budget, one byte-rate budget and one
fair-share ceiling shared by many processes (in any language) through a
memory-mapped region.

A thin ``ctypes`` binding of ``libshmsched.so`` (the C ABI built from
``ffi/``), with no build step::

    import shmsched

    region = shmsched.Region.open_or_create("pool")      # /dev/shm/shmsched.pool
    sched = shmsched.Scheduler.shared(region, 8, low=2)   # 8 at once, low at most 2
    with sched.acquire("high"):                           # blocks; released on exit
        ...

    lim = shmsched.Limiter.shared(shmsched.Region.open_or_create("bytes"), 16_000_000)
    with lim.open("/var/log/syslog", "rb", priority="low") as f:
        data = f.read()                                   # at most 16 MB/s across processes

Errors raise :class:`Error` subclasses carrying the library's status code
and message (the same text a Rust caller sees). Blocking calls release the
GIL while they wait.

The library is found through the ``SHMSCHED_LIB`` environment variable (a
path to ``libshmsched.so``), else ``target/release`` then ``target/debug``
of the source tree this package sits in, else the system's library path.

Fork: a :class:`Region` and a :class:`FairShare` work in a forked child
(``multiprocessing`` with the ``fork`` start method); a :class:`Scheduler`,
a :class:`Limiter` and a :class:`Permit` belong to the process that made
them: make new ones from the region in the child.
"""

import ctypes
import ctypes.util
import io
import json
import os
from pathlib import Path

__all__ = [
    "ABI_VERSION",
    "Error",
    "FairShare",
    "Grant",
    "Lease",
    "Limiter",
    "Permit",
    "PRIORITIES",
    "Refusal",
    "Region",
    "Scheduler",
    "ThrottledFile",
    "priority_value",
]

#: The C ABI version this binding was written for (``SHMSCHED_ABI_VERSION``).
ABI_VERSION = 1

#: Priority names by value, lowest first.
PRIORITIES = {
    "lowest": -3,
    "lower": -2,
    "low": -1,
    "normal": 0,
    "high": 1,
    "higher": 2,
    "highest": 3,
}

UNLIMITED = 0xFFFFFFFF
CAP_UNSET = 0xFFFFFFFF
LEASE_ID_MAX = 64


# --------------------------------------------------------------------------
# Errors


class Error(Exception):
    """A failed call: ``status`` is the C status code, ``str(e)`` the
    library's message."""

    status = None

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


class InvalidArgument(Error, ValueError):
    """An argument was out of range or malformed."""


class InvalidPriority(InvalidArgument):
    """A priority outside lowest..highest (-3..3)."""


class NotFound(Error):
    """The region file does not exist."""


class AlreadyExists(Error):
    """The region file already exists."""


class OSFailure(Error):
    """An operating-system call failed."""


class BadRegion(Error):
    """The region is not a valid shmsched region."""


class VersionMismatch(BadRegion):
    """The region has another layout version than the library."""


class WrongKind(Error):
    """The region holds another kind of object."""


class Mismatch(Error):
    """The region holds this kind of object with other parameters."""


class ProcessTableFull(Error):
    """The region's process table is full."""


class ZeroConcurrency(Error):
    """The scheduler's concurrency is 0."""


class Disposed(Error):
    """The scheduler is disposed."""


class Timeout(Error, TimeoutError):
    """A timed wait expired."""


class WouldBlock(Error):
    """A ``try_`` call found no capacity (the binding returns None/False
    instead of raising this)."""


class Forked(Error):
    """A handle was used in a forked child of the process that made it."""


class AlreadyReleased(Error):
    """The permit or lease was already released, or never issued."""


class ForeignPermit(Error):
    """The permit belongs to another process."""


class BufferTooSmall(Error):
    """Internal: a buffer was too small (the binding retries)."""


class UnknownTenant(Error, KeyError):
    """A fair-share call named a tenant that is not configured."""

    def __str__(self):
        return self.message


class UnknownLease(Error, KeyError):
    """A fair-share release named a lease that was never issued."""

    def __str__(self):
        return self.message


class TimeWentBackwards(Error):
    """A fair-share ``now`` is earlier than the last accepted one."""


class CapacityExhausted(Error):
    """A fixed-capacity table is full."""


class InternalError(Error):
    """A caught panic inside the library, or an unknown error."""


_ERRORS = {
    1: InvalidArgument,  # NULL argument: a binding bug, reported as such
    2: InvalidArgument,
    3: InvalidPriority,
    4: NotFound,
    5: AlreadyExists,
    6: OSFailure,
    7: BadRegion,
    8: VersionMismatch,
    9: WrongKind,
    10: Mismatch,
    11: ProcessTableFull,
    12: ZeroConcurrency,
    13: Disposed,
    14: Timeout,
    15: WouldBlock,
    16: Forked,
    17: AlreadyReleased,
    18: ForeignPermit,
    19: BufferTooSmall,
    20: UnknownTenant,
    21: UnknownLease,
    22: TimeWentBackwards,
    23: CapacityExhausted,
    24: InternalError,
}

# --------------------------------------------------------------------------
# The library


def _find_library():
    env = os.environ.get("SHMSCHED_LIB")
    if env:
        return env
    root = Path(__file__).resolve().parent.parent.parent
    for profile in ("release", "debug"):
        p = root / "target" / profile / "libshmsched.so"
        if p.exists():
            return str(p)
    found = ctypes.util.find_library("shmsched")
    if found:
        return found
    raise ImportError(
        "libshmsched.so not found: build it with `cargo build --release -p shmsched-ffi` "
        "or set SHMSCHED_LIB to its path"
    )


class _Permit(ctypes.Structure):
    _fields_ = [("process", ctypes.c_uint64), ("serial", ctypes.c_uint64)]


class _Concurrency(ctypes.Structure):
    _fields_ = [("max", ctypes.c_uint32), ("caps", ctypes.c_uint32 * 7)]


class _Grant(ctypes.Structure):
    _fields_ = [("immediate", ctypes.c_bool), ("forced", ctypes.c_bool)]


class _RegionInfo(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),
        ("layout_version", ctypes.c_uint32),
        ("process_slots", ctypes.c_uint32),
        ("total_size", ctypes.c_uint64),
        ("created_at_unix_ms", ctypes.c_uint64),
        ("created_pid", ctypes.c_int32),
        ("reserved", ctypes.c_uint32),
    ]


class _FairOutcome(ctypes.Structure):
    _fields_ = [
        ("granted", ctypes.c_bool),
        ("reason", ctypes.c_uint32),
        ("retry_after_ms", ctypes.c_int64),
        ("deadline_ms", ctypes.c_uint64),
        ("lease_id", ctypes.c_char * LEASE_ID_MAX),
    ]


_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_S = ctypes.c_uint32  # shmsched_status
_STR = ctypes.c_char_p
_U32P = ctypes.POINTER(ctypes.c_uint32)
_U64P = ctypes.POINTER(ctypes.c_uint64)
_SIZEP = ctypes.POINTER(ctypes.c_size_t)

_SIGNATURES = {
    "shmsched_abi_version": (ctypes.c_uint32, []),
    "shmsched_layout_version": (ctypes.c_uint32, []),
    "shmsched_monotonic_ms": (ctypes.c_uint64, []),
    "shmsched_strerror": (ctypes.c_char_p, [ctypes.c_uint32]),
    "shmsched_last_error_message": (ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t]),
    "shmsched_debug_panic": (_S, []),
    "shmsched_region_create": (_S, [_STR, ctypes.c_uint32, ctypes.c_uint32, _PP]),
    "shmsched_region_open": (_S, [_STR, _PP]),
    "shmsched_region_open_or_create": (_S, [_STR, ctypes.c_uint32, ctypes.c_uint32, _PP]),
    "shmsched_region_anonymous": (_S, [ctypes.c_uint32, _PP]),
    "shmsched_region_open_fd": (_S, [ctypes.c_int32, _PP]),
    "shmsched_region_dup_fd": (_S, [_P, ctypes.POINTER(ctypes.c_int32)]),
    "shmsched_region_remove": (_S, [_STR]),
    "shmsched_region_get_info": (_S, [_P, ctypes.POINTER(_RegionInfo)]),
    "shmsched_region_close": (None, [_P]),
    "shmsched_concurrency_max": (_Concurrency, [ctypes.c_uint32]),
    "shmsched_scheduler_shared_with": (_S, [_P, ctypes.POINTER(_Concurrency), _PP]),
    "shmsched_scheduler_attach": (_S, [_P, _PP]),
    "shmsched_scheduler_child_with": (_S, [_P, ctypes.POINTER(_Concurrency), _PP]),
    "shmsched_scheduler_acquire": (_S, [_P, ctypes.c_int32, ctypes.POINTER(_Permit)]),
    "shmsched_scheduler_acquire_timeout": (
        _S,
        [_P, ctypes.c_int32, ctypes.c_uint64, ctypes.POINTER(_Permit)],
    ),
    "shmsched_scheduler_try_acquire": (_S, [_P, ctypes.c_int32, ctypes.POINTER(_Permit)]),
    "shmsched_permit_release": (_S, [_Permit]),
    "shmsched_scheduler_dispose": (_S, [_P]),
    "shmsched_scheduler_is_disposed": (_S, [_P, ctypes.POINTER(ctypes.c_bool)]),
    "shmsched_scheduler_reap": (_S, [_P, _U32P, _U64P]),
    "shmsched_scheduler_global_running": (_S, [_P, _U32P]),
    "shmsched_scheduler_concurrency": (_S, [_P, _U32P]),
    "shmsched_scheduler_set_lottery": (_S, [_P, ctypes.c_uint64, ctypes.c_bool]),
    "shmsched_scheduler_stats_json": (_S, [_P, ctypes.c_char_p, ctypes.c_size_t, _SIZEP]),
    "shmsched_scheduler_detach": (_S, [_P]),
    "shmsched_scheduler_close": (None, [_P]),
    "shmsched_limiter_shared": (_S, [_P, ctypes.c_uint64, _PP]),
    "shmsched_limiter_attach": (_S, [_P, _PP]),
    "shmsched_limiter_child": (_S, [_P, ctypes.c_uint64, _PP]),
    "shmsched_limiter_consume": (
        _S,
        [_P, ctypes.c_uint64, ctypes.c_int32, ctypes.POINTER(_Grant)],
    ),
    "shmsched_limiter_consume_timeout": (
        _S,
        [_P, ctypes.c_uint64, ctypes.c_int32, ctypes.c_uint64, ctypes.POINTER(_Grant)],
    ),
    "shmsched_limiter_try_consume": (_S, [_P, ctypes.c_uint64]),
    "shmsched_limiter_tokens": (_S, [_P, ctypes.POINTER(ctypes.c_int64)]),
    "shmsched_limiter_tokens_per_second": (_S, [_P, _U32P]),
    "shmsched_limiter_reap": (_S, [_P, _U32P]),
    "shmsched_limiter_stats_json": (_S, [_P, ctypes.c_char_p, ctypes.c_size_t, _SIZEP]),
    "shmsched_limiter_detach": (_S, [_P]),
    "shmsched_limiter_close": (None, [_P]),
    "shmsched_fair_shared": (_S, [_P, _STR, ctypes.c_uint32, _PP]),
    "shmsched_fair_attach": (_S, [_P, _PP]),
    "shmsched_fair_acquire": (
        _S,
        [
            _P,
            _STR,
            ctypes.c_double,
            ctypes.c_uint64,
            ctypes.c_uint64,
            ctypes.POINTER(_FairOutcome),
            ctypes.c_char_p,
            ctypes.c_size_t,
        ],
    ),
    "shmsched_fair_acquire_now": (
        _S,
        [
            _P,
            _STR,
            ctypes.c_double,
            ctypes.c_uint64,
            ctypes.POINTER(_FairOutcome),
            ctypes.c_char_p,
            ctypes.c_size_t,
        ],
    ),
    "shmsched_fair_release": (_S, [_P, _STR, ctypes.c_uint64]),
    "shmsched_fair_release_now": (_S, [_P, _STR]),
    "shmsched_fair_stats_json": (
        _S,
        [_P, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t, _SIZEP],
    ),
    "shmsched_fair_stats_json_now": (_S, [_P, ctypes.c_char_p, ctypes.c_size_t, _SIZEP]),
    "shmsched_fair_reap": (_S, [_P, _U32P, _U64P]),
    "shmsched_fair_close": (None, [_P]),
    "shmsched_refusal_reason_name": (ctypes.c_char_p, [ctypes.c_uint32]),
}


def _load():
    path = _find_library()
    lib = ctypes.CDLL(path)
    for name, (res, args) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    got = lib.shmsched_abi_version()
    if got != ABI_VERSION:
        raise ImportError(
            f"{path} has C ABI version {got}, and this binding speaks version {ABI_VERSION}"
        )
    return lib, path


_lib, LIBRARY_PATH = _load()
# The hot calls, bound once.
_acquire = _lib.shmsched_scheduler_acquire
_release = _lib.shmsched_permit_release
_byref = ctypes.byref


def _raise(status):
    n = _lib.shmsched_last_error_message(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    _lib.shmsched_last_error_message(buf, n + 1)
    message = buf.value.decode("utf-8", "replace")
    raise _ERRORS.get(status, Error)(status, message)


def _check(status):
    if status != 0:
        _raise(status)


def _text(fn, *args):
    """Calls a `(…, buf, len, out_len)` function, growing the buffer as asked."""
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        need = ctypes.c_size_t(0)
        st = fn(*args, buf, size, ctypes.byref(need))
        if st == 19:  # BUFFER_TOO_SMALL: the length needed is in `need`
            size = need.value + 1
            continue
        _check(st)
        return buf.value.decode("utf-8")


def priority_value(priority):
    """A priority as its integer value: a name (case-insensitive), or an
    integer -3..3. Out-of-range integers are left for the library to refuse
    (with its message)."""
    if isinstance(priority, bool):
        raise TypeError("a priority is a name or an int, not a bool")
    if isinstance(priority, int):
        return priority
    if isinstance(priority, str):
        v = PRIORITIES.get(priority.strip().lower())
        if v is not None:
            return v
        try:
            return int(priority.strip())
        except ValueError:
            pass
        raise InvalidPriority(
            3,
            f"priority {priority!r} is not a priority: expected lowest, lower, low, normal, "
            f"high, higher, highest or -3..=3",
        )
    raise TypeError(f"a priority is a name or an int, not {type(priority).__name__}")


def _ns(seconds):
    if seconds < 0:
        raise InvalidArgument(2, f"timeout {seconds} s is negative")
    return min(int(seconds * 1e9), 2**64 - 1)


def _bytes(s, what):
    if not isinstance(s, str):
        raise TypeError(f"{what} must be a str")
    return s.encode("utf-8")


class _Handle:
    """An owned C handle, closed once (explicitly, on ``with`` exit, or when
    garbage-collected)."""

    _close = None

    def __init__(self, ptr):
        self._ptr = ptr

    @property
    def _h(self):
        if self._ptr is None:
            raise InvalidArgument(1, f"this {type(self).__name__} is closed")
        return self._ptr

    def close(self):
        """Closes the handle (idempotent)."""
        ptr, self._ptr = getattr(self, "_ptr", None), None
        if ptr is not None and _lib is not None:
            getattr(_lib, self._close)(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# --------------------------------------------------------------------------
# Regions


class Region(_Handle):
    """A shared region file (named) or memfd (anonymous) holding one object.

    A name without ``/`` maps to ``/dev/shm/shmsched.<name>``; anything with
    ``/`` is a path. Works in a forked child.
    """

    _close = "shmsched_region_close"

    @classmethod
    def _make(cls, fn, *args):
        out = ctypes.c_void_p()
        _check(fn(*args, ctypes.byref(out)))
        return cls(out.value)

    @classmethod
    def create(cls, name, mode=0o600, process_slots=128):
        """Creates a new region file (it must not exist)."""
        return cls._make(_lib.shmsched_region_create, _bytes(name, "name"), mode, process_slots)

    @classmethod
    def open(cls, name):
        """Opens an existing region file."""
        return cls._make(_lib.shmsched_region_open, _bytes(name, "name"))

    @classmethod
    def open_or_create(cls, name, mode=0o600, process_slots=128):
        """Opens the region file, creating it if missing (race-free)."""
        return cls._make(
            _lib.shmsched_region_open_or_create, _bytes(name, "name"), mode, process_slots
        )

    @classmethod
    def anonymous(cls, process_slots=128):
        """An anonymous region (memfd): share it with forked children, or
        pass :meth:`dup_fd` to an exec'ed program."""
        return cls._make(_lib.shmsched_region_anonymous, process_slots)

    @classmethod
    def open_fd(cls, fd):
        """Opens the region behind a descriptor (the caller keeps ``fd``)."""
        return cls._make(_lib.shmsched_region_open_fd, int(fd))

    def dup_fd(self):
        """A new inheritable descriptor of an anonymous region, owned by the
        caller (pass it to a child with ``pass_fds``; close it afterwards)."""
        fd = ctypes.c_int32(-1)
        _check(_lib.shmsched_region_dup_fd(self._h, ctypes.byref(fd)))
        return fd.value

    @staticmethod
    def remove(name):
        """Removes a named region's file."""
        _check(_lib.shmsched_region_remove(_bytes(name, "name")))

    def info(self):
        """The region's header: kind, layout version, process slots, … (kind
        is None before an object was created in it)."""
        i = _RegionInfo()
        i.size = ctypes.sizeof(i)
        _check(_lib.shmsched_region_get_info(self._h, ctypes.byref(i)))
        kinds = {0: None, 1: "scheduler", 2: "limiter", 3: "fair-share"}
        return {
            "kind": kinds.get(i.kind, i.kind),
            "layout_version": i.layout_version,
            "process_slots": i.process_slots,
            "total_size": i.total_size,
            "created_at_unix_ms": i.created_at_unix_ms,
            "created_pid": i.created_pid,
        }


# --------------------------------------------------------------------------
# Scheduler


def _concurrency(max, caps):
    c = _lib.shmsched_concurrency_max(UNLIMITED if max is None else max)
    for name, cap in caps.items():
        v = priority_value(name)
        if not -3 <= v <= 3:
            raise InvalidPriority(3, f"priority {name!r} is out of range: expected -3..=3")
        c.caps[v + 3] = CAP_UNSET if cap is None else cap
    return c


class Permit:
    """The right to run one task; release it exactly once (a ``with`` block
    does). Belongs to the process that acquired it."""

    __slots__ = ("_permit", "priority", "_released")

    def __init__(self, permit, priority):
        self._permit = permit
        self.priority = priority
        self._released = False

    @property
    def released(self):
        """True once :meth:`release` succeeded."""
        return self._released

    @property
    def token(self):
        """The C token ``(process, serial)``."""
        return (self._permit.process, self._permit.serial)

    def release(self):
        """Gives the slot back. Raises :class:`AlreadyReleased` the second
        time, :class:`ForeignPermit` in another process (a forked child)."""
        st = _release(self._permit)
        if st:
            _raise(st)
        self._released = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._released:
            self.release()

    def __repr__(self):
        state = "released" if self._released else "held"
        return f"<Permit {self.priority} {state}>"


class Scheduler(_Handle):
    """A concurrency budget: at most ``max`` tasks at once across every
    process sharing the region, seven priorities, per-priority caps."""

    _close = "shmsched_scheduler_close"

    @classmethod
    def shared(cls, region, max, **caps):
        """Binds the scheduler in ``region`` with a global ``max``; keyword
        caps per priority name (``low=2``) apply to this handle's tasks."""
        c = _concurrency(max, caps)
        out = ctypes.c_void_p()
        _check(_lib.shmsched_scheduler_shared_with(region._h, ctypes.byref(c), ctypes.byref(out)))
        return cls(out.value)

    @classmethod
    def attach(cls, region):
        """Joins the scheduler in ``region``, whatever its max."""
        out = ctypes.c_void_p()
        _check(_lib.shmsched_scheduler_attach(region._h, ctypes.byref(out)))
        return cls(out.value)

    def child(self, max=None, **caps):
        """A child scheduler: a local cap on top of this one (``max=None``
        for no overall local cap)."""
        c = _concurrency(max, caps)
        out = ctypes.c_void_p()
        _check(_lib.shmsched_scheduler_child_with(self._h, ctypes.byref(c), ctypes.byref(out)))
        return Scheduler(out.value)

    def acquire(self, priority="normal", timeout=None):
        """Blocks until a slot is free (at most ``timeout`` seconds, then
        :class:`Timeout`); returns a :class:`Permit`, usable in ``with``."""
        # The common case (a priority name) without the general parser.
        p = PRIORITIES.get(priority) if type(priority) is str else None
        if p is None:
            p = priority_value(priority)
        h = self._ptr
        if h is None:
            h = self._h  # raises: closed
        permit = _Permit()
        if timeout is None:
            st = _acquire(h, p, _byref(permit))
        else:
            st = _lib.shmsched_scheduler_acquire_timeout(h, p, _ns(timeout), _byref(permit))
        if st:
            _raise(st)
        return Permit(permit, priority)

    def try_acquire(self, priority="normal"):
        """A :class:`Permit` if a slot is free now, else None."""
        permit = _Permit()
        st = _lib.shmsched_scheduler_try_acquire(
            self._h, priority_value(priority), ctypes.byref(permit)
        )
        if st == 15:  # WOULD_BLOCK
            return None
        _check(st)
        return Permit(permit, priority)

    def run(self, fn, *args, priority="normal", **kwargs):
        """Acquires, runs ``fn(*args, **kwargs)``, releases."""
        with self.acquire(priority):
            return fn(*args, **kwargs)

    def dispose(self):
        """Disposes this handle (and its children): waiters get
        :class:`Disposed`."""
        _check(_lib.shmsched_scheduler_dispose(self._h))

    @property
    def disposed(self):
        """True once disposed."""
        b = ctypes.c_bool(False)
        _check(_lib.shmsched_scheduler_is_disposed(self._h, ctypes.byref(b)))
        return b.value

    def reap(self):
        """Gives back now the slots of dead processes: ``(processes, slots)``."""
        procs, slots = ctypes.c_uint32(0), ctypes.c_uint64(0)
        _check(_lib.shmsched_scheduler_reap(self._h, ctypes.byref(procs), ctypes.byref(slots)))
        return procs.value, slots.value

    @property
    def global_running(self):
        """Slots held now across every process."""
        n = ctypes.c_uint32(0)
        _check(_lib.shmsched_scheduler_global_running(self._h, ctypes.byref(n)))
        return n.value

    @property
    def concurrency(self):
        """This level's max, None when unlimited."""
        n = ctypes.c_uint32(0)
        _check(_lib.shmsched_scheduler_concurrency(self._h, ctypes.byref(n)))
        return None if n.value == UNLIMITED else n.value

    def set_lottery(self, seed=0, enabled=True):
        """Reseeds the starvation lottery (0 keeps the generator) or turns it
        off (strict priority; for tests)."""
        _check(_lib.shmsched_scheduler_set_lottery(self._h, seed, enabled))

    def stats(self):
        """Gauges and counters as a dict (``shared`` holds the region-wide
        figures)."""
        return json.loads(_text(_lib.shmsched_scheduler_stats_json, self._h))

    def detach(self):
        """Leaves the region's process table now and closes the handle."""
        ptr, self._ptr = self._h, None  # closed whatever the outcome
        _check(_lib.shmsched_scheduler_detach(ptr))


# --------------------------------------------------------------------------
# Limiter


class Grant(tuple):
    """How a consume went: ``(immediate, forced)``."""

    __slots__ = ()

    def __new__(cls, immediate, forced):
        return super().__new__(cls, (immediate, forced))

    immediate = property(lambda self: self[0])
    forced = property(lambda self: self[1])


class Limiter(_Handle):
    """A byte-rate budget: a token bucket of ``tokens_per_second`` shared by
    every process bound to the region."""

    _close = "shmsched_limiter_close"

    @classmethod
    def shared(cls, region, tokens_per_second):
        """Binds the limiter in ``region`` (a new bucket starts full)."""
        out = ctypes.c_void_p()
        _check(_lib.shmsched_limiter_shared(region._h, tokens_per_second, ctypes.byref(out)))
        return cls(out.value)

    @classmethod
    def attach(cls, region):
        """Joins the limiter in ``region``, whatever its rate."""
        out = ctypes.c_void_p()
        _check(_lib.shmsched_limiter_attach(region._h, ctypes.byref(out)))
        return cls(out.value)

    def child(self, tokens_per_second):
        """A child limiter: this process's own bucket on top of this one."""
        out = ctypes.c_void_p()
        _check(_lib.shmsched_limiter_child(self._h, tokens_per_second, ctypes.byref(out)))
        return Limiter(out.value)

    def consume(self, n, priority="normal", timeout=None):
        """Blocks until ``n`` tokens are charged (at most ``timeout``
        seconds, then :class:`Timeout`); returns a :class:`Grant`."""
        g = _Grant()
        p = priority_value(priority)
        if timeout is None:
            st = _lib.shmsched_limiter_consume(self._h, n, p, ctypes.byref(g))
        else:
            st = _lib.shmsched_limiter_consume_timeout(self._h, n, p, _ns(timeout), ctypes.byref(g))
        _check(st)
        return Grant(g.immediate, g.forced)

    def try_consume(self, n):
        """Consumes ``n`` only if available now; True if it did."""
        st = _lib.shmsched_limiter_try_consume(self._h, n)
        if st == 15:
            return False
        _check(st)
        return True

    @property
    def tokens(self):
        """The balance now (negative while in debt)."""
        v = ctypes.c_int64(0)
        _check(_lib.shmsched_limiter_tokens(self._h, ctypes.byref(v)))
        return v.value

    @property
    def tokens_per_second(self):
        """The rate, also the capacity."""
        v = ctypes.c_uint32(0)
        _check(_lib.shmsched_limiter_tokens_per_second(self._h, ctypes.byref(v)))
        return v.value

    def reap(self):
        """Frees the entries of dead processes; returns how many."""
        v = ctypes.c_uint32(0)
        _check(_lib.shmsched_limiter_reap(self._h, ctypes.byref(v)))
        return v.value

    def stats(self):
        """Gauges and counters as a dict."""
        return json.loads(_text(_lib.shmsched_limiter_stats_json, self._h))

    def detach(self):
        """Leaves the region's process table now and closes the handle."""
        ptr, self._ptr = self._h, None  # closed whatever the outcome
        _check(_lib.shmsched_limiter_detach(ptr))

    def wrap(self, raw, priority="normal"):
        """A :class:`ThrottledFile` over the binary file object ``raw``."""
        return ThrottledFile(raw, self, priority)

    def open(self, file, mode="rb", priority="normal", buffering=-1):
        """Opens ``file`` (binary modes) with every byte read or written
        charged to this limiter. Returns a buffered binary file (or the raw
        :class:`ThrottledFile` with ``buffering=0``)."""
        if "b" not in mode:
            raise InvalidArgument(2, f"mode {mode!r}: throttled files are binary (add 'b')")
        raw = ThrottledFile(io.open(file, mode, buffering=0), self, priority)
        if buffering == 0:
            return raw
        size = io.DEFAULT_BUFFER_SIZE if buffering in (-1, 1) else buffering
        if raw.readable() and raw.writable():
            return io.BufferedRandom(raw, size)
        if raw.writable():
            return io.BufferedWriter(raw, size)
        return io.BufferedReader(raw, size)


class ThrottledFile(io.RawIOBase):
    """A raw binary file whose reads and writes are charged to a
    :class:`Limiter`, byte for byte: a read is charged for what it returned
    (after reading, so the end of a file costs nothing), a write before it
    is written. Chunks above the limiter's largest consume are split."""

    _MAX = 2**31 - 1

    def __init__(self, raw, limiter, priority="normal"):
        super().__init__()
        self.raw = raw
        self.limiter = limiter
        self.priority = priority_value(priority)

    def _charge(self, n):
        while n > 0:
            k = min(n, self._MAX)
            self.limiter.consume(k, self.priority)
            n -= k

    def readable(self):
        return self.raw.readable()

    def writable(self):
        return self.raw.writable()

    def seekable(self):
        return self.raw.seekable()

    def seek(self, offset, whence=io.SEEK_SET):
        return self.raw.seek(offset, whence)

    def tell(self):
        return self.raw.tell()

    def fileno(self):
        return self.raw.fileno()

    def readinto(self, b):
        n = self.raw.readinto(b)
        if n:
            self._charge(n)
        return n

    def write(self, b):
        n = len(memoryview(b).cast("B"))
        self._charge(n)
        return self.raw.write(b)

    def close(self):
        if not self.closed:
            try:
                self.raw.close()
            finally:
                super().close()


# --------------------------------------------------------------------------
# FairShare


class Lease(tuple):
    """A granted fair-share lease: ``(id, deadline_ms)``."""

    __slots__ = ()
    granted = True

    def __new__(cls, id, deadline_ms):
        return super().__new__(cls, (id, deadline_ms))

    id = property(lambda self: self[0])
    deadline_ms = property(lambda self: self[1])

    def __bool__(self):
        return True


class Refusal(tuple):
    """A refused acquire (an answer, not an error): ``(reason,
    retry_after_ms, explanation)``; ``retry_after_ms`` is None when no time
    can be promised. False in a boolean context."""

    __slots__ = ()
    granted = False

    def __new__(cls, reason, retry_after_ms, explanation):
        return super().__new__(cls, (reason, retry_after_ms, explanation))

    reason = property(lambda self: self[0])
    retry_after_ms = property(lambda self: self[1])
    explanation = property(lambda self: self[2])

    def __bool__(self):
        return False


class FairShare(_Handle):
    """A fair-share ceiling split between weighted tenants, shared through a
    region. Every call takes ``now_ms`` (explicit time, so a trace replays),
    or reads the shared clock when it is None."""

    _close = "shmsched_fair_close"

    @classmethod
    def shared(cls, region, config, lease_capacity=0):
        """Binds the ledger in ``region`` with ``config`` (a dict or JSON
        text: ceiling, fairness_unit, tenants, reclaim_horizon_ms,
        idle_after_ms, started_at_ms)."""
        text = config if isinstance(config, str) else json.dumps(config)
        out = ctypes.c_void_p()
        _check(
            _lib.shmsched_fair_shared(
                region._h, _bytes(text, "config"), lease_capacity, ctypes.byref(out)
            )
        )
        return cls(out.value)

    @classmethod
    def attach(cls, region):
        """Joins the ledger stored in ``region``."""
        out = ctypes.c_void_p()
        _check(_lib.shmsched_fair_attach(region._h, ctypes.byref(out)))
        return cls(out.value)

    @staticmethod
    def monotonic_ms():
        """The clock the ``now_ms=None`` calls read (CLOCK_MONOTONIC ms)."""
        return _lib.shmsched_monotonic_ms()

    def acquire(self, tenant, cost, hold_ms, now_ms=None):
        """A :class:`Lease`, or a :class:`Refusal` (falsy)."""
        o = _FairOutcome()
        why = ctypes.create_string_buffer(4096)
        t = _bytes(tenant, "tenant")
        if now_ms is None:
            st = _lib.shmsched_fair_acquire_now(
                self._h, t, float(cost), hold_ms, ctypes.byref(o), why, len(why)
            )
        else:
            st = _lib.shmsched_fair_acquire(
                self._h, t, float(cost), hold_ms, now_ms, ctypes.byref(o), why, len(why)
            )
        _check(st)
        if o.granted:
            return Lease(o.lease_id.decode("utf-8"), o.deadline_ms)
        reason = _lib.shmsched_refusal_reason_name(o.reason).decode()
        retry = None if o.retry_after_ms < 0 else o.retry_after_ms
        return Refusal(reason, retry, why.value.decode("utf-8", "replace"))

    def release(self, lease, now_ms=None):
        """Releases a lease (a :class:`Lease` or its id)."""
        lease_id = _bytes(lease.id if isinstance(lease, Lease) else lease, "lease")
        if now_ms is None:
            _check(_lib.shmsched_fair_release_now(self._h, lease_id))
        else:
            _check(_lib.shmsched_fair_release(self._h, lease_id, now_ms))

    def stats(self, now_ms=None):
        """Per-tenant stats as a dict."""
        if now_ms is None:
            return json.loads(_text(_lib.shmsched_fair_stats_json_now, self._h))
        return json.loads(_text(_lib.shmsched_fair_stats_json, self._h, now_ms))

    def reap(self):
        """Releases the leases of dead processes: ``(processes, leases)``."""
        procs, leases = ctypes.c_uint32(0), ctypes.c_uint64(0)
        _check(_lib.shmsched_fair_reap(self._h, ctypes.byref(procs), ctypes.byref(leases)))
        return procs.value, leases.value


def _debug_panic():
    """For tests: the library panics; the boundary turns it into an error."""
    _check(_lib.shmsched_debug_panic())
