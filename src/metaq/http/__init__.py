"""metaq's HTTP API: produce, fetch with long polling, offsets, metadata, lookups and consumer groups
over HTTP/1.1 and JSON, for any language and for curl (docs/http.md).

A transport like the TCP one: each endpoint builds the binary protocol's request and hands it to the
broker core (:meth:`metaq.broker.core.Broker.handle`), so the limits, validation and errors are the
binary protocol's. Modules: :mod:`~metaq.http.routes` (the endpoints), :mod:`~metaq.http.codecs` (JSON
in and out), :mod:`~metaq.http.errors` (wire codes to HTTP statuses), :mod:`~metaq.http.openapi` (the
description served at /openapi.json), :mod:`~metaq.http.listener` (the aiohttp server on the broker's
event loop, started by :class:`metaq.broker.service.BrokerService` when ``httpPort`` is set).
"""

from metaq.http.listener import HttpListener

__all__ = ["HttpListener"]
