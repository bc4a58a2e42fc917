"""Split a layer's exported backward by dependency, for zero-bubble schedules.

A layer's backward (a `jax.export.Exported`, StableHLO inside, so opaque to `make_jaxpr`)
returns its parameter gradients, then its input cotangents. Its `main` is inlined and its
operations partitioned by backward reachability from the input cotangents:

- B (`input_grad`): the operations the input cotangents need. It returns them and the
  *handoff*: every value of B that an operation of W reads.
- W (`weight_grad`): every other operation. It takes the backward's arguments plus the
  handoff and returns the parameter gradients.

Operations that depend only on constants (and the platform index) are repeated in W
instead of handed off. Nothing else is computed twice: FLOPs(B) + FLOPs(W) = FLOPs(backward).
"""

import dataclasses
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax._src.export._export import _module_to_bytecode
from jax._src.interpreters import mlir
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func as func_dialect
from jaxlib.mlir.passmanager import PassManager

Exported = jax.export.Exported
# jaxlib's `func.FuncOp` and the MLIR values around it, typed loosely: their stubs lag the
# bindings (`FuncOp.arguments`, iterating a `DictAttr`).
FuncOp = Any

_ELEMENT_DTYPES = {
    "f64": np.float64,
    "f32": np.float32,
    "f16": np.float16,
    "bf16": jax.numpy.bfloat16,
    "i1": np.bool_,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "ui8": np.uint8,
    "ui16": np.uint16,
    "ui32": np.uint32,
    "ui64": np.uint64,
}


@dataclass(frozen=True)
class LayerSplit:
    """A layer backward split in two. `input_grad` is None when the layer has no input
    cotangents (W is the whole backward); `weight_grad` is None when it has no parameters.

    input_grad(*backward args) -> (*input cotangents, *handoff);
    weight_grad(*backward args, *handoff) -> parameter gradients;
    `weight_reads`: the indices of the backward's arguments that W reads."""

    input_grad: Exported | None
    weight_grad: Exported | None
    handoff: tuple[jax.ShapeDtypeStruct, ...]
    weight_reads: frozenset[int]


_CACHE_SIZE = 256
_cache: dict[tuple[str, int], LayerSplit] = {}


def split_layer_backward(backward: Exported, num_params: int) -> LayerSplit:
    """Split `backward`, whose first `num_params` results are parameter gradients and the
    rest input cotangents (cached by program)."""
    key = (hashlib.sha256(backward.mlir_module_serialized).hexdigest(), num_params)
    hit = _cache.get(key)
    if hit is None:
        hit = _cache[key] = _split(backward, num_params)
        if len(_cache) > _CACHE_SIZE:
            del _cache[next(iter(_cache))]
    return hit


def _split(backward: Exported, num_params: int) -> LayerSplit:
    n_out = len(backward.out_avals)
    everything = frozenset(backward.module_kept_var_idx)
    if num_params == 0:
        return LayerSplit(backward, None, (), frozenset())
    if num_params == n_out:
        return LayerSplit(None, backward, (), everything)
    with mlir.make_ir_context(), ir.Location.unknown():
        b_module = ir.Module.parse(backward.mlir_module())
        PassManager.parse("builtin.module(inline)").run(b_module.operation)
        w_module = ir.Module.parse(str(b_module))
        part = _Partition(_main(b_module), num_params)
        handoff_types = [v.type for v in part.handoff]
        reads = _cut_weight_grad(_main(w_module), part)
        _cut_input_grad(_main(b_module), part)
        handoff = tuple(_struct(t) for t in handoff_types)
        b_bytes = _module_to_bytecode(b_module)
        w_bytes = _module_to_bytecode(w_module)
    offset = _num_leading_args(backward)
    kept = backward.module_kept_var_idx
    weight_reads = frozenset(kept[i - offset] for i in reads if 0 <= i - offset < len(kept))
    return LayerSplit(
        _exported(backward, b_bytes, backward.in_avals, backward.out_avals[num_params:], handoff),
        _exported(
            backward, w_bytes, (*backward.in_avals, *handoff), backward.out_avals[:num_params]
        ),
        handoff,
        weight_reads,
    )


def _main(module: ir.Module) -> FuncOp:
    for op in module.body.operations:
        name: Any = op.attributes["sym_name"] if "sym_name" in op.attributes else None
        if op.operation.name == "func.func" and name is not None and name.value == "main":
            return op
    raise ValueError("the exported backward has no main function")


def _num_leading_args(exported: Exported) -> int:
    """Arguments of `main` before the kept inputs: the platform index, effect tokens."""
    return int(len(exported.platforms) > 1) + len(exported.ordered_effects)


def _nested_operands(op: ir.Operation) -> Iterator[ir.Value]:
    """Operands of `op` and of every operation nested in its regions."""
    yield from op.operands
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield from _nested_operands(inner.operation)


