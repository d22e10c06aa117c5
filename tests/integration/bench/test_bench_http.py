"""`metaq bench http`: produce over the HTTP API with keep-alive clients, every message acknowledged."""

from __future__ import annotations

import json

import pytest
from cli_process import metaq


@pytest.mark.parametrize(("api", "count"), [("single", 300), ("batch", 3000), ("raw", 300)])
def test_bench_http_sends_every_message(api: str, count: int) -> None:
    done = metaq("bench", "http", "--api", api, "--batch", "100", "-n", str(count), "--concurrency", "4", "--json",
                 timeout_s=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["api"] == api and result["failures"] == 0
    assert result["messages"] >= count and result["msgs_per_s"] > 0
    assert result["url"].startswith("http://127.0.0.1:")
