"""Run one page's code blocks as a reader pastes them, inside a network namespace of their own.

``unshare --net python snippets_runner.py BLOCKS.json RESULTS.json WORKDIR``: the namespace has only its own
loopback, so the blocks use the addresses the docs show (127.0.0.1:8123, :9092, ...) without meeting another
test's broker. A broker on 127.0.0.1:8123 is started before a block that needs one (with the block's options) and
stopped before one marked ``no-broker``; each block runs in WORKDIR with a deadline, and what it printed is kept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from metaq.testing.broker import BrokerProcess

PORT = 8123
OUTPUT_KEPT_CHARS = 4000


def run_block(block: dict[str, Any], workdir: Path, index: int, env: dict[str, str]) -> dict[str, Any]:
    lang = block["lang"]
    suffix = {"python": ".py", "ini": ".ini"}.get(lang, ".sh")
    path = workdir / f"snippet-{index}{suffix}"
    path.write_text(block["code"])
    if lang == "python":
        argv = [sys.executable, str(path)]
    elif lang == "ini":
        argv = [sys.executable, "-c", "import sys; from metaq.broker.ini import load_broker_config; "
                "load_broker_config(sys.argv[1], {})", str(path)]
    else:  # a shell session: stop at the first command that fails, as a reader would notice it
        argv = ["bash", "-e", "-o", "pipefail", str(path)]
    started = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=block["timeout_s"], start_new_session=True)
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        out = f"did not end within {block['timeout_s']:g}s\n" + _text(exc.stdout) + _text(exc.stderr)
    return {"where": block["where"], "returncode": code, "seconds": round(time.monotonic() - started, 1),
            "output": out[-OUTPUT_KEPT_CHARS:]}


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def main() -> None:
    blocks_file, results_file, workdir = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("METAQ_SERVERS", None)
    results: list[dict[str, Any]] = []
    broker: BrokerProcess | None = None
    broker_options: dict[str, str] | None = None
    try:
        for index, block in enumerate(json.loads(blocks_file.read_text())):
            wanted = None if block["no_broker"] else block["broker_options"]
            if broker is not None and wanted != broker_options:
                broker.stop()
                broker = None
            if wanted is not None and broker is None:
                broker = BrokerProcess(workdir / ".broker", {"unflushThreshold": 0, **wanted}, port=PORT,
                                       ready_timeout_s=120, expect_errors=True)
                broker.start()
            broker_options = wanted
            results.append(run_block(block, workdir, index, env))
    finally:
        if broker is not None:
            broker.stop_or_kill()
        results_file.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
