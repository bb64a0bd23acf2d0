"""The bad-input table: every public function of the binding, every
parameter, called with a wrong type, an out-of-range value, NaN and the
infinities, huge integers, negatives and NULs. Each call must raise a typed
error (a ``shmsched.Error`` that is also the matching built-in:
``TypeError``, ``ValueError``, ``OverflowError``), naming the value, and
must take nothing (no silent truncation: the scheduler holds nothing
afterwards, the limiter's bucket is untouched, no region file appears).

A crash (a segfault in ctypes) kills this process, which the runner sees
as a failure.
"""

import datetime
import math
import os
import unittest

import shmsched
from shmsched import ArgumentTypeError, InvalidArgument, InvalidPriority, OutOfRange

from common import RegionTest, temp_path

NAN = float("nan")
INF = math.inf

# Values of the wrong type for an integer parameter.
NOT_INTS = [1.5, 2.0, NAN, INF, -INF, True, False, "1", b"1", None, [], object(), 1j]
# Values for a priority that are not priorities at all (a wrong type) ...
NOT_PRIORITIES = [1.5, NAN, INF, True, None, b"high", [], object()]
# ... and priority-shaped values out of range.
BAD_PRIORITIES = ["urgent", "", "high\0", "4", 4, -4, 2**31, 2**32 + 1, 2**64 + 1, -(2**63) - 1]
NOT_TIMEOUTS = ["1", b"1", True, [], object(), 1j]
BAD_TIMEOUTS = [NAN, -1, -0.001, -INF, -(10**30), datetime.timedelta(seconds=-1)]
NOT_NAMES = [None, 1, 1.5, True, [], object()]
BAD_NAMES = ["a\0b", b"a\0b", "\udc80x"]
NOT_TEXT = [None, 1, 1.5, True, b"a", [], object()]
BAD_TEXT = ["a\0b", "\udc80"]
NOT_BOOLS = [1, 0, "yes", None, 1.0]
NOT_REALS = ["1", None, True, [], object(), 1j]
BAD_REALS = [NAN, INF, -INF, -1, 2**1100]


def out_of_range(lo, hi):
    """Integers just outside lo..=hi, and the huge ones that truncate in a
    C type (2**32 + 2 becomes 2 in a uint32_t)."""
    vals = [lo - 1, hi + 1, -1, 2**31, 2**32, 2**32 + 2, 2**63, 2**64, 2**64 + 5, 10**30, -(2**64)]
    return [v for v in vals if not lo <= v <= hi]


