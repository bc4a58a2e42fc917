"""Measuring one stage candidate inside one process: compose the stage from its layers'
programs, shard it, compile and time its modules, and read their memory (Alpa's stage
profiling). Imports jax: set `XLA_FLAGS` first."""

from workers.measure.compose import check_programs, compose_stage
from workers.measure.fingerprint import MEASUREMENT_METHOD, stage_fingerprint, stage_io
from workers.measure.stage import CandidateFailure, measure_stage, measure_stage_on, remat_spec

__all__ = [
    "MEASUREMENT_METHOD",
    "CandidateFailure",
    "check_programs",
    "compose_stage",
    "measure_stage",
    "measure_stage_on",
    "remat_spec",
    "stage_fingerprint",
    "stage_io",
]
