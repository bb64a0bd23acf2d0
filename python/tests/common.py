"""What the Python tests share: region paths unique to the test and the
process, removed afterwards (nothing is left in /dev/shm)."""

import itertools
import os
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
