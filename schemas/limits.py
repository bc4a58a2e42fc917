"""Limits a plan request must meet, shared by the API (refused at the door) and the workers.

The cap on stage candidates is a setting (`STAGEPROF_MAX_CANDIDATES`), read where it is
used so that the API and every runner apply the value of their own environment.
"""

import os
from collections.abc import Mapping

MAX_CANDIDATES_ENV = "STAGEPROF_MAX_CANDIDATES"
DEFAULT_MAX_CANDIDATES = 20_000

MIB = 2**20
TIB = 2**40
# A device's memory in a plan request: 1 MiB (nothing smaller holds a stage) .. 16 TiB
# (well above any accelerator; beyond it a CPU worker would really try to use host RAM).
MIN_DEVICE_MEMORY_BYTES = MIB
MAX_DEVICE_MEMORY_BYTES = 16 * TIB

MAX_MANUAL_SUBMESHES = 64


def max_candidates(environ: Mapping[str, str] | None = None) -> int:
    """The most stage candidates a job may have: `STAGEPROF_MAX_CANDIDATES`, default 20000.

    Raises ValueError naming the variable when it is set to anything but a positive integer.
    """
    env = os.environ if environ is None else environ
    text = env.get(MAX_CANDIDATES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_CANDIDATES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{MAX_CANDIDATES_ENV} must be a positive integer, got {text!r}")
    return value
