"""Measure one stage candidate: compose, shard, compile, time, account memory.

Every failure of the candidate (out of memory, compile error, runtime error, timeout) comes
back as a `StageProfileResult` with that status and the error text, never as an exception.
"""

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import jax

from planner import enumerate_candidates
from schemas import (
    ClusterSpec,
    ModelSpec,
    ModuleProfileResult,
    PlanOptions,
    ProfileStatus,
    ShardingConfig,
    StageKey,
    StageProfileResult,
    SubmeshShape,
    max_n_succ_stages,
)
from workers.measure.compose import compose_stage
from workers.measure.compose_split import compose_split_backward
from workers.measure.fingerprint import stage_fingerprint
from workers.measure.hlo_stats import collective_bytes
from workers.measure.memory import estimate_initial_bytes
from workers.measure.quiet import compile_slot, timing_slot
from workers.measure.scan_modules import scan_stage_modules
from workers.measure.scan_runs import scan_stages_enabled
from workers.measure.sharding import (
    activation_constraint,
    make_mesh,
    sequence_length,
    stage_shardings,
)
from workers.measure.stage_modules import CompiledModule, StageModules
from workers.measure.timing import (
    CandidateTimeout,
    Deadline,
    clock_for,
    median,
    random_array,
    relative_spread,
    time_runs,
)

logger = logging.getLogger(__name__)

OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")


class CandidateFailure(Exception):
    """A candidate failed with `status`; the message is the error text."""

    def __init__(self, status: ProfileStatus, message: str, estimate_bytes: int | None = None):
        super().__init__(message)
        self.status = status
        self.estimate_bytes = estimate_bytes


def _failure(err: Exception, default: ProfileStatus, phase: str) -> CandidateFailure:
    text = f"{phase}: {type(err).__name__}: {err}"
    status = ProfileStatus.oom if any(m in str(err) for m in OOM_MARKERS) else default
    return CandidateFailure(status, text)


@dataclass
class _Measured:
    """What the phases found so far (the result is built from it, whatever the status)."""

    modules: dict[str, CompiledModule] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)
    initial_var_size: int = 0
    intermediate_size: int = 0
    weight_stash_size: int = 0
    input_shardings: dict[str, str] = field(default_factory=dict)


def _available_memory(devices: Sequence[jax.Device], cluster: ClusterSpec) -> int:
    """The cluster's device memory, or the device's own limit where it reports a lower one."""
    available = cluster.device_memory_bytes
    local = [d for d in devices if d.process_index == jax.process_index()]
    for d in local[:1]:
        try:
            stats = d.memory_stats() or {}
        except Exception:  # backends without memory stats
            stats = {}
        limit = int(stats.get("bytes_limit", 0) or 0)
        if 0 < limit < available:
            available = limit
    return available


def _module_result(
    m: CompiledModule, samples: list[float], available: int, num_devices: int
) -> ModuleProfileResult:
    mem = m.memory
    costs = m.compiled.cost_analysis() or {}
    if isinstance(costs, list):  # older jax returned one dict per device program
        costs = costs[0] if costs else {}
    return ModuleProfileResult(
        module=m.kind,
        compute_cost=median(samples),
        compute_cost_spread=relative_spread(samples),
        peak_memory=mem.peak,
        temp_buffer_size=mem.temp,
        invar_names=m.invar_names,
        outvar_names=m.outvar_names,
        invar_sizes=m.invar_sizes,
        outvar_sizes=m.outvar_sizes,
        donated_invars=m.donated_invars,
        acc_grad_invars_indices=m.acc_grad_invars_indices,
        acc_grad_outvars_indices=m.acc_grad_outvars_indices,
        available_memory=available,
        compute_cost_samples_s=tuple(samples),
        compile_seconds=m.compile_seconds,
        compile_cache_hit=m.cache_hit,
        flops=max(0.0, float(costs.get("flops", 0.0))) + m.flops_uncounted,
        bytes_accessed=max(0.0, float(costs.get("bytes accessed", 0.0))),
        # one device has no collectives: skip printing its HLO (large for long stages)
        collective_bytes=collective_bytes((m.compiled.as_text() or "") if num_devices > 1 else ""),
    )


