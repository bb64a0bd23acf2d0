"""asyncio: waits that take no thread each, cancellation that takes nothing
and leaves no waiter, and 5,000 pending waits on one scheduler (start time,
event-loop lag, drain time; the figures are printed to stderr)."""

import asyncio
import gc
import os
import sys
import time
import unittest
import warnings

import shmsched

from common import RegionTest


def os_threads():
    """The threads of this process, as the kernel counts them."""
    return len(os.listdir("/proc/self/task"))


class Ticker:
    """A coroutine that sleeps 1 ms at a time and records how late it woke:
    the event loop's lag."""

    def __init__(self, period=0.001):
        self.period = period
        self.worst = 0.0
        self.task = None

    async def run(self):
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(self.period)
            self.worst = max(self.worst, loop.time() - t - self.period)

    def start(self):
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self):
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass


class AioTest(RegionTest):
    def shared_waiters(self, sched):
        return sum(sched.snapshot().shared["waiters"])

    async def until(self, what, cond, limit=30.0):
        end = time.monotonic() + limit
        while not cond():
            if time.monotonic() > end:
                self.fail(f"timed out waiting for {what}")
            await asyncio.sleep(0.001)


class AsyncApiTest(AioTest):
    def test_async_with_and_await(self):
        sched = shmsched.Scheduler.shared(self.region("with"), 2)

        async def main():
            async with sched.acquire_async("high") as permit:
                self.assertEqual(sched.global_running, 1)
                self.assertFalse(permit.released)
            self.assertTrue(permit.released)
            p = await sched.acquire_async()
            q = await sched.acquire_async("low", timeout=5)
            self.assertEqual(sched.global_running, 2)
            # Full: this one waits until p is released by another task.
            later = asyncio.create_task(sched.acquire_async("highest"))
            await self.until("the waiter queued", lambda: self.shared_waiters(sched) == 1)
            p.release()
            r = await asyncio.wait_for(later, 30)
            self.assertEqual(r.priority, "highest")
            r.release()
            q.release()
            many = await sched.acquire_many_async(2, "normal")
            self.assertEqual((many.units, sched.global_running), (2, 2))
            many.release()

        asyncio.run(main())
        self.assertEqual(sched.global_running, 0)

    def test_async_timeout_takes_nothing(self):
        sched = shmsched.Scheduler.shared(self.region("timeout"), 1)
        held = sched.acquire()

        async def main():
            with self.assertRaises(shmsched.Timeout):
                await sched.acquire_async("normal", timeout=0.02)
            with self.assertRaises(shmsched.Timeout):
                await sched.acquire_many_async(1, "low", timeout=0)

        asyncio.run(main())
        self.assertEqual(self.shared_waiters(sched), 0)
        self.assertEqual(sched.global_running, 1)
        held.release()

    def test_errors_come_from_the_wait(self):
        sched = shmsched.Scheduler.shared(self.region("errors"), 2)

        async def main():
            with self.assertRaises(shmsched.InvalidArgument):
                await sched.acquire_many_async(3)
            held = sched.acquire()
            waiting = asyncio.create_task(sched.acquire_many_async(2))
            await self.until("the waiter queued", lambda: self.shared_waiters(sched) == 1)
            sched.dispose()
            with self.assertRaises(shmsched.Disposed):
                await asyncio.wait_for(waiting, 30)
            held.release()

        asyncio.run(main())
        self.assertEqual(self.shared_waiters(sched), 0)

    def test_consume_async(self):
        lim = shmsched.Limiter.shared(self.region("lim"), 1000)

        async def main():
            g = await lim.consume_async(1000)
            self.assertTrue(g.immediate)
            t0 = time.monotonic()
            g = await lim.consume_async(100, "high")
            self.assertFalse(g.immediate)
            self.assertGreaterEqual(time.monotonic() - t0, 0.05)
            with self.assertRaises(shmsched.Timeout):
                await lim.consume_async(1000, "low", timeout=0.01)

        asyncio.run(main())
        self.assertEqual(lim.snapshot().pending, 0)

    def test_consume_async_at_once_counts_at_its_priority(self):
        # 1 token/s: nothing measurable refills while the test runs.
        lim = shmsched.Limiter.shared(self.region("limprio"), 1, capacity=1000)
        hi, normal, lo = 1 + 3, 0 + 3, -1 + 3

        async def main():
            g = await lim.consume_async(300, "high")
            self.assertTrue(g.immediate)
            g = await lim.consume_async(200, "low")
            self.assertTrue(g.immediate)

        asyncio.run(main())
        s = lim.snapshot()
        want = [0] * 7
        want[hi], want[lo] = 300, 200
        self.assertEqual(s.consumed, want, "not at normal")
        self.assertEqual(s.shared["consumed"], want)
        self.assertEqual(s.refunded, [0] * 7)
        self.assertEqual(s.consumed[normal], 0)

    def test_try_consume_at(self):
        lim = shmsched.Limiter.shared(self.region("limtry"), 1, capacity=1000)
        self.assertTrue(lim.try_consume_at(600, "high"))
        self.assertFalse(lim.try_consume_at(600, "low"))  # 400 left
        # A child of the emptied root is charged, refused at the root and
        # refunded, both at the priority.
        self.assertTrue(lim.try_consume(400))
        child = lim.child(1, capacity=1000)
        self.assertFalse(child.try_consume_at(250, "low"))
        c = child.snapshot()
        self.assertEqual(c.consumed, [0, 0, 250, 0, 0, 0, 0])
        self.assertEqual(c.refunded, [0, 0, 250, 0, 0, 0, 0])
        self.assertEqual(lim.snapshot().consumed, [0, 0, 0, 400, 600, 0, 0])
        with self.assertRaises(shmsched.InvalidPriority) as e:
            lim.try_consume_at(1, 7)
        self.assertIn("7", str(e.exception))


