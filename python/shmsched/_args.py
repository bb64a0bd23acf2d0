"""Checks of every argument before ctypes sees it.

ctypes converts a Python int to a C integer by truncating it (``2**32 + 2``
becomes ``2`` in a ``uint32_t``), converts a bool as an int, and raises its
own ``ArgumentError`` for a float. So every integer the binding passes is
checked here first, against the range its parameter has in the C ABI (the
library's own limit where it is a constant, else the C type's width), and
refused with an :class:`~shmsched.OutOfRange` that names the value and the
limit in the library's words. The rules:

- An integer parameter takes an ``int`` (or any object with
  ``__index__``, such as a NumPy integer). A ``bool`` is refused
  (``True`` is not a count), and so is a ``float``, even an integral one
  (``2.0``): :class:`~shmsched.ArgumentTypeError`.
- A priority is a name (``"high"``, case-insensitive), an integer -3..3, or
  the text of one (``"3"``).
- A timeout is a number of seconds (``int``, ``float``, any real number,
  or a ``datetime.timedelta``); ``None`` and ``math.inf`` wait for ever; a
  NaN or a negative timeout is refused; a huge finite one is clamped to
  the largest the C ABI takes (about 584 years).
- A name (region name or path, tenant, lease id) is a ``str`` (a region name
  may also be ``bytes`` or an ``os.PathLike``); a NUL in it is refused, as
  is text that cannot be encoded as UTF-8.
"""

from __future__ import annotations

import datetime
import math
import numbers
import os
from typing import Any, Optional, Union

from ._errors import INVALID_ARGUMENT, ArgumentTypeError, InvalidArgument, InvalidPriority, OutOfRange

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
I32_MAX = 2**31 - 1
I32_MIN = -(2**31)

#: The largest count of the library's Limiter and Scheduler (``i32::MAX``).
MAX_COUNT = I32_MAX
#: The largest max of a shared scheduler (one owner cell per slot).
MAX_SHARED_SLOTS = 65_536
#: The largest process table of a region.
MAX_PROCESS_SLOTS = 4096
#: ``SHMSCHED_FOREVER``: the timeout of a wait without a limit.
FOREVER_NS = U64_MAX
#: The longest finite timeout, in nanoseconds (one below ``SHMSCHED_FOREVER``).
MAX_TIMEOUT_NS = U64_MAX - 1

PRIORITIES = {
    "lowest": -3,
    "lower": -2,
    "low": -1,
    "normal": 0,
    "high": 1,
    "higher": 2,
    "highest": 3,
}

_PRIORITY_NAMES = "lowest, lower, low, normal, high, higher, highest"


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}


