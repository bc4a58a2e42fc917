"""Measuring stage candidates on Ray, in three rooms with one-way imports:

- `workers.jobs`: a job's life against the store (claims, leases, retries, the measuring
  phase, then the plan). Alpa's stage construction loop, as a service.
- `workers.cluster`: Ray groups and placement (measuring groups of one shape, the pool that
  runs candidates on them).
- `workers.measure`: inside one process: compose a stage, shard, compile, time, read its
  memory. Alpa's stage profiling.

jobs -> cluster -> measure. `workers.measure` imports jax: set `XLA_FLAGS` before importing it.
"""
