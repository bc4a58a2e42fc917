"""A stage whose runs of identical layers (`workers.measure.scan_runs`) are `lax.scan`s.

Forward of a run: one scan over the layers' parameters stacked on a new leading axis,
carrying the activation, emitting the layer forward's residuals (and the saved carried vars)
stacked; backward: a reversed scan over the stacked parameters, residuals and saved vars,
carrying the output cotangent (and the sum of the broadcast inputs' cotangents), emitting the
parameter grads stacked. Layers outside the runs stay as in `workers.measure.compose`.

The stacked parameters are the modules' *inputs* (`ScanStageProgram.params`), not stacked
inside the program: a scanned trainer (MaxText `scan_layers`, `nn.scan`) keeps them stacked,
apply_grad updates the same bytes, and the program pays no per-call copy of k parameter sets
(forward) and of k grads (backward) that the unrolled stage does not pay. Each stacked
parameter is sharded as its layers' ones, with the layer axis replicated, so every device
holds the same bytes as unrolled. The stash is the unrolled stage's, the runs' parts stacked.
Compiled and sharded by `workers.measure.scan_modules`.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from programs import load_layer
from schemas import FLOAT_DTYPES, LayerSpec, ModelSpec, ParamSpec, ShardingConfig, VarSpec
from workers.measure.compose import Arrays, StageProgram, compose_stage, residual_name
from workers.measure.scan_runs import Run, find_runs

Step = LayerSpec | Run


@dataclass(frozen=True)
class ScanStageProgram(StageProgram):
    """A `StageProgram` with its runs scanned. `param_sources[i]`: the indices, in the
    unrolled program's `params`, of what `params[i]` holds (k of them for a stacked one)."""

    runs: tuple[Run, ...] = ()
    param_sources: tuple[tuple[int, ...], ...] = ()
    run_params: tuple[tuple[int, ...], ...] = ()  # per run: its stacked params' indices
    run_residuals: tuple[tuple[int, ...], ...] = ()  # per run: its stacked residuals' stash indices

    def stack(self, unrolled: Arrays) -> list[jax.Array]:
        """Values of the unrolled program's parameters as this program's."""
        return [
            unrolled[s[0]] if len(s) == 1 else jnp.stack([unrolled[i] for i in s])
            for s in self.param_sources
        ]

    def unstack(self, values: Arrays) -> list[jax.Array]:
        """This program's parameter values (or grads) as the unrolled program's."""
        out: dict[int, jax.Array] = {}
        for v, sources in zip(values, self.param_sources, strict=True):
            if len(sources) == 1:
                out[sources[0]] = v
            else:
                out.update({i: v[j] for j, i in enumerate(sources)})
        return [out[i] for i in range(len(out))]


def _stacked(v: VarSpec, name: str, k: int) -> VarSpec:
    # internal names (never stored as specs): skip the 128-character name check
    return VarSpec.model_construct(name=name, shape=(k, *v.shape), dtype=v.dtype)


def _stacked_param(p: ParamSpec, k: int) -> ParamSpec:
    axes = None if p.logical_axes is None else ("layers", *p.logical_axes)
    return ParamSpec.model_construct(
        name=f"{p.name}[:{k}]", shape=(k, *p.shape), dtype=p.dtype, logical_axes=axes
    )


def _run_name(layers: Sequence[LayerSpec], run: Run) -> str:
    return f"{layers[run.first].name}..{layers[run.last].name}"


def _zeros(v: VarSpec) -> jax.Array:
    return jnp.zeros(v.shape, v.dtype)


