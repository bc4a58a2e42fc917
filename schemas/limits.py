"""Limits a plan request must meet, shared by the API (refused at the door) and the workers.

The cap on stage candidates is a setting (`STAGEPROF_MAX_CANDIDATES`, `schemas.settings`),
read where it is used so that the API and every runner apply the value of their own environment.
"""

from collections.abc import Mapping

from schemas.settings import DEFAULT_MAX_CANDIDATES as DEFAULT_MAX_CANDIDATES
from schemas.settings import env_name, env_settings

MAX_CANDIDATES_ENV = env_name("max_candidates")

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
    return env_settings(environ).max_candidates
