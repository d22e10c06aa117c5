"""The consumer's CPU per MultiFetch reply: frame in, FetchResults out (issue 13). No broker, no socket.

What ``PullConsumer.get_many`` does with a woken long poll's reply in ``bench e2e --consumer multi``:
the frame handed to the client codec (``receive_data`` + ``next_event``: the MultiFetchResponse and its
FetchedPartition entries decoded), then each partition's entry checked and its records decoded into
Messages (``Fetcher.fetch_many``'s per-partition work). The reply has ``--partitions`` entries, each one
stored batch of ``--per-batch`` messages of ``--size`` bytes (``--empty`` of them with no records, as a
reply woken by one partition's append). ``single`` is the same work for one Fetch reply of one such
batch, for comparison. Figures are this process's CPU time per reply (median of ``--repeat`` timings of
``--reps`` replies each).

    .venv/bin/python scripts/bench_multi_fetch_decode.py [--partitions 4] [--reps 20000] [--repeat 5]
    PYTHONPATH=/tmp/old/src .venv/bin/python scripts/bench_multi_fetch_decode.py     # the code before
    .venv/bin/python scripts/bench_multi_fetch_decode.py --cprofile /tmp/decode.pstats
"""

from __future__ import annotations

import argparse
import cProfile
import json
import statistics
import time
from typing import Any

from metaq.client.consumer import Fetcher
from metaq.client.metadata import Partition
from metaq.protocol import messages as m
from metaq.protocol.codec import NEED_DATA, ClientConnection, RequestHeader, ServerConnection
from metaq.protocol.records import encode_values, stamp


def _frame(response: Any, request: Any) -> bytes:
    """The response frame a broker would write for ``request`` (the newest version; the correlation id,
    bytes 4..8, is set to the request's at each use)."""
    version = m.APIS[type(request).API_KEY].max_version
    header = RequestHeader(type(request).API_KEY, version, 1, "bench")
    return ServerConnection().encode_response(header, response)


def _client() -> ClientConnection:
    codec = ClientConnection("bench")
    codec.set_versions({key: spec.max_version for key, spec in m.APIS.items()})
    return codec


def _cases(args: argparse.Namespace) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    payload = b"x" * args.size
    parts = [Partition(0, p) for p in range(args.partitions)]
    fetcher = Fetcher.__new__(Fetcher)  # only the decode half: no client core, no connection
    fetcher.verify_crc = True

    def batch(base: int) -> bytes:
        raw = bytearray(encode_values([payload] * args.per_batch, now_ms))
        stamp(raw, base, base << 8, now_ms)  # what the broker writes into a stored batch's header
        return bytes(raw)

    offset = 1000
    wanted = [("t", p, offset, 1 << 20) for p in parts]
    entries = []
    for i, p in enumerate(parts):
        empty = i >= args.partitions - args.empty
        entries.append(m.FetchedPartition("t", p.partition, log_start_offset=0,
                                          log_end_offset=offset + (0 if empty else args.per_batch),
                                          records=b"" if empty else batch(offset)))
    multi_req = m.MultiFetchRequest(500, 1, 4 << 20, "", [m.FetchPartition("t", p.partition, offset, 1 << 20)
                                                           for p in parts])
    multi_frame = _frame(m.MultiFetchResponse(partitions=entries), multi_req)
    single_req = m.FetchRequest("t", 0, offset, 1 << 20, 500)
    single_frame = _frame(m.FetchResponse(log_start_offset=0, log_end_offset=offset + args.per_batch,
                                          records=batch(offset)), single_req)

    def multi(codec: ClientConnection) -> int:
        cid, _ = codec.send(multi_req)
        codec.receive_data(multi_frame[:4] + cid.to_bytes(4, "big") + multi_frame[8:])
        event = codec.next_event()
        assert event is not NEED_DATA
        got = 0
        for (topic, p, o, _pmax), entry in zip(wanted, event.response.partitions, strict=True):  # type: ignore[union-attr]
            got += len(fetcher._result(topic, p, o, entry).messages)
        return got

    def single(codec: ClientConnection) -> int:
        cid, _ = codec.send(single_req)
        codec.receive_data(single_frame[:4] + cid.to_bytes(4, "big") + single_frame[8:])
        event = codec.next_event()
        assert event is not NEED_DATA
        return len(fetcher.decode_response(event.response, "t", parts[0], offset).messages)  # type: ignore[union-attr]

    expected = args.per_batch * (args.partitions - args.empty)
    assert multi(_client()) == expected and single(_client()) == args.per_batch
    return {"multi": multi, "single": single}


def _time(fn: Any, reps: int) -> float:
    codec = _client()
    t0 = time.process_time()
    for _ in range(reps):
        fn(codec)
    return (time.process_time() - t0) / reps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--empty", type=int, default=0, help="entries with no records")
    parser.add_argument("--per-batch", type=int, default=1)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--reps", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cprofile", default="", help="profile the multi case, pstats to this file")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cases = _cases(args)
    if args.cprofile:
        fn, codec = cases["multi"], _client()
        with cProfile.Profile() as prof:
            for _ in range(args.reps):
                fn(codec)
        prof.dump_stats(args.cprofile)
        return
    runs: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeat):
        for name, fn in cases.items():
            runs[name].append(_time(fn, args.reps))
    result = {name: {"cpu_us_per_reply": statistics.median(r), "runs": [round(x, 2) for x in r]}
              for name, r in runs.items()}
    if args.json:
        print(json.dumps(result))
        return
    print(f"multi ({args.partitions} partitions, {args.empty} empty): "
          f"{result['multi']['cpu_us_per_reply']:.1f} us per reply (runs {result['multi']['runs']})")
    print(f"single (one Fetch reply): {result['single']['cpu_us_per_reply']:.1f} us per reply "
          f"(runs {result['single']['runs']})")


if __name__ == "__main__":
    main()