def _compile(
    modules: StageModules, measured: _Measured, deadline: Deadline, available: int
) -> None:
    """Compile the modules (B and W too when the backward is split), then predict OOM
    from their memory analysis."""
    builds = [
        ("forward", modules.compile_forward),
        ("backward", modules.compile_backward),
        ("apply_grad", modules.compile_apply_grad),
    ]
    if modules.split is not None:
        builds += [
            ("backward_input", modules.compile_input_grad),
            ("backward_weight", modules.compile_weight_grad),
        ]
    for kind, build in builds:
        with (
            _failing_as(ProfileStatus.compile_error, f"compiling {kind}"),
            compile_slot(deadline.limit_s),
        ):
            measured.modules[kind] = build()
        deadline.check(f"compile {kind}")
    apply = measured.modules["apply_grad"]
    n_args = len(apply.outvar_names)  # parameters + optimizer state
    measured.initial_var_size = sum(apply.outvar_sizes[:n_args])
    measured.intermediate_size = sum(modules.stash_sizes)
    if modules.split is not None:
        measured.weight_stash_size = sum(modules.handoff_sizes)
    peak = max(measured.modules[k].memory.peak for k in ("forward", "backward"))
    if peak + measured.initial_var_size > available:
        raise CandidateFailure(
            ProfileStatus.oom,
            f"predicted out of memory: peak {peak} B + parameters and optimizer state "
            f"{measured.initial_var_size} B exceed the {available} B available per device",
        )


@contextmanager
def _failing_as(status: ProfileStatus, phase: str) -> Iterator[None]:
    """Turn any exception in the block into a `CandidateFailure` (OOM text gives oom)."""
    try:
        yield
    except (CandidateTimeout, CandidateFailure):
        raise
    except Exception as err:
        raise _failure(err, status, phase) from err


@dataclass
class _Arrays:
    """What a stage runs on: random parameters and inputs, and the optimizer's initial state."""

    params: list[jax.Array]
    inputs: list[jax.Array]
    opt_state: Any


def _allocate(modules: StageModules) -> _Arrays:
    """The stage's arrays, made before its quiet timing section so that the other actors
    can compile meanwhile (eager ops here may compile one-op programs: a compile section)."""
    with _failing_as(ProfileStatus.runtime_error, "allocating parameters"):
        params = [random_array(s, i) for i, s in enumerate(modules.param_structs)]
    with _failing_as(ProfileStatus.runtime_error, "allocating inputs"):
        inputs = [random_array(s, 1000 + i) for i, s in enumerate(modules.input_structs)]
    with _failing_as(ProfileStatus.runtime_error, "allocating the optimizer state"):
        opt_state = _initial_opt_state(modules, params)
    return _Arrays(params, inputs, opt_state)


def _run_forward_backward(
    modules: StageModules,
    measured: _Measured,
    options: PlanOptions,
    deadline: Deadline,
    arrays: _Arrays,
) -> list[jax.Array]:
    """Time forward then backward (on the last forward's VJP), then B and W when split;
    returns parameter grads."""
    params, inputs = arrays.params, arrays.inputs
    fwd = measured.modules["forward"].compiled
    with _failing_as(ProfileStatus.runtime_error, "running forward"):
        measured.samples["forward"], (outs, stash, _) = _timed(
            lambda: fwd(params, inputs), options, deadline, "forward"
        )
        cot = jax.block_until_ready(tuple(jax.numpy.ones_like(o) for o in outs))
    bwd = measured.modules["backward"].compiled
    with _failing_as(ProfileStatus.runtime_error, "running backward"):
        measured.samples["backward"], (grads, _) = _timed(
            lambda: bwd(params, stash, cot), options, deadline, "backward"
        )
    if modules.split is not None:
        b = measured.modules["backward_input"].compiled
        w = measured.modules["backward_weight"].compiled
        with _failing_as(ProfileStatus.runtime_error, "running backward_input"):
            measured.samples["backward_input"], (_, handoff) = _timed(
                lambda: b(params, stash, cot), options, deadline, "backward_input"
            )
        with _failing_as(ProfileStatus.runtime_error, "running backward_weight"):
            measured.samples["backward_weight"], _ = _timed(
                lambda: w(params, stash, handoff), options, deadline, "backward_weight"
            )
    return grads


# Timed runs stop adding samples beyond `repeats` once they add up to this, per module.
TIMING_BUDGET_S = 1.0


def _timed(
    run: Callable[[], Any], options: PlanOptions, deadline: Deadline, phase: str
) -> tuple[list[float], Any]:
    """Warm-up and timed runs of `run`, repeated until the spread is under the target, the
    cap or the time budget (inside `_run`'s quiet timing section)."""
    return time_runs(
        run,
        options.warmup,
        options.repeats,
        deadline,
        phase,
        max_repeats=options.max_repeats,
        target_spread=options.target_spread,
        budget_s=TIMING_BUDGET_S,
        clock=clock_for(jax.devices()),
    )


def _run(
    modules: StageModules, measured: _Measured, options: PlanOptions, deadline: Deadline
) -> None:
    """Allocate the stage's arrays, then time forward, backward (B and W), apply_grad while
    no other process on the machine compiles or times (`workers.measure.quiet`: one section for
    all modules, so the other actors' compiles wait once, not between modules)."""
    with compile_slot(deadline.limit_s):
        arrays = _allocate(modules)
    deadline.check("allocate")
    with timing_slot(deadline.limit_s):
        _run_quietly(modules, measured, options, deadline, arrays)


