"""The HTTP listener: an aiohttp application on the broker's own event loop, on ``httpPort``.

:class:`metaq.broker.service.BrokerService` binds it before the data directory is opened (a port in use
is refused before anything is created), starts it once the core is serving, and closes it on stop: no
new connections, waiting long polls answered by the core's drain, then the connections closed.

Every failure becomes a JSON error body (:mod:`metaq.http.errors`), including aiohttp's own refusals
(no such endpoint, method not allowed, a body over the limit), and nothing a client sends can stop the
listener: an unexpected exception is logged and answered with 500.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Any

from aiohttp import web

from metaq.broker.core import Broker
from metaq.broker.http_limits import LimitedFactory, limits_of, runner_options
from metaq.http import auth, errors, routes
from metaq.http.openapi import openapi_document

log = logging.getLogger("metaq.http")

BODY_OVERHEAD_BYTES = 64 * 1024
SHUTDOWN_TIMEOUT_S = 2.0
"""How long stop() lets in-flight HTTP requests finish once the core has drained."""
OPENAPI_KEY: web.AppKey[dict[str, Any]] = web.AppKey("openapi", dict)


def body_bytes_max(broker: Broker) -> int:
    """Largest request body read: a batch of maxBatchSize as base64 inside JSON (4/3 of it, and room for
    the field names). The core then applies maxBatchSize and maxMessageSize themselves (413)."""
    return broker.config.max_batch_bytes * 4 // 3 + BODY_OVERHEAD_BYTES


@web.middleware
async def error_middleware(request: web.Request, handler: routes.Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except errors.HttpInputError as exc:
        return errors.input_error_response(exc)
    except errors.WireError as exc:
        return errors.wire_error_response(exc.code, exc.message, **exc.extra)
    except web.HTTPRequestEntityTooLarge as exc:
        return errors.http_error_response(exc, f"the request body is larger than this broker reads "
                                               f"({exc.text}); send smaller batches")
    except web.HTTPMethodNotAllowed as exc:
        return errors.http_error_response(exc, f"{request.method} is not allowed on {request.path[:200]}; "
                                               f"allowed: {', '.join(sorted(exc.allowed_methods))}")
    except web.HTTPNotFound as exc:
        return errors.http_error_response(exc, f"no endpoint {request.path[:200]!r}; see /openapi.json")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return errors.http_error_response(exc, exc.text or exc.reason)
    except Exception:
        log.exception("HTTP %s %s failed", request.method, request.path[:200])
        return errors.json_error(500, errors.error_body(500, -1, "UNKNOWN_SERVER_ERROR",
                                                        "the broker failed in an unexpected way; see its log"))


async def _openapi(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI_KEY])


def make_app(broker: Broker) -> web.Application:
    app = web.Application(middlewares=[error_middleware, auth.basic_auth_middleware],
                          client_max_size=body_bytes_max(broker))
    app[routes.BROKER_KEY] = broker
    app[auth.AUTHENTICATOR_KEY] = auth.BasicAuthenticator(broker)
    app[OPENAPI_KEY] = openapi_document(broker)
    for method, path, handler in routes.ROUTES:
        app.router.add_route(method, path, handler)
    app.router.add_get("/openapi.json", _openapi)
    return app


class HttpListener:
    """``broker``'s HTTP endpoints on ``host:port`` (port 0: a free one; :attr:`address` once bound)."""

    def __init__(self, broker: Broker, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.broker = broker
        self.ssl_context = ssl_context
        """HTTPS with this context (the broker's sslCertFile, sslHttp); None: plain HTTP."""
        self.host = host
        self.port = port
        self._sock: socket.socket | None = None
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self.factory: LimitedFactory | None = None
        """The connections' limits (httpMaxConnections, httpHeaderTimeoutSeconds) and counts, once started."""

    @property
    def address(self) -> tuple[str, int]:
        assert self._sock is not None, "not bound"
        host, port = self._sock.getsockname()[:2]
        return host, port

    def bind(self) -> None:
        """Bind the port (OSError if it cannot be), not serving yet."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock

    async def start(self) -> None:
        assert self._sock is not None, "bind() first"
        # handler_cancellation: a client that hangs up cancels its request, so a long poll gives its
        # waiting-fetch slot back at once instead of at max_wait_ms
        runner = web.AppRunner(make_app(self.broker), handler_cancellation=True, access_log=None,
                               shutdown_timeout=SHUTDOWN_TIMEOUT_S, **runner_options())
        await runner.setup()
        assert runner.server is not None
        self.factory = LimitedFactory(runner.server, limits_of(self.broker.config))
        self._server = await asyncio.get_running_loop().create_server(self.factory, sock=self._sock,
                                                                      ssl=self.ssl_context, backlog=1024)
        self._runner = runner
        host, port = self.address
        log.info("HTTP API on %s://%s:%d (OpenAPI at /openapi.json)", self.scheme, host, port)

    @property
    def scheme(self) -> str:
        return "http" if self.ssl_context is None else "https"

    async def stop_accepting(self) -> None:
        """Close the listening socket; requests in progress go on (the core's drain answers them)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        elif self._sock is not None and self._runner is None:
            self._sock.close()

    async def close(self) -> None:
        await self.stop_accepting()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
