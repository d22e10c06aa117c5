"""Realistic web-access and application log events, logged through Python ``logging``.

A seeded :class:`EventGenerator` produces the same events for the same seed: a Poisson stream of
HTTP requests (per-endpoint status mixes, log-normal latencies with a long tail, a pool of clients
and user agents), incidents that make one backend endpoint answer 5xx for a few seconds and slow
down, and application log lines (several loggers and levels) that follow the traffic and the
incidents. Times are simulated (``start`` + arrivals), so a test can build a known event set.

:func:`log_event` turns an event into one logging call: ``web.access`` records for requests, the
event's own logger for application lines, with the event's fields as ``extra`` (the JSON formatter
of :class:`metaq.logging.MetaqHandler` puts them at the top level). :class:`LiveGenerator` paces the
same stream in real time on a thread and stamps each event with the wall-clock time of its logging
call, which is the event time the Spark job windows on.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

ACCESS_LOGGER = "web.access"
PUNCTUATION_LOGGER = "demo.control"


@dataclass(frozen=True)
class Endpoint:
    method: str
    route: str
    weight: float
    median_ms: float
    sigma: float
    statuses: tuple[tuple[int, float], ...]
    backend: bool = True  # incidents hit backends; static files come from the CDN cache


_GET_API = ((200, 0.955), (404, 0.02), (400, 0.008), (401, 0.008), (429, 0.004), (500, 0.003), (503, 0.002))
ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/api/orders", 14, 45, 0.45, _GET_API),
    Endpoint("POST", "/api/orders", 5, 120, 0.5,
             ((201, 0.9), (400, 0.05), (409, 0.01), (401, 0.02), (422, 0.01), (500, 0.008), (502, 0.002))),
    Endpoint("GET", "/api/orders/{id}", 12, 30, 0.4, _GET_API),
    Endpoint("GET", "/api/users/{id}", 10, 25, 0.4, _GET_API),
    Endpoint("POST", "/api/login", 4, 80, 0.35, ((200, 0.8), (401, 0.17), (429, 0.02), (500, 0.01))),
    Endpoint("GET", "/api/search", 8, 150, 0.7, ((200, 0.97), (400, 0.02), (500, 0.006), (504, 0.004))),
    Endpoint("GET", "/static/app.js", 12, 3, 0.5, ((200, 0.82), (304, 0.17), (404, 0.01)), backend=False),
    Endpoint("GET", "/static/style.css", 9, 2.5, 0.5, ((200, 0.8), (304, 0.19), (404, 0.01)), backend=False),
    Endpoint("GET", "/static/img/logo.png", 6, 4, 0.6, ((200, 0.85), (304, 0.14), (404, 0.01)), backend=False),
    Endpoint("GET", "/health", 3, 1.2, 0.3, ((200, 1.0),), backend=False),
)

_WEBKIT = "AppleWebKit/537.36 (KHTML, like Gecko)"
_SAFARI = "AppleWebKit/605.1.15 (KHTML, like Gecko)"
USER_AGENTS: tuple[tuple[str, float], ...] = (
    (f"Mozilla/5.0 (Windows NT 10.0; Win64; x64) {_WEBKIT} Chrome/131.0 Safari/537.36", 38),
    (f"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_6) {_SAFARI} Version/18.1 Safari/605.1.15", 16),
    ("Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0", 9),
    (f"Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) {_SAFARI} Mobile/15E148", 17),
    (f"Mozilla/5.0 (Linux; Android 14; Pixel 8) {_WEBKIT} Chrome/131.0 Mobile Safari/537.36", 11),
    ("okhttp/4.12.0", 4),
    ("curl/8.5.0", 2),
    ("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", 3),
)


@dataclass(frozen=True)
class Event:
    """One log record to be: ``fields`` become the record's extra fields (and the JSON's keys)."""

    ts: float
    logger: str
    level: int
    message: str
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return str(self.fields["kind"])


@dataclass
class _Incident:
    route: str
    until: float
    error_ratio: float
    slowdown: float


class EventGenerator:
    """A deterministic stream of events for ``seed``, starting at ``start`` (seconds since the epoch).

    ``rate`` is the mean number of requests per second (the load swings ±30 % over a 40-second cycle);
    about one application line is logged per ``app_every`` requests, more during incidents.
    ``incident_every_s`` is the mean time between 5xx bursts.
    """

    def __init__(self, seed: int = 1, *, rate: float = 150.0, start: float = 0.0, app_every: int = 8,
                 incident_every_s: float = 20.0) -> None:
        self.rng = random.Random(seed)
        self.rate = rate
        self.start = start
        self.now = start
        self.seq = 0
        self.app_every = app_every
        self.incident_every_s = incident_every_s
        self.incident: _Incident | None = None
        self._peek: Event | None = None
        self._next_incident = start + self.rng.expovariate(1 / incident_every_s) * 0.5 + 3
        rng = self.rng
        # A client population with a few heavy users: IPs from the documentation ranges (RFC 5737).
        nets = ("192.0.2", "198.51.100", "203.0.113")
        self._clients = [f"{nets[i % 3]}.{rng.randrange(1, 255)}" for i in range(300)]
        self._client_weights = [1 / (i + 1) ** 0.8 for i in range(len(self._clients))]
        self._client_agent = {ip: rng.choices([a for a, _ in USER_AGENTS], [w for _, w in USER_AGENTS])[0]
                              for ip in self._clients}
        self._weights = [e.weight for e in ENDPOINTS]

    def _rate_at(self, t: float) -> float:
        return self.rate * (1 + 0.3 * math.sin(2 * math.pi * (t - self.start) / 40))

    def _next_id(self) -> int:
        seq = self.seq
        self.seq += 1
        return seq

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        if self._peek is not None:
            ev, self._peek = self._peek, None
            return ev
        rng = self.rng
        self.now += rng.expovariate(self._rate_at(self.now))
        self._update_incident()
        if rng.random() < 1 / self.app_every * (3 if self.incident else 1):
            return self._app_event()
        return self._access_event()

    def until(self, end: float) -> list[Event]:
        """The next events, up to (not including) time ``end``."""
        out: list[Event] = []
        while True:
            ev = next(self)
            if ev.ts >= end:
                self._peek = ev
                return out
            out.append(ev)

    def next_seq(self) -> int:
        """A sequence number for a record that is not one of the generated events."""
        return self._next_id()

    def _update_incident(self) -> None:
        rng = self.rng
        if self.incident is not None and self.now >= self.incident.until:
            self.incident = None
        if self.incident is None and self.now >= self._next_incident:
            route = rng.choice([e.route for e in ENDPOINTS if e.backend])
            self.incident = _Incident(route, self.now + rng.uniform(3, 8), rng.uniform(0.35, 0.7),
                                      rng.uniform(3, 8))
            self._next_incident = self.incident.until + rng.expovariate(1 / self.incident_every_s)

    def _access_event(self) -> Event:
        rng = self.rng
        ep = rng.choices(ENDPOINTS, self._weights)[0]
        latency = rng.lognormvariate(math.log(ep.median_ms), ep.sigma)
        if rng.random() < 0.01:  # GC pauses, cold caches, slow disks: the long tail
            latency *= rng.uniform(5, 20)
        statuses, weights = zip(*ep.statuses, strict=True)
        status = rng.choices(statuses, weights)[0]
        inc = self.incident
        if inc is not None and inc.route == ep.route:
            latency *= inc.slowdown
            if rng.random() < inc.error_ratio:
                status = rng.choices((500, 502, 503, 504), (2, 3, 4, 2))[0]
                latency = 3000.0 + rng.uniform(0, 50) if status == 504 else latency
        path = ep.route
        if "{id}" in path:
            path = path.replace("{id}", str(rng.randrange(1, 50_000)))
        ip = rng.choices(self._clients, self._client_weights)[0]
        size = 0 if status == 304 else int(rng.lognormvariate(7.5, 1.0))
        latency = round(latency, 2)
        fields = {"kind": "access", "seq": self._next_id(), "ts": self.now, "method": ep.method,
                  "endpoint": ep.route, "path": path, "status": status, "latency_ms": latency, "bytes": size,
                  "client_ip": ip, "user_agent": self._client_agent[ip]}
        return Event(self.now, ACCESS_LOGGER, logging.INFO, f'{ip} "{ep.method} {path}" {status} {latency} ms',
                     fields)

    def _app_event(self) -> Event:
        rng = self.rng
        inc = self.incident
        if inc is not None and rng.random() < 0.6:
            logger = {"/api/search": "shop.search", "/api/login": "shop.auth"}.get(inc.route, "shop.orders")
            level, message = rng.choice((
                (logging.ERROR, f"upstream request for {inc.route} failed: timed out after 3000 ms"),
                (logging.ERROR, f"{inc.route}: connection reset by peer (pool db-{rng.randrange(1, 4)})"),
                (logging.WARNING, f"circuit breaker for {inc.route} is half-open, {rng.randrange(5, 40)} calls queued"),
                (logging.WARNING, f"retrying {inc.route} (attempt {rng.randrange(2, 4)}/3)"),
            ))
        else:
            n = rng.randrange(1, 100_000)
            logger, level, message = rng.choices((
                ("shop.orders", logging.INFO,
                 f"order {n} placed: {rng.randrange(1, 6)} item(s), total {rng.uniform(5, 400):.2f} EUR"),
                ("shop.auth", logging.INFO, f"user {n} logged in"),
                ("shop.auth", logging.WARNING, f"login failed for user {n}: wrong password"),
                ("shop.cache", logging.DEBUG, f"cache hit ratio {rng.uniform(0.7, 0.99):.1%} over the last minute"),
                ("shop.search", logging.INFO, f"search '{rng.choice(('shoes', 'tea', 'lamp', 'usb-c cable', 'desk'))}'"
                                              f" returned {rng.randrange(0, 300)} results"),
                ("shop.payments", logging.WARNING, f"payment provider slow: {rng.randrange(800, 2500)} ms "
                                                   f"for order {n}"),
                ("shop.db", logging.WARNING, f"connection pool {rng.randrange(70, 100)}% used"),
                ("shop.payments", logging.ERROR, f"order {n}: card declined (code {rng.choice(('05', '51', '54'))})"),
            ), (30, 14, 4, 10, 14, 8, 6, 3))[0]
        fields = {"kind": "app", "seq": self._next_id(), "ts": self.now}
        return Event(self.now, logger, level, message, fields)


def log_event(event: Event, ts: float | None = None,
              get_logger: Callable[[str], logging.Logger] = logging.getLogger) -> None:
    """One logging call for the event; ``ts`` replaces the event time (the live generator's stamp)."""
    fields = event.fields if ts is None else {**event.fields, "ts": ts}
    get_logger(event.logger).log(event.level, event.message, extra=fields)


def punctuation(ts: float, seq: int) -> Event:
    """A record that only moves event time forward (see docs/demo.md: closing the last windows)."""
    return Event(ts, PUNCTUATION_LOGGER, logging.INFO, "end of stream", {"kind": "punctuation", "seq": seq, "ts": ts})


@dataclass
class GeneratorStats:
    events: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    first_ts: float = 0.0
    last_ts: float = 0.0


class LiveGenerator:
    """Logs the events of an :class:`EventGenerator` in real time, on a thread, until stopped.

    Every tick (``tick_s``) it logs the events whose simulated time has come, each stamped with
    ``time.time()`` taken just before its logging call.
    """

    def __init__(self, generator: EventGenerator, *, tick_s: float = 0.01,
                 get_logger: Callable[[str], logging.Logger] = logging.getLogger) -> None:
        self.gen = generator
        self.tick_s = tick_s
        self.get_logger = get_logger
        self.stats = GeneratorStats()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="demo-generator", daemon=True)

    def start(self) -> LiveGenerator:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _main(self) -> None:
        gen = self.gen
        offset = time.time() - gen.now  # simulated time -> wall clock
        pending = next(gen)
        stats = self.stats
        while not self._stop.is_set():
            now = time.time()
            while pending.ts + offset <= now:
                ts = time.time()
                log_event(pending, ts, self.get_logger)
                if not stats.events:
                    stats.first_ts = ts
                stats.last_ts = ts
                stats.events += 1
                stats.by_kind[pending.kind] += 1
                pending = next(gen)
            self._stop.wait(self.tick_s)
