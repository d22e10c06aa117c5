"""A temporary instrumentation of one e2e run: wraps metaq's private functions in every process of the run
(producer, broker, consumer) and records ``time.perf_counter_ns()`` (CLOCK_MONOTONIC: one clock for every
process of the machine) at each stage a message passes. Nothing of this is in metaq's hot paths; it is
loaded only through ``scripts/e2e_trace/sitecustomize.py`` when METAQ_TRACE_DIR is set.

Records are tuples written as JSON lines to ``$METAQ_TRACE_DIR/<pid>.jsonl``:

producer (keyed by the payload's 8-byte time stamp, ``ts``)
    ("send", ts, t)            send_async called
    ("sealed", [ts...], t)     the batch was sealed and dispatched (Producer._dispatch; a batch merged into
                               one queued before it travels with that one)
    ("written", [ts...], t)    its frame was handed to the transport (BrokerConnection._flush)
    ("acked", p, base, [ts...], t)   the ack arrived (Producer._complete_ok): ts i has offset base+i
broker (keyed by partition and offsets)
    ("append", p, base, last, t_read, t_handle, t_appended)
    ("flush", p, end_before, t_start, t_end)
    ("ack", p, base, t)        the produce reply was queued for writing (BrokerProtocol._complete)
    ("woken", p, t)            a long-poll waiter resumed
    ("fetchreq", p, offset, t_handle, parked)   a Fetch request handled (parked: it long-polls)
    ("rearm", p, t)            a woken waiter found nothing it may see and waits again
    ("timeup", p, t)           a waiter's timer fired (answered by its timeout, maybe empty)
    ("reply", p, first, last, t)   a fetch reply was queued for writing
every process
    ("gc", generation, t_start, t_end, collected)   a garbage collection
consumer
    ("fetch", p, offset, t)    the fetch call started (before the request is written)
    ("recv", p, [offsets], t_data, t_decoded)   bytes arrived / the fetch call returned
    ("yield", p, [offsets], t) the batch was handed to the application
"""

from __future__ import annotations

import atexit
import json
import os
import struct
import time
from typing import Any

_now = time.perf_counter_ns
_TS = struct.Struct(">q")
_records: list[Any] = []
_path = ""
_state: dict[str, Any] = {"read": 0, "handle": 0, "data": 0}


def _rec(*item: Any) -> None:
    _records.append(item)
    if len(_records) >= 5_000_000:  # written at exit: a mid-run dump would stall the run
        _dump()


def _dump() -> None:
    if not _records:
        return
    with open(_path, "a") as f:
        for r in _records:
            f.write(json.dumps(r))
            f.write("\n")
    _records.clear()


def _ts(data: Any) -> int:
    return int(_TS.unpack_from(data)[0]) if len(data) >= 8 else 0


def install(directory: str) -> None:
    global _path
    os.makedirs(directory, exist_ok=True)
    _path = os.path.join(directory, f"{os.getpid()}.jsonl")
    atexit.register(_dump)
    import signal

    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        _dump()
        if callable(previous):
            previous(signum, frame)
        else:
            raise SystemExit(0)

    # the broker installs its own SIGTERM handler on its loop later; this only covers processes that do not
    signal.signal(signal.SIGTERM, on_term)
    _patch_gc()
    _patch_producer()
    _patch_broker()
    _patch_consumer()


