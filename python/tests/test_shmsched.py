"""Tests of the Python binding (stdlib only): python3 -m unittest discover python/tests

Run against the library named by SHMSCHED_LIB (ffi/tests/python.rs sets it
to the freshly built one), else target/release or target/debug.
"""

import ctypes
import io
import os
import subprocess
import sys
import tempfile
import threading
import unittest

import shmsched

from common import RegionTest, run_in_fork, temp_path


class Versions(unittest.TestCase):
    def test_abi_version_matches(self):
        self.assertEqual(shmsched._lib.shmsched_abi_version(), shmsched.ABI_VERSION)
        self.assertGreaterEqual(shmsched._lib.shmsched_layout_version(), 2)

    def test_panic_becomes_an_error(self):
        with self.assertRaises(shmsched.InternalError) as cm:
            shmsched._debug_panic()
        self.assertIn("the library panicked", str(cm.exception))
        self.assertEqual(cm.exception.status, 24)


class ParityTest(unittest.TestCase):
    """Every function of the C header is bound (shmsched._ffi.SIGNATURES),
    and nothing is bound that the header lacks."""

    def test_every_header_function_is_bound(self):
        import re

        header = os.path.join(
            os.path.dirname(__file__), "..", "..", "ffi", "include", "shmsched.h"
        )
        with open(header) as f:
            text = f.read()
        text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
        text = re.sub(r"//[^\n]*", "", text)
        declared = set(re.findall(r"\b(shmsched_[a-z0-9_]+)\s*\(", text))
        bound = set(shmsched._ffi.SIGNATURES)
        self.assertEqual(sorted(declared - bound), [], "C functions without a binding")
        self.assertEqual(sorted(bound - declared), [], "bindings of no C function")
        for name in declared:
            self.assertTrue(hasattr(shmsched._lib, name), name)