def compose_scan_stage(
    spec: ModelSpec, start: int, end: int, config: ShardingConfig
) -> ScanStageProgram | None:
    """The stage of layers start..end with its runs scanned (None when it has no run)."""
    runs = find_runs(spec, start, end, config)
    if not runs:
        return None
    unrolled = compose_stage(spec, start, end)
    layers = spec.layers
    by_first = {r.first: r for r in runs}
    steps: list[Step] = []
    i = start
    while i <= end:
        run = by_first.get(i)
        steps.append(layers[i] if run is None else run)
        i = i + 1 if run is None else run.last + 1
    unrolled_index = {p.name: n for n, p in enumerate(unrolled.params)}
    params: list[ParamSpec] = []
    sources: list[tuple[int, ...]] = []
    run_params: list[tuple[int, ...]] = []
    once: dict[str, VarSpec] = {}  # saved vars stashed once (by name)
    residuals: list[VarSpec] = []
    run_residuals: list[tuple[int, ...]] = []
    var_of = {v.name: v for layer in layers for v in [*layer.inputs, *layer.outputs]}
    for step in steps:
        if isinstance(step, LayerSpec):
            for p in step.params:
                if p.name not in {q.name for q in params}:
                    params.append(p)
                    sources.append((unrolled_index[p.name],))
            once.update({n: var_of[n] for n in step.saved})
            residuals += [
                VarSpec(name=residual_name(step, k), shape=r.shape, dtype=r.dtype)
                for k, r in enumerate(step.residuals)
            ]
            continue
        body = layers[step.first : step.last + 1]
        run_params.append(tuple(range(len(params), len(params) + len(body[0].params))))
        for j, p in enumerate(body[0].params):
            params.append(_stacked_param(p, step.length))
            sources.append(tuple(unrolled_index[layer.params[j].name] for layer in body))
        once.update(
            {
                n: var_of[n]
                for (kind, _), n in zip(step.saved, body[0].saved, strict=True)
                if kind == "bcast"
            }
        )
        if step.out_from_next:  # the run's output: the last layer's saved output, once
            last = body[-1]
            once.update(
                {last.outputs[q].name: last.outputs[q] for k, q in step.saved if k == "out"}
            )
        name = _run_name(layers, step)
        first_res = len(residuals)
        residuals += [_stacked(r, f"{name}/{r.name}", step.length) for r in body[0].residuals]
        run_residuals.append(tuple(range(first_res, len(residuals))))
        residuals += [
            _stacked(var_of[n], f"{name}/saved{j}", step.length)
            for j, ((kind, _), n) in enumerate(zip(step.saved, body[0].saved, strict=True))
            if step.stacks(kind)
        ]
    stash = list(once.values()) + residuals
    run_residuals = [tuple(len(once) + k for k in ks) for ks in run_residuals]
    forward, backward = _functions(spec, steps, unrolled, params, stash)
    return ScanStageProgram(
        params=params,
        inputs=unrolled.inputs,
        outputs=unrolled.outputs,
        stash=stash,
        diff_outputs=unrolled.diff_outputs,
        grad_inputs=unrolled.grad_inputs,
        forward=forward,
        backward=backward,
        runs=tuple(runs),
        param_sources=tuple(sources),
        run_params=tuple(run_params),
        run_residuals=tuple(run_residuals),
    )


def _saved_name(layers: Sequence[LayerSpec], run: Run, j: int) -> str:
    return f"{_run_name(layers, run)}/saved{j}"


def _stacked_saved(layers: Sequence[LayerSpec], run: Run) -> list[str]:
    """Stash names of the run's stacked saved vars, in its pattern's order."""
    return [_saved_name(layers, run, j) for j, (k, _) in enumerate(run.saved) if run.stacks(k)]


def _layer_forward(layer: LayerSpec, env: dict[str, jax.Array]) -> None:
    fwd = load_layer(layer)[0]
    results = fwd.call(*[env[p.name] for p in layer.params], *[env[v.name] for v in layer.inputs])
    n_out = len(layer.outputs)
    env.update(zip((v.name for v in layer.outputs), results[:n_out], strict=True))
    for k, r in enumerate(results[n_out:]):
        env[residual_name(layer, k)] = r


def _run_forward(layers: Sequence[LayerSpec], run: Run, env: dict[str, jax.Array]) -> None:
    first, last = layers[run.first], layers[run.last]
    fwd = load_layer(first)[0]
    stacked = tuple(env[_stacked_param(p, run.length).name] for p in first.params)
    carried = run.carried_inputs
    bcast = {p: env[v.name] for p, v in enumerate(first.inputs) if p not in carried}
    n_out = len(first.outputs)

    def body(carry: tuple, xs: tuple) -> tuple[tuple, tuple]:
        ins = dict(bcast) | {p: c for (p, _), c in zip(run.carry, carry, strict=True)}
        results = fwd.call(*xs, *[ins[p] for p in range(len(first.inputs))])
        outs, res = results[:n_out], results[n_out:]
        saved = [
            ins[pos] if kind == "in" else outs[pos] for kind, pos in run.saved if run.stacks(kind)
        ]
        return tuple(outs), (tuple(res), tuple(saved))

    carry0 = tuple(env[first.inputs[p].name] for p, _ in run.carry)
    final, (res, saved) = jax.lax.scan(body, carry0, stacked)
    env.update(zip((v.name for v in last.outputs), final, strict=True))
    name = _run_name(layers, run)
    env.update(zip((f"{name}/{r.name}" for r in first.residuals), res, strict=True))
    env.update(zip(_stacked_saved(layers, run), saved, strict=True))


def _add(table: dict[str, jax.Array], name: str, value: jax.Array) -> None:
    table[name] = table[name] + value if name in table else value


def _layer_backward(
    layer: LayerSpec, env: dict[str, jax.Array], ct: dict[str, jax.Array], grads: dict
) -> None:
    bwd = load_layer(layer)[1]
    args = [env[p.name] for p in layer.params] + [env[n] for n in layer.saved]
    args += [env[residual_name(layer, k)] for k in range(len(layer.residuals))]
    args += [ct[v.name] if v.name in ct else _zeros(v) for v in float_outputs(layer)]
    results = bwd.call(*args)
    n_p = len(layer.params)
    for p, g in zip(layer.params, results[:n_p], strict=True):
        _add(grads, p.name, g)
    for n, g in zip(layer.grad_inputs, results[n_p:], strict=True):
        _add(ct, n, g)


