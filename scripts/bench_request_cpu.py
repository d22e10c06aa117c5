"""The broker's CPU per small request: one-message produce requests, one in flight (issue 13).

A fresh broker process (uvloop, ``unflushThreshold`` 1000 by default, 4 partitions) and a blocking raw-socket
client in this process that sends one 100 B message per ProduceRequest and waits for its ack before the
next one, so the broker handles one request per loop step: its fixed cost per request (read, frame
parse, validation, the append's write, the reply), with nothing to amortise it over. The broker's CPU time
(utime + stime of its process, from /proc) over the measured requests, divided by their number, is the
figure; wall time per request is printed too (it includes the client's own work and two process
wake-ups per round trip).

``--fetch`` adds a long-polling consumer on a second connection: before each produce a Fetch for the next
offset is parked at the broker (``max_wait_ms`` 5 s), the produce's append wakes it, and the client reads
both replies; the CPU per round then includes parking the fetch, waking it and the fetch reply (what the
e2e bench's consumer costs the broker per message).

``--multi N`` compares, in the same run (alternating, ``--repeat`` times each), two ways of sending a burst
of N one-message batches to partitions 0..N-1 (N <= 4): N Produce requests one at a time (each waits for
the previous one's ack); N Produce requests written together (one write) and their N replies; one
MultiProduce (API 24) of the N batches and its one reply. The broker's CPU is then given per burst and per
batch. ``--count`` counts bursts.

``--multi N --multi-fetch`` measures, the same way, the broker's side of a consumer's long poll woken by
such a MultiProduce: the MultiProduce alone; with N Fetches (one per partition, on a second connection)
parked before it and woken by it; with one MultiFetch of the N partitions parked before it and woken by
it (answered once, at the end of the read that carried the MultiProduce). The difference to the first
is what the consumer's fetches cost the broker per burst. ``--only MODE`` runs one of the cases (to
profile it with ``--cprofile``).

``--messages N`` puts N messages (each ``--size`` bytes) in every batch instead of one (a producer's burst of a
few messages to one partition: what a batch holds when many partitions are produced round robin).

``--cprofile FILE`` runs the broker under cProfile (pstats file; its CPU figure is then inflated by the
profiler). ``--profile FILE`` records the broker with py-spy (speedscope JSON, or collapsed stacks for a FILE
named *.raw; ``--rate`` samples per s) during the measured phase.

    .venv/bin/python scripts/bench_request_cpu.py [--count 20000] [--fetch] [--repeat 3]
    .venv/bin/python scripts/bench_request_cpu.py --multi 4 --count 10000 --repeat 3
    .venv/bin/python scripts/bench_request_cpu.py --multi 4 --messages 5 --count 10000 --repeat 3
    .venv/bin/python scripts/bench_request_cpu.py --multi 4 --multi-fetch --count 10000 --repeat 3
    PYTHONPATH=/tmp/old/src .venv/bin/python scripts/bench_request_cpu.py     # the code before
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from metaq.broker.launcher import BrokerLauncher
from metaq.protocol import messages as m
from metaq.protocol.codec import NEED_DATA, ClientConnection, ResponseEvent
from metaq.protocol.records import encode_values

_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICKS, int(fields[12]) / _TICKS


class _Conn:
    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.codec = ClientConnection("bench-request-cpu")
        self.codec.set_versions({key: spec.max_version for key, spec in m.APIS.items()})

    def send(self, request: object) -> None:
        _cid, frame = self.codec.send(request)
        self.sock.sendall(frame)

    def send_all(self, requests: Sequence[object]) -> None:
        """Several requests in one write (a client's buffered burst)."""
        self.sock.sendall(b"".join(self.codec.send(r)[1] for r in requests))

    def receive(self) -> object:
        while True:
            event = self.codec.next_event()
            if event is not NEED_DATA:
                assert isinstance(event, ResponseEvent)
                return event.response
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("broker closed the connection")
            self.codec.receive_data(data)


class _ProfiledBroker(BrokerLauncher):
    """The broker under cProfile (its whole life, start-up included): what its Python time goes to."""

    def __init__(self, out: str, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.out = out

    def command(self) -> list[str]:
        cmd = super().command()
        return [cmd[0], "-m", "cProfile", "-o", self.out, *cmd[1:]]


def _run(args: argparse.Namespace, mode: str = "produce") -> dict[str, float]:
    """``mode``: "produce" (one Produce per round, the default measure); "serial", "produces" or "multi"
    (``--multi``)."""
    with tempfile.TemporaryDirectory(prefix="metaq-reqcpu-") as tmp:
        options = {"numPartitions": 4, "unflushThreshold": args.flush, "event-loop": "uvloop"}
        if args.cprofile:
            broker = _ProfiledBroker(args.cprofile, os.path.join(tmp, "data"), options).start()
        else:
            broker = BrokerLauncher(os.path.join(tmp, "data"), options).start()
        try:
            producer = _Conn(broker.host, broker.port)
            consumer = _Conn(broker.host, broker.port) if args.fetch or mode in ("multi_fetch", "fetches") else None
            topic = "reqcpu"
            payload = b"x" * args.size
            payloads = [payload] * args.messages
            offset = 0

            parts = range(args.multi)
            positions = dict.fromkeys(parts, 0)

            def burst(i: int) -> None:
                now_ms = int(time.time() * 1000)
                if mode in ("multi", "multi_fetch", "fetches"):
                    assert consumer is not None or mode == "multi"
                    if mode == "multi_fetch":  # one MultiFetch of the N partitions, parked
                        consumer.send(m.MultiFetchRequest(5000, 1, 4 << 20, "", [  # type: ignore[union-attr]
                            m.FetchPartition(topic, p, positions[p], 1 << 20) for p in parts]))
                    elif mode == "fetches":  # one Fetch per partition, parked
                        consumer.send_all([m.FetchRequest(topic, p, positions[p], 1 << 20, 5000)  # type: ignore[union-attr]
                                           for p in parts])
                    producer.send(m.MultiProduceRequest(1, 30000, "", [
                        m.ProducePartition(topic, p, encode_values(payloads, now_ms)) for p in parts]))
                    reply = producer.receive()
                    assert reply.error_code == 0 and not any(  # type: ignore[attr-defined]
                        p.error_code for p in reply.partitions), reply  # type: ignore[attr-defined]
                    if mode == "multi_fetch":
                        fetched = consumer.receive()  # type: ignore[union-attr]
                        assert fetched.error_code == 0, fetched  # type: ignore[attr-defined]
                        for entry in fetched.partitions:  # type: ignore[attr-defined]
                            assert entry.error_code == 0 and entry.records, entry
                            positions[entry.partition] = entry.log_end_offset
                    elif mode == "fetches":
                        for p in parts:  # replies in request order
                            got = consumer.receive()  # type: ignore[union-attr]
                            assert got.error_code == 0 and got.records, got  # type: ignore[attr-defined]
                            positions[p] = got.log_end_offset  # type: ignore[attr-defined]
                    return
                produces = [m.ProduceRequest(topic=topic, partition=p, acks=1, records=encode_values(payloads, now_ms))
                            for p in parts]
                if mode == "serial":  # each waits for the previous one's ack
                    for request in produces:
                        producer.send(request)
                        produced = producer.receive()
                        assert produced.error_code == 0, produced  # type: ignore[attr-defined]
                    return
                producer.send_all(produces)
                for _ in parts:
                    produced = producer.receive()
                    assert produced.error_code == 0, produced  # type: ignore[attr-defined]

            def one(i: int) -> None:
                nonlocal offset
                if mode != "produce":
                    burst(i)
                    return
                if consumer is not None:
                    consumer.send(m.FetchRequest(topic=topic, partition=0, offset=offset, max_wait_ms=5000,
                                                 max_bytes=1 << 20))
                batch = encode_values(payloads, int(time.time() * 1000))
                producer.send(m.ProduceRequest(topic=topic, partition=0, acks=1, records=batch))
                reply = producer.receive()
                assert reply.error_code == 0, reply  # type: ignore[attr-defined]
                if consumer is not None:
                    fetched = consumer.receive()
                    assert fetched.error_code == 0, fetched  # type: ignore[attr-defined]
                    offset = fetched.log_end_offset  # type: ignore[attr-defined]

            producer.send(m.ProduceRequest(topic=topic, partition=0, acks=1,
                                           records=encode_values([payload], int(time.time() * 1000))))
            offset = producer.receive().base_offset + 1  # type: ignore[attr-defined]  # the topic exists now
            positions[0] = offset
            for i in range(args.warmup):
                one(i)
            spy = None
            if args.profile:
                kind = "raw" if args.profile.endswith(".raw") else "speedscope"
                spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-r", str(args.rate),
                                        "-p", str(broker.pid), "-f", kind, "-o", args.profile, "--nonblocking"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)  # py-spy attaches
            cpu0, wall0 = _cpu_s(broker.pid), time.perf_counter()
            for i in range(args.count):
                one(i)
            cpu1, wall1 = _cpu_s(broker.pid), time.perf_counter()
            if spy is not None:
                spy.send_signal(2)
                spy.wait(60)
        finally:
            broker.stop()
    n = args.count
    user, system = (cpu1[0] - cpu0[0]) / n * 1e6, (cpu1[1] - cpu0[1]) / n * 1e6
    return {"broker_cpu_us": user + system, "user_us": user, "system_us": system, "wall_us": (wall1 - wall0) / n * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--messages", type=int, default=1, help="messages per batch (each --size bytes)")
    parser.add_argument("--flush", default="1000", help="the broker's unflushThreshold")
    parser.add_argument("--fetch", action="store_true", help="a long-polling fetch woken by each produce")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--profile", default="", help="py-spy speedscope output file (one repeat)")
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--cprofile", default="", help="run the broker under cProfile, stats to this file")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--multi", type=int, default=0,
                        help="N Produces against one MultiProduce of N one-message batches (N partitions, <= 4)")
    parser.add_argument("--only", choices=("serial", "produces", "multi", "fetches", "multi_fetch"), default="",
                        help="with --multi: this one case (e.g. to profile it)")
    parser.add_argument("--multi-fetch", action="store_true",
                        help="with --multi: the MultiProduce alone, with N parked Fetches it wakes, and with one "
                             "parked MultiFetch of the N partitions it wakes")
    args = parser.parse_args()
    if args.multi:
        _compare_multi(args)
        return
    runs = [_run(args) for _ in range(args.repeat)]
    cpu = [r["broker_cpu_us"] for r in runs]
    wall = [r["wall_us"] for r in runs]
    result = {"broker_cpu_us": statistics.median(cpu), "wall_us": statistics.median(wall),
              "user_us": statistics.median(r["user_us"] for r in runs),
              "system_us": statistics.median(r["system_us"] for r in runs),
              "runs_cpu_us": [round(c, 2) for c in cpu], "runs_wall_us": [round(w, 2) for w in wall]}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"broker CPU per {'produce+fetch round' if args.fetch else 'produce request'}: "
              f"{result['broker_cpu_us']:.1f} us (user {result['user_us']:.1f}, system {result['system_us']:.1f}; "
              f"runs {result['runs_cpu_us']}); wall per round "
              f"{result['wall_us']:.1f} us")


