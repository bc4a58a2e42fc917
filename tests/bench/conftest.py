"""The bench/ smoke tests import bench/'s modules (`import common`): bench/ on sys.path.
(Test modules take `BENCH` and `ROOT` from tests.support.scripts; they are bound here too
for a module that still imports them from this conftest.)"""

import sys

from tests.support.scripts import BENCH, ROOT  # noqa: F401

if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