def _run_quietly(
    modules: StageModules,
    measured: _Measured,
    options: PlanOptions,
    deadline: Deadline,
    arrays: _Arrays,
) -> None:
    grads = _run_forward_backward(modules, measured, options, deadline, arrays)
    apply = measured.modules["apply_grad"].compiled
    with _failing_as(ProfileStatus.runtime_error, "running apply_grad"):
        state: list[Any] = [arrays.params, arrays.opt_state]
        arrays.params = []  # apply_grad donates them: only `state` holds them from here
        arrays.opt_state = None

        def apply_once() -> Any:
            state[:] = apply(state[0], state[1], grads)
            return state

        measured.samples["apply_grad"], _ = _timed(apply_once, options, deadline, "apply_grad")


def _initial_opt_state(modules: StageModules, params: list[jax.Array]) -> Any:
    """`optimizer.init(params)`, placed with the optimizer state's shardings.

    Evaluated eagerly: its one-op programs are compiled once per parameter shape and sharding
    and reused by every later candidate, where a jitted init was a fourth compile per
    candidate whose program nothing else used."""
    shardings = jax.tree_util.tree_map(lambda s: s.sharding, modules.opt_state_structs())
    return jax.device_put(modules.optimizer.init(params), shardings)


_remat_specs: dict[tuple[int, str], tuple[ModelSpec, ModelSpec]] = {}


def remat_spec(spec: ModelSpec, remat: str) -> ModelSpec:
    """`spec.under_remat(remat)`, kept for the last specs seen (every candidate of a job
    would otherwise copy the whole spec and re-hash its layers)."""
    if remat == "as_written" and not any(layer.remat_variants for layer in spec.layers):
        return spec
    hit = _remat_specs.get((id(spec), remat))
    if hit is not None and hit[0] is spec:
        return hit[1]
    if len(_remat_specs) > 16:
        _remat_specs.clear()
    under = spec.under_remat(remat)
    _remat_specs[id(spec), remat] = (spec, under)
    return under


def measure_stage_on(
    spec: ModelSpec,
    start: int,
    end: int,
    submesh: SubmeshShape,
    config: ShardingConfig,
    cluster: ClusterSpec,
    options: PlanOptions,
    devices: Sequence[jax.Device] | None = None,
    key: StageKey | None = None,
) -> StageProfileResult:
    """Measure layers start..end on the first `submesh.num_devices` of `devices` (default
    `jax.devices()`) under `config`. Never raises for the candidate: every failure (oom,
    compile_error, runtime_error, timeout) is the result's status, with the error text.

    The timeout is checked between phases and runs (an XLA compile cannot be interrupted
    in-process); a hard limit is the runner's, which kills the worker. The stage's layers
    run under `config.remat` (their programs of that remat variant)."""
    spec = remat_spec(spec, config.remat)
    all_devices = list(jax.devices() if devices is None else devices)
    stage_devices = all_devices[: submesh.num_devices]
    device_kind = stage_devices[0].device_kind if stage_devices else cluster.device_kind
    base: dict[str, Any] = dict(
        fingerprint="",
        key=key,
        submesh=submesh,
        config=config,
        num_layers=max(1, end - start + 1),
        available_memory=_available_memory(stage_devices, cluster),
        device_kind=device_kind,
        jax_version=jax.__version__,
        measured_by=(f"local:{os.getpid()}",),  # a measuring group names its processes
    )
    measured = _Measured()
    try:
        base["fingerprint"] = stage_fingerprint(
            spec, start, end, submesh, config, device_kind, jax.__version__, options
        )
        _measure(spec, start, end, stage_devices, base, measured, options)
    except CandidateTimeout as err:
        logger.info("candidate %s..%s %s %s: %s", start, end, submesh, config.label(), err)
        return _result(base, measured, ProfileStatus.timeout, str(err))
    except CandidateFailure as err:
        logger.info("candidate %s..%s %s %s: %s", start, end, submesh, config.label(), err)
        return _result(base, measured, err.status, str(err), err.estimate_bytes)
    except Exception as err:  # a bug of ours must not end the caller's loop either
        logger.exception("candidate %s..%s %s %s failed", start, end, submesh, config.label())
        return _result(
            base, _Measured(), ProfileStatus.runtime_error, f"{type(err).__name__}: {err}"
        )
    return _result(base, measured, ProfileStatus.ok, None)


