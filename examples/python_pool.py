"""A multiprocessing pool sharing one concurrency cap and one byte-rate
budget with every other process (in any language) bound to the same
regions.

    PYTHONPATH=python python3 examples/python_pool.py --workers 4 --cap 2 --tasks 200

The master creates two named regions (a Scheduler and a Limiter); each pool
worker attaches to them in its initializer (handles belong to the process
that made them, so workers make their own), then runs "requests": acquire
a slot at a priority from the demo's mix, read a file through the
throttled reader, release. The master prints what each priority got, and
that the cap held (every worker checks the global running count while it
holds its slot).

Needs the package: `pip install ./python` (then run it without PYTHONPATH),
or the library built in the checkout (`cargo build --release -p
shmsched-ffi`, or SHMSCHED_LIB set) with PYTHONPATH=python.
"""

import argparse
import multiprocessing
import os
import random
import sys
import time

import shmsched

MIX = [("highest", 5), ("high", 20), ("normal", 40), ("low", 25), ("lowest", 10)]

_sched = None
_lim = None


def attach(sched_path, lim_path):
    """Pool initializer: this worker's own handles on the shared regions."""
    global _sched, _lim
    _sched = shmsched.Scheduler.attach(shmsched.Region.open(sched_path))
    _lim = shmsched.Limiter.attach(shmsched.Region.open(lim_path))


def request(args):
    """One request: returns (priority, wait seconds, bytes read, running seen)."""
    priority, path = args
    t0 = time.monotonic()
    with _sched.acquire(priority):
        waited = time.monotonic() - t0
        running = _sched.global_running
        with _lim.open(path, "rb", priority=priority) as f:
            data = f.read(256 * 1024)
        time.sleep(random.uniform(0.002, 0.02))  # work while holding the slot
    return priority, waited, len(data), running


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--cap", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--rate", type=int, default=32_000_000, help="bytes per second, all processes")
    ap.add_argument("--file", default=sys.executable)
    a = ap.parse_args()

    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    sched_path = f"/dev/shm/shmsched-pool-sched-{tag}"
    lim_path = f"/dev/shm/shmsched-pool-bytes-{tag}"
    sched = shmsched.Scheduler.shared(shmsched.Region.create(sched_path), a.cap)
    lim = shmsched.Limiter.shared(shmsched.Region.create(lim_path), a.rate)
    try:
        names = [n for n, _ in MIX]
        weights = [w for _, w in MIX]
        jobs = [(random.choices(names, weights)[0], a.file) for _ in range(a.tasks)]
        t0 = time.monotonic()
        with multiprocessing.Pool(a.workers, attach, (sched_path, lim_path)) as pool:
            results = pool.map(request, jobs, chunksize=1)
        elapsed = time.monotonic() - t0
        worst = max(r[3] for r in results)
        total_bytes = sum(r[2] for r in results)
        print(f"python_pool: {a.workers} workers, cap {a.cap}, {a.tasks} requests in {elapsed:.2f} s")
        print(f"{'priority':<8} {'tasks':>6} {'avg wait ms':>12}")
        for name in names:
            mine = [r for r in results if r[0] == name]
            if mine:
                avg = 1000 * sum(r[1] for r in mine) / len(mine)
                print(f"{name:<8} {len(mine):>6} {avg:>12.2f}")
        print(f"max running seen by a holder {worst} of cap {a.cap}")
        print(f"bytes read {total_bytes} (budget {a.rate} B/s)")
        print(f"running after the pool {sched.global_running}")
        ok = worst <= a.cap and sched.global_running == 0 and len(results) == a.tasks
        print("ok" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        sched.close()
        lim.close()
        for p in (sched_path, lim_path):
            shmsched.Region.remove(p)


if __name__ == "__main__":
    sys.exit(main())
