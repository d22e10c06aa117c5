"""HTTP Basic authentication for the HTTP API (docs/security.md#http-authentication).

With ``authRequired`` every request but ``/openapi.json`` needs an ``Authorization: Basic`` header of a
stored user (checked by :class:`metaq.broker.basic_auth.BasicAuthenticator`, which the dashboard uses
too); no or wrong credentials get 401 with ``WWW-Authenticate``, Basic on plain HTTP 403 (unless
``httpBasicAuthOverPlaintext``). The principal (``User:<name>``) goes into the request's
:class:`~metaq.broker.session.Session`, and the core's one dispatch point (:meth:`Broker.handle
<metaq.broker.core.Broker.handle>`) applies the ACLs and quotas to it exactly as to a TCP connection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from metaq.broker.basic_auth import REALM, BasicAuthenticator
from metaq.errors import SaslAuthenticationError
from metaq.http import errors

PRINCIPAL_KEY: Final = "metaq.principal"
"""Where the middleware leaves the authenticated principal on the aiohttp request."""
OPEN_PATHS: Final = frozenset({"/openapi.json"})
AUTHENTICATOR_KEY: web.AppKey[BasicAuthenticator] = web.AppKey("authenticator", BasicAuthenticator)

RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def basic_auth_middleware(request: web.Request, handler: RouteHandler) -> web.StreamResponse:
    authenticator = request.app[AUTHENTICATOR_KEY]
    if not authenticator.broker.config.auth_required or request.path in OPEN_PATHS:
        return await handler(request)
    found = await authenticator.authenticate(request.headers.get("Authorization"), request.secure,
                                             request.remote or "?")
    if isinstance(found, str):
        request[PRINCIPAL_KEY] = found
        return await handler(request)
    response = errors.json_error(found.status, errors.error_body(found.status, SaslAuthenticationError.code,
                                                                 "SASL_AUTHENTICATION_FAILED", found.message))
    if found.status == 401:
        response.headers["WWW-Authenticate"] = REALM
    return response
