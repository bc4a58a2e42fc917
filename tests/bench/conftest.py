"""The bench/ smoke tests import bench/'s modules (`import common`): bench/ on sys.path."""

import sys

from tests.support.scripts import BENCH

if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