class SchedulerTest(RegionTest):
    def test_with_acquire_releases(self):
        sched = shmsched.Scheduler.shared(self.region("with"), 2)
        with sched.acquire("high") as permit:
            self.assertEqual(sched.global_running, 1)
            self.assertFalse(permit.released)
        self.assertTrue(permit.released)
        self.assertEqual(sched.global_running, 0)

    def test_release_twice_is_an_error(self):
        sched = shmsched.Scheduler.shared(self.region("twice"), 2)
        permit = sched.acquire()
        permit.release()
        with self.assertRaises(shmsched.AlreadyReleased) as cm:
            permit.release()
        self.assertIn("already released", str(cm.exception))
        self.assertEqual(sched.global_running, 0)

    def test_try_acquire_and_timeout_when_full(self):
        sched = shmsched.Scheduler.shared(self.region("full"), 1)
        held = sched.acquire("normal")
        self.assertIsNone(sched.try_acquire("highest"))
        with self.assertRaises(shmsched.Timeout) as cm:
            sched.acquire("low", timeout=0.005)
        self.assertIsInstance(cm.exception, TimeoutError)
        self.assertEqual(sched.global_running, 1)
        held.release()
        got = sched.try_acquire("low")
        self.assertIsNotNone(got)
        got.release()

    def test_priorities_by_name_and_value(self):
        sched = shmsched.Scheduler.shared(self.region("prio"), 3)
        for p in ["lowest", "LOW", "normal", 2, -3, "3"]:
            sched.acquire(p).release()
        with self.assertRaises(shmsched.InvalidPriority) as cm:
            sched.acquire(7)
        self.assertIn("priority 7 is out of range", str(cm.exception))
        self.assertIn("-3..=3", str(cm.exception))
        with self.assertRaises(shmsched.InvalidPriority):
            sched.acquire("urgent")

    def test_errors_carry_the_library_text(self):
        p = temp_path("exists")
        self.paths.append(p)
        shmsched.Region.create(p).close()
        with self.assertRaises(shmsched.AlreadyExists) as cm:
            shmsched.Region.create(p)
        self.assertIn(p, str(cm.exception))
        with self.assertRaises(shmsched.InvalidArgument) as cm:
            shmsched.Region.create(temp_path("ww"), mode=0o666)
        self.assertIn("world-writable", str(cm.exception))

    def test_wrong_kind_mismatch_zero_and_disposed(self):
        r = self.region("kinds")
        sched = shmsched.Scheduler.shared(r, 2)
        with self.assertRaises(shmsched.WrongKind):
            shmsched.Limiter.shared(r, 1000)
        with self.assertRaises(shmsched.Mismatch):
            shmsched.Scheduler.shared(r, 3)
        self.assertEqual(shmsched.Scheduler.attach(r).concurrency, 2)
        sched.dispose()
        self.assertTrue(sched.disposed)
        with self.assertRaises(shmsched.Disposed):
            sched.acquire()
        zero = shmsched.Scheduler.shared(self.region("zero"), 0)
        with self.assertRaises(shmsched.ZeroConcurrency):
            zero.acquire()

    def test_child_caps_and_stats(self):
        r = self.region("child")
        sched = shmsched.Scheduler.shared(r, 4, low=1)
        child = sched.child(2)
        a = child.acquire()
        b = child.acquire()
        self.assertIsNone(child.try_acquire())
        self.assertEqual(sched.global_running, 2)
        st = sched.stats()
        self.assertEqual(st["shared"]["running"], 2)
        self.assertEqual(st["shared"]["max"], 4)
        a.release()
        b.release()
        self.assertEqual(r.info()["kind"], "scheduler")

    def test_threads_share_the_budget_and_wait_without_the_gil(self):
        sched = shmsched.Scheduler.shared(self.region("threads"), 2)
        lock = threading.Lock()
        running = [0]
        worst = [0]

        def work():
            for _ in range(200):
                with sched.acquire("normal"):
                    with lock:
                        running[0] += 1
                        worst[0] = max(worst[0], running[0])
                    with lock:
                        running[0] -= 1

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
            self.assertFalse(t.is_alive())
        self.assertLessEqual(worst[0], 2)
        self.assertEqual(sched.global_running, 0)

    def test_fork_child_cannot_use_parent_handles(self):
        r = self.region("fork")
        sched = shmsched.Scheduler.shared(r, 2)
        permit = sched.acquire()

        def child():
            try:
                sched.acquire()
                return 1
            except shmsched.Forked:
                pass
            try:
                permit.release()
                return 2
            except shmsched.ForeignPermit:
                pass
            mine = shmsched.Scheduler.attach(r)
            with mine.acquire("high"):
                if mine.global_running != 2:
                    return 3
            return 0

        self.assertEqual(run_in_fork(child), 0)
        self.assertEqual(sched.global_running, 1, "the child's refusals freed nothing")
        permit.release()

    def test_anonymous_region_passes_to_an_exec_child(self):
        region = shmsched.Region.anonymous()
        sched = shmsched.Scheduler.shared(region, 5)
        held = sched.acquire()
        fd = region.dup_fd()
        try:
            code = (
                "import shmsched, sys\n"
                "r = shmsched.Region.open_fd(int(sys.argv[1]))\n"
                "s = shmsched.Scheduler.attach(r)\n"
                "print(s.concurrency, s.global_running)\n"
            )
            out = subprocess.run(
                [sys.executable, "-c", code, str(fd)],
                pass_fds=[fd],
                capture_output=True,
                text=True,
                timeout=60,
                env=os.environ,
            )
        finally:
            os.close(fd)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), ["5", "1"])
        held.release()


