"""Settings come from STAGEPROF_* variables and normalise what they read."""

import pytest

from server.settings import MIB, Settings


def test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGEPROF_DATABASE_URL", "postgresql://u@db:5432/sp")
    monkeypatch.setenv("STAGEPROF_API_TOKEN", "a-token-from-the-environment")
    monkeypatch.setenv("STAGEPROF_READS_OPEN", "false")
    monkeypatch.setenv("STAGEPROF_MAX_MODEL_BYTES", str(2 * MIB))
    s = Settings()
    assert s.database_url == "postgresql+psycopg://u@db:5432/sp"
    assert s.api_token is not None
    assert s.api_token.get_secret_value() == "a-token-from-the-environment"
    assert "a-token" not in repr(s)  # secrets stay out of logs
    assert s.reads_open is False and s.max_model_bytes == 2 * MIB


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("STAGEPROF_DATABASE_URL", "STAGEPROF_API_TOKEN", "STAGEPROF_READS_OPEN"):
        monkeypatch.delenv(name, raising=False)
    s = Settings()
    assert s.database_url == "sqlite:///stageprof.db" and s.api_token is None
    assert s.reads_open is True and s.max_model_bytes == 64 * MIB


@pytest.mark.parametrize(
    "kwargs", [{"database_url": " "}, {"max_model_bytes": 10}, {"poll_interval_ms": 1}]
)
def test_rejects_unusable_values(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Settings(**kwargs)
