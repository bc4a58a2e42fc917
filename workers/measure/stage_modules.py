"""The modules of a stage (forward, backward, apply_grad, and for zero-bubble schedules the
backward's B and W parts): build, shard and compile.

forward = the stage's layers' forwards, returning the stage outputs and the stash (the
residuals and the vars the backwards read); backward = the layers' backwards in reverse,
from the parameters, the stash and the output cotangents (see `workers.measure.compose`); nothing is
recomputed. apply_grad = the optax update of the parameters. backward_input (B) and
backward_weight (W) = the backward split by dependency (see `workers.measure.compose_split`).
Only floating outputs and floating inputs that come from earlier layers are differentiated;
integer ones (token ids, labels) and the model's batch inputs ride along untouched.
"""

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec
from jax.tree_util import SequenceKey
from jax.typing import DTypeLike

from schemas import ModuleKind
from workers.measure.compile_cache import counting_cache_hits
from workers.measure.compose import StageProgram
from workers.measure.compose_split import SplitBackward
from workers.measure.memory import ModuleMemory, module_memory, per_device_bytes
from workers.measure.sharding import StageShardings

logger = logging.getLogger(__name__)

LEARNING_RATE = 1e-3

OPTIMIZERS: dict[str, Callable[[], optax.GradientTransformation]] = {
    "sgd": lambda: optax.sgd(LEARNING_RATE),
    "adam": lambda: optax.adam(LEARNING_RATE),
}


@dataclass(frozen=True)
class CompiledModule:
    """One compiled module with its named, per-device-sized arguments and results."""

    kind: ModuleKind
    compiled: jax.stages.Compiled
    compile_seconds: float
    invar_names: tuple[str, ...]
    outvar_names: tuple[str, ...]
    invar_sizes: tuple[int, ...]
    outvar_sizes: tuple[int, ...]
    donated_invars: tuple[bool, ...]
    acc_grad_invars_indices: tuple[int, ...] = ()
    acc_grad_outvars_indices: tuple[int, ...] = ()
    # FLOPs the compiled module's cost analysis leaves out (a scan's further iterations)
    flops_uncounted: float = 0.0
    cache_hit: bool = False  # loaded from the persistent compilation cache

    @functools.cached_property
    def memory(self) -> ModuleMemory:
        """Its memory per device (see `workers.measure.memory.module_memory`)."""
        return module_memory(self.compiled)