class WholeApiTest(RegionTest):
    """What the binding lacked: weighted acquires, the ceiling, burst
    capacities, live retuning, the C stats struct, callbacks."""

    def test_acquire_many_takes_all_or_nothing(self):
        sched = shmsched.Scheduler.shared(self.region("many"), 4)
        three = sched.acquire_many(3, "high")
        self.assertEqual((three.units, sched.global_running), (3, 3))
        self.assertIsNone(sched.try_acquire_many(2))
        with self.assertRaises(shmsched.Timeout):
            sched.acquire_many(2, timeout=0.01)
        self.assertEqual(sched.global_running, 3, "a timed-out weighted wait took nothing")
        one = sched.try_acquire_many(1)
        self.assertIsNotNone(one)
        one.release()
        three.release()
        self.assertEqual(sched.global_running, 0)
        with self.assertRaises(shmsched.InvalidArgument) as cm:
            sched.acquire_many(5)
        self.assertIn("5", str(cm.exception))
        with self.assertRaises(shmsched.InvalidArgument) as cm:
            sched.acquire_many(0)
        self.assertIn("at least 1", str(cm.exception))
        with self.assertRaises(shmsched.InvalidArgument):
            sched.try_acquire_many(0)

    def test_set_ceiling_for_every_process(self):
        r = self.region("ceiling")
        sched = shmsched.Scheduler.shared(r, 4)
        other = shmsched.Scheduler.attach(r)
        self.assertEqual(sched.ceiling, 4)
        self.assertTrue(sched.set_ceiling(2))
        self.assertEqual(other.ceiling, 2)
        a, b = other.acquire(), other.acquire()
        self.assertIsNone(sched.try_acquire("highest"))
        with self.assertRaises(shmsched.InvalidArgument) as cm:
            sched.set_ceiling(5)
        self.assertIn("above the region's max 4", str(cm.exception))
        self.assertFalse(sched.set_ceiling(1), "two held: the lower ceiling is not reached yet")
        a.release()
        b.release()
        sched.set_ceiling(4)
        four = [sched.acquire() for _ in range(4)]
        self.assertEqual(sched.global_running, 4)
        for p in four:
            p.release()

    def test_limiter_capacity_rate_and_retuning(self):
        r = self.region("burst")
        lim = shmsched.Limiter.shared(r, 1000, capacity=100)
        self.assertEqual((lim.tokens_per_second, lim.capacity), (1000, 100))
        self.assertTrue(lim.try_consume(100))
        self.assertFalse(lim.try_consume(1), "the burst is spent")
        with self.assertRaises(shmsched.Mismatch):
            shmsched.Limiter.shared(r, 1000)
        other = shmsched.Limiter.attach(r)
        lim.set_rate(5000)
        lim.set_capacity(50)
        self.assertEqual((other.tokens_per_second, other.capacity), (5000, 50))
        child = lim.child(10, capacity=3)
        self.assertEqual((child.tokens_per_second, child.capacity), (10, 3))
        with self.assertRaises(shmsched.InvalidArgument) as cm:
            lim.set_rate(0)
        self.assertIn("tokens_per_second 0 is out of range", str(cm.exception))

    def test_snapshots_match_the_json_stats(self):
        sched = shmsched.Scheduler.shared(self.region("snap"), 3, low=1)
        held = sched.acquire_many(2)
        snap, st = sched.snapshot(), sched.stats()
        self.assertEqual(snap.shared["running"], st["shared"]["running"])
        self.assertEqual(snap.shared["max"], 3)
        self.assertEqual(snap.concurrency, st["concurrency"])
        held.release()
        lim = shmsched.Limiter.shared(self.region("limsnap"), 1000)
        lim.consume(400)
        ls = lim.snapshot()
        self.assertEqual(ls.tokens_per_second, 1000)
        self.assertLessEqual(ls.tokens, 1000)
        self.assertEqual(ls.shared["processes"], 1)

    def test_limiter_snapshot_counts_tokens_consumed_and_refunded(self):
        r = self.region("limctr")
        lim = shmsched.Limiter.shared(r, 1000)
        other = shmsched.Limiter.attach(r)
        # 360 of a full bucket of 1000: everything goes at once.
        lim.consume(200, "high")
        ws = shmsched.Waitset()
        try:
            # Granted at start, cancelled before it is taken: refunded.
            ws.cancel(ws.start_consume(lim, 100, "high"))
            (done,) = ws.take()
            self.assertIsInstance(done.error, shmsched.Cancelled)
        finally:
            ws.close()
        self.assertTrue(lim.try_consume(10))  # counted at normal
        other.consume(50, "low")
        hi, normal, lo = 1 + 3, 0 + 3, -1 + 3
        s = lim.snapshot()
        want = [0] * 7
        want[hi], want[normal] = 300, 10
        self.assertEqual(s.consumed, want)
        self.assertEqual(s.refunded, [0, 0, 0, 0, 100, 0, 0])
        assert s.shared is not None
        want[lo] = 50
        self.assertEqual(s.shared["consumed"], want)
        self.assertEqual(s.shared["refunded"], [0, 0, 0, 0, 100, 0, 0])
        o = other.snapshot()
        self.assertEqual(o.consumed, [0, 0, 50, 0, 0, 0, 0])
        self.assertEqual(o.refunded, [0] * 7)
        self.assertEqual(o.shared["consumed"], want)
        # The JSON stats say the same.
        st = lim.stats()
        self.assertEqual([q["consumed"] for q in st["queues"]], s.consumed)
        self.assertEqual([q["refunded"] for q in st["queues"]], s.refunded)
        self.assertEqual(st["shared"]["consumed"], s.shared["consumed"])
        self.assertEqual(st["shared"]["refunded"], s.shared["refunded"])

    def test_limiter_stats_struct_matches_the_library(self):
        # Offered more room than any version needs, the library fills (and
        # reports) exactly its own sizeof: the ctypes mirror must match.
        lim = shmsched.Limiter.shared(self.region("limsize"), 1000)
        big = (ctypes.c_uint8 * 4096)()
        ctypes.c_uint32.from_buffer(big).value = len(big)
        st = shmsched._lib.shmsched_limiter_get_stats(
            lim._h, ctypes.cast(big, ctypes.POINTER(shmsched._ffi.LimiterStats))
        )
        self.assertEqual(st, 0)
        self.assertEqual(
            ctypes.c_uint32.from_buffer(big).value, ctypes.sizeof(shmsched._ffi.LimiterStats)
        )

    def test_callbacks_run_on_a_library_thread(self):
        sched = shmsched.Scheduler.shared(self.region("cb"), 1)
        held = sched.acquire()
        got = []
        done = threading.Event()

        def on_permit(permit, error):
            got.append((permit, error, threading.get_ident()))
            done.set()

        sched.acquire_with_callback(on_permit, "high")
        held.release()
        self.assertTrue(done.wait(30))
        permit, error, ident = got[0]
        self.assertIsNone(error)
        self.assertNotEqual(ident, threading.get_ident())
        self.assertEqual(sched.global_running, 1)
        permit.release()
        done.clear()
        held = sched.acquire()
        sched.acquire_with_callback(on_permit, "low", timeout=0.01)
        self.assertTrue(done.wait(30))
        self.assertIsInstance(got[1][1], shmsched.Timeout)
        held.release()
        lim = shmsched.Limiter.shared(self.region("cblim"), 1000)
        done.clear()
        lim.consume_with_callback(lambda g, e: (got.append((g, e)), done.set()), 10)
        self.assertTrue(done.wait(30))
        self.assertEqual(got[2], (shmsched.Grant(True, False), None))


