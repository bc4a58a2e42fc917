"""`stageprof db upgrade|current`: apply the store's migrations."""

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("db", help="database migrations")
    actions = parser.add_subparsers(dest="db_action", required=True)
    up = actions.add_parser("upgrade", help="apply migrations up to a revision (default head)")
    up.add_argument("revision", nargs="?", default="head")
    up.add_argument("--url", help="database URL (default: STAGEPROF_DATABASE_URL or SQLite)")
    up.set_defaults(func=_upgrade)
    cur = actions.add_parser("current", help="show the database's revision")
    cur.add_argument("--url", help="database URL")
    cur.set_defaults(func=_current)


def _upgrade(args: argparse.Namespace) -> int:
    from migrations import upgrade
    from store import database_url

    url = args.url or database_url()
    upgrade(url, args.revision)
    print(f"database at {_redact(url)} is at {args.revision}")
    return 0


def _current(args: argparse.Namespace) -> int:
    from alembic import command

    from migrations import alembic_config
    from store import database_url

    command.current(alembic_config(args.url or database_url()))
    return 0


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