class CancellationTest(AioTest):
    def test_cancel_leaves_no_waiter_and_takes_nothing(self):
        sched = shmsched.Scheduler.shared(self.region("cancel"), 2)
        held = [sched.acquire(), sched.acquire()]

        async def main():
            tasks = [
                asyncio.create_task(sched.acquire_async(p))
                for p in ["lowest", "low", "normal", "high", "highest"] * 10
            ]
            await self.until("50 waiters", lambda: self.shared_waiters(sched) == 50)
            for t in tasks:
                t.cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            self.assertTrue(all(isinstance(d, asyncio.CancelledError) for d in done))
            await self.until("no waiter", lambda: self.shared_waiters(sched) == 0)
            # asyncio.timeout (3.11) and wait_for cancel the same way.
            if sys.version_info >= (3, 11):
                with self.assertRaises(TimeoutError):
                    async with asyncio.timeout(0.02):
                        await sched.acquire_async("high")
            with self.assertRaises(asyncio.TimeoutError):
                await asyncio.wait_for(sched.acquire_async("high"), 0.02)
            await self.until("no waiter", lambda: self.shared_waiters(sched) == 0)

        asyncio.run(main())
        st = sched.snapshot().shared
        self.assertEqual((st["running"], st["waiters"]), (2, [0] * 7))
        for p in held:
            p.release()
        self.assertEqual(sched.global_running, 0)

    def test_a_cancelled_consume_charges_nothing(self):
        lim = shmsched.Limiter.shared(self.region("cancel-lim"), 1000)
        lim.consume(1000)  # the bucket is empty now

        def waiters():
            return sum(lim.snapshot().shared["waiters"])

        async def main():
            tasks = [asyncio.create_task(lim.consume_async(900, p)) for p in ("low", "high")]
            await self.until("both consumes queued", lambda: waiters() == 2)
            for t in tasks:
                t.cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            self.assertTrue(all(isinstance(d, asyncio.CancelledError) for d in done))

        asyncio.run(main())
        self.assertEqual(waiters(), 0)
        self.assertGreaterEqual(lim.tokens, 0, "a cancelled consume left the bucket in debt")

    def test_a_grant_racing_the_cancel_is_given_back(self):
        sched = shmsched.Scheduler.shared(self.region("race"), 1)

        async def main():
            for _ in range(200):
                held = sched.acquire()
                t = asyncio.create_task(sched.acquire_async())
                await self.until("queued", lambda: self.shared_waiters(sched) == 1)
                held.release()  # the slot goes to the waiter ...
                t.cancel()  # ... which is cancelled at the same moment
                try:
                    (await t).release()  # the grant won: the task got it
                except asyncio.CancelledError:
                    pass
                await self.until("nothing held", lambda: sched.global_running == 0)
                self.assertEqual(self.shared_waiters(sched), 0)

        asyncio.run(main())

    def test_waits_left_when_the_loop_ends_are_cancelled(self):
        sched = shmsched.Scheduler.shared(self.region("loopend"), 1)
        held = sched.acquire()

        async def main():
            for p in ["low", "high"]:
                asyncio.get_running_loop().create_task(sched.acquire_async(p))
            await self.until("queued", lambda: self.shared_waiters(sched) == 2)
            # Return with both tasks pending: asyncio.run cancels them.

        asyncio.run(main())
        self.assertEqual(self.shared_waiters(sched), 0)
        self.assertEqual(sched.global_running, 1)
        held.release()
        # The finished loop is collected, and its waitset closed with it.
        gc.collect()
        from shmsched import _aio

        self.assertEqual(len(_aio._by_loop), 0, "a finished event loop was kept alive")

    def test_an_unawaited_acquire_starts_nothing(self):
        sched = shmsched.Scheduler.shared(self.region("unawaited"), 1)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            sched.acquire_async("high")
            gc.collect()
        self.assertEqual((sched.global_running, self.shared_waiters(sched)), (0, 0))


