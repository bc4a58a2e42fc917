"""The tests' XLA compile flags: added where missing, never over a flag already given."""

import os

from tests.support.xla_flags import FAST_COMPILE_FLAGS, with_fast_compile


def test_missing_flags_are_added_and_a_given_flag_wins() -> None:
    assert with_fast_compile("") == " ".join(FAST_COMPILE_FLAGS)
    given = "--xla_backend_optimization_level=3 --xla_force_host_platform_device_count=2"
    out = with_fast_compile(given)
    assert out.startswith(given) and "--xla_backend_optimization_level=0" not in out
    assert out.endswith("--xla_llvm_disable_expensive_passes=true")
    assert with_fast_compile(out) == out


def test_this_process_was_given_them_before_jax_loaded() -> None:
    flags = os.environ["XLA_FLAGS"]
    assert all(f.split("=")[0] in flags for f in FAST_COMPILE_FLAGS)
    assert "xla_force_host_platform_device_count" in flags
