"""POST /v1/models (idempotent by content hash), GET /v1/models, GET /v1/models/{id}."""

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Response, status
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

import programs
from schemas import DTYPE_BYTES, TEXT_PATTERN, ModelSpec
from server.api_models import LayerInfo, ModelCreated, ModelOut, ModelSummary, error_responses
from server.checks import program_errors, raise_if, storable_errors
from server.deps import SessionDep
from server.errors import Conflict, NotFound, field_error
from server.examples import MODEL_EXAMPLES
from store import ModelRow, OldModelForm, get_model_row, get_model_spec, list_models, put_model
from store.queries import layer_jaxprs

router = APIRouter(prefix="/v1/models", tags=["models"])


def _bytes(vs: list[dict[str, Any]]) -> int:
    total = 0
    for v in vs:
        n = DTYPE_BYTES.get(v["dtype"], 0)
        for d in v["shape"]:
            n *= d
        total += n
    return total


def layer_infos(skeleton: dict[str, Any]) -> list[LayerInfo]:
    """Per-layer summary of a stored spec (its `models.spec` skeleton)."""
    out = []
    for i, layer in enumerate(skeleton["layers"]):
        params = layer.get("params", [])
        param_bytes = _bytes(params)
        out.append(
            LayerInfo(
                index=i,
                name=layer["name"],
                fingerprint=layer["fingerprint"],
                inputs=[v["name"] for v in layer["inputs"]],
                outputs=[v["name"] for v in layer["outputs"]],
                num_params=len(params),
                param_bytes=param_bytes,
                flops=layer.get("flops", 0.0),
                residual_bytes=_bytes(layer.get("residuals", [])),
            )
        )
    return out


def store_model(session: Session, spec: ModelSpec) -> tuple[ModelRow, bool]:
    """`put_model` of `spec` keyed by the fingerprints its programs give (call after
    `program_errors` found none), tolerating a concurrent request that stored it first.
    The programs are stored without source locations (the uploader's file paths)."""
    try:
        spec = programs.with_fingerprints(programs.without_locations(spec))
    except ValueError as e:
        raise_if([field_error(("body", "layers"), str(e))])
    try:
        with session.begin_nested():
            return put_model(session, spec=spec)
    except IntegrityError:
        return put_model(session, spec=spec)


def check_model(spec: ModelSpec, loc: tuple[str, ...]) -> None:
    raise_if(program_errors(spec, loc) + storable_errors(spec, loc))


@router.post(
    "",
    response_model=ModelCreated,
    status_code=status.HTTP_201_CREATED,
    responses=error_responses(
        400,
        401,
        403,
        413,
        415,
        extra={200: {"model": ModelCreated, "description": "Already stored."}},
    ),
    summary="Store a model spec (idempotent by content hash)",
)
def create_model(
    spec: Annotated[ModelSpec, Body(openapi_examples=MODEL_EXAMPLES)],
    session: SessionDep,
    response: Response,
) -> ModelCreated:
    """Store `spec` and return its id and layer fingerprints. Posting an equal spec again
    returns the same id with `created: false` and status 200. The programs are stored without
    source locations (file paths, function and scope names are stripped).

    Beyond the schema's per-field rules, a spec must meet these rules between fields (a 422
    naming the field otherwise): names are unique (model inputs, layers, a layer's vars and
    residuals); each layer input is a model input or an output of an earlier layer, with the
    same shape and dtype, and no var is produced twice; a parameter shared by layers is
    declared alike, and never has a var's name; `saved` names the layer's own inputs and
    outputs; `grad_inputs` lists, in order, its floating inputs that are not model inputs;
    `logical_axes` has one entry per dim of `shape`; `loss` is a scalar output of the last
    layer; a layer has at most 4096 vars and the programs at most 512 MiB in all; each
    program is `jax.export` bytes whose arguments and results match the layer's vars; a
    stated `fingerprint` is the one its programs give (leave it empty)."""
    check_model(spec, ("body",))
    row, created = store_model(session, spec)
    if not created:
        response.status_code = status.HTTP_200_OK
    return ModelCreated(
        id=row.id,
        name=row.name,
        num_layers=row.num_layers,
        created=created,
        layer_fingerprints=[layer["fingerprint"] for layer in row.spec["layers"]],
        url=f"/v1/models/{row.id}",
    )


@router.get(
    "",
    response_model=list[ModelSummary],
    responses=error_responses(),
    summary="List stored models, newest first",
)
def read_models(
    session: SessionDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[ModelSummary]:
    return [
        ModelSummary(id=r.id, name=r.name, num_layers=r.num_layers, created_at=r.created_at)
        for r in list_models(session, limit=limit)
    ]


@router.get(
    "/{model_id}",
    response_model=ModelOut,
    responses=error_responses(404, 409),
    summary="A stored model: layers, fingerprints and its spec",
)
def read_model(
    model_id: Annotated[str, Path(pattern=TEXT_PATTERN, description="The model's id.")],
    session: SessionDep,
    programs: Annotated[
        bool, Query(description="Include the layers' serialized programs (can be large).")
    ] = False,
) -> ModelOut:
    row = get_model_row(session, model_id=model_id)
    if row is None:
        raise NotFound(f"model {model_id!r} not found")
    try:
        spec = get_model_spec(session, model_id=model_id, with_programs=programs)
    except OldModelForm as err:
        raise Conflict(str(err)) from err
    assert spec is not None
    if not programs:
        fps = [layer["fingerprint"] for layer in row.spec["layers"]]
        jaxprs = layer_jaxprs(session, fingerprints=fps)
        spec = spec.model_copy(
            update={
                "layers": [
                    layer.model_copy(update={"jaxpr": jaxprs.get(s["fingerprint"], "")})
                    for layer, s in zip(spec.layers, row.spec["layers"], strict=True)
                ]
            }
        )
    return ModelOut(
        id=row.id,
        name=row.name,
        num_layers=row.num_layers,
        created_at=row.created_at,
        layers=layer_infos(row.spec),
        spec=spec,
    )
