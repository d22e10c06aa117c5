"""`metaq bench goals`: metaq's performance goals in one run, each beside its same-run baseline, optionally interleaved
with another commit.

A round runs each goal's ``metaq bench`` command once per tree: the code this bench runs from, then (with
``against``) another commit's, exported with ``git archive`` and its compiled module built from its own source, so
that both trees meet the machine in the same minutes (on a shared 2-core VM the same code moves 10-15% within
minutes: a figure means something only beside a baseline measured at the same time). Who goes first alternates from
round to round.

The goals, on one broker over loopback, 100 B messages: ``send_async`` at 500k msg/s or more, ``send_oneway`` at
700k, the per-message consumer at 1.5M, end-to-end latency p50 at most 0.3 ms and p99 at most 1 ms (round robin and
sticky selectors) and, with an fsync before every ack, p50 at most the disk's fdatasync + 0.3 ms. The baselines
printed with them: the batch API's msg/s (what the per-message producer APIs are compared with), the machine's
loopback round trip between two processes (the floor under an e2e delivery's two hops) and the disk's fdatasync
p50. ``async_yield`` is measured beside them (``send_async`` with the event loop run between two sends, as from
request handlers). The 10,000-partition goal takes minutes a case: `metaq bench partitions`. With ``peers``, each
end-to-end goal's peer of the same shape runs once a round beside it under the same load (Redis Streams: four
streams round robin for ``e2e_rr``, one stream for ``e2e_sticky``, ``appendfsync always`` for ``e2e_sync``): the
goals are absolute, the peers say what this machine gives.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import metaq
from metaq.bench.report import BenchError, Report

THIS_SRC = Path(metaq.__file__).resolve().parent.parent
"""The ``src`` directory of the metaq this bench runs from (its checkout's root above it, for ``--against``)."""
THIS_TREE = "this tree"

Result = dict[str, Any]


@dataclass(frozen=True)
class Goal:
    name: str
    argv: list[str]
    target: str
    met: Callable[[Result], bool | None]
    """None: a baseline, nothing to meet."""
    show: Callable[[Result], str]
    versus: str = ""
    """A goal whose msg/s in the same round and tree this one's is also given as a share of."""
    peer: str = ""
    """With peers: the `metaq bench peers` system of the same shape, run once a round beside it."""


def _msgs(r: Result) -> float:
    return float(r["msgs_per_s"])


def _p(r: Result, q: str) -> float:
    return float(r["latency_ms"][q])


def _show_rate(r: Result) -> str:
    cpu = (r.get("cpu_us_per_msg") or {}).get("client")
    return f"{_msgs(r):,.0f}" + (f" ({cpu:.2f} µs)" if cpu else "")


def _show_e2e(r: Result) -> str:
    rtt = (r.get("loopback_rtt_ms") or {}).get("p50")
    return f"{_p(r, 'p50'):.3f} / {_p(r, 'p99'):.2f}" + (f" (rtt {rtt:.3f})" if rtt is not None else "")


def _show_sync(r: Result) -> str:
    return f"{_p(r, 'p50'):.3f} (fdatasync {r['fdatasync_ms']['p50']:.3f})"


def _e2e(*extra: str, flush: str = "1000") -> list[str]:
    return ["e2e", "--flush", flush, "--linger-ms", "0", "--rate", "5000", "-d", "8", *extra]


GOALS = [
    Goal("batch", ["produce", "--api", "batch", "--count", "3000000"], "baseline", lambda r: None, _show_rate),
    Goal("send_async", ["produce", "--api", "async", "--count", "1000000"], "≥ 500k msg/s",
         lambda r: _msgs(r) >= 500_000, _show_rate, versus="batch"),
    # not a goal: how send_async does for an application that sends from callbacks or request handlers
    Goal("async_yield", ["produce", "--api", "async-yield", "--count", "1000000"], "(one send per loop iteration)",
         lambda r: None, _show_rate, versus="batch"),
    Goal("oneway", ["produce", "--api", "oneway", "--count", "1000000"], "≥ 700k msg/s",
         lambda r: _msgs(r) >= 700_000, _show_rate, versus="batch"),
    Goal("iterate", ["consume", "--api", "iterate", "--count", "3000000"], "≥ 1.5M msg/s",
         lambda r: _msgs(r) >= 1_500_000, lambda r: f"{_msgs(r) / 1e6:.2f}M"),
    Goal("e2e_rr", _e2e(), "p50 ≤ 0.3, p99 ≤ 1 ms",
         lambda r: _p(r, "p50") <= 0.3 and _p(r, "p99") <= 1.0, _show_e2e, peer="redis-4"),
    Goal("e2e_sticky", _e2e("--selector", "sticky"), "p50 ≤ 0.3, p99 ≤ 1 ms",
         lambda r: _p(r, "p50") <= 0.3 and _p(r, "p99") <= 1.0, _show_e2e, peer="redis"),
    Goal("e2e_sync", _e2e(flush="sync"), "p50 ≤ fdatasync + 0.3 ms",
         lambda r: _p(r, "p50") <= r["fdatasync_ms"]["p50"] + 0.3, _show_sync, peer="redis-always"),
]
GOALS_BY_NAME = {g.name: g for g in GOALS}


def scaled(argv: list[str], scale: float) -> list[str]:
    """``argv`` with its --count and -d multiplied by ``scale`` (a quick look, or a smoke test)."""
    out = list(argv)
    for flag, kind in (("--count", int), ("-d", float)):
        if flag in out:
            i = out.index(flag) + 1
            out[i] = str(max(kind(1), kind(float(out[i]) * scale)))
    return out


def export_tree(rev: str, into: Path, report: Report) -> Path:
    """``rev`` of the checkout this metaq runs from, under ``into`` (git archive), its compiled module built in place
    when it has one; returns its src directory."""
    root = THIS_SRC.parent
    if not (root / ".git").exists():
        raise BenchError(f"--against {rev}: metaq does not run from a git checkout here ({root}); check the other "
                         "commit out with `git worktree add`, build it, and run this bench from each")
    archive = subprocess.run(["git", "-C", str(root), "archive", rev], capture_output=True)
    if archive.returncode:
        raise BenchError(f"--against {rev}: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    source = into / "src" / "metaq" / "_speedups.c"
    if source.exists():  # compiled as setup.py's Extension would be, with this interpreter's headers
        target = source.with_name("_speedups" + sysconfig.get_config_var("EXT_SUFFIX"))
        built = subprocess.run([(sysconfig.get_config_var("CC") or "cc").split()[0], "-shared", "-fPIC", "-O2",
                                f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(target)],
                               capture_output=True, text=True)
        if built.returncode:
            report(f"warning: {rev}'s compiled module did not build, it runs pure Python: {built.stderr[-300:]}")
    return into / "src"


def run_one(src: Path, argv: list[str], timeout_s: float) -> Result:
    """One ``metaq bench`` command with ``src`` first on the path; its JSON result, or {"error": ...}."""
    env = dict(os.environ, PYTHONPATH=str(src))
    cmd = [sys.executable, "-m", "metaq.cli.main", "bench", *argv, "--json", "--no-progress"]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f}s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}"}
    result: Result = json.loads(lines[-1])
    return result


