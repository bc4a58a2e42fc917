"""XLA flags of every test process (set by tests/conftest.py before jax loads).

Tests compile hundreds of small programs and compare timings only with timings taken under
the same flags: XLA's cheapest CPU codegen compiles them about 40% faster from the same HLO
(FLOPs, buffers and peak memory unchanged; the programs run slower). Measuring actors and
CLI subprocesses inherit them; `bench/` scripts run by tests are given them. Benchmarks run
by hand, and users, get XLA's defaults."""

FAST_COMPILE_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
)


def with_fast_compile(flags: str) -> str:
    """`flags` with each fast-compile flag it does not already set (a flag given wins)."""
    for flag in FAST_COMPILE_FLAGS:
        if flag.split("=")[0] not in flags:
            flags = f"{flags} {flag}".strip()
    return flags
