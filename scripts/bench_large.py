"""Large messages: 1 MB fetches through the broker against raw sendfile of the same files, same run.

Issue 13: "1 MB fetches at >= 80% of the machine's sendfile bandwidth (measure both in one run)". For each
event loop asked for (a fresh broker each, group commit, one topic of --partitions partitions):

- ``metaq bench consume`` as it runs (metaq.bench.client_bench.run_bench, mode consume): --count messages
  of --size bytes are produced with send_batch (not measured), then one consumer process reads them back
  from the first offset with the pull consumer, every record checked (CRC): MB/s of payload. ``--api
  fetch`` (the default): ``Fetcher.fetch`` in a loop, one fetch of max_bytes 1 MiB per request and one
  request in flight per partition, a list of Messages per fetch; ``--api iterate``: ``PullConsumer.iterate``
  (a Message at a time; it sends the next fetch before handing out a reply); ``--api columns``:
  ``iterate_columns`` (payloads as views of the received reply, nothing copied);
- then, on the same segment files (in the page cache, as the consumer read them), the baseline: a sender in
  this process pushes every segment file to a receiver process over a loopback TCP connection with
  ``os.sendfile``, 1 MiB per call (what the broker's sendfile path does, without protocol or client), the
  receiver ``recv_into`` a 1 MiB buffer and answers with the byte count at EOF. MB/s of file bytes; also
  ``pread`` + ``sendall`` (what the broker does under uvloop, which has no loop.sendfile);
- and between the two, the same messages read through the broker by the blocking client's raw Fetch (one
  thread per partition, 1 MiB per request, batch headers walked, nothing decoded or checked): the broker
  and the socket without the consumer's per-record work (CRC check, payload copies).

The broker's event loop matters here: asyncio's selector loop sends fetch replies with sendfile(2), uvloop
reads them with pread and writes them (docs/storage.md). Every phase is bounded by a count and a deadline;
loopback only. Example (the figures in docs/benchmarks.md, "Large messages"):

    .venv/bin/python scripts/bench_large.py --count 2000 --size 1000000 --loops uvloop,asyncio [--api iterate]

The broker's resident set (VmRSS) is printed idle and after the consume, and the CPU seconds and minor page
faults the broker spent on the produce and the consume (from /proc). ``--malloc-env
none|broker|consumer|both`` puts glibc's ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` into the
environment of the broker, the consumer, both or neither (this script's own are not passed on);
``--tune-allocator`` has the consumer call ``metaq.tune_allocator()``, and ``--broker-option
mallocTrimThreshold=0`` etc. sets the broker's (docs/benchmarks.md, "1 MB messages: glibc's heap trimming").
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from metaq.bench.client_bench import BenchSpec, run_bench
from metaq.broker.launcher import BrokerLauncher

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_backlog import raw_fetch  # a sibling script

TOPIC = "large"
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "134217728"}
"""glibc's heap tuning by environment (``--malloc-env``): read once, at a process's start."""
CHUNK_BYTES = 1 << 20
"""Bytes per sendfile / pread / recv call of the baselines: the consumer's max_bytes per fetch."""


def _receive(port_out: Any, done: Any) -> None:
    """Child: accept one connection, read it to EOF into one reused buffer, answer with the byte count."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port_out.put(server.getsockname()[1])
        conn, _ = server.accept()
        with conn:
            buf = bytearray(CHUNK_BYTES)
            view = memoryview(buf)
            total = 0
            while True:
                n = conn.recv_into(view)
                if not n:
                    break
                total += n
            conn.sendall(total.to_bytes(8, "big"))
    done.put(total)


def raw_send(files: list[Path], how: str, deadline_s: float) -> tuple[int, float]:
    """(bytes, seconds) of pushing ``files`` over loopback TCP to a receiver process, ``how`` being
    ``sendfile`` or ``pread`` (pread + sendall), CHUNK_BYTES per call; timed to the receiver's answer."""
    ctx = mp.get_context("spawn")
    port_q, done_q = ctx.Queue(), ctx.Queue()
    receiver = ctx.Process(target=_receive, args=(port_q, done_q), daemon=True)
    receiver.start()
    port = port_q.get(timeout=60)
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as conn:
        out = conn.fileno()
        start = time.perf_counter()
        deadline = start + deadline_s
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                position = 0
                while position < size and time.perf_counter() < deadline:
                    if how == "sendfile":
                        n = os.sendfile(out, fd, position, min(CHUNK_BYTES, size - position))
                    else:
                        data = os.pread(fd, min(CHUNK_BYTES, size - position), position)
                        conn.sendall(data)
                        n = len(data)
                    if n == 0:
                        break
                    position += n
                    sent += n
            finally:
                os.close(fd)
        conn.shutdown(socket.SHUT_WR)
        got = int.from_bytes(conn.recv(8), "big")
        seconds = time.perf_counter() - start
    receiver.join(30)
    if got != sent:
        raise RuntimeError(f"receiver counted {got} bytes, {sent} were sent")
    return sent, seconds


