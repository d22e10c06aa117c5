"""Every code block of README.md and docs/ that is meant to run, run as a reader pastes it (issue 42: the
Quick start of docs/consumers.md raised NameError, the async one of docs/client.md never ended, a documented
keyword argument was a TypeError). doc_snippets.py says how blocks are found and marked; each page's blocks run
in order in a network namespace of their own (snippets_runner.py), with a broker on 127.0.0.1:8123 as the docs
assume."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from doc_snippets import RUNNABLE, blocks, pages

RUNNER = Path(__file__).with_name("snippets_runner.py")
PAGES = {str(p.name): p for p in pages()}


def test_every_block_names_its_language_and_every_marker_is_understood() -> None:
    unnamed = [b.where for p in pages() for b in blocks(p) if not b.lang]
    assert unnamed == [], "label these blocks: python/bash/ini to run them, text (or another language) if not"


def _namespaces_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    return subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0


@pytest.mark.parametrize("name", sorted(n for n, p in PAGES.items() if any(b.runnable for b in blocks(p))))
def test_the_blocks_of_a_page_run_as_pasted(name: str, tmp_path: Path) -> None:
    if not _namespaces_available():
        pytest.skip("needs `unshare --net` (root, or user namespaces) for a loopback of its own")
    runnable = [b for b in blocks(PAGES[name]) if b.runnable]
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps([{**dataclasses.asdict(b), "where": b.where} for b in runnable]))
    results_file, workdir = tmp_path / "results.json", tmp_path / "work"
    workdir.mkdir()
    deadline = sum(b.timeout_s for b in runnable) + 240
    done = subprocess.run(["unshare", "--net", sys.executable, str(RUNNER), str(spec), str(results_file),
                           str(workdir)], capture_output=True, text=True, timeout=deadline,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert results_file.exists(), f"the runner failed:\n{done.stdout}\n{done.stderr}"
    results = json.loads(results_file.read_text())
    failed = [r for r in results if r["returncode"] != 0]
    report = "\n\n".join(f"{r['where']} (exit {r['returncode']}, {r['seconds']}s):\n{r['output']}" for r in failed)
    assert not failed, report
    assert len(results) == len(runnable), f"the runner stopped early:\n{done.stdout}\n{done.stderr}"
    assert {b.lang for b in runnable} <= RUNNABLE