def _measure(
    spec: ModelSpec,
    start: int,
    end: int,
    devices: list[jax.Device],
    base: dict[str, Any],
    measured: _Measured,
    options: PlanOptions,
) -> None:
    """The phases, in order; raises CandidateFailure / CandidateTimeout to stop."""
    deadline = Deadline(options.candidate_timeout_s)
    submesh: SubmeshShape = base["submesh"]
    config: ShardingConfig = base["config"]
    available: int = base["available_memory"]
    if not 0 <= start <= end < spec.num_layers:
        raise CandidateFailure(
            ProfileStatus.compile_error,
            f"layers {start}..{end} are outside the model's {spec.num_layers} layers",
        )
    if len(devices) < submesh.num_devices:
        raise CandidateFailure(
            ProfileStatus.runtime_error,
            f"submesh {submesh} needs {submesh.num_devices} devices but this process has "
            f"{len(devices)} ({base['device_kind']}); start it with more (XLA_FLAGS="
            "--xla_force_host_platform_device_count=N on CPU)",
        )
    with _failing_as(ProfileStatus.compile_error, "building the logical mesh"):
        mesh = make_mesh(devices, config)
    seq_len = sequence_length(spec)
    # today's strategies leave the activations inside a stage to the partitioner, as before
    constrain = None if config.is_legacy else activation_constraint(mesh, config, seq_len)
    with _failing_as(ProfileStatus.compile_error, "composing the stage"):
        program = compose_stage(spec, start, end, constrain)
    deadline.check("compose")
    shardings = stage_shardings(mesh, config, program.params, program.inputs, seq_len)
    measured.input_shardings = shardings.describe(program.params, program.inputs)
    estimate = estimate_initial_bytes(program.params, shardings.params, options.optimizer)
    if estimate > available:
        raise CandidateFailure(
            ProfileStatus.oom,
            f"parameters and {options.optimizer} state need {estimate} B per device, "
            f"more than the {available} B available; not compiled",
            estimate_bytes=estimate,
        )
    split = None
    if options.measures_split_backward:
        with _failing_as(ProfileStatus.compile_error, "splitting the backward"):
            split = compose_split_backward(spec, start, end, program)
    modules: StageModules | None = None
    if scan_stages_enabled(split is not None):  # runs of identical layers as lax.scans
        with _failing_as(ProfileStatus.compile_error, "composing the stage's scans"):
            modules = scan_stage_modules(spec, start, end, config, shardings, options.optimizer)
    modules = modules or StageModules(program, shardings, options.optimizer, split)
    _compile(modules, measured, deadline, available)
    _run(modules, measured, options, deadline)


def _result(
    base: dict[str, Any],
    measured: _Measured,
    status: ProfileStatus,
    error: str | None,
    estimate_bytes: int | None = None,
) -> StageProfileResult:
    available = base["available_memory"]
    modules = tuple(
        _module_result(m, measured.samples.get(kind, []), available, base["submesh"].num_devices)
        for kind, m in measured.modules.items()
    )
    # apply_grad runs once per iteration, when no micro-batch is stashed: the 1F1B rule
    # weighs the stash against the forward/backward peak.
    peak = max(
        (m.peak_memory for m in modules if m.module.value in ("forward", "backward")), default=0
    )
    n_succ = -1
    if status == ProfileStatus.ok:
        n_succ = max_n_succ_stages(
            available, peak, measured.initial_var_size, measured.intermediate_size
        )
    return StageProfileResult(
        status=status,
        error=error,
        module_profile_results=modules,
        initial_var_size=measured.initial_var_size,
        intermediate_size=measured.intermediate_size,
        weight_stash_size=measured.weight_stash_size,
        max_n_succ_stages=n_succ,
        input_shardings=measured.input_shardings,
        flops=sum(m.flops for m in modules if m.module.value in ("forward", "backward")),
        compile_seconds=sum(m.compile_seconds for m in modules),
        compile_cache_hits=sum(m.compile_cache_hit for m in modules),
        estimate_bytes=estimate_bytes,
        **base,
    )


def measure_stage(
    spec: ModelSpec,
    key: StageKey,
    cluster: ClusterSpec,
    options: PlanOptions,
    *,
    devices: Sequence[jax.Device] | None = None,
) -> StageProfileResult:
    """Measure candidate `key` of `spec` on `cluster`: its submesh and config are the
    planner's choices `key.submesh_id` / `key.config_id`. Candidate failures are results
    (see `measure_stage_on`); a key outside the planner's choices raises IndexError and
    options that disagree with the spec ValueError (caller bugs, not candidates)."""
    submesh, config = enumerate_candidates(spec, cluster, options).resolve(key)
    return measure_stage_on(
        spec, key.start, key.end, submesh, config, cluster, options, devices=devices, key=key
    )
