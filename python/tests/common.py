"""What the Python tests share: region paths unique to the test and the
process, removed afterwards (nothing is left in /dev/shm)."""

import itertools
import os
import signal
import time
import traceback
import unittest

_names = itertools.count()


def temp_path(tag):
    return f"/dev/shm/shmsched-pytest-{tag}-{os.getpid()}-{next(_names)}"


class RegionTest(unittest.TestCase):
    def setUp(self):
        self.paths = []

    def tearDown(self):
        for p in self.paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    def region(self, tag, **kw):
        import shmsched

        p = temp_path(tag)
        self.paths.append(p)
        return shmsched.Region.create(p, **kw)


def run_in_fork(fn, timeout=60):
    """Runs ``fn()`` in a forked child and returns the child's exit code:
    what ``fn`` returned (0 for success), or 99 if it raised. A child that
    has not exited after ``timeout`` seconds is killed and the test fails."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = fn() or 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the forked child did not exit within {timeout} s")
        time.sleep(0.005)