class WaitsetTest(AioTest):
    """The waitset under the asyncio API, used directly: one thread (or a
    selector) serving every pending wait."""

    def test_one_thread_serves_every_wait(self):
        import threading

        sched = shmsched.Scheduler.shared(self.region("ws"), 2)
        held = [sched.acquire(), sched.acquire()]
        ws = shmsched.Waitset()
        ids = [ws.start_acquire(sched, "high", tag=100 + i) for i in range(10)]
        self.assertEqual(ws.pending, 10)
        self.assertEqual(self.shared_waiters(sched), 10)
        self.assertEqual(ws.wait(0.01), 0, "nothing is ready yet")
        ws.cancel(ids[0])
        self.assertGreaterEqual(ws.wait(5), 1)
        (c,) = ws.take()
        self.assertTrue(c.cancelled)
        self.assertEqual((c.tag, c.id, c.permit), (100, ids[0], None))
        self.assertIsInstance(c.error, shmsched.Cancelled)
        with self.assertRaises(shmsched.AlreadyReleased):
            ws.cancel(ids[0])
        held.pop().release()
        self.assertGreaterEqual(ws.wait(5), 1)
        (c,) = ws.take()
        self.assertEqual(c.tag, 101, "the oldest waiter at the priority")
        self.assertEqual(sched.global_running, 2)
        c.permit.release()
        # A thread blocked in wait() returns on interrupt().
        back = []
        t = threading.Thread(target=lambda: back.append(ws.wait(None)))
        t.start()
        time.sleep(0.05)
        ws.interrupt()
        t.join(10)
        self.assertFalse(t.is_alive())
        ws.close()  # the 8 still pending are cancelled
        self.assertEqual(self.shared_waiters(sched), 0)
        self.assertEqual(sched.global_running, 1)
        held.pop().release()

    def test_a_selector_watches_the_descriptor(self):
        import selectors

        lim = shmsched.Limiter.shared(self.region("wslim"), 1000)
        lim.consume(1000)
        with shmsched.Waitset() as ws, selectors.DefaultSelector() as sel:
            sel.register(ws, selectors.EVENT_READ)
            ws.start_consume(lim, 100, "low", tag=1)
            ws.start_consume(lim, 1000, "low", timeout=0.01, tag=2)
            got = {}
            end = time.monotonic() + 30
            while len(got) < 2 and time.monotonic() < end:
                if sel.select(5):
                    for c in ws.take():
                        got[c.tag] = c
            self.assertIsInstance(got[2].error, shmsched.Timeout)
            self.assertEqual(got[1].grant, shmsched.Grant(False, False))

    def test_bad_input(self):
        sched = shmsched.Scheduler.shared(self.region("wsbad"), 1)
        lim = shmsched.Limiter.shared(self.region("wsbadlim"), 10)
        with shmsched.Waitset() as ws:
            for call in (
                lambda: ws.start_acquire(None),
                lambda: ws.start_acquire(lim),
                lambda: ws.start_acquire(sched, 1.5),
                lambda: ws.start_acquire(sched, "high", True),
                lambda: ws.start_acquire(sched, "high", 1, "1"),
                lambda: ws.start_consume(sched, 1),
                lambda: ws.start_consume(lim, 2.0),
                lambda: ws.cancel(None),
                lambda: ws.take(1.0),
                lambda: ws.wait("1"),
            ):
                with self.assertRaises(shmsched.ArgumentTypeError):
                    call()
            for call in (
                lambda: ws.start_acquire(sched, "high", 2**32 + 1),
                lambda: ws.start_acquire(sched, "high", 1, None, 2**64),
                lambda: ws.start_consume(lim, 2**64 + 1),
                lambda: ws.cancel(-1),
                lambda: ws.take(0),
                lambda: ws.take(10**6),
            ):
                with self.assertRaises(shmsched.OutOfRange):
                    call()
            with self.assertRaises(shmsched.InvalidPriority):
                ws.start_acquire(sched, 2**32 + 1)
            with self.assertRaises(shmsched.InvalidArgument):
                ws.wait(float("nan"))
            with self.assertRaises(shmsched.InvalidArgument):
                ws.start_acquire(sched, "high", 0)  # the library: n must be at least 1
            self.assertEqual(ws.pending, 0)
        self.assertEqual((sched.global_running, self.shared_waiters(sched)), (0, 0))


