"""The frozen base model every schema derives from."""

from pydantic import BaseModel, ConfigDict

# The JSON Schema form of rules the service applies to every string it stores: no NUL
# characters (a NUL in a URL is a 400, in a body a 422).
TEXT_PATTERN = r"^[^\x00]*$"


class Frozen(BaseModel):
    """Immutable, strict about unknown fields: the contract between phases."""

    model_config = ConfigDict(frozen=True, extra="forbid")
