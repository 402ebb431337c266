"""moto's S3 server on 127.0.0.1, with its writes made atomic as S3's are.

S3 decides conditional writes atomically: of racing ``PutObject`` requests with
``If-None-Match: *`` on one key, one succeeds and the others get 412. moto's server
checks the condition and then writes, in separate steps, on a thread per request
(``moto/s3/responses.py``, ``put_object``: ``get_object`` to check, ``put_object`` to
write): two racing creates can both pass the check, and both succeed. The full chaos
budget found it: in 1,600 holds of one lease by 8 processes on moto, two processes held
it at once for 0.1 s (the lease's fencing refused the loser's state write).

So that moto stands in for S3 and not for a store that breaks its own conditions, this
server lets one write (``PUT``, ``POST``, ``DELETE``) run at a time; reads stay
concurrent. It also answers S3 only: moto's dispatcher works out the service of every
request from its host, listing moto's ~150 service folders on disk each time, under one
lock that every request passes (a fifth of the server's samples in a profile of
Meltano's own tests on S3); the suite asks this server for S3 alone. Everything else is
moto's own server, as ``moto.server.ThreadedMotoServer`` runs it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

WRITES = frozenset({"PUT", "POST", "DELETE"})

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class OneWriteAtATime:
    """WSGI middleware: requests that write run one at a time, body and answer included."""

    def __init__(self, app: Wsgi) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("REQUEST_METHOD") not in WRITES:
            return self.app(environ, start_response)
        with self.lock:
            return list(self.app(environ, start_response))  # the whole answer, under the lock


def s3_only(dispatcher_class: type) -> type:
    """moto's dispatcher, answering every request but its own API's with its S3 application."""

    class S3Dispatcher(dispatcher_class):  # type: ignore[misc]
        def get_application(self, environ: dict[str, Any]) -> Any:
            if str(environ.get("PATH_INFO", "")).startswith(("/moto-api", "/latest/")):
                return super().get_application(environ)
            app = self.app_instances.get("s3")
            if app is None:
                with self.lock:
                    app = self.app_instances.get("s3") or self.create_app("s3")
                    self.app_instances["s3"] = app
            return app

    return S3Dispatcher


class AtomicMotoServer:
    """moto's S3 in this process, on its own thread (like ``ThreadedMotoServer``), with
    :class:`OneWriteAtATime` in front of its application, S3 only, and no access log."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log on stderr
        app = OneWriteAtATime(s3_only(DomainDispatcherApplication)(create_backend_app))
        self._server = make_server(host, port, app, True, request_handler=MotoRequestHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
