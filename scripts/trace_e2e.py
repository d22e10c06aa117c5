"""Trace messages of a `metaq bench e2e` run through every stage, with timestamps, and print where the time goes.

    python scripts/trace_e2e.py [--keep DIR] -- --flush 1000 --linger-ms 0 --rate 5000 -d 10

Everything after ``--`` is passed to ``metaq bench e2e``. The run is instrumented from outside: the
directory ``scripts/e2e_trace`` goes on PYTHONPATH, so its ``sitecustomize`` wraps metaq's private
functions in each process of the run (producer, broker, consumer; see ``e2e_tracer.py``) and records
``time.perf_counter_ns()`` (CLOCK_MONOTONIC, shared by every process) at each stage. metaq itself carries
no tracing code. The wrappers cost a few microseconds per stage, so the traced run is a little slower
than a plain one: compare stages with each other, and totals with a plain run.

Prints, for each stage, the p50/p99 in microseconds of the time since the previous stage, over every
message of the measured phase (the first second is skipped as warm-up).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run(bench_args: list[str], trace_dir: str) -> str:
    env = dict(os.environ)
    env["METAQ_TRACE_DIR"] = trace_dir
    env["PYTHONPATH"] = os.pathsep.join([str(HERE / "e2e_trace"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    metaq = Path(sys.executable).with_name("metaq")
    out = subprocess.run([str(metaq), "bench", "e2e", "--no-progress", *bench_args], env=env, check=True,
                         capture_output=True, text=True)
    return out.stdout


def load(trace_dir: str) -> dict[str, list[Any]]:
    kinds: dict[str, list[Any]] = defaultdict(list)
    for path in Path(trace_dir).glob("*.jsonl"):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                kinds[r[0]].append(r[1:])
    return kinds


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


STAGES = [
    ("send", "producer: send_async called"),
    ("sealed", "producer: batch sealed (dispatched)"),
    ("written", "producer: frame handed to the transport"),
    ("read", "broker: bytes read (data_received)"),
    ("handle", "broker: request decoded, handler called"),
    ("appended", "broker: appended (pwrite done)"),
    ("woken", "broker: long-poll waiter resumed"),
    ("reply", "broker: fetch reply queued to write"),
    ("recv", "consumer: reply bytes received"),
    ("decoded", "consumer: fetch() returned (decoded)"),
    ("yield", "consumer: batch yielded to the application"),
]
"""The delivery path; each stage's time is measured from the previous stage present."""
ACK_STAGES = [
    ("appended", "broker: appended (pwrite done)"),
    ("sync_start", "broker: sync covering it started"),
    ("flushed", "broker: fdatasync covering it done"),
    ("ack", "broker: ack queued to write"),
    ("acked", "producer: ack arrived"),
]
"""The acknowledgement path, from the append on."""


