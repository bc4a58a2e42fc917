"""Schemathesis hooks for tests/server/test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

`positive_data_within_rules` replaces schemathesis's `positive_data_acceptance`: a request
valid by the OpenAPI schema may still be refused, but only with a 422 whose every error is
one of the rules listed here, the rules that relate several fields (or a field and stored
state, or bytes no schema can read) and so cannot be written as a per-field JSON Schema. Each
is also stated in its operation's description (and docs/api.md). Any other refusal of a
schema-valid request fails the run: a per-field rule the schema does not state.
"""

import re
from dataclasses import dataclass
from typing import Any

import schemathesis

MODELS = "POST /v1/models"
PLANS = "POST /v1/plans"
PROFILES = "GET /v1/profiles"
COST_MATRIX = "GET /v1/jobs/{job_id}/cost-matrix"
SPEC_OPS = (MODELS, PLANS)  # a plan request may carry a model spec inline


@dataclass(frozen=True)
class CrossFieldRule:
    operations: tuple[str, ...]
    message: str  # a regex searched in the 422 error's `msg`
    why: str  # why no per-field schema can say it
    field: str = ""  # a regex searched in the error's dotted `field`

    def explains(self, operation: str, error: dict[str, Any]) -> bool:
        return (
            operation in self.operations
            and re.search(self.message, str(error.get("msg", ""))) is not None
            and re.search(self.field, str(error.get("field", ""))) is not None
        )


CROSS_FIELD_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        SPEC_OPS,
        r"duplicate (model input|layer|var|residual|\w+ residual|\w+ saved) name|"
        r"more than \d+ vars",
        "names unique across lists and by their `name` property; vars per layer in all",
    ),
    CrossFieldRule(
        SPEC_OPS,
        r"is not produced by any earlier layer|is declared .* but .* produces|is already "
        r"produced by|is also the name of|shared parameter",
        "the dataflow: a layer's inputs are outputs of earlier layers or model inputs",
    ),
    CrossFieldRule(
        SPEC_OPS,
        r"saved var|remat_variants\[.*\]\.saved: .* is neither an input nor an output",
        "`saved` (of the layer and of each remat variant) names the layer's own inputs and outputs",
    ),
    CrossFieldRule(
        SPEC_OPS,
        r"grad_inputs names .* which is not a floating input|grad_inputs: must list the floating",
        "`grad_inputs` follows the inputs' names and dtypes",
    ),
    CrossFieldRule(
        SPEC_OPS,
        r"loss .* is not an output of the last layer|the loss .* must be a scalar",
        "`loss` is a scalar output of the last layer",
    ),
    CrossFieldRule(SPEC_OPS, r"logical_axes has", "`logical_axes` has one name per dim of `shape`"),
    CrossFieldRule(
        SPEC_OPS,
        r"symbolic_batch\.probe_flops has \d+ entries|symbolic_batch\.probe_size must differ",
        "`symbolic_batch` has one entry per layer and a probe size other than the traced one",
    ),
    CrossFieldRule(SPEC_OPS, r"the programs total", "the programs' total size, over all layers"),
    CrossFieldRule(
        SPEC_OPS,
        r"program is empty|not valid base64|cannot be deserialized by jax.export|StableHLO "
        r"module cannot be read|fingerprints are computed from the programs|^(takes|returns) "
        r"\d+ \w+s but|^(argument|output) \d+ has (shape|dtype)|^exported for",
        "programs must be jax.export bytes whose signature matches the layer's vars, and a "
        "stated fingerprint must be the programs' own",
        field=r"layers\.\d+\.(remat_variants\W+\w+\W+)?(forward|backward|fingerprint)$",
    ),
    CrossFieldRule((PLANS,), r"give exactly one of", "exactly one of model_id, model, zoo"),
    CrossFieldRule(
        (PLANS,), r"must divide global_batch_size", "num_microbatches divides global_batch_size"
    ),
    CrossFieldRule(
        (PLANS,),
        r"manual_submeshes is required|does not fit a cluster|do not divide|must use whole "
        r"hosts|cannot cover the cluster",
        "manual submeshes are given for submesh_space 'manual' and must divide the cluster",
    ),
    CrossFieldRule(
        (PLANS,),
        r"at most one mesh axis may be -1|sharding names must be unique|the mesh axes' product "
        r"\d+ is not the device count|give at least one of strategies, mesh_axes, shardings",
        "shardings: one -1 per config, unique names, sizes that resolve on a submesh of the "
        "cluster; some sharding to search",
    ),
    CrossFieldRule(
        (PLANS,), r"but the model was traced at micro-batch", "global batch vs the model's shape"
    ),
    CrossFieldRule(
        (PLANS,),
        r"counts must be unique|searched by the estimate search|without a symbolic batch "
        r"dimension|do not divide the global batch|each count of microbatch_search has its own",
        "microbatch_search: counts unique and few, dividing the global batch; the estimate "
        "search; sizes other than the model's own need a symbolic batch dimension; no "
        "measure_stages beside it",
    ),
    CrossFieldRule(
        (PLANS,),
        r"must be >= start \(|is past the model's last layer",
        "measure_stages: a key's end >= its start, and below the model's number of layers",
        field=r"^options\.measure_stages\.\d+(\.end)?$",
    ),
    CrossFieldRule(
        (PLANS,),
        r"stage candidates|leave no stage candidate",
        "the number of stage candidates (layers x cluster x options) within the cap, and >= 1",
    ),
    CrossFieldRule(
        (PLANS,),
        r".",
        "zoo.config: its keys, value types and bounds depend on zoo.name",
        field=r"^zoo\.config(\.|$)",
    ),
    CrossFieldRule(
        (PLANS,),
        r"end \(\d+\) must be >= start \(\d+\)",
        "a stage key of options.measure_stages: end >= start",
        field=r"^options\.measure_stages\.\d+$",
    ),
    CrossFieldRule((PROFILES,), r"must be >= start_min", "end_max >= start_min"),
    CrossFieldRule(
        (COST_MATRIX,),
        r"not a size of this job",
        "micro_batch_size: one of the sizes the job searched (the job's data)",
        field=r"micro_batch_size$",
    ),
    CrossFieldRule(
        (PROFILES,),
        r"not a cursor returned by this API|the cursor was made for sort",
        "cursor: an opaque token this API made, for the same sort (its form is in the schema)",
    ),
)


def unlisted_errors(operation: str, errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The errors of a 422 that no listed cross-field rule of `operation` explains."""
    return [e for e in errors if not any(r.explains(operation, e) for r in CROSS_FIELD_RULES)]


ACCEPTED = {401, 403, 404, 409, 429}  # as schemathesis's positive_data_acceptance


@schemathesis.check
def positive_data_within_rules(ctx: Any, response: Any, case: Any) -> bool | None:
    """A schema-valid request is accepted, or refused only by listed cross-field rules."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    status = response.status_code
    if status < 400 or status >= 500 or status in ACCEPTED:
        return None
    operation = f"{case.method.upper()} {case.operation.path}"
    if status == 422:
        detail = response.json().get("detail")
        errors = detail if isinstance(detail, list) else [{"msg": str(detail)}]
        unlisted = unlisted_errors(operation, errors)
        if not unlisted:
            return None
        raise AssertionError(f"schema-valid request refused by unlisted rules: {unlisted}")
    raise AssertionError(f"schema-valid request answered {status}: {response.text[:300]}")