class PermitCollectedTest(RegionTest):
    def test_a_collected_permit_gives_its_slot_back_and_warns(self):
        import gc
        import warnings

        sched = shmsched.Scheduler.shared(self.region("gc"), 2)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            sched.acquire("high")  # dropped at once
            sched.acquire_many(2)
            gc.collect()
        self.assertEqual(sched.global_running, 0)
        kinds = [w.category for w in seen]
        self.assertEqual(kinds, [ResourceWarning, ResourceWarning], [str(w.message) for w in seen])
        self.assertIn("garbage-collected without release()", str(seen[0].message))
        # A released permit and one in a `with` do not warn.
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            sched.acquire().release()
            with sched.acquire():
                pass
            gc.collect()
        self.assertEqual(seen, [])

    def test_a_forked_childs_copy_is_not_released(self):
        import gc
        import warnings

        sched = shmsched.Scheduler.shared(self.region("gcfork"), 2)
        box = [sched.acquire()]

        def child():
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                box.pop()  # the child's copy, collected here
                gc.collect()
            return 1 if seen else 0

        self.assertEqual(run_in_fork(child), 0)
        self.assertEqual(sched.global_running, 1, "the child's copy released nothing")
        box[0].release()


class CountingLimiter:
    """Counts what a throttled file charges, then charges the real limiter."""

    def __init__(self, lim):
        self.lim = lim
        self.total = 0

    def consume(self, n, priority):
        self.total += n
        return self.lim.consume(n, priority)