class _Partition:
    """Which operations of `main`'s body are B's, which are constant-like, what B hands W."""

    def __init__(self, main: FuncOp, num_params: int):
        self.block = block = main.regions[0].blocks[0]
        ops = [op.operation for op in block.operations]
        self.body, self.ret = ops[:-1], ops[-1]
        self.index = {op: i for i, op in enumerate(self.body)}
        n_lead = sum(
            "jax.global_constant" in _arg_attrs(main, a.arg_number) for a in block.arguments
        )
        self.deps: list[set[int]] = []
        self.args: list[set[int]] = []
        for op in self.body:
            d, a = self._uses(_nested_operands(op))
            self.deps.append(d)
            self.args.append(a)
        self.const = [False] * len(self.body)
        for i in range(len(self.body)):
            self.const[i] = all(a < n_lead for a in self.args[i]) and all(
                self.const[j] for j in self.deps[i]
            )
        ret_ops = list(self.ret.operands)
        self.b_results, self.w_results = ret_ops[num_params:], ret_ops[:num_params]
        self.in_b = self._closure(self.b_results)
        w_uses = [
            v for i, op in enumerate(self.body) if i not in self.in_b for v in _nested_operands(op)
        ]
        # (operation index, result number) of each value B hands to W, in order of first use
        self.handoff_ids: list[tuple[int, int]] = []
        self.handoff: list[ir.Value] = []
        for v in [*w_uses, *self.w_results]:
            owner = self._owner(v)
            if owner is None or owner not in self.in_b or self.const[owner]:
                continue
            k = (owner, ir.OpResult(v).result_number)
            if k not in self.handoff_ids:
                self.handoff_ids.append(k)
                self.handoff.append(v)

    def _owner(self, v: Any) -> int | None:
        if isinstance(v, ir.BlockArgument):
            return None
        return self.index.get(v.owner.operation)

    def _uses(self, values: Iterator[ir.Value]) -> tuple[set[int], set[int]]:
        deps: set[int] = set()
        args: set[int] = set()
        for v in values:
            if isinstance(v, ir.BlockArgument):
                if v.owner == self.block:
                    args.add(v.arg_number)
                continue
            owner = self._owner(v)
            if owner is not None:
                deps.add(owner)
        return deps, args

    def _closure(self, values: list[ir.Value]) -> set[int]:
        todo = [i for i in (self._owner(v) for v in values) if i is not None]
        seen: set[int] = set()
        while todo:
            i = todo.pop()
            if i not in seen:
                seen.add(i)
                todo.extend(self.deps[i])
        return seen


def _arg_attrs(main: FuncOp, i: int) -> dict[str, ir.Attribute]:
    if "arg_attrs" not in main.attributes:
        return {}
    attrs: Any = ir.DictAttr(ir.ArrayAttr(main.attributes["arg_attrs"])[i])
    return {a.name: a.attr for a in attrs}


def _set_signature(main: FuncOp, results: list[ir.Value]) -> None:
    block = main.regions[0].blocks[0]
    ret = list(block.operations)[-1]
    with ir.InsertionPoint.at_block_terminator(block):
        func_dialect.ReturnOp(results)
    ret.erase()
    inputs = [a.type for a in block.arguments]
    main.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(inputs, [v.type for v in results])
    )
    if "res_attrs" in main.attributes:
        del main.attributes["res_attrs"]
    if "arg_attrs" in main.attributes:
        old: list[Any] = list(ir.ArrayAttr(main.attributes["arg_attrs"]))
        extra = [ir.DictAttr.get({})] * (len(inputs) - len(old))
        main.attributes["arg_attrs"] = ir.ArrayAttr.get(old + extra)


def _cut_input_grad(main: FuncOp, part: _Partition) -> None:
    """Keep B's operations; return the input cotangents then the handoff."""
    block = main.regions[0].blocks[0]
    body = [op.operation for op in block.operations][:-1]
    ret = list(list(block.operations)[-1].operands)
    handoff = [body[i].results[r] for i, r in part.handoff_ids]
    _set_signature(main, ret[len(part.w_results) :] + handoff)
    for i in reversed(range(len(body))):
        if i not in part.in_b:
            body[i].erase()


def _cut_weight_grad(main: FuncOp, part: _Partition) -> set[int]:
    """Keep W's and the constant-like operations, read the handoff from new arguments;
    returns the indices of `main`'s original arguments W still reads."""
    block = main.regions[0].blocks[0]
    body = [op.operation for op in block.operations][:-1]
    n_args = len(block.arguments)
    ret = list(list(block.operations)[-1].operands)
    for i, r in part.handoff_ids:
        v = body[i].results[r]
        v.replace_all_uses_with(block.add_argument(v.type, ir.Location.unknown()))
    _set_signature(main, ret[: len(part.w_results)])
    for i in reversed(range(len(body))):
        if i in part.in_b and not part.const[i]:
            body[i].erase()
    reads: set[int] = set()
    for op in block.operations:
        for v in _nested_operands(op.operation):
            if isinstance(v, ir.BlockArgument) and v.arg_number < n_args:
                reads.add(v.arg_number)
    return reads


def _struct(t: ir.Type) -> jax.ShapeDtypeStruct:
    tensor = ir.RankedTensorType(t)
    return jax.ShapeDtypeStruct(tuple(tensor.shape), _ELEMENT_DTYPES[str(tensor.element_type)])


def _exported(
    base: Exported,
    module: bytes,
    in_avals: tuple,
    out_avals: tuple,
    extra_out: tuple[jax.ShapeDtypeStruct, ...] = (),
) -> Exported:
    """`base` with another module and signature (no shardings: the caller's jit shards)."""
    ins = tuple(jax.core.ShapedArray(a.shape, a.dtype) for a in in_avals)
    outs = tuple(jax.core.ShapedArray(a.shape, a.dtype) for a in (*out_avals, *extra_out))
    n_new = len(ins) - len(base.in_avals)
    return dataclasses.replace(
        base,
        in_tree=jax.tree_util.tree_structure((tuple(range(len(ins))), {})),
        in_avals=ins,
        out_tree=jax.tree_util.tree_structure(tuple(range(len(outs)))),
        out_avals=outs,
        _in_named_shardings=(None,) * len(ins),
        _out_named_shardings=(None,) * len(outs),
        in_shardings_hlo=(None,) * len(ins),
        out_shardings_hlo=(None,) * len(outs),
        mlir_module_serialized=module,
        module_kept_var_idx=(
            *base.module_kept_var_idx,
            *range(len(base.in_avals), len(base.in_avals) + n_new),
        ),
        _get_vjp=None,
    )
