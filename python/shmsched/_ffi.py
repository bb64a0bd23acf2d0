"""The C ABI as ctypes sees it: the library, its structs, and one table of
every function this binding binds (:data:`SIGNATURES`, name → ``(restype,
argtypes)``), which is the single place a prototype is declared. A test
compares the table with ``ffi/include/shmsched.h``: a C function without a
binding fails it.

The library is found through the ``SHMSCHED_LIB`` environment variable (a
path to ``libshmsched.so``), else the copy installed inside this package
(``pip install``), else ``target/release`` then ``target/debug`` of the
source tree this package sits in, else the system's library path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._errors import BY_STATUS, Error

#: The C ABI version this binding was written for (``SHMSCHED_ABI_VERSION``).
ABI_VERSION = 1

UNLIMITED = 0xFFFFFFFF
CAP_UNSET = 0xFFFFFFFF
LEASE_ID_MAX = 64

OK = 0
WOULD_BLOCK = 15
BUFFER_TOO_SMALL = 19


class Permit(ctypes.Structure):
    _fields_ = [("process", ctypes.c_uint64), ("serial", ctypes.c_uint64)]


class Concurrency(ctypes.Structure):
    _fields_ = [("max", ctypes.c_uint32), ("caps", ctypes.c_uint32 * 7)]


class Grant(ctypes.Structure):
    _fields_ = [("immediate", ctypes.c_bool), ("forced", ctypes.c_bool)]


class RegionInfo(ctypes.Structure):
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


class FairOutcome(ctypes.Structure):
    _fields_ = [
        ("granted", ctypes.c_bool),
        ("reason", ctypes.c_uint32),
        ("retry_after_ms", ctypes.c_int64),
        ("deadline_ms", ctypes.c_uint64),
        ("lease_id", ctypes.c_char * LEASE_ID_MAX),
    ]


class QueueStats(ctypes.Structure):
    _fields_ = [
        ("count", ctypes.c_uint64),
        ("deferred", ctypes.c_uint64),
        ("completed", ctypes.c_uint64),
        ("cancelled", ctypes.c_uint64),
    ]


class SchedulerRegionStats(ctypes.Structure):
    _fields_ = [
        ("running", ctypes.c_uint32),
        ("max", ctypes.c_uint32),
        ("processes", ctypes.c_uint32),
        ("waiters", ctypes.c_uint32 * 7),
        ("reclaimed", ctypes.c_uint64),
        ("reaped_processes", ctypes.c_uint64),
        ("stall_ns", ctypes.c_uint64),
    ]


class SchedulerStats(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("concurrency", ctypes.c_uint32),
        ("running", ctypes.c_uint64),
        ("pending", ctypes.c_uint64),
        ("stall_ns", ctypes.c_uint64),
        ("total", QueueStats),
        ("queues", QueueStats * 7),
        ("has_region", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("region", SchedulerRegionStats),
    ]


class LimiterQueueStats(ctypes.Structure):
    _fields_ = [
        ("count", ctypes.c_uint64),
        ("deferred", ctypes.c_uint64),
        ("completed", ctypes.c_uint64),
        ("cancelled", ctypes.c_uint64),
        ("stall", ctypes.c_uint64),
    ]


class LimiterRegionStats(ctypes.Structure):
    _fields_ = [
        ("forced", ctypes.c_uint64),
        ("waiters", ctypes.c_uint64 * 7),
        ("processes", ctypes.c_uint32),
        ("tsc_clock", ctypes.c_uint32),
        ("stall_ns", ctypes.c_uint64),
        ("wakes", ctypes.c_uint64),
        ("consumed", ctypes.c_uint64 * 7),
        ("refunded", ctypes.c_uint64 * 7),
    ]


class LimiterStats(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("tokens_per_second", ctypes.c_uint32),
        ("tokens", ctypes.c_int64),
        ("pending", ctypes.c_uint64),
        ("forced", ctypes.c_uint64),
        ("clock", ctypes.c_uint64),
        ("stall_ns", ctypes.c_uint64),
        ("total", QueueStats),
        ("queues", LimiterQueueStats * 7),
        ("has_region", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("region", LimiterRegionStats),
        ("consumed", ctypes.c_uint64 * 7),
        ("refunded", ctypes.c_uint64 * 7),
    ]


#: Bytes of `shmsched_completion.message`, NUL included.
COMPLETION_MESSAGE_MAX = 128
#: `shmsched_completion.kind`
WAIT_ACQUIRE = 1
WAIT_CONSUME = 2
#: `SHMSCHED_STATUS_CANCELLED`
CANCELLED = 25


class Completion(ctypes.Structure):
    _fields_ = [
        ("tag", ctypes.c_uint64),
        ("id", ctypes.c_uint64),
        ("permit", Permit),
        ("status", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),
        ("grant", Grant),
        ("reserved", ctypes.c_uint8 * 6),
        ("message", ctypes.c_char * COMPLETION_MESSAGE_MAX),
    ]


#: `shmsched_acquire_callback`
ACQUIRE_CALLBACK = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint32, Permit, ctypes.c_char_p
)
#: `shmsched_consume_callback`
CONSUME_CALLBACK = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint32, Grant, ctypes.c_char_p
)

_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_S = ctypes.c_uint32  # shmsched_status
_STR = ctypes.c_char_p
_BUF = ctypes.c_char_p
_BOOLP = ctypes.POINTER(ctypes.c_bool)
_I32P = ctypes.POINTER(ctypes.c_int32)
_I64P = ctypes.POINTER(ctypes.c_int64)
_U32P = ctypes.POINTER(ctypes.c_uint32)
_U64P = ctypes.POINTER(ctypes.c_uint64)
_SIZEP = ctypes.POINTER(ctypes.c_size_t)
_U8, _U32, _U64, _I32 = ctypes.c_uint8, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32
_SIZE, _F64, _BOOL = ctypes.c_size_t, ctypes.c_double, ctypes.c_bool

#: Every C function this binding binds: name → (restype, argtypes). The one
#: place a prototype is written (the parity test reads it).
SIGNATURES: Dict[str, Tuple[Any, List[Any]]] = {
    # Versions, clock, errors
    "shmsched_abi_version": (_U32, []),
    "shmsched_layout_version": (_U32, []),
    "shmsched_monotonic_ms": (_U64, []),
    "shmsched_strerror": (ctypes.c_char_p, [_U32]),
    "shmsched_last_error_message": (_SIZE, [_BUF, _SIZE]),
    "shmsched_debug_panic": (_S, []),
    # Regions
    "shmsched_region_create": (_S, [_STR, _U32, _U32, _PP]),
    "shmsched_region_open": (_S, [_STR, _PP]),
    "shmsched_region_open_or_create": (_S, [_STR, _U32, _U32, _PP]),
    "shmsched_region_anonymous": (_S, [_U32, _PP]),
    "shmsched_region_open_fd": (_S, [_I32, _PP]),
    "shmsched_region_dup_fd": (_S, [_P, _I32P]),
    "shmsched_region_remove": (_S, [_STR]),
    "shmsched_region_get_info": (_S, [_P, ctypes.POINTER(RegionInfo)]),
    "shmsched_region_close": (None, [_P]),
    # Schedulers
    "shmsched_concurrency_max": (Concurrency, [_U32]),
    "shmsched_concurrency_set_cap": (_S, [ctypes.POINTER(Concurrency), _I32, _U32]),
    "shmsched_scheduler_shared": (_S, [_P, _U32, _PP]),
    "shmsched_scheduler_shared_with": (_S, [_P, ctypes.POINTER(Concurrency), _PP]),
    "shmsched_scheduler_attach": (_S, [_P, _PP]),
    "shmsched_scheduler_child": (_S, [_P, _U32, _PP]),
    "shmsched_scheduler_child_with": (_S, [_P, ctypes.POINTER(Concurrency), _PP]),
    "shmsched_scheduler_acquire": (_S, [_P, _I32, ctypes.POINTER(Permit)]),
    "shmsched_scheduler_acquire_timeout": (_S, [_P, _I32, _U64, ctypes.POINTER(Permit)]),
    "shmsched_scheduler_acquire_many": (_S, [_P, _I32, _U32, ctypes.POINTER(Permit)]),
    "shmsched_scheduler_acquire_many_timeout": (
        _S,
        [_P, _I32, _U32, _U64, ctypes.POINTER(Permit)],
    ),
    "shmsched_scheduler_acquire_async": (_S, [_P, _I32, _U64, ACQUIRE_CALLBACK, _P]),
    "shmsched_scheduler_try_acquire": (_S, [_P, _I32, ctypes.POINTER(Permit)]),
    "shmsched_scheduler_try_acquire_many": (_S, [_P, _I32, _U32, ctypes.POINTER(Permit)]),
    "shmsched_permit_release": (_S, [Permit]),
    "shmsched_scheduler_dispose": (_S, [_P]),
    "shmsched_scheduler_is_disposed": (_S, [_P, _BOOLP]),
    "shmsched_scheduler_reap": (_S, [_P, _U32P, _U64P]),
    "shmsched_scheduler_global_running": (_S, [_P, _U32P]),
    "shmsched_scheduler_concurrency": (_S, [_P, _U32P]),
    "shmsched_scheduler_set_ceiling": (_S, [_P, _U32, _BOOLP]),
    "shmsched_scheduler_ceiling": (_S, [_P, _U32P]),
    "shmsched_scheduler_set_lottery": (_S, [_P, _U64, _BOOL]),
    "shmsched_scheduler_get_stats": (_S, [_P, ctypes.POINTER(SchedulerStats)]),
    "shmsched_scheduler_stats_json": (_S, [_P, _BUF, _SIZE, _SIZEP]),
    "shmsched_scheduler_detach": (_S, [_P]),
    "shmsched_scheduler_close": (None, [_P]),
    # Limiters
    "shmsched_limiter_shared": (_S, [_P, _U64, _PP]),
    "shmsched_limiter_shared_with_capacity": (_S, [_P, _U64, _U64, _PP]),
    "shmsched_limiter_attach": (_S, [_P, _PP]),
    "shmsched_limiter_child": (_S, [_P, _U64, _PP]),
    "shmsched_limiter_child_with_capacity": (_S, [_P, _U64, _U64, _PP]),
    "shmsched_limiter_consume": (_S, [_P, _U64, _I32, ctypes.POINTER(Grant)]),
    "shmsched_limiter_consume_timeout": (_S, [_P, _U64, _I32, _U64, ctypes.POINTER(Grant)]),
    "shmsched_limiter_consume_async": (_S, [_P, _U64, _I32, _U64, CONSUME_CALLBACK, _P]),
    "shmsched_limiter_try_consume": (_S, [_P, _U64]),
    "shmsched_limiter_try_consume_at": (_S, [_P, _U64, _I32]),
    "shmsched_limiter_tokens": (_S, [_P, _I64P]),
    "shmsched_limiter_tokens_per_second": (_S, [_P, _U32P]),
    "shmsched_limiter_capacity": (_S, [_P, _U32P]),
    "shmsched_limiter_set_rate": (_S, [_P, _U64]),
    "shmsched_limiter_set_capacity": (_S, [_P, _U64]),
    "shmsched_limiter_reap": (_S, [_P, _U32P]),
    "shmsched_limiter_get_stats": (_S, [_P, ctypes.POINTER(LimiterStats)]),
    "shmsched_limiter_stats_json": (_S, [_P, _BUF, _SIZE, _SIZEP]),
    "shmsched_limiter_detach": (_S, [_P]),
    "shmsched_limiter_close": (None, [_P]),
    # Waitsets (many waits, no thread each)
    "shmsched_waitset_create": (_S, [_PP]),
    "shmsched_waitset_fd": (_S, [_P, _I32P]),
    "shmsched_scheduler_acquire_start": (_S, [_P, _I32, _U32, _U64, _P, _U64, _U64P]),
    "shmsched_limiter_consume_start": (_S, [_P, _U64, _I32, _U64, _P, _U64, _U64P]),
    "shmsched_waitset_cancel": (_S, [_P, _U64]),
    "shmsched_waitset_take": (_S, [_P, ctypes.POINTER(Completion), _SIZE, _SIZEP]),
    "shmsched_waitset_wait": (_S, [_P, _U64, _SIZEP]),
    "shmsched_waitset_interrupt": (_S, [_P]),
    "shmsched_waitset_pending": (_S, [_P, _SIZEP]),
    "shmsched_waitset_close": (None, [_P]),
    # Fair shares
    "shmsched_fair_shared": (_S, [_P, _STR, _U32, _PP]),
    "shmsched_fair_attach": (_S, [_P, _PP]),
    "shmsched_fair_acquire": (
        _S,
        [_P, _STR, _F64, _U64, _U64, ctypes.POINTER(FairOutcome), _BUF, _SIZE],
    ),
    "shmsched_fair_acquire_now": (
        _S,
        [_P, _STR, _F64, _U64, ctypes.POINTER(FairOutcome), _BUF, _SIZE],
    ),
    "shmsched_fair_release": (_S, [_P, _STR, _U64]),
    "shmsched_fair_release_now": (_S, [_P, _STR]),
    "shmsched_fair_stats_json": (_S, [_P, _U64, _BUF, _SIZE, _SIZEP]),
    "shmsched_fair_stats_json_now": (_S, [_P, _BUF, _SIZE, _SIZEP]),
    "shmsched_fair_reap": (_S, [_P, _U32P, _U64P]),
    "shmsched_fair_close": (None, [_P]),
    "shmsched_refusal_reason_name": (ctypes.c_char_p, [_U32]),
}


def find_library() -> str:
    """The path of ``libshmsched.so`` this package loads (see the module
    docs for the order)."""
    env = os.environ.get("SHMSCHED_LIB")
    if env:
        return env
    here = Path(__file__).resolve().parent
    packaged = sorted(here.glob("_libshmsched*.so"))
    if packaged:
        return str(packaged[0])
    root = here.parent.parent
    for profile in ("release", "debug"):
        p = root / "target" / profile / "libshmsched.so"
        if p.exists():
            return str(p)
    found = ctypes.util.find_library("shmsched")
    if found:
        return found
    raise ImportError(
        "libshmsched.so not found: install the package (pip install ./python builds it), "
        "build it with `cargo build --release -p shmsched-ffi`, or set SHMSCHED_LIB to its path"
    )


def load() -> Tuple[ctypes.CDLL, str]:
    """Loads the library and declares every prototype of :data:`SIGNATURES`."""
    path = find_library()
    lib = ctypes.CDLL(path)
    missing = [name for name in SIGNATURES if not hasattr(lib, name)]
    if missing:
        raise ImportError(
            f"{path} lacks {', '.join(missing)}: it is older than this binding "
            f"(rebuild it, or point SHMSCHED_LIB at a current one)"
        )
    for name, (res, args) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    got = lib.shmsched_abi_version()
    if got != ABI_VERSION:
        raise ImportError(
            f"{path} has C ABI version {got}, and this binding speaks version {ABI_VERSION}"
        )
    return lib, path


lib, LIBRARY_PATH = load()

_last_error_message = lib.shmsched_last_error_message


def last_error() -> str:
    """This thread's last error message from the library."""
    n = _last_error_message(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    _last_error_message(buf, n + 1)
    return buf.value.decode("utf-8", "replace")


def error(status: int, message: Optional[str] = None) -> Error:
    """The exception for ``status``, with this thread's last message unless
    ``message`` is given."""
    if message is None:
        message = last_error()
    return BY_STATUS.get(status, Error)(status, message)


def check(status: int) -> None:
    """Raises the exception for a failed status."""
    if status != OK:
        raise error(status)


def text_out(fn: Callable[..., int], *args: Any) -> str:
    """Calls a ``(…, buf, len, out_len)`` function, growing the buffer as
    asked."""
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        need = ctypes.c_size_t(0)
        st = fn(*args, buf, size, ctypes.byref(need))
        if st == BUFFER_TOO_SMALL:  # the length needed is in `need`
            size = need.value + 1
            continue
        check(st)
        return buf.value.decode("utf-8")
