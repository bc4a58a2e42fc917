"""bench/common.py: percentiles, plan costs and the last-line JSON."""

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import common  # bench/common.py, on sys.path through tests/bench/conftest.py
import pytest


def test_percentile_interpolates_between_ranks() -> None:
    values = [10.0, 1.0, 4.0, 2.0, 3.0]
    assert common.percentile(values, 50) == 3.0
    assert common.percentile(values, 0) == 1.0 and common.percentile(values, 100) == 10.0
    assert common.percentile(values, 95) == pytest.approx(4.0 + 0.8 * 6.0)
    assert math.isnan(common.percentile([], 50))


def _result(cost: float, ok: bool = True) -> SimpleNamespace:
    return SimpleNamespace(ok=ok, compute_cost=cost)


def test_plan_cost_is_alpas_objective() -> None:
    results = {(0, 1, 0, 0): _result(2.0), (2, 3, 0, 0): _result(3.0)}
    keys = [(0, 1, 0, 0), (2, 3, 0, 0)]
    assert common.plan_cost(keys, results, microbatches=4) == 2.0 + 3.0 + 3 * 3.0
    assert common.plan_cost([(0, 3, 0, 0)], results, 4) == math.inf  # not measured there
    results[(0, 1, 0, 0)] = _result(2.0, ok=False)
    assert common.plan_cost(keys, results, 4) == math.inf


def test_emit_json_is_one_line_with_nan_as_null(capsys: pytest.CaptureFixture[str]) -> None:
    common.emit_json({"ratio": 5.5, "gap": math.nan, "plan": [(0, 1, 0, 0)]})
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    assert json.loads(out[0]) == {"ratio": 5.5, "gap": None, "plan": [[0, 1, 0, 0]]}


def test_each_run_gets_an_empty_compile_cache_of_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(common.COMPILE_CACHE_ENV, "/the/sessions/cache")
    with common.compile_cache() as fresh:
        assert os.environ[common.COMPILE_CACHE_ENV] == fresh != "/the/sessions/cache"
        assert os.path.isdir(fresh) and not os.listdir(fresh)
    assert not os.path.exists(fresh)  # removed after the run
    assert os.environ[common.COMPILE_CACHE_ENV] == "/the/sessions/cache"
    with common.compile_cache(tmp_path / "warm") as given:
        assert os.environ[common.COMPILE_CACHE_ENV] == given == str(tmp_path / "warm")
    with common.compile_cache("off"):
        assert os.environ[common.COMPILE_CACHE_ENV] == "off"
    monkeypatch.delenv(common.COMPILE_CACHE_ENV)
    with common.compile_cache():
        pass
    assert common.COMPILE_CACHE_ENV not in os.environ