def analyse(kinds: dict[str, list[Any]], skip_s: float = 1.0) -> dict[str, Any]:
    by_ts: dict[int, dict[str, int]] = defaultdict(dict)
    for ts, t in kinds["send"]:
        by_ts[ts]["send"] = t
    for tss, t in kinds["sealed"]:
        for ts in tss:
            by_ts[ts].setdefault("sealed", t)
    for tss, t in kinds["written"]:
        for ts in tss:
            by_ts[ts].setdefault("written", t)
    key_of: dict[tuple[int, int], int] = {}
    acked_at: dict[int, int] = {}
    for p, base, tss, t in kinds["acked"]:
        for i, ts in enumerate(tss):
            key_of[(p, base + i)] = ts
            acked_at[ts] = t
    # broker: appended batches per partition, by base offset
    batch_of: dict[tuple[int, int], tuple[int, int]] = {}
    appends: dict[int, list[tuple[int, int, int, int, int]]] = defaultdict(list)
    for p, base, last, t_read, t_handle, t_app in kinds["append"]:
        appends[p].append((base, last, t_read, t_handle, t_app))
        for o in range(base, last + 1):
            batch_of[(p, o)] = (base, t_app)
    flushes: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for p, end, t0, t1 in kinds["flush"]:
        flushes[p].append((t0, t1, end))
    for p in flushes:
        flushes[p].sort()
    acks = {(p, base): t for p, base, t in kinds["ack"]}
    woken: dict[int, list[int]] = defaultdict(list)
    for p, t in kinds["woken"]:
        woken[p].append(t)
    for p in woken:
        woken[p].sort()
    replies: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for p, first, last, _end, t in kinds["reply"]:
        replies[p].append((t, first, last))
    for p in replies:
        replies[p].sort()
    recv: dict[tuple[int, int], tuple[int, int]] = {}
    for p, offsets, t_data, t_dec in kinds["recv"]:
        for o in offsets:
            recv.setdefault((p, o), (t_data, t_dec))
    yielded: dict[tuple[int, int], int] = {}
    for p, offsets, t in kinds["yield"]:
        for o in offsets:
            yielded.setdefault((p, o), t)

    rows: list[dict[str, int]] = []
    for p, plist in appends.items():
        for base, last, t_read, t_handle, t_app in plist:
            for o in range(base, last + 1):
                ts = key_of.get((p, o))
                if ts is None or (p, o) not in yielded:
                    continue
                row = dict(by_ts.get(ts, {}))
                row.update(read=t_read, handle=t_handle, appended=t_app, yield_=yielded[(p, o)])
                if flushes.get(p):
                    fl = flushes[p]
                    i = bisect.bisect_left(fl, (t_app, 0, 0))
                    while i < len(fl) and fl[i][2] <= o:
                        i += 1
                    if i < len(fl):
                        row["sync_start"], row["flushed"] = fl[i][0], fl[i][1]
                if (p, base) in acks:
                    row["ack"] = acks[(p, base)]
                ws = woken.get(p, [])
                i = bisect.bisect_left(ws, t_app)
                rs = replies.get(p, [])
                j = bisect.bisect_left(rs, (t_app, 0, 0))
                while j < len(rs) and not rs[j][1] <= base <= rs[j][2]:
                    j += 1
                if j < len(rs):
                    row["reply"] = rs[j][0]
                    if i < len(ws) and ws[i] <= rs[j][0]:
                        row["woken"] = ws[i]
                if (p, o) in recv:
                    row["recv"], row["decoded"] = recv[(p, o)]
                row["acked"] = acked_at.get(ts, 0)
                if "flushed" in row and row.get("ack", 0) < row["flushed"]:
                    del row["flushed"], row["sync_start"]  # the ack did not wait for it (unflushThreshold > 1)
                rows.append(row)
    if not rows:
        raise SystemExit("no traced message was delivered")
    first = min(r["send"] for r in rows if "send" in r)
    rows = [r for r in rows if "send" in r and r["send"] - first > skip_s * 1e9]
    out: dict[str, Any] = {"messages": len(rows), "stages": _stages(rows, STAGES),
                           "ack_stages": _stages(rows, ACK_STAGES)}
    total = [(r["yield_"] - r["send"]) / 1000 for r in rows]
    out["total"] = {"p50_us": round(pct(total, 0.5), 1), "p99_us": round(pct(total, 0.99), 1)}
    acked = [(r["acked"] - r["send"]) / 1000 for r in rows if r.get("acked")]
    if acked:
        out["send_to_ack"] = {"p50_us": round(pct(acked, 0.5), 1), "p99_us": round(pct(acked, 0.99), 1)}
    if kinds.get("round"):  # the flusher's rounds: how many logs each synced
        sizes: dict[int, int] = defaultdict(int)
        for n, _t0, _t1 in kinds["round"]:
            sizes[n] += 1
        out["flusher_rounds"] = {str(n): sizes[n] for n in sorted(sizes)}
        durations = [(t1 - t0) / 1000 for _n, t0, t1 in kinds["round"]]
        out["flusher_round_us"] = {"p50": round(pct(durations, 0.5), 1), "p99": round(pct(durations, 0.99), 1)}
    no_wait = sum(1 for r in rows if "woken" not in r)
    out["served_without_long_poll_wait"] = no_wait
    return out


def _stages(rows: list[dict[str, int]], stages: list[tuple[str, str]]) -> list[dict[str, Any]]:
    out = []
    names = [n for n, _ in stages]
    for k, (name, label) in enumerate(stages):
        if k == 0:
            continue
        key = "yield_" if name == "yield" else name
        deltas = []
        for r in rows:
            if not r.get(key):
                continue
            prev = next((r[n] for n in reversed(names[:k]) if r.get(n)), None)
            if prev is not None:
                deltas.append((r[key] - prev) / 1000)
        if deltas:
            out.append({"stage": label, "n": len(deltas), "p50_us": round(pct(deltas, 0.5), 1),
                        "p99_us": round(pct(deltas, 0.99), 1), "p999_us": round(pct(deltas, 0.999), 1)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", help="Keep the trace files in this directory (default: a temporary one).")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    bench_args = [a for a in args.bench_args if a != "--"]
    with tempfile.TemporaryDirectory(prefix="metaq-trace-") as tmp:
        trace_dir = args.keep or tmp
        stdout = run(bench_args, trace_dir)
        result = analyse(load(trace_dir))
    if args.json:
        print(json.dumps(result))
        return
    print(stdout.rstrip())
    print(f"traced {result['messages']} messages; {result['served_without_long_poll_wait']} found data at once "
          f"(no long-poll wait)")
    print(f"{'stage (time since the previous one)':48} {'p50 us':>9} {'p99 us':>9} {'p999 us':>9}")
    for s in result["stages"]:
        print(f"{s['stage']:48} {s['p50_us']:9.1f} {s['p99_us']:9.1f} {s['p999_us']:9.1f}")
    print("acknowledgement path:")
    for s in result["ack_stages"]:
        print(f"{s['stage']:48} {s['p50_us']:9.1f} {s['p99_us']:9.1f}  ({s['n']} messages)")
    print(f"{'total, send_async -> yielded':48} {result['total']['p50_us']:9.1f} {result['total']['p99_us']:9.1f}")
    if "flusher_rounds" in result:
        print(f"flusher rounds by number of logs synced: {result['flusher_rounds']}; a round takes "
              f"{result['flusher_round_us']['p50']} us p50, {result['flusher_round_us']['p99']} us p99")
    if "send_to_ack" in result:
        print(f"{'(producer: send_async -> ack arrived)':48} {result['send_to_ack']['p50_us']:9.1f} "
              f"{result['send_to_ack']['p99_us']:9.1f}")


if __name__ == "__main__":
    main()
