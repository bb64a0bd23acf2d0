"""A Python worker of the mixed-language tests (ffi/tests/mixed.rs); the
same roles and line protocol as worker.c (see there)."""

import asyncio
import random
import sys
import threading
import time

import shmsched


def say(line):
    print(line, flush=True)


def sched_hold(path, prio):
    sched = shmsched.Scheduler.attach(shmsched.Region.open(path))
    sched.set_lottery(0, False)
    say("ready")
    permit = sched.acquire(prio)
    say("got")
    sys.stdin.readline()
    permit.release()
    say("released")


def sched_churn(path, seconds):
    sched = shmsched.Scheduler.attach(shmsched.Region.open(path))
    say("ready")
    if not sys.stdin.readline():
        return
    end = time.monotonic() + float(seconds)
    n = 0
    while time.monotonic() < end:
        with sched.acquire(random.randint(-3, 3)):
            hold = time.monotonic() + random.random() * 0.0002
            while time.monotonic() < hold:
                pass
        n += 1
    say(f"done {n}")


def lim_consume(path, chunk):
    lim = shmsched.Limiter.attach(shmsched.Region.open(path))
    chunk = int(chunk)
    say("ready")
    line = sys.stdin.readline().split()
    if len(line) != 2 or line[0] != "go":
        return
    origin = int(line[1])
    stop = threading.Event()

    def watch():
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    buckets = {}
    total = 0
    while not stop.is_set():
        lim.consume(chunk, "normal")
        at = time.monotonic_ns()
        total += chunk
        if at >= origin:
            i = (at - origin) // 10_000_000
            buckets[i] = buckets.get(i, 0) + chunk
    for i in sorted(buckets):
        say(f"bucket {i} {buckets[i]}")
    say(f"consumed {total}")


def sched_async(path):
    """asyncio waiters (no thread per wait): one at highest that is
    cancelled on "cancel", one at low that is served; "release" releases."""
    sched = shmsched.Scheduler.attach(shmsched.Region.open(path))
    sched.set_lottery(0, False)

    async def main():
        loop = asyncio.get_running_loop()

        def line():
            return loop.run_in_executor(None, sys.stdin.readline)

        doomed = asyncio.create_task(sched.acquire_async("highest"))
        served = asyncio.create_task(sched.acquire_async("low"))
        await asyncio.sleep(0)  # both waits started
        say("ready")
        if (await line()).strip() != "cancel":
            return
        doomed.cancel()
        try:
            await doomed
        except asyncio.CancelledError:
            say("cancelled")
        permit = await served
        say("got")
        await line()
        permit.release()
        say("released")

    asyncio.run(main())


ROLES = {
    "sched-hold": sched_hold,
    "sched-async": sched_async,
    "sched-churn": sched_churn,
    "lim-consume": lim_consume,
}

if __name__ == "__main__":
    ROLES[sys.argv[1]](*sys.argv[2:])
