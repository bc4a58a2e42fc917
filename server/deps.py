"""Typed dependencies the routes declare: the request's database session and the settings."""

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from server.access import READ_METHODS
from server.settings import Settings
from store import session_scope


def get_session(request: Request) -> Iterator[Session]:
    """A session for one request: committed when the route returns, rolled back on error.

    Declared with `scope="function"` so the commit happens before the response is sent: a
    client that gets `202` can read the job it created at once. On SQLite a write request
    takes the write lock first (`BEGIN IMMEDIATE`, waiting up to the busy timeout): a
    transaction that read and then found another writer's commit would fail at once.
    """
    write = request.method not in READ_METHODS
    with session_scope(request.app.state.sessionmaker, write=write) as session:
        yield session


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
