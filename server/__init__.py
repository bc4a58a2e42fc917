"""The REST API and the dashboard (FastAPI). Imports schemas and store only: no jax, no ray."""

from server.app import create_app
from server.settings import Settings, get_settings

__all__ = ["Settings", "create_app", "get_settings"]
