"""The modules of a scanned stage (`workers.measure.compose_scan`): shardings and FLOPs.

Each stacked parameter is sharded as its layers' parameters under the stage's config, the new
layer axis replicated. XLA's cost analysis counts a while loop's body once, whatever its trip
count: the scanned forward's (backward's) FLOPs add (k - 1) times the FLOPs of the layer's
forward (backward) program compiled alone under the shardings it has in the scan (once per
layer fingerprint and shardings in a process: `layer_flops`), and that compile's seconds are
counted in the module's compile time.
"""

import dataclasses
import time
from collections.abc import Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec

from programs import load_layer
from schemas import LayerSpec, ModelSpec, ShardingConfig, VarSpec
from workers.measure.compose_scan import ScanStageProgram, compose_scan_stage, float_outputs
from workers.measure.layer_keys import layer_key
from workers.measure.scan_runs import Run
from workers.measure.sharding import StageShardings
from workers.measure.stage_modules import CompiledModule, StageModules


def scan_shardings(program: ScanStageProgram, unrolled: StageShardings) -> StageShardings:
    """The unrolled stage's shardings with each stacked parameter sharded as its layers'
    parameters, the new layer axis replicated."""
    params = []
    for sources in program.param_sources:
        s = unrolled.params[sources[0]]
        params.append(
            s if len(sources) == 1 else NamedSharding(s.mesh, PartitionSpec(None, *s.spec))
        )
    return dataclasses.replace(unrolled, params=params)


_LAYER_FLOPS: dict[tuple, float] = {}
_LAYER_FLOPS_SIZE = 256


def layer_flops(layer: LayerSpec, forward: bool, args: Sequence[jax.ShapeDtypeStruct]) -> float:
    """FLOPs (cost analysis) of the layer's forward (backward) program compiled alone on
    `args`, kept per layer fingerprint, program and sharded arguments: the candidates of a job
    that share a block and a sharding compile it once."""
    shapes = tuple((a.shape, str(a.dtype), repr(a.sharding)) for a in args)
    key = (layer_key(layer), forward, shapes)
    if key not in _LAYER_FLOPS:
        program = load_layer(layer)[0 if forward else 1]
        costs = jax.jit(program.call).lower(*args).compile().cost_analysis() or {}
        if len(_LAYER_FLOPS) >= _LAYER_FLOPS_SIZE:
            _LAYER_FLOPS.clear()
        _LAYER_FLOPS[key] = max(0.0, float(costs.get("flops", 0.0)))
    return _LAYER_FLOPS[key]


class ScanStageModules(StageModules):
    """`StageModules` of a scanned stage: forward's and backward's FLOPs add what the cost
    analysis leaves out, (k - 1) x the layer program's FLOPs per run (see the module doc)."""

    def __init__(
        self,
        spec: ModelSpec,
        program: ScanStageProgram,
        unrolled: StageShardings,
        optimizer: str,
    ):
        super().__init__(program, scan_shardings(program, unrolled), optimizer)
        self.scan = program
        self.layers = spec.layers
        self.unrolled = unrolled
        self.loop_flops_seconds: dict[str, float] = {}  # per module: compiling layer_flops

    def compile_forward(self) -> CompiledModule:
        return self._with_loop_flops(super().compile_forward(), forward=True)

    def compile_backward(self) -> CompiledModule:
        return self._with_loop_flops(super().compile_backward(), forward=False)

    def _with_loop_flops(self, module: CompiledModule, forward: bool) -> CompiledModule:
        t0 = time.perf_counter()
        flops = 0.0
        for i, run in enumerate(self.scan.runs):
            layer = self.layers[run.first]
            flops += (run.length - 1) * layer_flops(
                layer, forward, self._body_args(i, run, forward)
            )
        seconds = time.perf_counter() - t0
        self.loop_flops_seconds[module.kind.value] = seconds
        return dataclasses.replace(
            module,
            compile_seconds=module.compile_seconds + seconds,
            flops_uncounted=module.flops_uncounted + flops,
        )

    def _var(self, v: VarSpec) -> jax.ShapeDtypeStruct:
        sharding = self.shardings.activation(v)
        return jax.ShapeDtypeStruct(tuple(v.shape), v.dtype, sharding=sharding)

    def _body_args(self, i: int, run: Run, forward: bool) -> list[jax.ShapeDtypeStruct]:
        """One iteration's arguments of run `i`'s layer program, sharded as in the scan."""
        first = self.layers[run.first]
        params = [
            jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=self.unrolled.params[s[0]])
            for p, s in zip(
                first.params,
                [self.scan.param_sources[j] for j in self.scan.run_params[i]],
                strict=True,
            )
        ]
        if forward:
            return params + [self._var(v) for v in first.inputs]
        by_name = {v.name: v for v in [*first.inputs, *first.outputs]}
        residuals = []
        for k, r in zip(self.scan.run_residuals[i], first.residuals, strict=True):
            stacked = self.forward_out[1][k].sharding
            spec = getattr(stacked, "spec", None)
            sharding = (
                NamedSharding(self.shardings.mesh, PartitionSpec(*spec[1:]))
                if spec is not None
                else self._var(r).sharding
            )
            residuals.append(jax.ShapeDtypeStruct(r.shape, r.dtype, sharding=sharding))
        saved = [self._var(by_name[n]) for n in first.saved]
        return params + saved + residuals + [self._var(v) for v in float_outputs(first)]


def scan_stage_modules(
    spec: ModelSpec,
    start: int,
    end: int,
    config: ShardingConfig,
    shardings: StageShardings,
    optimizer: str,
) -> ScanStageModules | None:
    """The modules of the stage with its runs scanned, under the unrolled stage's
    `shardings`; None when the stage has no run (measure it unrolled)."""
    program = compose_scan_stage(spec, start, end, config)
    return None if program is None else ScanStageModules(spec, program, shardings, optimizer)
