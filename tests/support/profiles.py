"""The one builder of made-up stage profiles (`StageProfileResult`) for every test: the
store's round trips, the planner's cost tables, the server's seeded jobs, the gate's
re-measurements. Each caller states only the figures it cares about."""

from schemas import (
    ModuleKind,
    ModuleProfileResult,
    ProfileStatus,
    ShardingConfig,
    StageKey,
    StageProfileResult,
    SubmeshShape,
)

GIB = 2**30
ONE_DEVICE = SubmeshShape(hosts=1, devices_per_host=1)
DATA_1 = ShardingConfig(logical_mesh=(1, 1), strategy="data")


def fake_module(
    kind: ModuleKind,
    seconds: float,
    *,
    peak: int = 1000,
    temp: int = 0,
    available_memory: int = GIB,
    spread: float = 0.0,
    samples: int = 0,
    with_vars: bool = False,
) -> ModuleProfileResult:
    """One measured module; `samples` copies of `seconds` as its timed runs; `with_vars`:
    a `(w, x) -> y` signature with sizes instead of an empty one."""
    return ModuleProfileResult(
        module=kind,
        compute_cost=seconds,
        peak_memory=peak,
        temp_buffer_size=temp,
        invar_names=("w", "x") if with_vars else (),
        outvar_names=("y",) if with_vars else (),
        invar_sizes=(400, 100) if with_vars else (),
        outvar_sizes=(100,) if with_vars else (),
        donated_invars=(False, False) if with_vars else (),
        available_memory=available_memory,
        compute_cost_samples_s=(seconds,) * samples,
        compute_cost_spread=spread,
    )


def fake_profile(
    fingerprint: str,
    status: ProfileStatus = ProfileStatus.ok,
    *,
    forward: float = 0.005,
    backward: float = 0.005,
    error: str | None = None,
    key: StageKey | None = None,
    submesh: SubmeshShape = ONE_DEVICE,
    config: ShardingConfig = DATA_1,
    num_layers: int = 1,
    peak: int = 1000,
    temp: int = 0,
    spread: float = 0.0,
    samples: int = 0,
    with_vars: bool = False,
    available_memory: int = GIB,
    initial_var_size: int = 400,
    intermediate_size: int = 100,
    max_n_succ_stages: int = 5,
    failed_max_n_succ_stages: int = -1,
    flops: float = 0.0,
) -> StageProfileResult:
    """A stage measured at `forward` + `backward` seconds (one module each), or, when
    `status` is a failure, a stage with no modules, `error` (default "<status> happened")
    and `failed_max_n_succ_stages`."""
    ok = status == ProfileStatus.ok
    modules = tuple(
        fake_module(
            kind,
            seconds,
            peak=peak,
            temp=temp,
            available_memory=available_memory,
            spread=spread,
            samples=samples,
            with_vars=with_vars,
        )
        for kind, seconds in ((ModuleKind.forward, forward), (ModuleKind.backward, backward))
    )
    return StageProfileResult(
        status=status,
        error=None if ok else (error or f"{status.value} happened"),
        fingerprint=fingerprint,
        key=key,
        submesh=submesh,
        config=config,
        num_layers=num_layers,
        module_profile_results=modules if ok else (),
        available_memory=available_memory,
        initial_var_size=initial_var_size,
        intermediate_size=intermediate_size,
        max_n_succ_stages=max_n_succ_stages if ok else failed_max_n_succ_stages,
        flops=flops,
    )