def verdict(goal: Goal, runs: list[Result]) -> str:
    """'met', 'missed' or 'met in k of n' over the runs that finished; '' for a baseline."""
    outcomes = [goal.met(r) for r in runs if "error" not in r]
    if not outcomes or outcomes[0] is None:
        return ""
    k = sum(bool(x) for x in outcomes)
    return "met" if k == len(outcomes) else "missed" if k == 0 else f"met in {k} of {len(outcomes)}"


def cell(goal: Goal, r: Result, baseline: Result | None = None) -> str:
    if "error" in r:
        return f"error: {r['error']}"
    text = goal.show(r)
    if baseline is not None and "error" not in baseline:
        text += f", {100 * _msgs(r) / _msgs(baseline):.0f}% of {goal.versus}"
    return text


def _baseline(goal: Goal, per_goal: dict[str, list[Result]], i: int) -> Result | None:
    base = per_goal.get(goal.versus) if goal.versus else None
    return base[i] if base is not None and i < len(base) else None


def _peer_cell(r: Result) -> str:
    if "error" in r:
        return f"error: {r['error']}"
    return f"{_p(r, 'p50'):.3f} / {_p(r, 'p99'):.2f}"


def _run_peer(goal: Goal, address: str, scale: float) -> Result:
    """The goal's peer under the goal's own load: its rate and duration, 1 ms ticks."""
    from metaq.bench.peers import run_peer

    argv = scaled(goal.argv, scale)
    rate, duration = int(argv[argv.index("--rate") + 1]), float(argv[argv.index("-d") + 1])
    try:
        return run_peer(goal.peer, address, rate, duration, "tick", 100)
    except RuntimeError as exc:
        return {"error": str(exc)}


