"""The HTTP server of ``dashboardHttpPort``: ``/metrics``, the dashboard page and its JSON API.

aiohttp on the broker's own event loop. Every JSON answer is built on the loop (the thread that
changes the state, so no lock is needed); the Prometheus text, which for thousands of partitions
takes tens of milliseconds to format, is rendered in a worker thread. Until the broker serves, every
path answers 503. Errors under ``/api/`` are JSON: ``{"error": {"status", "name", "message"}}``.

Routes (docs/operations.md, "Dashboard")::

    GET  /                     the page (static/index.html, app.js, style.css)
    GET  /metrics              Prometheus text format
    GET  /api/state            {"broker", "topics", "groups"}: what the page polls every second
    GET  /api/broker | /api/topics | /api/topics/{topic} | /api/groups | /api/groups/{group}
    GET  /api/history[?since=ms]   the rolling history the charts draw
    GET  /api/cluster          ZooKeeper mode: the whole cluster as `metaq cluster` shows it (cached 3 s)
    POST /api/topics/{topic}/partitions/{partition}/close | /open
    POST /api/groups/{group}/reset   {"topic": T, "to": "earliest" | "latest" | offset, "partitions": [...]}
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from metaq.broker.basic_auth import REALM, BasicAuthenticator
from metaq.broker.dashboard import views
from metaq.broker.dashboard.cluster import ClusterView
from metaq.broker.dashboard.history import History
from metaq.broker.dashboard.views import DashboardError
from metaq.broker.metrics import render, take_snapshot

if TYPE_CHECKING:
    from metaq.broker.core import Broker

PRINCIPAL_KEY = "metaq.principal"
"""Where the middleware leaves the authenticated principal on the request."""
log = logging.getLogger("metaq.broker.dashboard")

REQUEST_BODY_BYTES_MAX = 64 * 1024
"""Admin requests are a few hundred bytes; anything much larger is refused with 413."""
STATIC_FILES = {"index.html": "text/html", "app.js": "application/javascript", "style.css": "text/css"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _static(name: str) -> bytes:
    return resources.files("metaq.broker.dashboard").joinpath("static", name).read_bytes()


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(doc), status=status, content_type="application/json",
                        headers={"Cache-Control": "no-store"})


def _error(exc: DashboardError) -> web.Response:
    return _json(exc.to_json(), exc.status)


class MetricsServer:
    """``/metrics`` and the dashboard over HTTP. :meth:`bind` takes the port (before the data directory
    is opened, so a taken port leaves nothing behind); requests get 503 until :meth:`serve` says the
    broker is serving."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.serving = False
        self.host = ""
        self.port = 0
        self.scheme = "http"
        self.history = History(broker)
        self.cluster = ClusterView(broker)
        self.authenticator = BasicAuthenticator(broker)
        """With authRequired: who may see the page and its API (HTTP Basic, as the HTTP API)."""
        self._runner: web.AppRunner | None = None
        self._static = {name: _static(name) for name in STATIC_FILES}

    def app(self) -> web.Application:
        app = web.Application(client_max_size=REQUEST_BODY_BYTES_MAX, middlewares=[self._middleware])
        get, post = app.router.add_get, app.router.add_post
        get("/metrics", self._metrics)
        get("/", self._index)
        for name in STATIC_FILES:
            if name != "index.html":
                get(f"/static/{name}", self._file(name))
        get("/api/state", self._state)
        get("/api/broker", self._broker)
        get("/api/topics", self._topics)
        get("/api/topics/{topic}", self._topic)
        get("/api/groups", self._groups)
        get("/api/groups/{group}", self._group)
        get("/api/history", self._history)
        get("/api/cluster", self._cluster)
        post("/api/topics/{topic}/partitions/{partition}/{action}", self._partition_action)
        post("/api/groups/{group}/reset", self._reset)
        return app

    async def bind(self, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None) -> None:
        """Listen on host:port (0: any free port), HTTPS with ``ssl_context`` (sslHttp, docs/security.md);
        OSError as the socket raised it."""
        self.scheme = "http" if ssl_context is None else "https"
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=ssl_context)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        addresses = runner.addresses  # the bound port, when 0 was asked for
        self.host, self.port = addresses[0][:2] if addresses else (host, port)

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def url(self) -> str:
        """Where the metrics are (the dashboard is at the same address's ``/``)."""
        return f"{self.base_url}/metrics"

    def serve(self) -> None:
        self.serving = True
        self.history.start()
        log.info("dashboard at %s/", self.base_url)

    async def close(self) -> None:
        self.serving = False
        await self.history.stop()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # -- plumbing ----------------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        api = request.path.startswith("/api/")
        if not self.serving:
            if api:
                return _error(DashboardError(503, "BROKER_STARTING", "the broker is starting: try again shortly"))
            return web.Response(status=503, text="the broker is starting: no metrics yet\n")
        config = self.broker.config
        if config.auth_required and request.path != "/metrics":
            # the page and its API show topic names and group offsets: the same users as the HTTP API (a
            # browser asks for them once); /metrics stays open to scrapers (counters only)
            found = await self.authenticator.authenticate(request.headers.get("Authorization"), request.secure,
                                                          request.remote or "?")
            if not isinstance(found, str):
                refusal = _error(DashboardError(found.status, "SASL_AUTHENTICATION_FAILED", found.message))
                if found.status == 401:
                    refusal.headers["WWW-Authenticate"] = REALM
                return refusal
            request[PRINCIPAL_KEY] = found
        if request.method == "POST" and (config.auth_required or config.acl_enabled):
            # the dashboard's admin actions do not go through the core's ACL check (they act on the broker
            # directly): with authentication or ACLs on they are refused (the CLI does the same actions)
            return _error(DashboardError(403, "AUTHENTICATION_NOT_SUPPORTED",
                                         "this broker requires authentication (authRequired / aclEnabled) and the "
                                         "dashboard's admin actions are not checked against the ACLs: use the metaq "
                                         "CLI for admin actions"))
        try:
            return await handler(request)
        except DashboardError as exc:
            return _error(exc)
        except web.HTTPException as exc:
            if not api or exc.status < 400:
                raise
            reason = exc.reason
            if exc.status == 404:
                reason = f"no such dashboard API path: {request.method} {request.path}"
            elif exc.status == 405:
                reason = f"{request.method} is not allowed on {request.path}"
            elif exc.status == 413:
                reason = f"the request body is larger than {REQUEST_BODY_BYTES_MAX} bytes"
            return _error(DashboardError(exc.status, "INVALID_REQUEST", reason))

    def _file(self, name: str) -> Handler:
        async def serve_file(request: web.Request) -> web.Response:
            return web.Response(body=self._static[name], content_type=STATIC_FILES[name],
                                headers={"Cache-Control": "no-cache"})

        return serve_file

    async def _index(self, request: web.Request) -> web.Response:
        return web.Response(body=self._static["index.html"], content_type="text/html",
                            headers={"Cache-Control": "no-cache"})

    async def _metrics(self, request: web.Request) -> web.Response:
        snap = take_snapshot(self.broker)
        body = await asyncio.get_running_loop().run_in_executor(None, render, snap)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- JSON --------------------------------------------------------------------------------------

    def _views(self, request: web.Request) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        """The views; with aclEnabled only the topics and groups the request's principal may describe."""
        snap = take_snapshot(self.broker)
        topics = views.topics_view(self.broker, snap, self.history)
        groups = views.groups_view(self.broker, snap)
        principal = request.get(PRINCIPAL_KEY)
        if self.broker.config.acl_enabled:
            acls = self.broker.acls
            topics = [t for t in topics
                      if principal is not None and acls.allows(principal, "topic", t["name"], "describe")]
            groups = [g for g in groups
                      if principal is not None and acls.allows(principal, "group", g["name"], "describe")]
        return views.broker_view(self.broker, snap, self.history), topics, groups

    async def _state(self, request: web.Request) -> web.Response:
        broker, topics, groups = self._views(request)
        return _json({"broker": broker, "topics": topics, "groups": groups})

    async def _broker(self, request: web.Request) -> web.Response:
        return _json(self._views(request)[0])

    async def _topics(self, request: web.Request) -> web.Response:
        return _json({"topics": self._views(request)[1]})

    async def _topic(self, request: web.Request) -> web.Response:
        return _json(views.find(self._views(request)[1], request.match_info["topic"], "topic", "UNKNOWN_TOPIC"))

    async def _groups(self, request: web.Request) -> web.Response:
        return _json({"groups": self._views(request)[2]})

    async def _group(self, request: web.Request) -> web.Response:
        return _json(views.find(self._views(request)[2], request.match_info["group"], "group", "UNKNOWN_GROUP"))

    async def _history(self, request: web.Request) -> web.Response:
        since = request.query.get("since", "0")
        if not since.isdigit():
            raise DashboardError(400, "INVALID_REQUEST", f"since must be ms since the epoch, not {since!r}")
        return _json(self.history.to_json(int(since)))

    async def _cluster(self, request: web.Request) -> web.Response:
        return _json(await self.cluster.get())

    # -- admin actions -----------------------------------------------------------------------------

    async def _partition_action(self, request: web.Request) -> web.Response:
        action = request.match_info["action"]
        if action not in ("open", "close"):
            raise DashboardError(404, "INVALID_REQUEST", f"a partition can be opened or closed, not {action!r}")
        topic, partition = request.match_info["topic"], request.match_info["partition"]
        done = await views.set_partition_open(self.broker, topic, partition, action == "open")
        log.info("dashboard: %s partition %s of %s (from %s)", action, done["partition"], topic, request.remote)
        return _json(done)

    async def _reset(self, request: web.Request) -> web.Response:
        if request.content_type != "application/json":
            raise DashboardError(415, "INVALID_REQUEST", "send the reset as application/json")
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as exc:
            raise DashboardError(400, "INVALID_REQUEST", f"the body is not JSON: {exc}") from None
        group = request.match_info["group"]
        done = await views.reset_group(self.broker, group, body)
        log.info("dashboard: reset group %s on %s: %s (from %s)", group, done["topic"], done["moved"], request.remote)
        return _json(done)


def bind_error(host: str, port: int, exc: OSError) -> str:
    """The one line a broker prints when it cannot listen for metrics."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EADDRINUSE:
        reason = "the address is already in use (another broker? choose another dashboardHttpPort, or 0)"
    return f"cannot listen for metrics on {host}:{port} (dashboardHttpPort): {reason}"
