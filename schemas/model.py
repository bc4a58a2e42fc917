"""The model on the wire: a layered dataflow graph of `jax.export` programs.

Each layer travels as a pair of programs, positional arguments and results throughout:
- `forward(*params, *inputs) -> (*outputs, *residuals)`: the layer's forward, returning
  what its backward needs (what `jax.vjp` keeps, or what a `jax.checkpoint` policy saves);
- `backward(*params, *saved, *residuals, *cotangents) -> (*param_grads, *input_cotangents)`:
  `saved` are the layer's own inputs/outputs the backward reads (by name), cotangents come
  for the floating outputs in order, input cotangents go to `grad_inputs` in order.
The backward never re-runs the forward. Never a pickle.
"""

import re
from typing import Annotated

from pydantic import AfterValidator, Field, WithJsonSchema, field_validator, model_validator
from pydantic.config import JsonDict

from schemas.base import TEXT_PATTERN, Frozen
from schemas.cluster import DTYPE_BYTES, FLOAT_DTYPES, REMAT_CHOICES, REMAT_VARIANTS
from schemas.sharding import MeshFacts

MAX_LAYERS = 1024
MAX_RANK = 8
MAX_DIM = 2**31
MAX_PROGRAM_CHARS = 64 * 2**20
MAX_VARS_PER_LAYER = 4096
OLD_LAYER_FORM = (
    "this layer is in the old single-program form ('program'), whose backward re-runs the "
    "forward and whose residuals are unknown; trace the model again with this version of "
    "the stageprof client (client.trace) and upload it again: layers now carry 'forward' "
    "and 'backward' programs and their 'residuals'"
)
MAX_MODEL_PROGRAM_CHARS = 512 * 2**20
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:/\-\[\]]{0,127}$"
_NAME_RE = re.compile(NAME_PATTERN)
# Standard base64 (the programs' encoding); empty only in answers that leave programs out.
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
NAME_SCHEMA: JsonDict = {"type": "string", "pattern": NAME_PATTERN}
DTYPE_SCHEMA: JsonDict = {"enum": [*sorted(DTYPE_BYTES)]}
SHAPE_SCHEMA: JsonDict = {
    "maxItems": MAX_RANK,
    "items": {"type": "integer", "minimum": 1, "maximum": MAX_DIM},
}


def _check_name(v: str) -> str:
    if not _NAME_RE.fullmatch(v):
        raise ValueError(
            f"{v!r} is not a valid name: start with a letter or '_', at most 128 characters "
            "of letters, digits and _.:/-[]"
        )
    return v


Name = Annotated[str, AfterValidator(_check_name), WithJsonSchema(NAME_SCHEMA)]