class LimiterTest(RegionTest):
    def test_consume_try_and_timeout(self):
        lim = shmsched.Limiter.shared(self.region("lim"), 1000)
        self.assertEqual(lim.tokens_per_second, 1000)
        g = lim.consume(1000, "normal")
        self.assertTrue(g.immediate)
        self.assertFalse(lim.try_consume(900))
        with self.assertRaises(shmsched.Timeout):
            lim.consume(900, "low", timeout=0.001)
        with self.assertRaises(shmsched.InvalidArgument) as cm:
            lim.consume(3_000_000_000)
        self.assertIn("3000000000", str(cm.exception))

    def test_throttled_file_charges_every_byte(self):
        lim = shmsched.Limiter.shared(self.region("file"), 50_000_000)
        data = os.urandom(300_000)
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "src")
            with open(src, "wb") as f:
                f.write(data)
            counting = CountingLimiter(lim)
            raw = shmsched.ThrottledFile(open(src, "rb", buffering=0), counting, "low")
            with io.BufferedReader(raw, 8192) as f:
                self.assertEqual(f.read(), data)
            self.assertEqual(counting.total, len(data), "every byte read, once")
            dst = os.path.join(d, "dst")
            counting = CountingLimiter(lim)
            raw = shmsched.ThrottledFile(open(dst, "wb", buffering=0), counting, "high")
            with io.BufferedWriter(raw, 8192) as f:
                for k in range(0, len(data), 1000):
                    f.write(data[k : k + 1000])
            self.assertEqual(counting.total, len(data), "every byte written, once")
            # Limiter.open is the same wrapper, buffered.
            with lim.open(src, "rb", priority="low") as f:
                self.assertEqual(f.read(), data)
            with lim.open(dst, "wb") as f:
                f.write(data)
            with open(dst, "rb") as f:
                self.assertEqual(f.read(), data)
            with self.assertRaises(shmsched.InvalidArgument):
                lim.open(src, "r")


class FairShareTest(RegionTest):
    CONFIG = {
        "ceiling": 100,
        "fairness_unit": "cost",
        "tenants": [{"id": "a", "weight": 1}, {"id": "b", "weight": 1}],
        "reclaim_horizon_ms": 100,
        "idle_after_ms": 1000,
        "started_at_ms": 0,
    }

    def test_lease_refusal_release_stats(self):
        fair = shmsched.FairShare.shared(self.region("fair"), self.CONFIG)
        own = fair.acquire("b", 50, 1000, now_ms=2000)
        self.assertTrue(own)
        self.assertEqual(own.id, "b1")
        loan = fair.acquire("b", 50, 100, now_ms=2000)
        self.assertTrue(loan)
        refused = fair.acquire("a", 50, 100, now_ms=2010)
        self.assertFalse(refused)
        self.assertEqual(refused.reason, "guarantee_on_loan")
        self.assertEqual(refused.retry_after_ms, 90)
        self.assertIn("50", refused.explanation)
        fair.release(loan, now_ms=2020)
        with self.assertRaises(shmsched.AlreadyReleased):
            fair.release(loan.id, now_ms=2021)
        with self.assertRaises(shmsched.UnknownTenant):
            fair.acquire("nobody", 1, 1, now_ms=2022)
        # In a region an earlier now is taken at the last accepted one (2020).
        late = fair.acquire("a", 1, 1, now_ms=10)
        self.assertTrue(late)
        self.assertEqual(late.deadline_ms, 2021)
        st = fair.stats(now_ms=2030)
        self.assertEqual(st["tenants"]["b"]["held"], 50)
        self.assertEqual(st["tenants"]["a"]["guarantee"], 50)

    def test_now_variants_read_the_shared_clock(self):
        fair = shmsched.FairShare.shared(self.region("fairnow"), self.CONFIG)
        before = shmsched.FairShare.monotonic_ms()
        lease = fair.acquire("a", 10, 100)
        self.assertTrue(lease)
        self.assertGreaterEqual(lease.deadline_ms, before + 100)
        self.assertEqual(fair.stats()["tenants"]["a"]["held"], 10)
        fair.release(lease)
        self.assertEqual(fair.stats()["tenants"]["a"]["held"], 0)


if __name__ == "__main__":
    unittest.main()
