"""An estimated stage as a `StageProfileResult`: what plans, tables and reports read of a
stage that was not measured."""

from collections.abc import Mapping

from schemas import (
    ModuleKind,
    ModuleProfileResult,
    ProfileStatus,
    ShardingConfig,
    StageProfileResult,
    SubmeshShape,
    max_n_succ_stages,
)


def estimated_result(
    submesh: SubmeshShape,
    config: ShardingConfig,
    num_layers: int,
    times: Mapping[ModuleKind, float],
    *,
    peak: int,
    initial: int,
    intermediate: int,
    weight_stash: int,
    available: int,
    flops: float = 0.0,
    fingerprint: str = "",
) -> StageProfileResult:
    """An estimated stage as a result (status ok, unvalidated: made for every candidate a
    plan shows): one module per time, the peak on the forward, Alpa's memory rule applied."""
    modules = tuple(
        ModuleProfileResult.model_construct(
            module=kind,
            compute_cost=seconds,
            peak_memory=peak if kind == ModuleKind.forward else 0,
            temp_buffer_size=0,
            invar_names=(),
            outvar_names=(),
            invar_sizes=(),
            outvar_sizes=(),
            donated_invars=(),
            acc_grad_invars_indices=(),
            acc_grad_outvars_indices=(),
            available_memory=available,
            compute_cost_samples_s=(),
            compute_cost_spread=0.0,
            compile_seconds=0.0,
            flops=0.0,
            bytes_accessed=0.0,
            collective_bytes={},
        )
        for kind, seconds in times.items()
    )
    return StageProfileResult.model_construct(
        status=ProfileStatus.ok,
        error=None,
        fingerprint=fingerprint,
        key=None,
        submesh=submesh,
        config=config,
        num_layers=num_layers,
        module_profile_results=modules,
        available_memory=available,
        initial_var_size=initial,
        intermediate_size=intermediate,
        weight_stash_size=weight_stash,
        max_n_succ_stages=max_n_succ_stages(available, peak, initial, intermediate),
        input_shardings={},
        flops=flops,
        compile_seconds=0.0,
        device_kind="",
        jax_version="",
        measured_by=(),
        estimate_bytes=None,
    )