def run(rounds: int, only: list[str], against: str | None, scale: float, timeout_s: float, peers: bool,
        report: Report) -> dict[str, Any]:
    goals = [GOALS_BY_NAME[n] for n in only]
    trees = {THIS_TREE: THIS_SRC}
    with_peers = [g for g in goals if g.peer] if peers else []
    peer_runs: dict[str, list[Result]] = {g.name: [] for g in with_peers}
    runs: dict[str, dict[str, list[Result]]] = {}
    with tempfile.TemporaryDirectory(prefix="metaq-bench-goals-") as tmp, contextlib.ExitStack() as stack:
        servers = None
        if with_peers:
            from metaq.bench.peers import Servers

            servers = stack.enter_context(Servers(sorted({g.peer for g in with_peers}), Path(tmp)))
        if against:
            report(f"exporting {against} and building its compiled module ...")
            trees[against] = export_tree(against, Path(tmp), report)
        runs = {t: {g.name: [] for g in goals} for t in trees}
        for rnd in range(1, rounds + 1):
            order = list(trees.items())
            if rnd % 2 == 0:
                order.reverse()  # who goes first alternates: a drifting machine favours neither
            for goal in goals:
                for label, src in order:
                    result = run_one(src, scaled(goal.argv, scale), timeout_s)
                    runs[label][goal.name].append(result)
                    shown = cell(goal, result, _baseline(goal, runs[label], rnd - 1))
                    report(f"round {rnd} {goal.name} [{label}]: {shown}")
                if goal.name in peer_runs and servers is not None:
                    result = _run_peer(goal, servers.addresses[goal.peer], scale)
                    peer_runs[goal.name].append(result)
                    report(f"round {rnd} {goal.name} [{goal.peer}]: {_peer_cell(result)}")
    return {"rounds": rounds, "against": against, "goals": only, "trees": list(trees),
            "commands": [f"metaq bench {' '.join(scaled(g.argv, scale))} --json --no-progress" for g in goals],
            "runs": runs, "peers": peer_runs}


def failed(result: dict[str, Any]) -> bool:
    """Whether a command of the run (a goal's, or a peer's) ended in an error."""
    per_tree: list[dict[str, list[Result]]] = [*result["runs"].values(), result["peers"]]
    return any("error" in r for per_goal in per_tree for rs in per_goal.values() for r in rs)


def table(result: dict[str, Any]) -> str:
    goals = [GOALS_BY_NAME[n] for n in result["goals"]]
    trees: list[str] = result["trees"]
    runs, peers = result["runs"], result["peers"]
    head = ("| goal | target | " + " | ".join(f"{t}: each run" for t in trees) + " | " + " | ".join(trees) + " |"
            + (" the same shape's peer, same rounds |" if peers else ""))
    rows = ["    " + "\n    ".join(result["commands"]), "", head, "|" + "---|" * (2 + 2 * len(trees) + bool(peers))]
    for goal in goals:
        cells = [" · ".join(cell(goal, r, _baseline(goal, runs[t], i)) for i, r in enumerate(runs[t][goal.name]))
                 for t in trees]
        verdicts = [verdict(goal, runs[t][goal.name]) for t in trees]
        row = f"| {goal.name} | {goal.target} | " + " | ".join(cells) + " | " + " | ".join(verdicts) + " |"
        if peers:
            got = peers.get(goal.name) or []
            row += f" {goal.peer}: {' · '.join(_peer_cell(r) for r in got)} |" if got else "  |"
        rows.append(row)
    return "\n".join(rows)