def _check_unique(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise ValueError(f"duplicate {what} name {n!r}")
        seen.add(n)


class VarSpec(Frozen):
    """A named array: shape and dtype (per micro-batch for batch inputs and activations)."""

    name: Name = Field(description="Variable name, unique in the model.")
    shape: tuple[int, ...] = Field(
        description=f"Array shape: at most {MAX_RANK} dims, each in [1, 2**31].",
        json_schema_extra=SHAPE_SCHEMA,
    )
    dtype: str = Field(
        description=f"Element type, one of {sorted(DTYPE_BYTES)}.", json_schema_extra=DTYPE_SCHEMA
    )

    @field_validator("shape")
    @classmethod
    def _shape(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if len(v) > MAX_RANK:
            raise ValueError(f"rank {len(v)} exceeds the limit of {MAX_RANK}")
        for d in v:
            if d < 1 or d > MAX_DIM:
                raise ValueError(f"every dimension must be in [1, {MAX_DIM}], got {v}")
        return v

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        if v not in DTYPE_BYTES:
            raise ValueError(f"unsupported dtype {v!r}; use one of {sorted(DTYPE_BYTES)}")
        return v

    @property
    def size_bytes(self) -> int:
        n = DTYPE_BYTES[self.dtype]
        for d in self.shape:
            n *= d
        return n


class ParamSpec(VarSpec):
    """A trainable parameter, optionally with logical axis names (for the sharding rules)."""

    logical_axes: tuple[str | None, ...] | None = Field(
        None,
        description="One logical name per dim (e.g. ('embed', 'mlp')) or null; a sharding "
        "config's rules split each named dim over mesh axes (MaxText's: embed on fsdp, "
        "mlp/heads/vocab on tensor, experts on expert); null: a structural fallback.",
        json_schema_extra={
            "anyOf": [
                {
                    "type": "array",
                    "items": {
                        "anyOf": [{"type": "string", "pattern": TEXT_PATTERN}, {"type": "null"}]
                    },
                },
                {"type": "null"},
            ]
        },
    )

    @model_validator(mode="after")
    def _axes_rank(self) -> "ParamSpec":
        if self.logical_axes is not None and len(self.logical_axes) != len(self.shape):
            raise ValueError(
                f"logical_axes has {len(self.logical_axes)} names for a rank-{len(self.shape)} "
                "parameter"
            )
        return self


class RematVariant(Frozen):
    """The layer's pair exported under a rematerialization policy: the same inputs, outputs,
    params and gradient inputs, its own programs, residuals and backward reads."""

    forward: str = Field(
        max_length=MAX_PROGRAM_CHARS,
        json_schema_extra={"pattern": BASE64_PATTERN},
        description="jax.export serialized forward under the policy, base64.",
    )
    backward: str = Field(
        max_length=MAX_PROGRAM_CHARS,
        json_schema_extra={"pattern": BASE64_PATTERN},
        description="jax.export serialized backward under the policy (it recomputes what the "
        "policy did not save), base64.",
    )
    residuals: list[VarSpec] = Field(
        default_factory=list, description="What this forward keeps for its backward."
    )
    saved: list[str] = Field(
        default_factory=list,
        description="Names of the layer's inputs and outputs this backward reads, in order.",
        json_schema_extra={"items": NAME_SCHEMA, "uniqueItems": True},
    )
    backward_flops: float = Field(
        0.0, ge=0, description="Backward FLOPs per micro-batch, recomputation included."
    )
    fingerprint: str = Field(
        "",
        max_length=128,
        json_schema_extra={"pattern": TEXT_PATTERN},
        description="Fingerprint of the layer under this variant (its programs' own).",
    )

    @property
    def program_chars(self) -> int:
        return len(self.forward) + len(self.backward)


class LayerSpec(Frozen):
    """One layer: a contiguous piece of the forward computation, as a forward/backward pair."""

    name: Name = Field(description="Layer name, unique in the model.")
    inputs: list[VarSpec] = Field(
        description="Vars it reads: model inputs or outputs of earlier layers."
    )
    outputs: list[VarSpec] = Field(min_length=1, description="Vars it produces.")
    params: list[ParamSpec] = Field(default_factory=list, description="Its parameters.")
    forward: str = Field(
        max_length=MAX_PROGRAM_CHARS,
        json_schema_extra={"pattern": BASE64_PATTERN},
        description="jax.export serialized forward, base64: "
        "(*params, *inputs) -> (*outputs, *residuals).",
    )
    backward: str = Field(
        max_length=MAX_PROGRAM_CHARS,
        json_schema_extra={"pattern": BASE64_PATTERN},
        description="jax.export serialized backward, base64: (*params, *saved, *residuals, "
        "*cotangents of the floating outputs) -> (*param grads, *cotangents of grad_inputs).",
    )
    residuals: list[VarSpec] = Field(
        default_factory=list,
        description="What forward returns after the outputs for backward, per micro-batch.",
    )
    saved: list[str] = Field(
        default_factory=list,
        description="Names of the layer's inputs and outputs that backward reads, in order.",
        json_schema_extra={"items": NAME_SCHEMA, "uniqueItems": True},
    )
    grad_inputs: list[str] = Field(
        default_factory=list,
        json_schema_extra={"items": NAME_SCHEMA, "uniqueItems": True},
        description="Names of the inputs whose cotangents backward returns, in order: the "
        "floating inputs that are not model batch inputs.",
    )
    jaxpr: str = Field(
        "",
        max_length=MAX_PROGRAM_CHARS,
        json_schema_extra={"pattern": TEXT_PATTERN},
        description="Its jaxpr, as text.",
    )
    flops: float = Field(0.0, ge=0, description="Forward FLOPs per micro-batch.")
    fingerprint: str = Field(
        "",
        max_length=128,
        json_schema_extra={"pattern": TEXT_PATTERN},
        description="Hash of the canonical computation and shapes; equal for identical layers.",
    )
    backward_flops: float = Field(
        0.0, ge=0, description="Backward FLOPs per micro-batch of the pair as written (0: unknown)."
    )
    remat_variants: dict[str, RematVariant] = Field(
        default_factory=dict,
        description=f"The pair under rematerialization policies, by name ({list(REMAT_VARIANTS)}); "
        "the pair above is 'as_written'.",
        json_schema_extra={"propertyNames": {"enum": list(REMAT_VARIANTS)}},
    )

    @model_validator(mode="before")
    @classmethod
    def _old_form(cls, data: object) -> object:
        if isinstance(data, dict) and "program" in data and "forward" not in data:
            raise ValueError(OLD_LAYER_FORM)
        return data

    @model_validator(mode="after")
    def _unique(self) -> "LayerSpec":
        names = [v.name for v in self.inputs] + [v.name for v in self.outputs]
        names += [p.name for p in self.params]
        if len(names) + len(self.residuals) > MAX_VARS_PER_LAYER:
            raise ValueError(f"more than {MAX_VARS_PER_LAYER} vars")
        _check_unique(names, "var")
        _check_unique([v.name for v in self.residuals], "residual")
        own = {v.name for v in self.inputs} | {v.name for v in self.outputs}
        _check_unique(self.saved, "saved")
        for n in self.saved:
            if n not in own:
                raise ValueError(f"saved var {n!r} is neither an input nor an output")
        floats = {v.name for v in self.inputs if v.dtype in FLOAT_DTYPES}
        _check_unique(self.grad_inputs, "grad_inputs")
        for n in self.grad_inputs:
            if n not in floats:
                raise ValueError(f"grad_inputs names {n!r}, which is not a floating input")
        for key, variant in self.remat_variants.items():
            if key not in REMAT_VARIANTS:
                raise ValueError(
                    f"remat_variants: unknown variant {key!r}; use one of {list(REMAT_VARIANTS)}"
                )
            _check_unique([v.name for v in variant.residuals], f"{key} residual")
            _check_unique(variant.saved, f"{key} saved")
            for n in variant.saved:
                if n not in own:
                    raise ValueError(
                        f"remat_variants[{key!r}].saved: {n!r} is neither an input nor an output"
                    )
        return self

    def variant(self, name: str) -> "LayerSpec":
        """This layer as it runs under remat variant `name` ('as_written': itself), with no
        variants of its own. Raises `KeyError` for a variant it does not carry."""
        if name == "as_written":
            return self.model_copy(update={"remat_variants": {}}) if self.remat_variants else self
        v = self.remat_variants[name]
        return self.model_copy(
            update={
                "forward": v.forward,
                "backward": v.backward,
                "residuals": v.residuals,
                "saved": v.saved,
                "backward_flops": v.backward_flops,
                "fingerprint": v.fingerprint,
                "remat_variants": {},
            }
        )

    @property
    def param_bytes(self) -> int:
        return sum(p.size_bytes for p in self.params)

    @property
    def program_chars(self) -> int:
        """Characters of its programs, its remat variants' included."""
        own = len(self.forward) + len(self.backward)
        return own + sum(v.program_chars for v in self.remat_variants.values())


class ModelSpec(Frozen):
    """A model as L layers of `jax.export` programs, traced at the micro-batch size."""

    name: Name = Field("model", description="Human-readable model name.")
    inputs: list[VarSpec] = Field(
        min_length=1, description="Batch inputs per micro-batch; dim 0 is the batch dim."
    )
    layers: list[LayerSpec] = Field(
        min_length=1, max_length=MAX_LAYERS, description="The layers, in execution order."
    )
    loss: str = Field(
        description="Name of the scalar loss var, an output of the last layer.",
        json_schema_extra={"pattern": NAME_PATTERN},
    )
    jax_version: str = Field(
        "",
        max_length=64,
        json_schema_extra={"pattern": TEXT_PATTERN},
        description="jax version that exported it.",
    )

    @model_validator(mode="after")
    def _names(self) -> "ModelSpec":
        _check_unique([v.name for v in self.inputs], "model input")
        _check_unique([layer.name for layer in self.layers], "layer")
        if self.loss not in {v.name for v in self.layers[-1].outputs}:
            raise ValueError(f"loss {self.loss!r} is not an output of the last layer")
        return self

    @model_validator(mode="after")
    def _dataflow(self) -> "ModelSpec":
        errors = dataflow_errors(self)
        if errors:
            raise ValueError("; ".join(errors))
        return self

    def under_remat(self, name: str) -> "ModelSpec":
        """The model with every layer that carries remat variant `name` running under it
        (the others as written); 'as_written' gives the model as traced, without variants.
        A stage composed from it runs all its layers under one variant, and its stage
        fingerprint differs from the as-written one exactly where a layer's programs do."""
        if name not in REMAT_CHOICES:
            raise ValueError(f"remat: unknown variant {name!r}; use one of {list(REMAT_CHOICES)}")
        layers = [
            layer.variant(name if name in layer.remat_variants else "as_written")
            for layer in self.layers
        ]
        return self.model_copy(update={"layers": layers})

    @property
    def mesh_facts(self) -> MeshFacts:
        """Whether it has a sequence dim and expert parameters (for the mesh-axes search)."""
        return MeshFacts.of(
            [(v.shape, v.dtype) for v in self.inputs],
            (p.logical_axes for layer in self.layers for p in layer.params),
        )

    @property
    def micro_batch_size(self) -> int:
        return self.inputs[0].shape[0] if self.inputs[0].shape else 1

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def _typed(v: VarSpec) -> str:
    return f"{v.dtype}{list(v.shape)}"


def dataflow_errors(spec: ModelSpec) -> list[str]:
    """Structural problems of a spec's wiring, each naming the layer and field.

    Every layer input is a model input or an output of an earlier layer, with the same shape
    and dtype; no var is produced twice; parameters shared between layers agree and never
    reuse a var's name; the loss is a scalar; the programs fit the size limit.
    """
    errors: list[str] = []
    producers: dict[str, tuple[str, VarSpec]] = {
        v.name: (f"inputs[{j}]", v) for j, v in enumerate(spec.inputs)
    }
    params: dict[str, tuple[str, ParamSpec]] = {}
    for i, layer in enumerate(spec.layers):
        for j, v in enumerate(layer.inputs):
            where = f"layers[{i}].inputs[{j}]"
            if v.name not in producers:
                errors.append(
                    f"{where}: {v.name!r} is not produced by any earlier layer or model input"
                )
            elif (v.shape, v.dtype) != (producers[v.name][1].shape, producers[v.name][1].dtype):
                origin, produced = producers[v.name]
                errors.append(
                    f"{where}: {v.name!r} is declared {_typed(v)} but {origin} produces "
                    f"{_typed(produced)}"
                )
        for j, p in enumerate(layer.params):
            where = f"layers[{i}].params[{j}]"
            if p.name in producers:
                errors.append(f"{where}: {p.name!r} is also the name of {producers[p.name][0]}")
            elif p.name in params and params[p.name][1] != p:
                origin, first = params[p.name]
                errors.append(
                    f"{where}: shared parameter {p.name!r} is {_typed(p)} with axes "
                    f"{p.logical_axes} but {origin} declares {_typed(first)} with axes "
                    f"{first.logical_axes}"
                )
            params.setdefault(p.name, (where, p))
        for j, v in enumerate(layer.outputs):
            where = f"layers[{i}].outputs[{j}]"
            if v.name in producers:
                errors.append(f"{where}: {v.name!r} is already produced by {producers[v.name][0]}")
            elif v.name in params:
                errors.append(f"{where}: {v.name!r} is also the name of {params[v.name][0]}")
            else:
                producers[v.name] = (where, v)
    last = len(spec.layers) - 1
    for j, v in enumerate(spec.layers[-1].outputs):
        if v.name == spec.loss and v.shape != ():
            errors.append(
                f"layers[{last}].outputs[{j}]: the loss {v.name!r} must be a scalar (shape ()), "
                f"got shape {v.shape}"
            )
    model_inputs = {v.name for v in spec.inputs}
    for i, layer in enumerate(spec.layers):
        want = [
            v.name for v in layer.inputs if v.dtype in FLOAT_DTYPES and v.name not in model_inputs
        ]
        if list(layer.grad_inputs) != want:
            errors.append(
                f"layers[{i}].grad_inputs: must list the floating inputs that are not model "
                f"inputs, in order ({want}), got {list(layer.grad_inputs)}"
            )
    total = sum(layer.program_chars for layer in spec.layers)
    if total > MAX_MODEL_PROGRAM_CHARS:
        errors.append(
            f"layers: the programs total {total} characters, over the limit of "
            f"{MAX_MODEL_PROGRAM_CHARS}"
        )
    return errors
