"""A real uvicorn server on a free loopback port, in a thread, for HTTP tests."""

import threading
from types import TracebackType

import uvicorn

from server import Settings, create_app
from tests.support.waiting import wait_until

START_TIMEOUT_S = 20.0


class LiveServer:
    """`with LiveServer(settings) as srv:` serves the app at `srv.url` until the block ends."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        config = uvicorn.Config(
            create_app(settings),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="on",
            access_log=False,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self.url = ""

    def __enter__(self) -> "LiveServer":
        self._thread.start()
        wait_until(
            lambda: self._server.started,
            START_TIMEOUT_S,
            "uvicorn start",
            interval_s=0.02,
            check=self._assert_serving,
        )
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def _assert_serving(self) -> None:
        assert self._thread.is_alive(), "uvicorn exited before it started"

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=START_TIMEOUT_S)
