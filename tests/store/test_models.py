"""Model specs: content-addressed, programs stored once per layer fingerprint."""

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from store import (
    LayerProgramRow,
    ModelRow,
    OldModelForm,
    get_model_spec,
    model_id_for,
    put_model,
)
from tests.store.factories import tiny_spec


def test_put_model_is_idempotent_by_content(session: Session) -> None:
    spec = tiny_spec()
    row, created = put_model(session, spec=spec)
    again, created_again = put_model(session, spec=tiny_spec(program_tag="other-bytes"))
    assert created and not created_again
    assert row.id == again.id == model_id_for(spec)
    assert len(row.id) == 64


def test_model_round_trips_with_programs(session: Session) -> None:
    spec = tiny_spec()
    row, _ = put_model(session, spec=spec)
    loaded = get_model_spec(session, model_id=row.id)
    assert loaded == spec


def test_different_widths_are_different_models(session: Session) -> None:
    a, _ = put_model(session, spec=tiny_spec(width=8))
    b, created = put_model(session, spec=tiny_spec(width=16))
    assert created and a.id != b.id


def test_layer_programs_stored_once_per_fingerprint(session: Session) -> None:
    put_model(session, spec=tiny_spec(width=8, name="one"))
    put_model(session, spec=tiny_spec(width=8, name="two"))
    n = session.scalar(select(func.count()).select_from(LayerProgramRow))
    assert n == 2  # two distinct layer fingerprints, shared by both models


def test_unknown_model_is_none(session: Session) -> None:
    assert get_model_spec(session, model_id="0" * 64) is None


def _store_old_form(session: Session) -> str:
    """A model as the single-program form stored it: no residuals, no backward."""
    skeleton = tiny_spec().model_dump(mode="json")
    for layer in skeleton["layers"]:
        for key in ("forward", "backward", "jaxpr", "residuals", "saved", "grad_inputs"):
            layer.pop(key)
    session.add(LayerProgramRow(fingerprint="fp-old", program="AAAA", jaxpr=""))
    skeleton["layers"][0]["fingerprint"] = "fp-old"
    session.add(ModelRow(id="1" * 64, name="old", num_layers=2, spec=skeleton))
    session.flush()
    return "1" * 64


def test_old_form_model_asks_for_an_upload(session: Session) -> None:
    model_id = _store_old_form(session)
    with pytest.raises(OldModelForm, match="old single-program layer form.*upload it again"):
        get_model_spec(session, model_id=model_id)
    with pytest.raises(OldModelForm):
        get_model_spec(session, model_id=model_id, with_programs=False)


def test_new_upload_completes_an_old_program_row(session: Session) -> None:
    session.add(LayerProgramRow(fingerprint="fp-dense-8", program="AAAA", jaxpr=""))
    session.flush()
    row, _ = put_model(session, spec=tiny_spec())
    assert get_model_spec(session, model_id=row.id) == tiny_spec()