class ManyWaitsTest(AioTest):
    WAITS = 5000
    CAP = 8

    def run_waits(self, acquire, release_held):
        """Starts WAITS tasks that each take a slot through ``acquire()``
        (an async context manager) and give it back at once, while the
        CAP slots are held; then ``release_held()`` frees them. Returns the
        figures (seconds; the ticker's lateness is the loop's lag)."""
        figures = {}

        async def one():
            async with acquire():
                pass

        async def main():
            ticker = Ticker()
            ticker.start()
            await asyncio.sleep(0.01)
            threads_before = os_threads()
            t0 = time.perf_counter()
            tasks = [asyncio.create_task(one()) for _ in range(self.WAITS)]
            await asyncio.sleep(0)  # every task ran to its first await
            figures["start"] = time.perf_counter() - t0
            figures["threads_added"] = os_threads() - threads_before
            await asyncio.sleep(0.05)  # the ticker runs (and reports how late)
            figures["start_lag"] = ticker.worst
            ticker.worst = 0.0
            await asyncio.sleep(0.2)  # idle waiting: the loop is free
            figures["idle_lag"] = ticker.worst
            ticker.worst = 0.0
            figures["queued"] = self.queued()
            t1 = time.perf_counter()
            release_held()
            await asyncio.wait_for(asyncio.gather(*tasks), 120)
            figures["drain"] = time.perf_counter() - t1
            figures["drain_lag"] = ticker.worst
            await ticker.stop()

        asyncio.run(main())
        return figures

    def test_5000_pending_waits(self):
        """5,000 tasks wait on one scheduler whose CAP slots are all held;
        then the slots are freed and every task takes one and gives it back
        at once. No thread per wait. The same run with an
        asyncio.Semaphore (in-process, pure asyncio) gives the baseline the
        figures are compared with: what asyncio itself costs."""
        sched = shmsched.Scheduler.shared(self.region("5000"), self.CAP)
        held = [sched.acquire() for _ in range(self.CAP)]
        self.queued = lambda: self.shared_waiters(sched)
        prios = iter(("low", "normal", "high") * self.WAITS)
        ours = self.run_waits(
            lambda: sched.acquire_async(next(prios)), lambda: [p.release() for p in held]
        )
        self.assertEqual(ours["queued"], self.WAITS, "every wait was queued in the region")
        st = sched.snapshot().shared
        self.assertEqual((st["running"], st["waiters"]), (0, [0] * 7))

        # The baseline: a semaphore with its CAP slots taken (value 0), which
        # the same release_held frees.
        sem = asyncio.Semaphore(0)
        self.queued = lambda: self.WAITS
        base = self.run_waits(lambda: sem, lambda: [sem.release() for _ in range(self.CAP)])

        def ms(x):
            return f"{x * 1000:.1f} ms"

        print(
            f"\nasyncio, {self.WAITS} pending waits on cap {self.CAP} (asyncio.Semaphore "
            f"in the same run in brackets): started in {ms(ours['start'])} "
            f"({ms(base['start'])}), loop lag while starting {ms(ours['start_lag'])} "
            f"({ms(base['start_lag'])}), idle {ms(ours['idle_lag'])} ({ms(base['idle_lag'])}), "
            f"drained in {ms(ours['drain'])} ({ms(base['drain'])}), loop lag while "
            f"draining {ms(ours['drain_lag'])} ({ms(base['drain_lag'])}); "
            f"threads added {ours['threads_added']}",
            file=sys.stderr,
        )
        # Loose bounds (the machine is shared): the counts are the test.
        self.assertLessEqual(ours["threads_added"], 2, "no thread per wait")
        self.assertLess(ours["start"], 30)
        self.assertLess(ours["drain"], 60)


if __name__ == "__main__":
    unittest.main()
