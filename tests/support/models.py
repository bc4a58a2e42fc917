"""The tiny GPT and the fast plan options that every measuring test (runner, multi-host,
end to end) plans with."""

from typing import Any

from client import zoo
from schemas import ModelSpec, PlanOptions

# A GPT small enough to trace, compile and time in seconds on virtual CPU devices.
TINY_GPT: dict[str, Any] = {
    "hidden_size": 32,
    "num_heads": 2,
    "seq_len": 16,
    "vocab_size": 128,
    "batch_size": 4,
}
# Data parallel only, two timed runs after one warm-up; 1F1B alone and the stages as written,
# so no stage is also measured with its backward split or under a remat variant (the CLI
# tests, tests/workers and tests/planner cover `auto` for both).
FAST_OPTIONS = PlanOptions(
    schedule="1f1b",
    remat="as_written",
    num_microbatches=4,
    config_space="data_parallel_only",
    strategies=["data"],
    repeats=2,
    warmup=1,
    candidate_timeout_s=120,
)


def tiny_gpt(num_layers: int, **overrides: int) -> ModelSpec:
    """The tiny GPT with `num_layers` blocks (and any size overridden)."""
    return zoo.build("gpt", num_layers=num_layers, **(TINY_GPT | overrides))
