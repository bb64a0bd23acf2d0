"""The exceptions of the binding: one class per C status code, all
subclasses of :class:`Error`, each also a subclass of the built-in
exception a Python caller would catch for it where there is one
(``ValueError`` for a bad argument, ``TypeError`` for a wrong type,
``OverflowError`` for an integer out of range, ``TimeoutError`` for a
timed-out wait, ``KeyError`` for an unknown tenant or lease)."""

from __future__ import annotations

from typing import Dict, Optional, Type

__all__ = [
    "AlreadyExists",
    "AlreadyReleased",
    "ArgumentTypeError",
    "BadRegion",
    "BufferTooSmall",
    "Cancelled",
    "CapacityExhausted",
    "Disposed",
    "Error",
    "ForeignPermit",
    "Forked",
    "InternalError",
    "InvalidArgument",
    "InvalidPriority",
    "Mismatch",
    "NotFound",
    "OSFailure",
    "OutOfRange",
    "ProcessTableFull",
    "TimeWentBackwards",
    "Timeout",
    "UnknownLease",
    "UnknownTenant",
    "VersionMismatch",
    "WouldBlock",
    "WrongKind",
    "ZeroConcurrency",
]

#: ``SHMSCHED_STATUS_INVALID_ARGUMENT``: the code of every argument the
#: binding refuses before the library sees it.
INVALID_ARGUMENT = 2


class Error(Exception):
    """A failed call: ``status`` is the C status code (``SHMSCHED_STATUS_*``),
    ``str(e)`` the library's message, naming the bad value and the limit."""

    status: Optional[int] = None
    message: str

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgument(Error, ValueError):
    """An argument was out of range or malformed (the message names the
    value and the limit)."""


class ArgumentTypeError(InvalidArgument, TypeError):
    """An argument of the wrong type: a float, a bool or a str where an int
    is meant, an int where a name is meant, …"""


class OutOfRange(InvalidArgument, OverflowError):
    """An integer outside the range of its parameter (checked by the binding
    before the C library sees it, so nothing is ever truncated)."""


class InvalidPriority(InvalidArgument):
    """A priority that is not a name (lowest … highest) or an integer -3..3."""


class NotFound(Error):
    """The region file does not exist."""


class AlreadyExists(Error):
    """The region file already exists."""


class OSFailure(Error):
    """An operating-system call failed (the message names it and the file)."""


class BadRegion(Error):
    """The region is not a valid shmsched region."""


class VersionMismatch(BadRegion):
    """The region has another layout version than the library."""


class WrongKind(Error):
    """The region holds another kind of object."""


class Mismatch(Error):
    """The region holds this kind of object with other parameters (use
    ``attach`` to join whatever it holds)."""


class ProcessTableFull(Error):
    """The region's process table is full."""


class ZeroConcurrency(Error):
    """The scheduler's concurrency is 0: nothing can ever be admitted."""


class Disposed(Error):
    """The scheduler is disposed."""


class Timeout(Error, TimeoutError):
    """A timed wait expired; nothing was taken."""


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


class UnknownLease(Error, KeyError):
    """A fair-share release named a lease that was never issued."""


class TimeWentBackwards(Error):
    """A fair-share ``now`` is earlier than the last accepted one."""


class CapacityExhausted(Error):
    """A fixed-capacity table is full."""


class InternalError(Error):
    """A caught panic inside the library, or an unknown error."""


class Cancelled(Error):
    """A wait of a :class:`~shmsched.Waitset` was cancelled (an asyncio
    caller sees ``asyncio.CancelledError`` instead)."""


#: The exception class of each C status code.
BY_STATUS: Dict[int, Type[Error]] = {
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
    25: Cancelled,
}