class BadInputTable(RegionTest):
    """Each test walks one function's parameters through the table."""

    def setUp(self):
        super().setUp()
        self.r = self.region("table")
        self.sched = shmsched.Scheduler.shared(self.r, 4)
        self.lr = self.region("table-lim")
        self.lim = shmsched.Limiter.shared(self.lr, 1000)
        self.fr = self.region("table-fair")
        self.fair = shmsched.FairShare.shared(
            self.fr,
            {
                "ceiling": 100,
                "fairness_unit": "cost",
                "tenants": [{"id": "a", "weight": 1}],
                "reclaim_horizon_ms": 100,
                "idle_after_ms": 1000,
                "started_at_ms": 0,
            },
        )
        self.calls = 0

    def tearDown(self):
        # Nothing was taken by any refused call.
        self.assertEqual(self.sched.global_running, 0)
        st = self.sched.stats()["shared"]
        self.assertEqual(st["waiters"], [0] * 7)
        self.assertEqual(self.lim.snapshot().pending, 0)
        self.assertEqual(self.fair.stats(now_ms=10**6)["tenants"]["a"]["held"], 0)
        super().tearDown()

    def refused(self, fn, value, kind, builtin, *, named=True):
        """``fn(value)`` raises ``kind`` (a shmsched.Error and a
        ``builtin``) whose message names the value."""
        self.calls += 1
        with self.subTest(fn=getattr(fn, "__name__", fn), value=value):
            with self.assertRaises(kind) as cm:
                fn(value)
            e = cm.exception
            self.assertIsInstance(e, shmsched.Error)
            self.assertIsInstance(e, builtin)
            self.assertEqual(e.status, 2 if kind is not InvalidPriority else 3)
            if named and isinstance(value, int) and not isinstance(value, bool):
                # In decimal, or in octal for a mode (as the library writes it).
                self.assertTrue(
                    str(value) in str(e) or format(value, "#o") in str(e),
                    f"{value} is not named in {str(e)!r}",
                )

    def int_param(self, fn, lo, hi, optional=False):
        """An int parameter of range lo..=hi (``optional``: None is a
        valid value, the default)."""
        for v in NOT_INTS:
            if v is None and optional:
                continue
            self.refused(fn, v, ArgumentTypeError, TypeError)
        for v in out_of_range(lo, hi):
            self.refused(fn, v, OutOfRange, OverflowError)

    def walk(self, fn, wrong_types, bad_values, kind, builtin, named=True):
        """Wrong types raise ArgumentTypeError; bad values raise ``kind``."""
        for v in wrong_types:
            self.refused(fn, v, ArgumentTypeError, TypeError)
        for v in bad_values:
            self.refused(fn, v, kind, builtin, named=named)

    def priority_param(self, fn):
        self.walk(fn, NOT_PRIORITIES, BAD_PRIORITIES, InvalidPriority, ValueError)

    def timeout_param(self, fn):
        self.walk(fn, NOT_TIMEOUTS, BAD_TIMEOUTS, InvalidArgument, ValueError, named=False)

    def name_param(self, fn):
        self.walk(fn, NOT_NAMES, BAD_NAMES, InvalidArgument, ValueError)

    def text_param(self, fn):
        self.walk(fn, NOT_TEXT, BAD_TEXT, InvalidArgument, ValueError)

    def handle_param(self, fn):
        for v in [None, 1, "region", self.sched, object()]:
            self.refused(fn, v, ArgumentTypeError, TypeError)

    def bool_param(self, fn):
        for v in NOT_BOOLS:
            self.refused(fn, v, ArgumentTypeError, TypeError)

    # -- Region ------------------------------------------------------------

    def test_region_create_and_open_or_create(self):
        for make in (shmsched.Region.create, shmsched.Region.open_or_create):
            p = temp_path("never")
            self.name_param(lambda v: make(v))
            self.int_param(lambda v: make(p, mode=v), 0, 0o777)
            self.int_param(lambda v: make(p, process_slots=v), 1, 4096)
            self.assertFalse(os.path.exists(p), "a refused create made the file")
        # The NUL case of the issue: "name\0tail" used to create "name".
        p = temp_path("nul")
        self.refused(lambda v: shmsched.Region.open_or_create(v), p + "\0tail",
                     InvalidArgument, ValueError)
        self.assertFalse(os.path.exists(p))

    def test_region_open_remove_anonymous_open_fd(self):
        self.name_param(shmsched.Region.open)
        self.name_param(shmsched.Region.remove)
        self.int_param(lambda v: shmsched.Region.anonymous(v), 1, 4096)
        self.int_param(shmsched.Region.open_fd, 0, 2**31 - 1)

    # -- Scheduler ---------------------------------------------------------

    def test_scheduler_shared_attach_child(self):
        fresh = self.region("sched-fresh")
        self.int_param(lambda v: shmsched.Scheduler.shared(fresh, v), 0, 65536)
        self.refused(lambda v: shmsched.Scheduler.shared(fresh, v), None,
                     ArgumentTypeError, TypeError)
        self.int_param(lambda v: shmsched.Scheduler.shared(fresh, 4, low=v), 0, 2**31 - 1, True)
        for bad in ["urgent", "lw"]:
            self.refused(lambda v: shmsched.Scheduler.shared(fresh, 4, **{v: 1}), bad,
                         InvalidPriority, ValueError)
        self.assertIsNone(fresh.info()["kind"], "a refused shared() initialised the region")
        self.handle_param(lambda v: shmsched.Scheduler.shared(v, 4))
        self.handle_param(shmsched.Scheduler.attach)
        self.int_param(lambda v: self.sched.child(v), 0, 2**31 - 1, True)
        self.int_param(lambda v: self.sched.child(2, high=v), 0, 2**31 - 1, True)

    def test_scheduler_acquire_family(self):
        s = self.sched
        for fn in (
            lambda v: s.acquire(v),
            lambda v: s.try_acquire(v),
            lambda v: s.acquire_many(1, v),
            lambda v: s.try_acquire_many(1, v),
            lambda v: s.acquire_async(v),
            lambda v: s.acquire_many_async(1, v),
            lambda v: s.acquire_with_callback(lambda p, e: None, v),
            lambda v: s.run(lambda: None, priority=v),
        ):
            self.priority_param(fn)
        for fn in (
            lambda v: s.acquire("normal", v),
            lambda v: s.acquire_many(1, "normal", v),
            lambda v: s.acquire_async("normal", v),
            lambda v: s.acquire_many_async(1, "normal", v),
            lambda v: s.acquire_with_callback(lambda p, e: None, "normal", v),
        ):
            self.timeout_param(fn)
        for fn in (
            lambda v: s.acquire_many(v),
            lambda v: s.try_acquire_many(v),
            lambda v: s.acquire_many_async(v),
        ):
            self.int_param(fn, 0, 2**32 - 1)
        for v in [None, 1, "f"]:
            self.refused(lambda v: s.acquire_with_callback(v), v, ArgumentTypeError, TypeError)

    def test_scheduler_priority_that_used_to_wrap(self):
        # try_acquire(2**32 + 1) was granted at priority 1.
        for v in [2**32 + 1, 2**32 - 3, 2**64 + 1]:
            self.refused(self.sched.try_acquire, v, InvalidPriority, ValueError)
            self.refused(self.sched.acquire, v, InvalidPriority, ValueError)

    def test_scheduler_tuning(self):
        s = self.sched
        self.int_param(s.set_ceiling, 0, 2**32 - 1)
        self.int_param(lambda v: s.set_lottery(v), 0, 2**64 - 1)
        self.bool_param(lambda v: s.set_lottery(0, v))
        self.assertEqual(s.ceiling, 4, "a refused set_ceiling moved the ceiling")

    # -- Limiter -----------------------------------------------------------

    def test_limiter_shared_attach_child(self):
        fresh = self.region("lim-fresh")
        self.int_param(lambda v: shmsched.Limiter.shared(fresh, v), 1, 2**31 - 1)
        self.int_param(lambda v: shmsched.Limiter.shared(fresh, 10, v), 1, 2**31 - 1, True)
        self.assertIsNone(fresh.info()["kind"])
        self.handle_param(lambda v: shmsched.Limiter.shared(v, 10))
        self.handle_param(shmsched.Limiter.attach)
        self.int_param(lambda v: self.lim.child(v), 1, 2**31 - 1)
        self.int_param(lambda v: self.lim.child(10, v), 1, 2**31 - 1, True)

    def test_limiter_consume_family(self):
        lim = self.lim
        before = lim.tokens
        for fn in (
            lambda v: lim.consume(v),
            lambda v: lim.try_consume(v),
            lambda v: lim.consume_async(v),
            lambda v: lim.consume_with_callback(lambda g, e: None, v),
        ):
            self.int_param(fn, 0, 2**31 - 1)
        for fn in (
            lambda v: lim.consume(1, v),
            lambda v: lim.consume_async(1, v),
            lambda v: lim.consume_with_callback(lambda g, e: None, 1, v),
            lambda v: lim.wrap(open(os.devnull, "rb", buffering=0), v),
            lambda v: lim.open(os.devnull, "rb", priority=v),
        ):
            self.priority_param(fn)
        for fn in (
            lambda v: lim.consume(1, "normal", v),
            lambda v: lim.consume_async(1, "normal", v),
        ):
            self.timeout_param(fn)
        self.int_param(lambda v: lim.open(os.devnull, "rb", buffering=v), -1, 2**31 - 1)
        for v in [None, 1, b"rb"]:
            self.refused(lambda v: lim.open(os.devnull, v), v, ArgumentTypeError, TypeError)
        self.refused(lambda v: lim.open(os.devnull, v), "r", InvalidArgument, ValueError)
        # consume(2**64 + 1) used to consume 1 token.
        self.assertEqual(lim.tokens, before)

    def test_limiter_tuning(self):
        self.int_param(self.lim.set_rate, 1, 2**31 - 1)
        self.int_param(self.lim.set_capacity, 1, 2**31 - 1)
        self.assertEqual((self.lim.tokens_per_second, self.lim.capacity), (1000, 1000))

    # -- FairShare ---------------------------------------------------------

    def test_fair_share(self):
        f = self.fair
        fresh = self.region("fair-fresh")
        self.handle_param(lambda v: shmsched.FairShare.shared(v, {}))
        self.handle_param(shmsched.FairShare.attach)
        for v in [None, 1, [], b"{}"]:
            self.refused(lambda v: shmsched.FairShare.shared(fresh, v), v,
                         ArgumentTypeError, TypeError)
        self.refused(lambda v: shmsched.FairShare.shared(fresh, v), "{\0}",
                     InvalidArgument, ValueError)
        self.int_param(lambda v: shmsched.FairShare.shared(fresh, {}, v), 0, 2**32 - 1)
        self.text_param(lambda v: f.acquire(v, 1, 10, now_ms=1000))
        self.walk(lambda v: f.acquire("a", v, 10, now_ms=1000), NOT_REALS, BAD_REALS,
                  InvalidArgument, ValueError, named=False)
        self.int_param(lambda v: f.acquire("a", 1, v, now_ms=1000), 0, 2**64 - 1)
        self.int_param(lambda v: f.acquire("a", 1, 10, now_ms=v), 0, 2**64 - 1, True)
        self.text_param(lambda v: f.release(v, now_ms=1000))
        self.int_param(lambda v: f.release("a1", now_ms=v), 0, 2**64 - 1, True)
        self.int_param(lambda v: f.stats(now_ms=v), 0, 2**64 - 1, True)

    # -- Module functions ----------------------------------------------------

    def test_module_functions(self):
        self.int_param(shmsched.strerror, 0, 2**32 - 1)
        self.priority_param(shmsched.priority_value)

    def test_the_table_is_large(self):
        # Every test above ran; this one only says how large the table is
        # when run alone (a smoke check that the helpers call anything).
        self.int_param(shmsched.strerror, 0, 2**32 - 1)
        self.assertGreater(self.calls, 20)