def segment_files(data_dir: Path) -> list[Path]:
    return sorted(data_dir.glob(f"{TOPIC}-*/*.log"))


def broker_rss_mib(pid: int | None) -> float:
    """The broker's resident set (VmRSS) in MiB, 0.0 where /proc is absent."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def broker_cpu_faults(pid: int | None) -> tuple[float, int]:
    """The broker's CPU seconds (user + system) and minor page faults so far, from /proc (0 where absent)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks, int(fields[7])


def run_case(loop: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    data_dir = work / f"data-{loop}"
    options: dict[str, Any] = {"unflushThreshold": 0, "maxTransferSize": 1 << 20, "event-loop": loop}
    config = f"[system]\nnumPartitions=1\n\n[topic={TOPIC}]\nnumPartitions={args.partitions}\n"
    row: dict[str, Any] = {"loop": loop}
    broker_env = MALLOC_ENV if args.malloc_env in ("broker", "both") else {}
    consumer_env = MALLOC_ENV if args.malloc_env in ("consumer", "both") else {}
    for key in MALLOC_ENV:  # neither the broker nor the consumer inherits this process's setting
        os.environ.pop(key, None)
    options.update(dict(kv.split("=", 1) for kv in args.broker_option))
    with BrokerLauncher(data_dir, options, config_text=config, ready_timeout_s=120, env=broker_env) as launcher:
        row["rss_idle_mib"] = broker_rss_mib(launcher.pid)
        spec = BenchSpec(mode="consume", servers=launcher.servers, topic=TOPIC, partitions=args.partitions,
                         size=args.size, count=args.count, batch=args.batch, concurrency=args.concurrency,
                         duration_s=args.duration, api=args.api,
                         **({"tune_allocator": True} if args.tune_allocator else {}))  # older BenchSpecs lack it
        print(f"[{loop}] produce {args.count} x {args.size:,} B (not measured), then consume ...", flush=True)
        os.environ.update(consumer_env)  # the spawned consumer process inherits it
        cpu_before, faults_before = broker_cpu_faults(launcher.pid)
        try:
            result = run_bench(spec)
        finally:
            for key in consumer_env:
                os.environ.pop(key, None)
        row["rss_after_mib"] = broker_rss_mib(launcher.pid)
        cpu_after, faults_after = broker_cpu_faults(launcher.pid)
        # the produce (preload) and the consume together: the broker's share of a run
        row["broker_cpu_s"], row["broker_faults"] = cpu_after - cpu_before, faults_after - faults_before
        row.update(consume_mb_s=result.mb_per_s, messages=result.messages, consume_s=result.seconds)
        print(f"[{loop}] consume: {result.messages} messages, {result.bytes / 1e6:,.0f} MB of payload in "
              f"{result.seconds:.2f}s: {result.mb_per_s:,.1f} MB/s", flush=True)
        raw = raw_fetch(launcher.servers, TOPIC, args.partitions, args.duration) if args.raw else {"mb_s": 0.0}
        row["raw_mb_s"] = raw["mb_s"]
        if args.raw:
            print(f"[{loop}] raw fetch of the same (blocking client, records not decoded): "
                  f"{raw['bytes'] / 1e6:,.0f} MB in {raw['seconds']:.2f}s: {raw['mb_s']:,.1f} MB/s", flush=True)
        row["rss_end_mib"] = broker_rss_mib(launcher.pid)
        print(f"[{loop}] broker RSS: {row['rss_idle_mib']:.1f} MiB idle, {row['rss_after_mib']:.1f} after the "
              f"consume, {row['rss_end_mib']:.1f} at the end; produce + consume cost the broker "
              f"{row['broker_cpu_s']:.2f} CPU s and {row['broker_faults']:,} minor page faults", flush=True)
    files = segment_files(data_dir)
    stored = sum(p.stat().st_size for p in files)
    for how in args.baselines.split(","):
        nbytes, seconds = raw_send(files, how, args.duration)
        row[f"{how}_mb_s"] = nbytes / seconds / 1e6
        print(f"[{loop}] raw {how} of the same {len(files)} segment files ({stored / 1e6:,.0f} MB): "
              f"{nbytes / 1e6:,.0f} MB in {seconds:.2f}s = {nbytes / seconds / 1e6:,.1f} MB/s", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--count", type=int, default=1000, help="Messages produced and consumed.")
    parser.add_argument("--size", type=int, default=1_000_000, help="Payload bytes per message.")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--batch", type=int, default=4, help="Messages per send_batch call of the preload.")
    parser.add_argument("--concurrency", type=int, default=2, help="send_batch calls in flight (preload).")
    parser.add_argument("-d", "--duration", type=float, default=120.0, help="Upper bound of each phase, s.")
    parser.add_argument("--api", default="fetch", choices=["fetch", "iterate", "columns"],
                        help="The consumer's read: Fetcher.fetch in a loop (one request at a time), or the pull "
                             "consumer's iterate / iterate_columns (which fetch ahead while a reply is handed out).")
    parser.add_argument("--loops", default="uvloop,asyncio", help="Broker event loops, one fresh broker each.")
    parser.add_argument("--baselines", default="sendfile,pread", help="Raw sends of the segment files.")
    parser.add_argument("--no-raw", dest="raw", action="store_false", help="Skip the raw fetch.")
    parser.add_argument("--malloc-env", default="none", choices=["none", "broker", "consumer", "both"],
                        help="Which processes get MALLOC_MMAP_THRESHOLD_=32 MiB and MALLOC_TRIM_THRESHOLD_=128 MiB "
                             "in their environment (this script's own setting is not passed on).")
    parser.add_argument("--tune-allocator", action="store_true",
                        help="The consumer process calls metaq.tune_allocator() "
                             "(metaq bench consume --tune-allocator).")
    parser.add_argument("--broker-option", action="append", default=[], metavar="KEY=VALUE",
                        help="A further broker option (server.ini key), repeatable.")
    parser.add_argument("--work-dir", default=None, help="Where the data directories go (default: a temp dir).")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="metaq-large-", dir=args.work_dir) as tmp:
        rows = [run_case(loop, args, Path(tmp)) for loop in args.loops.split(",") if loop]
    tuned = ", consumer tune_allocator()" if args.tune_allocator else ""
    print(f"\n{args.count} messages of {args.size:,} B, {args.partitions} partition(s), consumer api {args.api}, "
          f"malloc env {args.malloc_env}{tuned}; MB/s (10^6 B/s); broker RSS MiB idle / after the consume:")
    print("| broker loop | consume MB/s | raw fetch MB/s | raw sendfile MB/s | consume / sendfile "
          "| raw fetch / sendfile | raw pread+send MB/s | broker RSS | broker CPU s | broker minor faults |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        sf = r.get("sendfile_mb_s", 0.0)
        ratio = f"{r['consume_mb_s'] / sf:.0%}" if sf else ""
        raw_ratio = f"{r['raw_mb_s'] / sf:.0%}" if sf else ""
        print(f"| {r['loop']} | {r['consume_mb_s']:,.1f} | {r['raw_mb_s']:,.1f} | {sf:,.1f} | {ratio} | {raw_ratio} "
              f"| {r.get('pread_mb_s', 0.0):,.1f} | {r['rss_idle_mib']:.0f} / {r['rss_after_mib']:.0f} "
              f"| {r['broker_cpu_s']:.2f} | {r['broker_faults']:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
