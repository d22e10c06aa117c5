"""Running out of file descriptors (EMFILE) is not a storage failure: the descriptor pool sheds idle
descriptors and tries again, so a low ``ulimit -n`` (or sockets taking the rest) costs reopens, never a
refused append or a partition taken offline. Each case runs in a child process whose soft
RLIMIT_NOFILE is lowered to a few dozen descriptors above what it already holds (or none): the real limit, real
files."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

LOWER_LIMIT = textwrap.dedent("""
    import os, resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    def lower_limit(room):
        # the limit bounds descriptor numbers: from the lowest free one, ``room`` numbers (some may be taken)
        lowest_free = 0
        while True:
            try:
                os.fstat(lowest_free)
            except OSError:
                break
            lowest_free += 1
        limit = lowest_free + room
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        return limit
""")


def _run(script: str, tmp_path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", LOWER_LIMIT + textwrap.dedent(script), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    result["stderr"] = done.stderr
    return result


def test_the_pool_sheds_idle_descriptors_when_the_process_has_none_left_and_gives_the_budget_back(tmp_path):
    result = _run("""
        import errno, json, sys
        from metaq.storage.files import FileCache
        d = sys.argv[1]
        paths = [f"{d}/f{i}" for i in range(300)]
        for i, p in enumerate(paths):
            with open(p, "wb") as f:
                f.write(b"%d" % i)
        limit = lower_limit(30)
        cache = FileCache(10_000)
        held = cache.acquire(paths[0])  # pinned all along: never closed under its holder
        for _ in range(2):
            for i, p in enumerate(paths):
                h = cache.acquire(p)
                assert os.pread(h.fd, 8, 0) == b"%d" % i
                cache.release(h)
        assert os.pread(held.fd, 8, 0) == b"0"
        lowered = cache.max_open_files
        open_after = cache.open_count
        # every descriptor pinned: nothing to shed, the error reaches the caller and nothing leaks
        pinned = [cache.acquire(p) for p in paths[1:cache.open_count + 1]]
        while True:
            try:
                pinned.append(cache.acquire(paths[len(pinned) + 1]))
            except OSError as exc:
                refused = exc.errno
                break
        for h in pinned:
            cache.release(h)
        cache.release(held)
        cache.close_idle(0)
        print(json.dumps({"limit": limit, "shortages": cache.shortages, "lowered": lowered,
                          "open_after": open_after, "refused": errno.errorcode[refused],
                          "restored": cache.max_open_files, "open_at_end": cache.open_count,
                          "fds_at_end": len(os.listdir("/proc/self/fd"))}))
    """, tmp_path)
    assert result["shortages"] >= 1, result
    assert result["lowered"] < 10_000 and result["open_after"] <= result["limit"], result
    assert result["refused"] == "EMFILE", result
    assert result["restored"] == 10_000 and result["open_at_end"] == 0, result
    assert result["fds_at_end"] < result["limit"] - 25, result
    assert "out of file descriptors" in result["stderr"], result["stderr"]


def test_a_log_manager_over_the_open_files_limit_acknowledges_every_append_and_takes_no_partition_offline(
        tmp_path):
    """Group commit over 120 partitions with 40 descriptors to spare and a budget of 5,000: every append's
    fsync (the log's, its directory's, the data directory's) finds a descriptor; everything reads back
    after a reopen."""
    result = _run("""
        import json, sys
        from pathlib import Path
        from metaq.protocol.records import decode_fetched, encode_values
        from metaq.storage import LogConfig, LogManager
        d = Path(sys.argv[1])
        lower_limit(40)
        config = LogConfig(unflush_threshold=0)
        manager = LogManager(d, 0, config, max_open_files=5_000)
        manager.open()
        errors = acked = 0
        for round_ in range(3):
            results = []
            for p in range(120):
                batch = encode_values([b"%d-%d" % (p, round_)], 0)
                results.append(manager.get_or_create("wide", p).append(batch))
            for r in results:
                try:
                    r.durable.result(60)
                    acked += 1
                except Exception as exc:
                    errors += 1
                    print("append failed:", exc, file=sys.stderr)
        shortages = manager.files.shortages
        manager.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        manager = LogManager(d, 0, config)
        manager.open()
        stored = {}
        for p in range(120):
            log = manager.get("wide", p)
            messages, _ = decode_fetched(log.read_bytes(0, 1 << 20), "wide", p, 0)
            stored[p] = [m.data.decode() for m in messages]
        manager.close()
        wrong = {p: values for p, values in stored.items() if values != [f"{p}-{r}" for r in range(3)]}
        print(json.dumps({"acked": acked, "errors": errors, "shortages": shortages, "wrong": wrong}))
    """, tmp_path)
    assert result["errors"] == 0 and result["acked"] == 360, result
    assert result["shortages"] >= 1, result
    assert result["wrong"] == {}, result


def test_a_flush_that_cannot_open_its_file_fails_its_acks_but_keeps_the_partition_online_and_retries(tmp_path):
    """The edge the pool cannot shed its way out of: every descriptor it holds is in use (a reader's slice)
    when a flush must open a file. No sync failed, so the partition must not go offline (as after a failed
    fdatasync): the flush's waiting acks fail, appends go on, and the flusher syncs the bytes by itself
    once descriptors are back."""
    result = _run("""
        import json, sys, time
        from pathlib import Path
        from metaq.protocol.records import decode_fetched, encode_values
        from metaq.storage import LogConfig, LogManager
        from metaq.errors import StorageError
        d = Path(sys.argv[1])
        config = LogConfig(unflush_threshold=1000, unflush_interval_ms=1 << 30)
        manager = LogManager(d, 0, config, max_open_files=1)
        manager.open()
        a, b = manager.get_or_create("t", 0), manager.get_or_create("t", 1)
        a.flush(); b.flush()
        a.append(encode_values([b"a0"], 0))
        b.append(encode_values([b"b0"], 0))  # a budget of one: b's descriptor closed a's
        reading = b.read(0, 1 << 20)  # and b's is held by a reader: nothing idle in the pool
        lower_limit(0)  # not one descriptor left
        flush_error = ""
        try:
            a.flush()
        except StorageError as exc:
            flush_error = str(exc)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        append_after = a.append(encode_values([b"a1"], 0)).base_offset  # online, not offline
        reading.release()
        deadline = time.monotonic() + 10
        while a._active.synced_bytes < a._active.size_bytes and time.monotonic() < deadline:
            time.sleep(0.01)
        synced = a._active.synced_bytes == a._active.size_bytes
        messages, _ = decode_fetched(a.read_bytes(0, 1 << 20), "t", 0, 0)
        manager.close()
        print(json.dumps({"flush_error": flush_error, "append_after": append_after, "synced": synced,
                          "values": [m.data.decode() for m in messages]}))
    """, tmp_path)
    assert "tried again" in result["flush_error"], result
    assert result["append_after"] == 1, result
    assert result["synced"], "the flusher retried the flush by itself"
    assert result["values"] == ["a0", "a1"], result
