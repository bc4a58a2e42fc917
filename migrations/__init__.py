"""Alembic environment and versions for `store`; `upgrade(url)` applies them."""

from pathlib import Path

from alembic import command
from alembic.config import Config

HERE = Path(__file__).resolve().parent


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config pointing at this package, for `url` (default: the store's URL)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Bring the database at `url` to `revision`."""
    command.upgrade(alembic_config(url), revision)