def _run_backward(
    layers: Sequence[LayerSpec],
    run: Run,
    env: dict[str, jax.Array],
    ct: dict[str, jax.Array],
    grads: dict,
) -> None:
    first, last = layers[run.first], layers[run.last]
    bwd = load_layer(first)[1]
    name = _run_name(layers, run)
    stacked_names = [_stacked_param(p, run.length).name for p in first.params]
    xs = (
        tuple(env[n] for n in stacked_names),
        tuple(env[f"{name}/{r.name}"] for r in first.residuals),
        tuple(env[n] for n in _stacked_saved(layers, run)),
    )
    position = {v.name: p for p, v in enumerate(first.inputs)}
    grad_pos = [position[n] for n in first.grad_inputs]
    output_of = dict(run.carry)  # carried input position -> output position
    bcast_pos = [p for p in grad_pos if p not in output_of]
    n_p = len(first.params)

    # with `out_from_next`, a layer's saved outputs are the next layer's inputs: carried back
    out_qs = [q for k, q in run.saved if k == "out" and not run.stacks(k)]

    def body(carry: tuple, xs: tuple) -> tuple[tuple, tuple]:
        ct_out, acc, nxt = carry
        params, res, stacked = xs
        rest = iter(stacked)
        ins: dict[int, jax.Array] = {}
        saved = []
        for (k, pos), n in zip(run.saved, first.saved, strict=True):
            if k == "bcast":
                saved.append(env[n])
            elif run.stacks(k):
                saved.append(next(rest))
                ins[pos] = saved[-1]
            else:
                saved.append(nxt[out_qs.index(pos)])
        results = bwd.call(*params, *saved, *res, *ct_out)
        new_ct: list = [None] * len(ct_out)
        acc = list(acc)
        for p, g in zip(grad_pos, results[n_p:], strict=True):
            if p in output_of:
                new_ct[output_of[p]] = g
            else:
                acc[bcast_pos.index(p)] = acc[bcast_pos.index(p)] + g
        nxt = tuple(ins[input_of[q]] for q in out_qs)
        return (tuple(new_ct), tuple(acc), nxt), tuple(results[:n_p])

    input_of = {q: p for p, q in run.carry}
    ct0 = tuple(ct[v.name] if v.name in ct else _zeros(v) for v in last.outputs)
    acc0 = tuple(_zeros(first.inputs[p]) for p in bcast_pos)
    nxt0 = tuple(env[last.outputs[q].name] for q in out_qs)
    (ct_first, acc, _), param_grads = jax.lax.scan(body, (ct0, acc0, nxt0), xs, reverse=True)
    grads.update(zip(stacked_names, param_grads, strict=True))
    for p, q in run.carry:
        _add(ct, first.inputs[p].name, ct_first[q])
    for p, a in zip(bcast_pos, acc, strict=True):
        _add(ct, first.inputs[p].name, a)


def float_outputs(layer: LayerSpec) -> list[VarSpec]:
    return [v for v in layer.outputs if v.dtype in FLOAT_DTYPES]


def _functions(
    spec: ModelSpec,
    steps: Sequence[Step],
    unrolled: StageProgram,
    params: Sequence[ParamSpec],
    stash: Sequence[VarSpec],
) -> tuple:
    """The scanned stage's `forward` and `backward` (signatures of `StageProgram`'s)."""
    layers = spec.layers
    param_names = [p.name for p in params]
    input_names = [v.name for v in unrolled.inputs]
    output_names = [v.name for v in unrolled.outputs]
    stash_names = [v.name for v in stash]
    inputs = unrolled.inputs

    def forward(param_values: Arrays, input_values: Arrays) -> tuple[tuple, tuple]:
        env = dict(zip(param_names, param_values, strict=True))
        env.update(zip(input_names, input_values, strict=True))
        for step in steps:
            if isinstance(step, LayerSpec):
                _layer_forward(step, env)
            else:
                _run_forward(layers, step, env)
        return tuple(env[n] for n in output_names), tuple(env[n] for n in stash_names)

    def backward(
        param_values: Arrays, stash_values: Arrays, cotangents: Arrays
    ) -> tuple[list[jax.Array], list[jax.Array]]:
        env = dict(zip(param_names, param_values, strict=True))
        env.update(zip(stash_names, stash_values, strict=True))
        ct = {output_names[i]: g for i, g in zip(unrolled.diff_outputs, cotangents, strict=True)}
        grads: dict[str, jax.Array] = {}
        for step in reversed(steps):
            if isinstance(step, LayerSpec):
                _layer_backward(step, env, ct, grads)
            else:
                _run_backward(layers, step, env, ct, grads)
        return (
            [
                grads[n] if n in grads else _zeros(p)
                for n, p in zip(param_names, params, strict=True)
            ],
            [
                ct[inputs[j].name] if inputs[j].name in ct else _zeros(inputs[j])
                for j in unrolled.grad_inputs
            ],
        )

    return forward, backward
