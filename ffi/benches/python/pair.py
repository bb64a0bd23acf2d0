"""One uncontended acquire + release pair from Python, timed like
benches/c/pair.c: a scheduler shared through an anonymous region (max 8),
ROUNDS rounds of ITERS pairs, the median round in ns per pair. Two rows:
the bare ctypes calls, and the binding's `with sched.acquire():`.

usage: pair.py ITERS ROUNDS  (with the binding on PYTHONPATH)
"""

import ctypes
import statistics
import sys
import time

import shmsched

iters, rounds = int(sys.argv[1]), int(sys.argv[2])
region = shmsched.Region.anonymous()
sched = shmsched.Scheduler.shared(region, 8)
lib = shmsched._lib
h = sched._h
acquire, release = lib.shmsched_scheduler_acquire, lib.shmsched_permit_release
permit = shmsched._ffi.Permit()
ref = ctypes.byref(permit)


def raw():
    for _ in range(iters):
        if acquire(h, 0, ref) != 0 or release(permit) != 0:
            raise SystemExit("pair failed")


def binding():
    for _ in range(iters):
        with sched.acquire("normal"):
            pass


for name, fn in [("ctypes_raw", raw), ("binding_with", binding)]:
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        fn()
        per.append((time.perf_counter_ns() - t0) / iters)
    print(f"{name} {statistics.median(per):.1f}")