def _sds(shape: Sequence[int], dtype: DTypeLike, sharding: NamedSharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def _lower_and_compile(
    lower: Callable[[], jax.stages.Lowered],
) -> tuple[jax.stages.Lowered, jax.stages.Compiled, float, bool]:
    """Lower and compile: the seconds both took, and whether the persistent compilation
    cache served the executable."""
    with counting_cache_hits() as hits:
        t0 = time.perf_counter()
        lowered = lower()
        compiled = lowered.compile()
        seconds = time.perf_counter() - t0
    return lowered, compiled, seconds, hits.hit


def _sizes(structs: Sequence[jax.ShapeDtypeStruct | jax.Array]) -> tuple[int, ...]:
    return tuple(per_device_bytes(s.shape, s.dtype, s.sharding) for s in structs)


def _with_shardings(avals: Any, shardings: Any) -> Any:
    """`avals` (a pytree of ShapeDtypeStruct) with the matching leaf of `shardings` attached."""
    leaves, tree = jax.tree_util.tree_flatten(avals)
    sh = jax.tree_util.tree_leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    if len(sh) != len(leaves):
        raise ValueError(f"{len(leaves)} results but {len(sh)} output shardings")
    return jax.tree_util.tree_unflatten(
        tree, [_sds(a.shape, a.dtype, s) for a, s in zip(leaves, sh, strict=True)]
    )


class StageModules:
    """Builds and compiles the modules of one stage program under one set of shardings."""

    def __init__(
        self,
        program: StageProgram,
        shardings: StageShardings,
        optimizer: str,
        split: SplitBackward | None = None,
    ):
        self.program = program
        self.split = split
        self.shardings = shardings
        self.optimizer = OPTIMIZERS[optimizer]()
        self.grad_in = list(program.grad_inputs)
        self.diff_out = list(program.diff_outputs)
        self.other_out = [i for i in range(len(program.outputs)) if i not in self.diff_out]
        self.param_structs = [
            _sds(p.shape, p.dtype, s) for p, s in zip(program.params, shardings.params, strict=True)
        ]
        self.input_structs = [
            _sds(v.shape, v.dtype, s) for v, s in zip(program.inputs, shardings.inputs, strict=True)
        ]
        self.forward_out: Any = None  # (float outputs, stash, other outputs), sharded
        self.handoff: Any = None  # B's handoff to W, sharded (after compile_input_grad)

    # ----- the functions that get jitted -------------------------------------------------
    def _forward(self, params: list, inputs: list) -> tuple[tuple, tuple, tuple]:
        outs, stash = self.program.forward(params, inputs)
        return (
            tuple(outs[i] for i in self.diff_out),
            tuple(stash),
            tuple(outs[i] for i in self.other_out),
        )

    def _backward(self, params: list, stash: tuple, cotangents: tuple) -> tuple[list, list]:
        return self.program.backward(params, stash, cotangents)

    def _apply_grad(self, params: list, state: Any, grads: list) -> tuple[list, Any]:
        updates, state = self.optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    # ----- argument structures -------------------------------------------------------------
    def opt_state_structs(self) -> Any:
        """Optimizer state as ShapeDtypeStructs: a leaf shaped like parameter i (reached
        through index i of a parameter-list-shaped subtree) is sharded like it; the rest
        (step counts) are replicated."""
        avals = jax.eval_shape(self.optimizer.init, self.param_structs)
        replicated = NamedSharding(self.shardings.mesh, PartitionSpec())

        def place(path: tuple, leaf: Any) -> jax.ShapeDtypeStruct:
            sharding = replicated
            if (
                path
                and isinstance(path[-1], SequenceKey)
                and path[-1].idx < len(self.param_structs)
            ):
                p = self.param_structs[path[-1].idx]
                if p.shape == leaf.shape:
                    sharding = p.sharding
            return _sds(leaf.shape, leaf.dtype, sharding)

        return jax.tree_util.tree_map_with_path(place, avals)

    @property
    def stash_sizes(self) -> tuple[int, ...]:
        """Per-device bytes of each stashed value under forward's output shardings (after
        `compile_forward`)."""
        return _sizes(list(self.forward_out[1]))

    # ----- compile -------------------------------------------------------------------------
    def compile_forward(self) -> CompiledModule:
        """Lower and compile forward; remembers its result structure for backward."""
        lowered, compiled, seconds, hit = _lower_and_compile(
            lambda: jax.jit(
                self._forward, in_shardings=(self.shardings.params, self.shardings.inputs)
            ).lower(self.param_structs, self.input_structs)
        )
        self.forward_out = _with_shardings(lowered.out_info, compiled.output_shardings)
        outs, stash, aux = self.forward_out
        out_names = [self.program.outputs[i].name for i in self.diff_out]
        out_names += [f"stash:{v.name}" for v in self.program.stash]
        out_names += [self.program.outputs[i].name for i in self.other_out]
        in_structs = self.param_structs + self.input_structs
        return CompiledModule(
            kind=ModuleKind.forward,
            compiled=compiled,
            compile_seconds=seconds,
            cache_hit=hit,
            invar_names=tuple(v.name for v in [*self.program.params, *self.program.inputs]),
            outvar_names=tuple(out_names),
            invar_sizes=_sizes(in_structs),
            outvar_sizes=_sizes(list(outs) + list(stash) + list(aux)),
            donated_invars=(False,) * len(in_structs),
        )

    def cotangent_structs(self) -> tuple:
        """Cotangents of the differentiated outputs, sharded like the outputs."""
        return tuple(self.forward_out[0])

    def compile_backward(self) -> CompiledModule:
        """Lower and compile backward (needs `compile_forward` first)."""
        if self.forward_out is None:
            raise RuntimeError("compile_forward must run before compile_backward")
        stash = list(self.forward_out[1])
        g = self.cotangent_structs()
        xg_sh = [self.shardings.inputs[i] for i in self.grad_in]
        _, compiled, seconds, hit = _lower_and_compile(
            lambda: jax.jit(self._backward, out_shardings=(self.shardings.params, xg_sh)).lower(
                self.param_structs, tuple(stash), g
            )
        )
        in_names = [p.name for p in self.program.params]
        in_names += [f"stash:{v.name}" for v in self.program.stash]
        in_names += [f"grad:{self.program.outputs[i].name}" for i in self.diff_out]
        grad_params = [f"grad:{p.name}" for p in self.program.params]
        grad_inputs = [f"grad:{self.program.inputs[i].name}" for i in self.grad_in]
        grad_structs = self.param_structs + [self.input_structs[i] for i in self.grad_in]
        in_structs = self.param_structs + stash + list(g)
        return CompiledModule(
            kind=ModuleKind.backward,
            compiled=compiled,
            compile_seconds=seconds,
            cache_hit=hit,
            invar_names=tuple(in_names),
            outvar_names=tuple(grad_params + grad_inputs),
            invar_sizes=_sizes(in_structs),
            outvar_sizes=_sizes(grad_structs),
            donated_invars=(False,) * len(in_structs),
            acc_grad_outvars_indices=tuple(range(len(grad_params))),
        )

    def _backward_in_names(self) -> list[str]:
        names = [p.name for p in self.program.params]
        names += [f"stash:{v.name}" for v in self.program.stash]
        return names + [f"grad:{self.program.outputs[i].name}" for i in self.diff_out]

    def compile_input_grad(self) -> CompiledModule:
        """Lower and compile B: the input cotangents and the handoff to W (needs
        `compile_forward` and a split)."""
        if self.forward_out is None or self.split is None:
            raise RuntimeError("compile_input_grad needs compile_forward and a split backward")
        stash = list(self.forward_out[1])
        g = self.cotangent_structs()
        xg_sh = [self.shardings.inputs[i] for i in self.grad_in]
        split = self.split
        # input cotangents laid out as backward's; the handoff as the compiler propagates it
        lowered, compiled, seconds, hit = _lower_and_compile(
            lambda: jax.jit(split.input_grad, out_shardings=(xg_sh, None)).lower(
                self.param_structs, tuple(stash), g
            )
        )
        outs = _with_shardings(lowered.out_info, compiled.output_shardings)
        self.handoff = tuple(outs[1])
        in_structs = self.param_structs + stash + list(g)
        grad_inputs = [f"grad:{self.program.inputs[i].name}" for i in self.grad_in]
        return CompiledModule(
            kind=ModuleKind.backward_input,
            compiled=compiled,
            compile_seconds=seconds,
            cache_hit=hit,
            invar_names=tuple(self._backward_in_names()),
            outvar_names=tuple(grad_inputs + [f"handoff:{n}" for n in self.split.handoff_names]),
            invar_sizes=_sizes(in_structs),
            outvar_sizes=_sizes(list(outs[0]) + list(outs[1])),
            donated_invars=(False,) * len(in_structs),
        )

    @property
    def handoff_sizes(self) -> tuple[int, ...]:
        """Per-device bytes of each value B hands to W (after `compile_input_grad`)."""
        return _sizes(list(self.handoff))

    def compile_weight_grad(self) -> CompiledModule:
        """Lower and compile W: the parameter gradients from the parameters, the stash and
        B's handoff (needs `compile_input_grad`)."""
        if self.handoff is None or self.split is None:
            raise RuntimeError("compile_input_grad must run before compile_weight_grad")
        stash = list(self.forward_out[1])
        split = self.split
        _, compiled, seconds, hit = _lower_and_compile(
            lambda: jax.jit(split.weight_grad, out_shardings=self.shardings.params).lower(
                self.param_structs, tuple(stash), self.handoff
            )
        )
        in_names = [p.name for p in self.program.params]
        in_names += [f"stash:{v.name}" for v in self.program.stash]
        in_names += [f"handoff:{n}" for n in self.split.handoff_names]
        in_structs = self.param_structs + stash + list(self.handoff)
        grad_params = [f"grad:{p.name}" for p in self.program.params]
        return CompiledModule(
            kind=ModuleKind.backward_weight,
            compiled=compiled,
            compile_seconds=seconds,
            cache_hit=hit,
            invar_names=tuple(in_names),
            outvar_names=tuple(grad_params),
            invar_sizes=_sizes(in_structs),
            outvar_sizes=_sizes(self.param_structs),
            donated_invars=(False,) * len(in_structs),
            acc_grad_outvars_indices=tuple(range(len(grad_params))),
        )

    def compile_apply_grad(self) -> CompiledModule:
        """Lower and compile the optimizer update; parameters and state are donated."""
        state = self.opt_state_structs()
        state_leaves, _ = jax.tree_util.tree_flatten_with_path(state)
        p_sh = self.shardings.params
        s_sh = jax.tree_util.tree_map(lambda s: s.sharding, state)
        _, compiled, seconds, hit = _lower_and_compile(
            lambda: jax.jit(
                self._apply_grad,
                in_shardings=(p_sh, s_sh, p_sh),
                out_shardings=(p_sh, s_sh),
                donate_argnums=(0, 1),
            ).lower(self.param_structs, state, self.param_structs)
        )
        names = [p.name for p in self.program.params]
        state_names = [f"opt_state{jax.tree_util.keystr(path)}" for path, _ in state_leaves]
        state_structs = [s for _, s in state_leaves]
        n_p, n_s = len(names), len(state_names)
        return CompiledModule(
            kind=ModuleKind.apply_grad,
            compiled=compiled,
            compile_seconds=seconds,
            cache_hit=hit,
            invar_names=tuple(names + state_names + [f"grad:{n}" for n in names]),
            outvar_names=tuple(names + state_names),
            invar_sizes=_sizes(self.param_structs + state_structs + self.param_structs),
            outvar_sizes=_sizes(self.param_structs + state_structs),
            donated_invars=(True,) * (n_p + n_s) + (False,) * n_p,
            acc_grad_invars_indices=tuple(range(n_p + n_s, 2 * n_p + n_s)),
        )
