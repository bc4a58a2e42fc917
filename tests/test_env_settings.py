"""`STAGEPROF_*` settings come from one object (`schemas.settings.EnvSettings`), read when
they are used: a variable set after import counts, a bad value names its variable."""

import os

import pytest

from cli.main import build_parser
from client.sdk import StageprofClient
from schemas.limits import max_candidates
from schemas.settings import EnvSettings, env_name, env_settings
from store import database_url
from workers.cluster.host_group import worker_env
from workers.measure.quiet import enabled, lock_dir


def test_the_defaults_without_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in EnvSettings.model_fields:
        monkeypatch.delenv(env_name(name), raising=False)
    env = env_settings()
    assert env.max_candidates == max_candidates() == 20_000
    assert env.workers is None and env.devices_per_worker is None and not env.use_gpus
    assert env.lease_seconds == 30.0 and env.quiet_timing and env.timing_clock == "wall"
    assert database_url() == "sqlite:///stageprof.db"


def test_each_reader_sees_the_variable_set_now(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("STAGEPROF_MAX_CANDIDATES", " 12 ")
    monkeypatch.setenv("STAGEPROF_DATABASE_URL", " postgresql://u@db/sp ")
    monkeypatch.setenv("STAGEPROF_LOCK_DIR", str(tmp_path))
    monkeypatch.setenv("STAGEPROF_QUIET_TIMING", "Off")
    monkeypatch.setenv("STAGEPROF_WORKERS", "3")
    monkeypatch.setenv("STAGEPROF_USE_GPUS", "1")
    monkeypatch.setenv("STAGEPROF_LEASE_SECONDS", "12.5")
    monkeypatch.setenv("STAGEPROF_API_TOKEN", "a-token-from-the-environment")
    assert max_candidates() == 12
    assert database_url() == "postgresql+psycopg://u@db/sp"
    assert lock_dir() == tmp_path and not enabled()
    args = build_parser().parse_args(["worker"])
    assert (args.workers, args.gpus, args.lease_seconds) == (3, True, 12.5)
    with StageprofClient("http://127.0.0.1:1") as api:
        assert api._http.headers["Authorization"] == "Bearer a-token-from-the-environment"
    monkeypatch.setenv("STAGEPROF_QUIET_TIMING", "yes-please")  # anything but 0/false/off/no
    assert enabled()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("STAGEPROF_MAX_CANDIDATES", "0"),
        ("STAGEPROF_WORKERS", "two"),
        ("STAGEPROF_LEASE_SECONDS", ""),
    ],
)
def test_a_bad_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        env_settings({name: value})


def test_a_mapping_alone_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGEPROF_MAX_CANDIDATES", "7")
    assert max_candidates({}) == 20_000
    assert max_candidates({"STAGEPROF_MAX_CANDIDATES": "9"}) == 9
    assert max_candidates() == 7


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (None, os.path.expanduser("~/.cache/stageprof/xla")),
        ("  ", os.path.expanduser("~/.cache/stageprof/xla")),
        (" /shared/xla ", "/shared/xla"),
        ("~/xla", os.path.expanduser("~/xla")),
        ("off", None),
        ("OFF", None),
        ("0", None),
        ("false", None),
        ("no", None),
    ],
)
def test_the_compile_cache_dir_parses(value: str | None, path: str | None) -> None:
    env = {} if value is None else {"STAGEPROF_COMPILE_CACHE_DIR": value}
    assert env_settings(env).compile_cache_path == path


def test_the_compile_cache_dir_reaches_the_actors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGEPROF_COMPILE_CACHE_DIR", "/shared/xla")
    assert worker_env(2, use_gpus=False)["STAGEPROF_COMPILE_CACHE_DIR"] == "/shared/xla"
    assert worker_env(1, use_gpus=True, rank=1)["STAGEPROF_COMPILE_CACHE_DIR"] == "/shared/xla"
    monkeypatch.delenv("STAGEPROF_COMPILE_CACHE_DIR")
    assert "STAGEPROF_COMPILE_CACHE_DIR" not in worker_env(2, use_gpus=False)  # their default
