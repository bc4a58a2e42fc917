"""Layer programs (`jax.export` bytes) on the CPU, without devices: deserialize them, check
them against the spec that declares them, and compute the fingerprints measurements are
keyed by. The SDK, the server and the workers all use these functions."""

from programs.batch import spec_at_batch
from programs.check import ProgramProblem, check_programs, platform_problems
from programs.fingerprint import (
    FINGERPRINT_VERSION,
    canonical_module,
    fingerprint_problems,
    layer_fingerprint,
    verified,
    with_fingerprints,
)
from programs.load import load_layer, load_program
from programs.strip import strip_locations, without_locations

__all__ = [
    "FINGERPRINT_VERSION",
    "ProgramProblem",
    "canonical_module",
    "fingerprint_problems",
    "check_programs",
    "layer_fingerprint",
    "load_layer",
    "load_program",
    "platform_problems",
    "spec_at_batch",
    "strip_locations",
    "verified",
    "with_fingerprints",
    "without_locations",
]
