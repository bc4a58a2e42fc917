"""The measuring phase asks `postpone` of each stage as it comes up, with the results that
came before it fed already: a stage it postpones is neither claimed, measured nor stored
(`workers.jobs.count_loop` judges its counts so). The pool, ledger and lease are stand-ins
that record what the phase asked of them."""

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from schemas import StageKey, SubmeshShape
from workers.jobs.job_stats import JobStats
from workers.jobs.phase import MeasuringPhase
from workers.jobs.stage_ledger import OURS

SUBMESH = SubmeshShape(hosts=1, devices_per_host=1)


class OneSlotPool:
    """Measures one stage at a time; `poll` answers the stage submitted."""

    def __init__(self) -> None:
        self.layout = SimpleNamespace(shape_for=lambda submesh: "1x1", groups_that_fit=lambda s: 1)
        self.running: Any = None
        self.submitted: list[str] = []

    def accepts(self, submesh: SubmeshShape) -> bool:
        return self.running is None

    @property
    def busy(self) -> bool:
        return self.running is not None

    def submit(self, task: Any, wanted: int) -> None:
        self.running = task
        self.submitted.append(task.fingerprint)

    def poll(self, seconds: float) -> list[Any]:
        done, self.running = self.running, None
        return [SimpleNamespace(fingerprint=done.fingerprint)]

    def release_idle(self) -> None:
        pass


class Ledger:
    """Claims every stage for this job and stores each result at once."""

    def __init__(self) -> None:
        self.claimed: list[str] = []
        self.waiting: list[str] = []
        self.unsaved: list[Any] = []

    def claim(self, fingerprint: str) -> str:
        self.claimed.append(fingerprint)
        return OURS

    def settle_waiting(self) -> tuple[list[Any], list[str]]:
        return [], []

    def keep(self, result: Any) -> None:
        self.unsaved.append(result)

    def flush(self, patient: bool = False) -> list[Any]:
        out, self.unsaved = self.unsaved, []
        return out


class Sink:
    def __init__(self) -> None:
        self.fed: list[str] = []

    def add(self, fingerprint: str, keys: Iterable[Any], result: Any) -> None:
        self.fed.append(fingerprint)

    def prunable(self, fingerprint: str, keys: Iterable[Any]) -> bool:
        return False


def test_a_stage_postponed_on_the_results_before_it_is_not_claimed_nor_measured() -> None:
    pool, ledger, sink = OneSlotPool(), Ledger(), Sink()
    fps = ["a", "b", "c", "d"]
    keys = {fp: [StageKey(start=i, end=i, submesh_id=0, config_id=0)] for i, fp in enumerate(fps)}
    asked: list[tuple[str, tuple[str, ...]]] = []

    def postpone(fp: str) -> bool:
        asked.append((fp, tuple(sink.fed)))
        return fp == "c" and "b" in sink.fed  # judged on b's result

    phase = MeasuringPhase(
        store=None,  # type: ignore[arg-type]  # nothing is pruned or waited for: never read
        job_id="job",
        owner="runner",
        start_pool=lambda: pool,  # type: ignore[arg-type,return-value]
        poll_seconds=0.0,
        on_progress=None,
    )
    keeper = SimpleNamespace(check=lambda: None, sleep=lambda s: None)
    phase.run(
        fps,
        keys,
        [SUBMESH],
        sink,
        JobStats(),
        keeper,  # type: ignore[arg-type]
        ledger,  # type: ignore[arg-type]
        postpone=postpone,
    )
    assert pool.submitted == ["a", "b", "d"]
    assert ledger.claimed == ["a", "b", "d"]
    assert sink.fed == ["a", "b", "d"]
    # each stage judged as it came up, on every result before it
    assert asked == [("a", ()), ("b", ("a",)), ("c", ("a", "b")), ("d", ("a", "b"))]