def debug_str(s: Union[str, bytes]) -> str:
    """``s`` quoted as the Rust library quotes text in its messages
    (``{:?}``): double quotes, escapes for quotes, backslashes and control
    characters (``\\0`` for a NUL)."""
    if isinstance(s, bytes):
        s = s.decode("utf-8", "backslashreplace")
    out = ['"']
    for ch in s:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F or 0xD800 <= ord(ch) <= 0xDFFF:
            out.append(f"\\u{{{ord(ch):x}}}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _shown(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = "?"
    if len(text) > 60:
        text = text[:57] + "..."
    return text


def type_error(what: str, expected: str, value: Any) -> ArgumentTypeError:
    return ArgumentTypeError(
        INVALID_ARGUMENT,
        f"{what} must be {expected}, not {type(value).__name__} ({_shown(value)})",
    )


def integer(
    value: Any,
    what: str,
    lo: int,
    hi: int,
    message: Optional[str] = None,
) -> int:
    """``value`` as an int in ``lo..=hi``. ``message`` (a format with
    ``{v}``) is the library's sentence for this parameter; the default
    names the parameter, the value and the range."""
    if type(value) is int:
        v = value
    elif isinstance(value, bool):
        raise type_error(what, "an int", value)
    elif isinstance(value, int):
        v = int(value)
    else:
        index = getattr(type(value), "__index__", None)
        if index is None:
            raise type_error(what, "an int", value)
        try:
            v = index(value)
        except Exception as e:
            raise type_error(what, "an int", value) from e
        if isinstance(v, bool) or not isinstance(v, int):
            raise type_error(what, "an int", value)
        v = int(v)
    if lo <= v <= hi:
        return v
    text = (message or "{what} {v} is out of range: must be an integer {lo}..={hi}").format(
        what=what, v=v, lo=lo, hi=hi
    )
    raise OutOfRange(INVALID_ARGUMENT, text)


def u32(value: Any, what: str) -> int:
    return integer(value, what, 0, U32_MAX)


def u64(value: Any, what: str) -> int:
    return integer(value, what, 0, U64_MAX)


def tokens_per_second(value: Any) -> int:
    return integer(
        value,
        "tokens_per_second",
        1,
        MAX_COUNT,
        "tokens_per_second {v} is out of range: must be a positive integer 1..={hi}",
    )


def capacity(value: Any) -> int:
    return integer(
        value,
        "capacity",
        1,
        MAX_COUNT,
        "capacity {v} is out of range: must be a positive integer 1..={hi}",
    )


def tokens(value: Any) -> int:
    return integer(
        value,
        "n",
        0,
        MAX_COUNT,
        "consume of {v} tokens is out of range: must be a non-negative integer 0..={hi}",
    )


def boolean(value: Any, what: str) -> bool:
    if value is True or value is False:
        return value
    raise type_error(what, "a bool", value)


def priority(value: Any) -> int:
    """A priority as its integer value -3..3: a name (case-insensitive), an
    integer, or the text of an integer."""
    if isinstance(value, str):
        p = PRIORITIES.get(value)
        if p is not None:
            return p
        t = value.strip()
        p = PRIORITIES.get(t.lower())
        if p is not None:
            return p
        try:
            v = int(t, 10)
        except ValueError:
            raise InvalidPriority(
                3,
                f"priority {debug_str(value)} is not a priority: expected {_PRIORITY_NAMES} "
                f"or -3..=3",
            ) from None
    elif isinstance(value, bool):
        raise type_error("priority", "a name (str) or an int -3..=3", value)
    elif isinstance(value, int):
        v = int(value)
    else:
        index = getattr(type(value), "__index__", None)
        try:
            got = index(value) if index is not None else None
        except Exception:
            got = None
        if isinstance(got, bool) or not isinstance(got, int):
            raise type_error("priority", "a name (str) or an int -3..=3", value)
        v = int(got)
    if -3 <= v <= 3:
        return v
    raise InvalidPriority(
        3,
        f"priority {v} is out of range: expected -3..=3 or a name ({_PRIORITY_NAMES})",
    )


def timeout_ns(value: Any, what: str = "timeout") -> Optional[int]:
    """A timeout in seconds as nanoseconds for the C ABI; None for "wait
    for ever" (``None`` or ``math.inf``)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise type_error(what, "a number of seconds (or None)", value)
    if isinstance(value, datetime.timedelta):
        if value < datetime.timedelta(0):
            raise InvalidArgument(INVALID_ARGUMENT, f"{what} {value} is negative")
        ns = (
            (value.days * 86_400 + value.seconds) * 1_000_000_000
            + value.microseconds * 1_000
        )
        return min(ns, MAX_TIMEOUT_NS)
    if isinstance(value, int):
        if value < 0:
            raise InvalidArgument(INVALID_ARGUMENT, f"{what} {value} s is negative")
        return min(value * 1_000_000_000, MAX_TIMEOUT_NS)
    if not isinstance(value, numbers.Real):
        raise type_error(what, "a number of seconds (or None)", value)
    try:
        s = float(value)
    except (OverflowError, ValueError):
        # A Fraction or Decimal beyond a float's range.
        s = math.inf if value > 0 else -math.inf  # type: ignore[operator]
    if math.isnan(s):
        raise InvalidArgument(INVALID_ARGUMENT, f"{what} {s} is not a number of seconds (NaN)")
    if s < 0:
        raise InvalidArgument(INVALID_ARGUMENT, f"{what} {s} s is negative")
    if s == math.inf:
        return None
    if s >= MAX_TIMEOUT_NS / 1e9:
        return MAX_TIMEOUT_NS
    return min(math.ceil(s * 1e9), MAX_TIMEOUT_NS)


def real(value: Any, what: str) -> float:
    """A real number as a float (NaN and infinities are passed on, for the
    library to refuse with its own words); an int beyond a float's range is
    refused here."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise type_error(what, "a number", value)
    try:
        return float(value)
    except OverflowError:
        raise OutOfRange(
            INVALID_ARGUMENT,
            f"{what} {value} is invalid: it must be finite and not negative "
            f"(it is beyond the range of a double)",
        ) from None


def _utf8(s: str, what: str) -> bytes:
    if "\0" in s:
        raise InvalidArgument(INVALID_ARGUMENT, f"{what} {debug_str(s)} contains a NUL byte")
    try:
        return s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgument(
            INVALID_ARGUMENT,
            f"{what} {debug_str(s)} is not valid UTF-8 (a lone surrogate at offset {e.start})",
        ) from None


def text(value: Any, what: str) -> bytes:
    """A ``str`` argument as NUL-free UTF-8."""
    if not isinstance(value, str):
        raise type_error(what, "a str", value)
    return _utf8(value, what)


def path(value: Any, what: str = "region name") -> bytes:
    """A region name or path: ``str``, ``bytes`` or ``os.PathLike``."""
    if isinstance(value, (str, bytes)) or hasattr(value, "__fspath__"):
        try:
            p = os.fspath(value)
        except TypeError as e:
            raise type_error(what, "a str, bytes or os.PathLike", value) from e
    else:
        raise type_error(what, "a str, bytes or os.PathLike", value)
    if isinstance(p, str):
        return _utf8(p, what)
    if b"\0" in p:
        raise InvalidArgument(INVALID_ARGUMENT, f"{what} {debug_str(p)} contains a NUL byte")
    return bytes(p)