def _patch_gc() -> None:
    """Every garbage collection of the process: ("gc", generation, t_start, t_end, objects tracked before it)."""
    import gc

    started = [0, 0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = _now()
            started[1] = sum(gc.get_count()) if info["generation"] < 2 else -1
        else:
            _rec("gc", info["generation"], started[0], _now(), info["collected"])

    gc.callbacks.append(on_gc)


def _patch_producer() -> None:
    from metaq.client import producer as pm
    from metaq.client.producer import batches as am
    from metaq.client.producer import sender as sm
    from metaq.net import connection as cm

    batch_ts: dict[int, list[int]] = {}

    orig_send_async = pm.Producer.send_async

    def send_async(self: Any, message: Any, *a: Any, **k: Any) -> Any:
        ts = _ts(message.data)
        if ts:
            _rec("send", ts, _now())
        return orig_send_async(self, message, *a, **k)

    pm.Producer.send_async = send_async  # type: ignore[method-assign]

    orig_dispatch = sm.Sender.dispatch

    def dispatch(self: Any, batch: Any) -> None:
        if batch.payload is None and id(batch) not in batch_ts:
            tss = [_ts(v) for v in batch.values]
            batch_ts[id(batch)] = tss
            _rec("sealed", tss, _now())
        return orig_dispatch(self, batch)

    sm.Sender.dispatch = dispatch  # type: ignore[method-assign]

    orig_absorb = getattr(am.ProducerBatch, "absorb", None)  # absent before batches could merge

    def absorb(self: Any, other: Any) -> None:
        mine, theirs = batch_ts.get(id(self)), batch_ts.pop(id(other), None)
        if mine is not None and theirs is not None:
            mine.extend(theirs)
        assert orig_absorb is not None
        return orig_absorb(self, other)

    if orig_absorb is not None:
        am.ProducerBatch.absorb = absorb  # type: ignore[method-assign]

    orig_write = sm.Sender._write

    def write(self: Any, conn: Any, lane: Any, batch: Any) -> None:
        tss = batch_ts.get(id(batch))
        orig_write(self, conn, lane, batch)
        if tss is not None:
            pending = conn.__dict__.setdefault("_trace_pending", [])
            pending.append(tss)

    sm.Sender._write = write  # type: ignore[method-assign]

    orig_write_multi = sm.Sender._write_multi

    def write_multi(self: Any, conn: Any, group: Any) -> None:  # several batches in one MultiProduce
        tss = [batch_ts.get(id(batch)) for _lane, batch in group]
        orig_write_multi(self, conn, group)
        pending = conn.__dict__.setdefault("_trace_pending", [])
        pending.extend(t for t in tss if t is not None)

    sm.Sender._write_multi = write_multi  # type: ignore[method-assign]

    orig_flush = cm.BrokerConnection._flush

    def flush(self: Any) -> None:
        t = _now()
        orig_flush(self)
        pending = self.__dict__.get("_trace_pending")
        if pending:
            for tss in pending:
                _rec("written", tss, t)
            pending.clear()

    cm.BrokerConnection._flush = flush  # type: ignore[method-assign]

    orig_ok = pm.Producer._complete_ok

    def complete_ok(self: Any, batch: Any, resp: Any) -> None:
        t = _now()
        tss = batch_ts.pop(id(batch), None)
        if tss is not None and resp is not None:
            _rec("acked", resp.partition, resp.base_offset, tss, t)
        return orig_ok(self, batch, resp)

    pm.Producer._complete_ok = complete_ok  # type: ignore[method-assign]

    orig_on_data = cm.BrokerConnection._on_data

    def on_data(self: Any, nbytes: int) -> None:  # the client's receive hook (bytes received into its buffer)
        _state["data"] = _now()
        return orig_on_data(self, nbytes)

    cm.BrokerConnection._on_data = on_data  # type: ignore[method-assign]


def _patch_broker() -> None:
    from metaq.broker import transport as tm
    from metaq.broker import waiters as wm
    from metaq.broker.session import FileReply
    from metaq.protocol import messages as m
    from metaq.protocol.records import peek_length
    from metaq.storage import log as lm

    orig_received = tm.BrokerProtocol.data_received

    def data_received(self: Any, data: bytes) -> None:
        _state["read"] = _now()
        return orig_received(self, data)

    tm.BrokerProtocol.data_received = data_received  # type: ignore[method-assign]

    reply_part: dict[int, int] = {}
    orig_handle = tm.BrokerProtocol._handle

    def handle(self: Any, event: Any) -> None:
        _state["handle"] = _now()
        req = event.request
        if isinstance(req, m.FetchRequest):
            n = len(self.replies)
            deferred = len(self.deferred)
            orig_handle(self, event)
            _rec("fetchreq", req.partition, req.offset, _state["handle"], len(self.deferred) > deferred)
            # the reply slot it appended (if not answered at once)
            for r in list(self.replies)[n:]:
                reply_part[id(r)] = req.partition
            if len(self.replies) <= n:
                pass
            return None
        return orig_handle(self, event)

    tm.BrokerProtocol._handle = handle  # type: ignore[method-assign]

    orig_complete = tm.BrokerProtocol._complete

    def complete(self: Any, reply: Any, result: Any) -> None:
        t = _now()
        if isinstance(result, m.ProduceResponse):
            _rec("ack", result.partition, result.base_offset, t)
        elif type(result).__name__ == "MultiProduceResponse":
            for produced in result.partitions:
                _rec("ack", produced.partition, produced.base_offset, t)
        elif isinstance(result, m.MultiFetchResponse):
            for fetched in result.partitions:
                first, last = _batch_range(fetched.records)
                if first >= 0:
                    _rec("reply", fetched.partition, first, last, fetched.log_end_offset, t)
        else:
            p = reply_part.pop(id(reply), None)
            records = None
            if isinstance(result, FileReply):
                records = result.file_slice.read_bytes()
            elif isinstance(result, m.FetchResponse):
                records = result.records
            if p is not None and records:
                first = last = -1
                pos = 0
                while True:
                    peeked = peek_length(records, pos)
                    if peeked is None or pos + peeked[1] > len(records):
                        break
                    if first < 0:
                        first = peeked[0]
                    # record count: bytes [67, 71) of a batch? use the next batch's base, else the log end
                    last = peeked[0]
                    pos += peeked[1]
                _rec("reply", p, first, last, result.response.log_end_offset if isinstance(result, FileReply)
                     else result.log_end_offset, t)
        return orig_complete(self, reply, result)

    tm.BrokerProtocol._complete = complete  # type: ignore[method-assign]

    orig_append = lm.PartitionLog.append

    def append(self: Any, batch: Any, header: Any = None, **k: Any) -> Any:
        r = orig_append(self, batch, header, **k)
        _rec("append", self.partition, r.base_offset, r.last_offset, _state["read"], _state["handle"], _now())
        return r

    lm.PartitionLog.append = append  # type: ignore[method-assign]

    orig_flush_pending = lm.PartitionLog.flush_pending

    def flush_pending(self: Any, *a: Any, **k: Any) -> Any:
        end = self.log_end_offset
        t0 = _now()
        try:
            return orig_flush_pending(self, *a, **k)
        finally:
            _rec("flush", self.partition, end, t0, _now())

    lm.PartitionLog.flush_pending = flush_pending  # type: ignore[method-assign]

    from metaq.storage import flush as fm

    orig_run_round = fm.Flusher._run_round

    def run_round(self: Any, *a: Any) -> Any:
        if len(a) == 2:  # (singles, targets): the flusher's rounds
            logs = len({id(t) for t, _s, _f in a[0]} | {id(t) for t in a[1]})
        else:  # {log: jobs}: the no-barrier experiment (commits c225bce..4a2794c)
            logs = len(a[0])
        t0 = _now()
        try:
            return orig_run_round(self, *a)
        finally:
            _rec("round", logs, t0, _now())

    fm.Flusher._run_round = run_round  # type: ignore[method-assign]

    orig_wait = wm.FetchWaiters.wait

    async def wait(self: Any, topic: str, partition: int, *a: Any, **k: Any) -> None:
        await orig_wait(self, topic, partition, *a, **k)
        _rec("woken", partition, _now())

    wm.FetchWaiters.wait = wait  # type: ignore[method-assign]

    if hasattr(wm.FetchWaiters, "park"):  # waiters woken by a callback inside the append's notify
        orig_wake = wm.FetchWaiters._wake

        def wake(self: Any, waiter: Any, timed_out: bool) -> None:
            if not timed_out and waiter.armed and not waiter.finished:
                t = _now()
                for key in waiter.keys:
                    _rec("woken", key[1], t)
            orig_wake(self, waiter, timed_out)

        wm.FetchWaiters._wake = wake  # type: ignore[method-assign]

        orig_rearm = wm.FetchWaiters.rearm

        def rearm(self: Any, waiter: Any) -> None:
            if not _state.get("parking") and not waiter.armed and not waiter.finished:  # not the first arming
                for key in waiter.keys:
                    _rec("rearm", key[1], _now())
            orig_rearm(self, waiter)

        wm.FetchWaiters.rearm = rearm  # type: ignore[method-assign]

        orig_park = wm.FetchWaiters.park

        def park(self: Any, *a: Any, **k: Any) -> Any:
            _state["parking"] = True
            try:
                return orig_park(self, *a, **k)
            finally:
                _state["parking"] = False

        wm.FetchWaiters.park = park  # type: ignore[method-assign]

        orig_time_up = wm.FetchWaiters._time_up

        def time_up(self: Any, waiter: Any) -> None:
            for key in waiter.keys:
                _rec("timeup", key[1], _now())
            orig_time_up(self, waiter)

        wm.FetchWaiters._time_up = time_up  # type: ignore[method-assign]


def _batch_range(records: bytes) -> tuple[int, int]:
    """Base offsets of the first and the last whole batch in ``records`` (-1, -1: none)."""
    from metaq.protocol.records import peek_length

    first = last = -1
    pos = 0
    while True:
        peeked = peek_length(records, pos)
        if peeked is None or pos + peeked[1] > len(records):
            return first, last
        if first < 0:
            first = peeked[0]
        last = peeked[0]
        pos += peeked[1]


def _patch_consumer() -> None:
    from metaq.client import consumer as cm

    orig_fetch = cm.Fetcher.fetch

    async def fetch(self: Any, *a: Any, **k: Any) -> Any:
        if len(a) >= 3:
            _rec("fetch", getattr(a[1], "partition", a[1]), a[2], _now())
        r = await orig_fetch(self, *a, **k)
        if r.messages:
            _rec("recv", r.messages[0].partition, [x.offset for x in r.messages], _state["data"], _now())
        return r

    cm.Fetcher.fetch = fetch  # type: ignore[method-assign]

    orig_many = cm.Fetcher.fetch_many

    async def fetch_many(self: Any, conn: Any, wanted: Any, *a: Any, **k: Any) -> Any:
        # the bench's `--consumer multi`: what a MultiFetch returns is handed to the application at once
        for _topic, p, offset, _max in wanted:
            _rec("fetch", p.partition, offset, _now())
        results = await orig_many(self, conn, wanted, *a, **k)
        t = _now()
        for r in results:
            if getattr(r, "messages", None):
                offsets = [x.offset for x in r.messages]
                _rec("recv", r.messages[0].partition, offsets, _state["data"], t)
                _rec("yield", r.messages[0].partition, offsets, t)
        return results

    cm.Fetcher.fetch_many = fetch_many  # type: ignore[method-assign]

    orig_iter = cm.PullConsumer.iterate_batches

    async def iterate_batches(self: Any, *a: Any, **k: Any) -> Any:
        gen = orig_iter(self, *a, **k)
        try:
            async for batch in gen:
                if batch:
                    _rec("yield", batch[0].partition, [x.offset for x in batch], _now())
                yield batch
        finally:
            await gen.aclose()

    cm.PullConsumer.iterate_batches = iterate_batches  # type: ignore[method-assign]