class EdgeValuesAreAccepted(RegionTest):
    """The other side of the table: every edge of a range, the infinite
    timeout and huge finite ones work."""

    def test_scheduler_max_edges(self):
        for m in (0, 1, 64, 65536):
            s = shmsched.Scheduler.shared(self.region(f"max{m}"), m)
            self.assertEqual(s.concurrency, m)
        child = shmsched.Scheduler.shared(self.region("child"), 2).child(2**31 - 1, low=0)
        self.assertEqual(child.concurrency, 2**31 - 1)

    def test_priorities_and_timeouts(self):
        s = shmsched.Scheduler.shared(self.region("edges"), 1)
        for p in (-3, 3, "HIGHEST", " low ", "-3", "+2"):
            s.acquire(p).release()
        for t in (None, INF, 1e300, 10**30, 0.5, 1, datetime.timedelta(days=10**6)):
            s.acquire("normal", timeout=t).release()
        held = s.acquire()
        for t in (0, 0.0, -0.0, datetime.timedelta(0)):
            with self.assertRaises(shmsched.Timeout):
                s.acquire("normal", timeout=t)
        held.release()

    def test_limiter_edges(self):
        lim = shmsched.Limiter.shared(self.region("lim"), 2**31 - 1)
        self.assertTrue(lim.consume(0).immediate)
        self.assertTrue(lim.try_consume(2**31 - 1))
        lim.set_rate(1)
        lim.set_capacity(2**31 - 1)
        self.assertEqual(lim.capacity, 2**31 - 1)

    def test_numpy_like_integers_are_ints(self):
        class Index:
            def __init__(self, v):
                self.v = v

            def __index__(self):
                return self.v

        s = shmsched.Scheduler.shared(self.region("index"), Index(3))
        self.assertEqual(s.concurrency, 3)
        s.acquire(Index(1)).release()
        with self.assertRaises(OutOfRange):
            shmsched.Scheduler.shared(self.region("index2"), Index(2**32 + 2))


if __name__ == "__main__":
    unittest.main()
