"""Every rule a runner would fail on, checked synchronously before a plan job is queued.

`check_plan_request` raises a 422 naming the field and the reason (or a 404/409 for a
stored model that is missing or in the old form) and writes nothing: sizes, the cluster,
manual submeshes, the micro-batch, the stages to measure against the model's layers, the
number of stage candidates against the cap, and last (the most expensive) the layers'
programs.
"""

from typing import Any

from sqlalchemy.orm import Session

from schemas import PlanRequest
from schemas.candidate_count import count_candidates
from schemas.limits import max_candidates
from schemas.sharding import MeshFacts
from server.checks import (
    Errors,
    candidate_errors,
    measure_stage_errors,
    micro_batch_errors,
    program_errors,
    raise_if,
    sharding_errors,
    storable_errors,
    submesh_errors,
    zoo_ref_errors,
    zoo_size_errors,
)
from server.errors import Conflict, Loc, NotFound, field_error
from server.zoo_limits import spec_shape
from store import OldModelForm, get_model_row, is_current_form
from store.models import model_id_for

BODY = ("body",)


def _stored_micro_batch(skeleton: dict[str, Any]) -> int:
    shape = skeleton["inputs"][0]["shape"]
    return shape[0] if shape else 1


# What the mesh-axes search needs of each zoo model (`ModelSpec.mesh_facts` of its spec):
# the language models take token ids (a sequence), the MoE has expert parameters.
ZOO_MESH_FACTS = {
    "gpt": MeshFacts(sequence=True, experts=False),
    "moe": MeshFacts(sequence=True, experts=True),
    "mlp": MeshFacts(sequence=False, experts=False),
    "wresnet": MeshFacts(sequence=False, experts=False),
}


def _stored_facts(skeleton: dict[str, Any]) -> MeshFacts:
    return MeshFacts.of(
        [(v["shape"], v["dtype"]) for v in skeleton["inputs"]],
        (p.get("logical_axes") for layer in skeleton["layers"] for p in layer.get("params", [])),
    )


def _model_shape(
    body: PlanRequest, session: Session
) -> tuple[int, int, list[float] | None, Loc, Errors, MeshFacts | None]:
    """(layers, micro-batch, layer FLOPs or None, where the layers come from, errors, the
    model's mesh facts or None)."""
    if body.model is not None:
        spec = body.model
        flops = [layer.flops for layer in spec.layers]
        loc: Loc = (*BODY, "model", "layers")
        return spec.num_layers, spec.micro_batch_size, flops, loc, [], spec.mesh_facts
    if body.zoo is not None:
        where = (*BODY, "zoo")
        errors = zoo_ref_errors(body.zoo, where)
        errors = errors or zoo_size_errors(body.zoo, where)
        if errors:
            return 0, 1, None, where, errors, None
        layers, micro_batch = spec_shape(body.zoo.name, body.zoo.config)
        loc = (*where, "config", "num_layers") if "num_layers" in body.zoo.config else where
        return layers, micro_batch, None, loc, [], ZOO_MESH_FACTS.get(body.zoo.name)
    assert body.model_id is not None
    row = get_model_row(session, model_id=body.model_id)
    if row is None:
        raise NotFound(f"model {body.model_id!r} not found; POST it to /v1/models first")
    if not is_current_form(row.spec):
        raise Conflict(str(OldModelForm(body.model_id)))
    flops = [float(layer.get("flops", 0.0)) for layer in row.spec["layers"]]
    micro_batch = _stored_micro_batch(row.spec)
    return row.num_layers, micro_batch, flops, (*BODY, "model_id"), [], _stored_facts(row.spec)


def _symbolic_batch(body: PlanRequest, session: Session) -> bool | None:
    """Whether the model has a symbolic batch dimension (None: a zoo model, traced with one
    by the runner when the job searches counts of micro-batches)."""
    if body.model is not None:
        return body.model.symbolic_batch is not None
    if body.model_id is not None:
        row = get_model_row(session, model_id=body.model_id)
        return row is not None and row.spec.get("symbolic_batch") is not None
    return None


def check_plan_request(body: PlanRequest, session: Session) -> str | None:
    """Raise unless a runner can carry out `body`; returns the model's id (None for a zoo
    model, which the runner builds)."""
    options_loc = (*BODY, "options")
    errors = storable_errors(body, BODY)
    errors += submesh_errors(body.options, body.cluster, options_loc)
    errors += sharding_errors(body.options, body.cluster, options_loc)
    raise_if(errors)
    num_layers, micro_batch, flops, layers_loc, errors, facts = _model_shape(body, session)
    raise_if(errors)
    symbolic = _symbolic_batch(body, session)
    raise_if(micro_batch_errors(body.options, micro_batch, options_loc, symbolic))
    if body.zoo is None:  # a zoo model is built by the runner, which ignores such keys
        raise_if(measure_stage_errors(body.options, num_layers, options_loc))
    remats = 1
    if body.model is not None:  # a stored model's variants are counted by the runner
        carried = {v for layer in body.model.layers for v in layer.remat_variants}
        remat = body.options.remat
        if remat == "auto":
            remats += len(carried)
        elif remat != "as_written" and remat not in carried:
            message = (
                f"no layer of the model carries the {remat!r} remat variant; trace it with "
                f"client.trace(..., remat_variants=({remat!r},))"
            )
            raise_if([field_error((*options_loc, "remat"), message)])
    options = body.options
    sizes = [micro_batch]
    if options.microbatch_search is not None:  # each count's space is the runner's at its size
        batch = options.global_batch(micro_batch)
        sizes = [batch // b for b in options.microbatch_counts(micro_batch)]
    count = max(
        (
            count_candidates(num_layers, body.cluster, options, size, flops, remats, facts)
            for size in sizes
        ),
        key=lambda c: c.total,
    )
    cap = max_candidates()
    raise_if(candidate_errors(count, cap, num_layers, body.cluster, body.options, layers_loc))
    if body.model is not None:
        raise_if(program_errors(body.model, (*BODY, "model")))
        return model_id_for(body.model)
    return body.model_id
