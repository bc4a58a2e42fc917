"""The `STAGEPROF_*` settings of runners, workers, the CLI and the client, in one
pydantic-settings object (the API server's own are `server.settings.Settings`).

Read at call time (`env_settings()`), where each is used, so a process and its tests see the
environment of the moment; a field's default and description are the setting's documentation.
"""

import os
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "STAGEPROF_"
DEFAULT_MAX_CANDIDATES = 20_000
SWITCH_ON = ("1", "true", "on", "yes")
# What turns an on/off setting off (any case).
OFF_WORDS = ("0", "false", "off", "no")
# The persistent XLA compilation cache's directory unless `STAGEPROF_COMPILE_CACHE_DIR` says
# otherwise: per user, shared by the measuring processes of a machine and across jobs.
DEFAULT_COMPILE_CACHE_DIR = "~/.cache/stageprof/xla"
COMPILE_CACHE_OFF = "off"


def env_name(field: str) -> str:
    """The environment variable of a setting: `max_candidates` -> `STAGEPROF_MAX_CANDIDATES`."""
    return ENV_PREFIX + field.upper()


class EnvSettings(BaseSettings):
    """Every setting read from `STAGEPROF_<FIELD>`; a bad value raises a ValueError that names
    the variable."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    database_url: str = Field(
        "", description="The store's SQLAlchemy URL; empty: a SQLite file ./stageprof.db."
    )
    api_token: str = Field(
        "", description="The bearer token the HTTP SDK (and `plan --server`) sends; empty: none."
    )
    max_candidates: int = Field(
        DEFAULT_MAX_CANDIDATES,
        description="The most stage candidates a job may have: the API refuses a request with "
        "more, a runner a job with more.",
    )
    workers: int | None = Field(
        None, description="`--workers`' default: the most measuring groups at once."
    )
    devices_per_worker: int | None = Field(
        None, description="`--devices-per-worker`'s default: the one-shape pool's devices."
    )
    use_gpus: bool = Field(False, description="`--gpus`' default: on when set to 1.")
    lease_seconds: float = Field(30.0, description="`--lease-seconds`' default: a job's lease.")
    quiet_timing: bool = Field(
        True,
        description="The machine-wide quiet-timing lock (workers.measure.quiet); off when set "
        "to 0, false, off or no.",
    )
    lock_dir: str = Field("", description="Where the quiet-timing lock files live; empty: temp.")
    timing_clock: str = Field(
        "wall", description="wall, or cpu: this process's CPU time on all-CPU devices."
    )
    scan_stages: bool = Field(
        False,
        description="Measure a stage's runs of identical consecutive layers as one lax.scan "
        "(workers.measure.compose_scan) instead of unrolled; on when set to 1, true, on or yes.",
    )
    compile_cache_dir: str = Field(
        DEFAULT_COMPILE_CACHE_DIR,
        description="JAX's persistent compilation cache of the measuring processes: a "
        "directory (`~` is the measuring process's home; a shared filesystem path shares it "
        "between nodes); off when set to off, 0, false or no; empty: the default.",
    )

    @property
    def compile_cache_path(self) -> str | None:
        """The compilation cache's directory, `~` expanded here; None when it is off."""
        if self.compile_cache_dir == COMPILE_CACHE_OFF:
            return None
        return os.path.expanduser(self.compile_cache_dir)

    @field_validator("database_url", "timing_clock", mode="before")
    @classmethod
    def _stripped(cls, v: Any) -> Any:
        return v.strip() if isinstance(v, str) else v

    @field_validator("timing_clock")
    @classmethod
    def _lower(cls, v: str) -> str:
        return v.lower() or "wall"

    @field_validator("compile_cache_dir", mode="before")
    @classmethod
    def _cache_dir(cls, v: Any) -> Any:
        if not isinstance(v, str):
            return v
        text = v.strip()
        if text.lower() in OFF_WORDS:
            return COMPILE_CACHE_OFF
        return text or DEFAULT_COMPILE_CACHE_DIR

    @field_validator("max_candidates", mode="before")
    @classmethod
    def _positive(cls, v: Any) -> Any:
        if not isinstance(v, str):
            return v
        text = v.strip()
        if not text:
            return DEFAULT_MAX_CANDIDATES
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"{env_name('max_candidates')} must be a positive integer, got {v!r}")
        return value

    @field_validator("workers", "devices_per_worker", mode="before")
    @classmethod
    def _optional_int(cls, v: Any) -> Any:
        if not isinstance(v, str):
            return v
        return int(v.strip()) if v.strip() else None

    @field_validator("use_gpus", mode="before")
    @classmethod
    def _one_is_on(cls, v: Any) -> Any:
        return v == "1" if isinstance(v, str) else v

    @field_validator("scan_stages", mode="before")
    @classmethod
    def _off_unless_on(cls, v: Any) -> Any:
        return v.strip().lower() in SWITCH_ON if isinstance(v, str) else v

    @field_validator("quiet_timing", mode="before")
    @classmethod
    def _on_unless_off(cls, v: Any) -> Any:
        return v.strip().lower() not in OFF_WORDS if isinstance(v, str) else v


def env_settings(environ: Mapping[str, str] | None = None) -> EnvSettings:
    """The settings of `environ` (default: this process's environment, read now; the object
    is cached per value of the `STAGEPROF_*` variables). Raises ValueError naming the variable
    of a bad value."""
    env = os.environ if environ is None else environ
    ours = tuple(sorted((k, v) for k, v in env.items() if k.upper().startswith(ENV_PREFIX)))
    try:
        return _settings(ours, environ is None)
    except ValidationError as err:
        raise ValueError(_named(err)) from None


@lru_cache(maxsize=64)
def _settings(ours: tuple[tuple[str, str], ...], from_environment: bool) -> EnvSettings:
    if from_environment:
        return EnvSettings()  # pydantic-settings reads os.environ, which holds `ours`
    given = {k.upper(): v for k, v in ours}
    fields = EnvSettings.model_fields
    # Every field given: the mapping alone decides, the process's environment is not read.
    return EnvSettings(
        **{f: given.get(env_name(f), info.get_default()) for f, info in fields.items()}
    )


def _named(err: ValidationError) -> str:
    """e.g. "STAGEPROF_WORKERS: invalid literal for int() with base 10: 'x'"."""
    problems = []
    for e in err.errors():
        field = str(e["loc"][0]) if e["loc"] else ""
        message = str(e["msg"]).removeprefix("Value error, ")
        problems.append(message if env_name(field) in message else f"{env_name(field)}: {message}")
    return "; ".join(problems)


def env_forwarded(
    names: tuple[str, ...], environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The variables of these settings that are set in `environ`, as they are (a process
    passes them on to the processes it starts)."""
    return {env_name(n): environ[env_name(n)] for n in names if env_name(n) in environ}
