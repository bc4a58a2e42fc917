"""A stage measured without the split backward, which a round then wants split, keeps its
recorded measurement until the split one goes to an actor (`EstimateLoop.detach`); put back
unmeasured (a count judged mid-round: `workers.jobs.count_loop`), it is measured as before
the round, never stored as estimated. The search is real (a tiny GPT's candidate space);
the job's context is a stand-in whose store records what is detached."""

from types import SimpleNamespace
from typing import Any

import pytest

import planner
from schemas import ClusterSpec
from tests.support.models import FAST_OPTIONS, tiny_gpt
from workers.jobs import estimate_loop
from workers.jobs.estimate_loop import EstimateLoop

AUTO = FAST_OPTIONS.model_copy(update={"schedule": "auto"})


class RecordingStore:
    """Runs each write on no session; the store functions it reaches are stand-ins."""

    def patient(self, what: str, put: Any) -> Any:
        return put(None)


@pytest.fixture
def detached(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The fingerprints of each `forget_results` the loop asks of the store."""
    calls: list[list[str]] = []
    fake = SimpleNamespace(
        forget_results=lambda s, *, job_id, fingerprints: calls.append(list(fingerprints)),
        refresh_progress=lambda s, *, job_id: None,
    )
    monkeypatch.setattr(estimate_loop, "store", fake)
    return calls


def _loop() -> EstimateLoop:
    spec = tiny_gpt(num_layers=2)
    cluster = ClusterSpec(num_hosts=1, devices_per_host=2)
    space = planner.enumerate_candidates(spec, cluster, AUTO)
    space, scaled, _ = planner.with_layer_profiles(space, [x.fingerprint for x in spec.layers])
    keys_by_fp = {f"fp{k.as_tuple()}": [k] for k in space.keys}
    ctx = SimpleNamespace(
        job_id="job",
        spec=spec,
        cluster=cluster,
        options=AUTO,
        space=space,
        scaled=frozenset(scaled),
        splits_on_demand=True,
        keys_by_fp=keys_by_fp,
        candidates=SimpleNamespace(fp_of={ks[0].as_tuple(): fp for fp, ks in keys_by_fp.items()}),
        store=RecordingStore(),
    )
    return EstimateLoop(ctx)  # type: ignore[arg-type]


def test_a_stage_put_back_keeps_its_measurement_without_the_split(
    detached: list[list[str]],
) -> None:
    loop = _loop()
    key = next(iter(loop.fp_of))
    fp = loop.fp_of[key]
    loop.unsplit = {fp}  # measured without the split, recorded for the job's candidates
    loop.pending = set()

    assert loop.fresh([key]) == [fp]  # a round wants its split
    assert detached == []  # still recorded: nothing went to an actor

    loop.put_back([fp])  # the count is stopped before the stage comes up
    assert fp in loop.unsplit and fp not in loop.pending  # never stored as estimated
    assert detached == []

    assert loop.fresh([key]) == [fp]  # a later round wants it again
    loop.detach([fp])  # now it goes to an actor
    assert detached == [[fp]]
    loop.detach([fp])
    loop.put_back([])
    assert detached == [[fp]] and fp not in loop.unsplit


def test_a_stage_never_measured_put_back_is_pending_again(detached: list[list[str]]) -> None:
    loop = _loop()
    key = next(iter(loop.fp_of))
    fp = loop.fp_of[key]
    loop.pending = {fp}

    assert loop.fresh([key]) == [fp]
    assert fp not in loop.pending
    loop.put_back([fp])
    assert fp in loop.pending and fp not in loop.unsplit
    loop.detach([fp])
    assert detached == []  # it had no measurement to lose
