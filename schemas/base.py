"""The frozen base model every schema derives from."""

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Immutable, strict about unknown fields: the contract between phases."""

    model_config = ConfigDict(frozen=True, extra="forbid")
