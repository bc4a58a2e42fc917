"""Model specs: content-addressed, with layer programs stored once per fingerprint."""

import hashlib
import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from schemas import ModelSpec
from store.tables import LayerProgramRow, ModelRow

_PROGRAM_FIELDS = ("forward", "backward", "jaxpr")

OLD_FORM_MESSAGE = (
    "model {model_id} was stored in the old single-program layer form (its backward re-ran "
    "the forward, its residuals were unknown) and cannot be measured faithfully; trace it "
    "again with this version of the stageprof client and upload it again (POST /v1/models)"
)


class OldModelForm(Exception):
    """A stored model in the pre-pair layer form: it must be traced and uploaded again."""

    def __init__(self, model_id: str) -> None:
        super().__init__(OLD_FORM_MESSAGE.format(model_id=model_id))
        self.model_id = model_id


def is_current_form(skeleton: dict[str, Any]) -> bool:
    """Whether a stored spec skeleton has the forward/backward layer form (its layers
    record residuals and gradient inputs; old ones do not)."""
    return all("grad_inputs" in layer for layer in skeleton.get("layers", []))


def _layer_fingerprint(layer: dict[str, Any]) -> str:
    """The layer's own fingerprint, or a hash of its programs when it has none."""
    fp = layer.get("fingerprint") or ""
    programs = (layer["forward"] + "\n" + layer["backward"]).encode()
    return fp or "program-sha256:" + hashlib.sha256(programs).hexdigest()


def model_id_for(spec: ModelSpec) -> str:
    """Content hash of a spec: its structure and layer fingerprints, not the program bytes
    (two exports of the same model differ byte for byte but describe the same computation)."""
    return hashlib.sha256(json.dumps(_skeleton(spec), sort_keys=True).encode()).hexdigest()


def _skeleton(spec: ModelSpec) -> dict[str, Any]:
    data = spec.model_dump(mode="json")
    for layer in data["layers"]:
        layer["fingerprint"] = _layer_fingerprint(layer)
        for field in _PROGRAM_FIELDS:
            layer.pop(field, None)
    return data


def put_model(session: Session, *, spec: ModelSpec) -> tuple[ModelRow, bool]:
    """Store `spec` unless an equal one is stored; returns the row and whether it is new."""
    model_id = model_id_for(spec)
    row = session.get(ModelRow, model_id)
    if row is not None:
        return row, False
    for layer in spec.layers:
        fp = _layer_fingerprint(layer.model_dump(include={"fingerprint", "forward", "backward"}))
        stored = session.get(LayerProgramRow, fp)
        if stored is None:
            session.add(
                LayerProgramRow(
                    fingerprint=fp,
                    program=layer.forward,
                    backward=layer.backward,
                    jaxpr=layer.jaxpr,
                )
            )
        elif stored.backward is None:  # an old-form row under the same fingerprint
            stored.program, stored.backward = layer.forward, layer.backward
            stored.jaxpr = layer.jaxpr
    row = ModelRow(id=model_id, name=spec.name, num_layers=spec.num_layers, spec=_skeleton(spec))
    session.add(row)
    session.flush()
    return row, True


def get_model_row(session: Session, *, model_id: str) -> ModelRow | None:
    return session.get(ModelRow, model_id)


def get_model_spec(
    session: Session, *, model_id: str, with_programs: bool = True
) -> ModelSpec | None:
    """The stored spec; programs and jaxprs are filled from `layer_programs` when asked.
    Raises `OldModelForm` for a model stored in the old single-program form."""
    row = session.get(ModelRow, model_id)
    if row is None:
        return None
    if not is_current_form(row.spec):
        raise OldModelForm(model_id)
    data = json.loads(json.dumps(row.spec))
    fps = [layer["fingerprint"] for layer in data["layers"]]
    programs: dict[str, LayerProgramRow] = {}
    if with_programs:
        stmt = select(LayerProgramRow).where(LayerProgramRow.fingerprint.in_(set(fps)))
        programs = {p.fingerprint: p for p in session.scalars(stmt)}
    for layer, fp in zip(data["layers"], fps, strict=True):
        stored = programs.get(fp)
        if stored is not None and stored.backward is None:
            raise OldModelForm(model_id)
        layer["forward"] = stored.program if stored else ""
        layer["backward"] = (stored.backward or "") if stored else ""
        layer["jaxpr"] = stored.jaxpr if stored else ""
    return ModelSpec.model_validate(data)


def list_models(session: Session, *, limit: int = 100) -> list[ModelRow]:
    stmt = select(ModelRow).order_by(ModelRow.created_at.desc()).limit(limit)
    return list(session.scalars(stmt))
