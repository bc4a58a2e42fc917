"""Agreement between the processes of one measuring group (one `jax.distributed` program).

Every process of a group runs the same compiled program, whose collectives wait for all of
them: a process that stops timing (its deadline passed, its samples are steady) while another
runs once more would leave that one waiting forever. So each stop decision is taken by all
of them at once, over the group's own collectives. In a single process these are plain
returns, with no collective.
"""

import jax
import numpy as np


def all_processes(flag: bool) -> bool:
    """True when `flag` is true in every process of the group (each one must call it)."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    flags = multihost_utils.process_allgather(np.asarray([int(flag)], dtype=np.int32))
    return bool(np.all(np.asarray(flags)))


def any_process(flag: bool) -> bool:
    """True when `flag` is true in some process of the group (each one must call it)."""
    return not all_processes(not flag)
