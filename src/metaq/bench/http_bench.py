"""`metaq bench http`: produce throughput over the HTTP API with keep-alive clients.

Each client process runs ``concurrency`` requests in flight on one aiohttp session (keep-alive
connections, one per request in flight), every request a POST to ``/topics/<topic>/messages``:
``--api single`` one JSON message per request, ``batch`` ``--batch`` messages per JSON request,
``raw`` one ``application/octet-stream`` message per request. The broker is an embedded one started for
the run (httpPort 0) unless ``--url`` names one. Every loop is bounded by the message count and a deadline.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from metaq.bench.baselines import percentiles
from metaq.bench.report import markdown_table
from metaq.broker.launcher import BrokerLauncher

WARMUP_REQUESTS = 50


@dataclass
class HttpBenchSpec:
    url: str | None = None
    topic: str = ""
    api: str = "single"
    size: int = 100
    batch: int = 100
    count: int = 100_000
    duration_s: float = 30.0
    concurrency: int = 16
    processes: int = 1
    partitions: int = 4
    flush: str = "group"


@dataclass
class HttpBenchResult:
    api: str
    url: str
    messages: int
    requests: int
    seconds: float
    msgs_per_s: float
    requests_per_s: float
    mb_per_s: float
    failures: int
    latency_ms: dict[str, float] = field(default_factory=dict)


def _request_body(spec: HttpBenchSpec) -> tuple[bytes, str, int]:
    """(body, content type, messages per request): the same bytes every time, as a load generator sends."""
    payload = "x" * spec.size
    if spec.api == "raw":
        return payload.encode(), "application/octet-stream", 1
    if spec.api == "single":
        return json.dumps({"payload": payload}).encode(), "application/json", 1
    return (json.dumps({"messages": [{"payload": payload}] * spec.batch}).encode(), "application/json", spec.batch)


async def _client(spec: HttpBenchSpec, url: str, messages_max: int) -> dict[str, Any]:
    body, content_type, per_request = _request_body(spec)
    target = f"{url}/topics/{spec.topic}/messages"
    headers = {"Content-Type": content_type}
    latencies: list[float] = []
    sent = failures = requests = 0
    connector = aiohttp.TCPConnector(limit=spec.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(WARMUP_REQUESTS):  # connections opened, the topic created
            async with session.post(target, data=body, headers=headers) as resp:
                await resp.read()
        started = time.perf_counter()
        deadline = started + spec.duration_s

        async def worker() -> None:
            nonlocal sent, failures, requests
            while sent < messages_max and time.perf_counter() < deadline:
                sent += per_request
                t0 = time.perf_counter()
                async with session.post(target, data=body, headers=headers) as resp:
                    await resp.read()
                    requests += 1
                    if resp.status != 200:
                        failures += 1
                latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker() for _ in range(spec.concurrency)))
        seconds = time.perf_counter() - started
    return {"messages": requests * per_request - failures * per_request, "requests": requests,
            "failures": failures, "seconds": seconds, "latencies": latencies}


def _client_process(spec: HttpBenchSpec, url: str, messages_max: int, out: Any) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    out.put(asyncio.run(_client(spec, url, messages_max)))


def run_http_bench(spec: HttpBenchSpec) -> HttpBenchResult:
    spec.topic = spec.topic or f"bench-http-{os.getpid()}"
    if spec.url is not None:
        return _measure(spec, spec.url)
    flush = {"group": "0", "sync": "1"}.get(spec.flush, spec.flush)
    with tempfile.TemporaryDirectory(prefix="metaq-bench-http-") as tmp, \
            BrokerLauncher(os.path.join(tmp, "data"), {"httpPort": 0, "numPartitions": spec.partitions,
                                                        "unflushThreshold": flush}) as broker:
        assert broker.http_url is not None, broker.output()
        return _measure(spec, broker.http_url)


def _measure(spec: HttpBenchSpec, url: str) -> HttpBenchResult:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    share = max(1, spec.count // spec.processes)
    procs = [ctx.Process(target=_client_process, args=(spec, url, share, out)) for _ in range(spec.processes)]
    for proc in procs:
        proc.start()
    parts = [out.get(timeout=spec.duration_s + 120) for _ in procs]
    for proc in procs:
        proc.join(30)
    seconds = max(p["seconds"] for p in parts)
    messages = sum(p["messages"] for p in parts)
    requests = sum(p["requests"] for p in parts)
    latencies = [x * 1000 for p in parts for x in p["latencies"]]  # ms
    return HttpBenchResult(api=spec.api, url=url, messages=messages, requests=requests, seconds=round(seconds, 3),
                           msgs_per_s=round(messages / seconds, 1), requests_per_s=round(requests / seconds, 1),
                           mb_per_s=round(messages * spec.size / seconds / 1e6, 2),
                           failures=sum(p["failures"] for p in parts), latency_ms=percentiles(latencies))


def table(result: dict[str, Any]) -> str:
    lat = result["latency_ms"]
    return markdown_table(
        ["api", "messages", "requests", "msg/s", "requests/s", "MB/s", "request latency p50 / p99 / max ms"],
        [[result["api"], f"{result['messages']:,}", f"{result['requests']:,}", f"{result['msgs_per_s']:,.0f}",
          f"{result['requests_per_s']:,.0f}", f"{result['mb_per_s']:.1f}",
          f"{lat.get('p50')} / {lat.get('p99')} / {lat.get('max')}" if lat else ""]], right=[1, 2, 3, 4, 5])
