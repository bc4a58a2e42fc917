"""Server settings from the environment (prefix `STAGEPROF_`), read once per process."""

import logging
from functools import lru_cache

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from store import database_url, normalize_url

log = logging.getLogger(__name__)

MIB = 2**20


class Settings(BaseSettings):
    """What the API needs to run: where the database is, who may write, how big a body may be."""

    model_config = SettingsConfigDict(env_prefix="STAGEPROF_", frozen=True, extra="ignore")

    database_url: str = Field(
        default_factory=database_url,
        description="SQLAlchemy URL; default: STAGEPROF_DATABASE_URL or ./stageprof.db.",
    )
    api_token: SecretStr | None = Field(
        None,
        description="Bearer token for writes. Unset: writes only from loopback clients.",
    )
    reads_open: bool = Field(
        True, description="Reads (GET, the dashboard) need no token. False: they need one."
    )
    read_token: SecretStr | None = Field(
        None, description="A token that grants reads only (api_token grants reads too)."
    )
    max_model_bytes: int = Field(
        64 * MIB, ge=1024, description="Largest request body (a model spec), bytes."
    )
    poll_interval_ms: int = Field(
        2000, ge=200, le=60000, description="How often dashboard pages poll for progress."
    )
    db_pool_size: int = Field(10, ge=1, le=200, description="Connections per API process.")

    @field_validator("database_url")
    @classmethod
    def _driver(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("database_url is empty")
        return normalize_url(v)

    @field_validator("api_token", "read_token")
    @classmethod
    def _no_blank_token(cls, v: SecretStr | None) -> SecretStr | None:
        """A blank token would let `Authorization: Bearer ` through: treat it as unset."""
        if v is None or not v.get_secret_value().strip():
            return None
        if len(v.get_secret_value()) < 16:
            log.warning("the API token is shorter than 16 characters; use a longer one")
        return v


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment on first use."""
    return Settings()