def _compare_multi(args: argparse.Namespace) -> None:
    if not 1 <= args.multi <= 4:
        raise SystemExit("--multi takes 1..4 (the bench topic has 4 partitions)")
    modes = ("multi", "fetches", "multi_fetch") if args.multi_fetch else ("serial", "produces", "multi")
    if args.only:
        modes = (args.only,)
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    for _ in range(args.repeat):  # alternating: both modes see the same machine state
        for mode in runs:
            runs[mode].append(_run(args, mode))
    n = args.multi
    result = {}
    for mode, rs in runs.items():
        cpu = statistics.median(r["broker_cpu_us"] for r in rs)
        result[mode] = {"broker_cpu_us_per_burst": cpu, "broker_cpu_us_per_batch": cpu / n,
                        "wall_us_per_burst": statistics.median(r["wall_us"] for r in rs),
                        "runs_cpu_us": [round(r["broker_cpu_us"], 2) for r in rs]}
    if args.json:
        print(json.dumps(result))
        return
    names = {"serial": f"{n} Produces, one at a time", "produces": f"{n} Produces in one write",
             "multi": f"1 MultiProduce of {n} batches", "fetches": f"+ {n} woken Fetches",
             "multi_fetch": f"+ 1 woken MultiFetch of {n}"}
    for mode, r in result.items():
        print(f"{names[mode]:>28}: broker CPU {r['broker_cpu_us_per_burst']:.1f} us per burst of {n} messages, "
              f"{r['broker_cpu_us_per_batch']:.1f} us per batch (runs {r['runs_cpu_us']}); wall per burst "
              f"{r['wall_us_per_burst']:.1f} us")


if __name__ == "__main__":
    main()
