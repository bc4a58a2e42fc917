"""Helpers shared by the test suites, one home each (fixtures stay in conftest.py files):

- `profiles`: made-up stage profiles (`fake_profile`, `fake_module`).
- `models`: the tiny GPT and the fast plan options the measuring tests run.
- `jobs`: queue a job of a spec in a store.
- `databases`: the Postgres test database's URL and reset, `RowCounts`.
- `waiting`: `wait_until`, the one polling loop with a deadline.
- `processes`: `stop_processes` (terminate, then kill) and `free_port`.
- `scripts`: run a `bench/` script and read its JSON last line.

Import from the module (`from tests.support.waiting import wait_until`): this package does
not import them all, so that a light helper never imports jax before the device count is set.
"""
