"""`metaq bench storage|partitions|large|backlog|delay|redrive|dashboard|limits|decode|quotas|security-paths|
auth-timing`: the broker and its storage, and what its limits and security hold against."""

from __future__ import annotations

from typing import Any

import click

from metaq.cli.bench_common import broker_option, comma_list, json_option, run_and_print, work_dir_option


@click.command("storage")
@click.option("--seconds", type=click.FloatRange(0.1), default=2.0, show_default=True, help="Time per mode.")
@click.option("--max-batches", type=click.IntRange(1), default=200_000, show_default=True,
              help="Batches per mode at most.")
@click.option("--group-threads", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Appender threads of the group-commit mode.")
@work_dir_option
@json_option
def bench_storage(as_json: bool, seconds: float, max_batches: int, group_threads: int, work_dir: str | None) -> None:
    """The storage engine in process: appends/s under each flush mode and reads, beside the disk's own figures
    (dd oflag=dsync, a Python write + fdatasync loop) in the same run."""
    from metaq.bench import storage

    run_and_print(as_json, lambda report: storage.run(seconds, max_batches, group_threads, report, work_dir),
                  storage.table)


@click.command("partitions")
@click.option("--small", type=click.IntRange(1), default=8, show_default=True,
              help="Partitions of the baseline topic.")
@click.option("--large", type=click.IntRange(1), default=10_000, show_default=True,
              help="Partitions of the many-partitions topic.")
@click.option("-n", "--count", type=click.IntRange(1), default=1_000_000, show_default=True,
              help="Messages per produce case.")
@click.option("-d", "--duration", "duration_s", type=click.FloatRange(0.1), default=20.0, show_default=True,
              help="Upper bound of a produce case, seconds.")
@click.option("--size", type=click.IntRange(8), default=100, show_default=True, help="Message payload bytes.")
@click.option("--batch", type=click.IntRange(1), default=1000, show_default=True,
              help="Messages per send_batch call (--apis batch).")
@click.option("--batch-bytes", type=click.IntRange(1024), default=256 * 1024, show_default=True,
              help="The producer's batch_bytes.")
@click.option("--concurrency", type=click.IntRange(1, 256), default=8, show_default=True,
              help="send_batch calls in flight.")
@click.option("--apis", default="batch,async", show_default=True,
              callback=comma_list(("batch", "async", "async-sticky", "oneway", "many")),
              help="Producer APIs, in order (a name may repeat: another run on the same broker): batch (send_batch, "
                   "each call to the next partition), async (send_async round robin per message), async-sticky "
                   "(send_async with StickyRoundRobinSelector), oneway, many.")
@click.option("--fill-bytes", type=click.FloatRange(0), default=1e9, show_default=True,
              help="Data filled into the --large partitions for the start-up cases (0: no start-up cases).")
@click.option("--fill-message-bytes", type=click.IntRange(1), default=1000, show_default=True)
@click.option("--unflush-threshold", type=click.IntRange(0), default=0, show_default=True,
              help="The brokers' unflushThreshold (0: group commit, every ack after its fsync).")
@click.option("--multi-produce/--no-multi-produce", default=True, show_default=True,
              help="The producer's multi_produce (several partitions' batches in one request).")
@click.option("--skip-produce", is_flag=True, help="Only the start-up cases.")
@broker_option
@work_dir_option
@json_option
def bench_partitions(as_json: bool, work_dir: str | None, skip_produce: bool, duration_s: float,
                     **kwargs: Any) -> None:
    """Many partitions on one broker beside a few (10,000 against 8), same run: produce msg/s, RSS and
    descriptors per partition, a new broker's creation and clean stop, start-up and recovery with data."""
    from metaq.bench import partitions

    spec = partitions.PartitionsSpec(produce=not skip_produce, duration_s=duration_s, **kwargs)
    run_and_print(as_json, lambda report: partitions.run(spec, report, work_dir), partitions.table)


@click.command("large")
@click.option("-n", "--count", type=click.IntRange(1), default=1000, show_default=True,
              help="Messages produced and consumed.")
@click.option("--size", type=click.IntRange(8), default=1_000_000, show_default=True, help="Payload bytes.")
@click.option("--partitions", type=click.IntRange(1), default=1, show_default=True)
@click.option("--batch", type=click.IntRange(1), default=4, show_default=True,
              help="Messages per send_batch call of the preload.")
@click.option("-d", "--duration", "duration_s", type=click.FloatRange(0.1), default=120.0, show_default=True,
              help="Upper bound of each phase, seconds.")
@click.option("--api", type=click.Choice(["fetch", "iterate", "columns"]), default="fetch", show_default=True,
              help="The consumer: Fetcher.fetch in a loop (one request at a time), or the pull consumer's iterate / "
                   "iterate_columns (which fetch ahead while a reply is handed out).")
@click.option("--loops", default="uvloop,asyncio", show_default=True, callback=comma_list(("uvloop", "asyncio")),
              help="Broker event loops, a fresh broker each.")
@click.option("--baselines", default="sendfile,pread", show_default=True, callback=comma_list(("sendfile", "pread")),
              help="The machine's copies of the same files over loopback: sendfile, pread + send.")
@click.option("--no-raw", "raw", is_flag=True, flag_value=False, default=True,
              help="Skip the raw fetch (the broker's Fetch with nothing decoded).")
@click.option("--malloc-env", type=click.Choice(["none", "broker", "consumer", "both"]), default="none",
              show_default=True, help="Which processes get glibc's MALLOC_MMAP_THRESHOLD_=32 MiB and "
                                      "MALLOC_TRIM_THRESHOLD_=128 MiB in their environment.")
@click.option("--tune-allocator", is_flag=True, help="The consumer process calls metaq.tune_allocator() first.")
@broker_option
@work_dir_option
@json_option
def bench_large(as_json: bool, work_dir: str | None, **kwargs: Any) -> None:
    """Large messages (1 MB) read through the broker, beside the machine's sendfile of the same segment files over
    loopback, same run; the broker's RSS, CPU and page faults."""
    from metaq.bench import large

    spec = large.LargeSpec(**kwargs)
    run_and_print(as_json, lambda report: large.run(spec, report, work_dir), large.table)


@click.command("backlog")
@click.option("--gb", type=click.FloatRange(0.001), default=1.0, show_default=True, help="Backlog size, 10^9 bytes.")
@click.option("--message-bytes", type=click.IntRange(1), default=1000, show_default=True,
              help="Payload bytes of the backlog's messages.")
@click.option("--partitions", type=click.IntRange(1), default=4, show_default=True)
@click.option("--consumers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Consumer processes of the backlog reads.")
@click.option("--loop", type=click.Choice(["uvloop", "asyncio"]), default="uvloop", show_default=True,
              help="The broker's event loop.")
@click.option("-d", "--duration", "duration_s", type=click.FloatRange(1), default=300.0, show_default=True,
              help="Upper bound of a backlog read, seconds.")
@click.option("--produce-seconds", type=click.FloatRange(0.1), default=15.0, show_default=True,
              help="Length of each produce phase.")
@click.option("--no-warm", "warm", is_flag=True, flag_value=False, default=True,
              help="Skip the raw fetch of the backlog once it is in the page cache.")
@click.option("--skip-produce", "produce", is_flag=True, flag_value=False, default=True,
              help="Only the backlog reads and their baseline.")
@work_dir_option
@json_option
def bench_backlog(as_json: bool, work_dir: str | None, **kwargs: Any) -> None:
    """A backlog read off the disk against the disk's own sequential read, and produce msg/s beside a backlog
    reader against produce alone, same run (the data directory is on --work-dir: that is the disk measured)."""
    from metaq.bench import backlog

    spec = backlog.BacklogSpec(**kwargs)
    run_and_print(as_json, lambda report: backlog.run(spec, report, work_dir), backlog.table)


@click.command("delay")
@click.option("--sends", type=click.IntRange(1), default=200_000, show_default=True,
              help="Plain, then delayed messages of the throughput step (twice each).")
@click.option("--pending", type=click.IntRange(1), default=1_000_000, show_default=True,
              help="Delayed messages of the lateness step.")
@click.option("--window", type=click.IntRange(1), default=60, show_default=True,
              help="Seconds their due times are spread over.")
@click.option("--lead", type=click.IntRange(1), default=60, show_default=True,
              help="Seconds from the start of the sends to the first due time (every message is sent before).")
@click.option("--in-flight", type=click.IntRange(1), default=20_000, show_default=True,
              help="Unacknowledged sends at most.")
@click.option("--kill-restart", is_flag=True,
              help="Kill the broker -9 once everything is pending and restart it first (the timer index is "
                   "rebuilt from the delay logs): the restart time.")
@work_dir_option
@json_option
def bench_delay(as_json: bool, work_dir: str | None, **kwargs: Any) -> None:
    """Delayed delivery: send msg/s of delayed against plain messages, same run, and how late the due messages
    arrive with a million pending; the broker's RSS meanwhile."""
    from metaq.bench import delay

    spec = delay.DelaySpec(**kwargs)
    run_and_print(as_json, lambda report: delay.run(spec, report, work_dir), delay.table)


@click.command("redrive")
@click.option("-n", "--count", type=click.IntRange(1), default=20_000, show_default=True,
              help="Dead letters in the dead-letter topic.")
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True)
@work_dir_option
@json_option
def bench_redrive(as_json: bool, count: int, rounds: int, work_dir: str | None) -> None:
    """How fast `metaq group redrive` sends dead letters back (the real command, as a user runs it), beside its
    --dry-run (reading alone) in the same run."""
    from metaq.bench import redrive

    run_and_print(as_json, lambda report: redrive.run(count, rounds, report, work_dir), redrive.table)


@click.command("dashboard")
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True,
              help="Rounds of every case, in a rotating order.")
@click.option("-n", "--count", type=click.IntRange(1), default=2_000_000, show_default=True,
              help="Messages of each produce run.")
@click.option("-d", "--duration", "duration_s", type=click.FloatRange(0.1), default=15.0, show_default=True,
              help="Upper bound of each produce run, seconds.")
@click.option("--cases", default="no-port,scraped,page-open", show_default=True,
              callback=comma_list(("no-port", "scraped", "page-open")),
              help="no-port (no dashboardHttpPort: the baseline); scraped (GET /metrics every --scrape-interval); "
                   "page-open (what an open dashboard page asks every second).")
@click.option("--scrape-interval", "scrape_interval_s", type=click.FloatRange(0.05), default=1.0, show_default=True,
              help="Seconds between two scrapes of /metrics (Prometheus' default is 15).")
@click.option("--topics", type=click.IntRange(1), default=5, show_default=True,
              help="Topics of the broker /api/state is timed on.")
@click.option("--partitions", type=click.IntRange(1), default=250, show_default=True, help="Partitions of each.")
@click.option("--requests", type=click.IntRange(0), default=20, show_default=True,
              help="GET /api/state in a row (0: skip that step).")
@work_dir_option
@json_option
def bench_dashboard(as_json: bool, work_dir: str | None, **kwargs: Any) -> None:
    """What dashboardHttpPort costs the broker: produce msg/s without it, scraped by Prometheus, and with the
    dashboard page open, same run; and /api/state's time for many partitions."""
    from metaq.bench import dashboard

    run_and_print(as_json, lambda report: dashboard.run(report=report, work_dir=work_dir, **kwargs), dashboard.table)


@click.command("limits")
@click.option("--frames", type=click.IntRange(1, 1024), default=16, show_default=True,
              help="Connections, each holding an unfinished produce frame.")
@click.option("--frame-mib", type=click.IntRange(1, 1024), default=64, show_default=True,
              help="MiB of each unfinished frame.")
@click.option("--lockout-cap-s", type=click.FloatRange(0.1), default=30.0, show_default=True,
              help="How long to wait, at most, for long polls to be served again.")
@work_dir_option
@json_option
def bench_limits(as_json: bool, frames: int, frame_mib: int, lockout_cap_s: float, work_dir: str | None) -> None:
    """Two attacks on a broker's limits: unfinished frames (its RSS, and whether others are served) and abandoned
    long polls (how long real consumers are locked out)."""
    from metaq.bench import limits

    run_and_print(as_json, lambda report: limits.run(frames, frame_mib, lockout_cap_s, report, work_dir),
                  limits.table)


@click.command("decode")
@click.option("--batches", type=click.IntRange(1), default=7, show_default=True, help="Stored batches per reply.")
@click.option("--per-batch", type=click.IntRange(1), default=1000, show_default=True, help="Messages per batch.")
@click.option("--size", type=click.IntRange(1), default=100, show_default=True, help="Payload bytes.")
@click.option("--reps", type=click.IntRange(1), default=100, show_default=True, help="Replies decoded a round.")
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True)
@json_option
def bench_decode(as_json: bool, **kwargs: Any) -> None:
    """The consumer's decode in process (a fetch reply to Messages, or to columns), in messages per CPU second:
    a figure that holds on a shared machine."""
    from metaq.bench import decode

    run_and_print(as_json, lambda report: decode.run(report=report, **kwargs), decode.table)


_QUOTA_ATTACKS = ("fetch-1", "fetch-5", "http-fetch-8", "produce-4m", "produce-4m-4", "multi-produce",
                  "http-connections")


@click.command("quotas")
@click.option("--seconds", type=click.FloatRange(0.1), default=20.0, show_default=True, help="Length of each attack.")
@click.option("--fetch-quota", type=click.IntRange(1), default=50 * 1024, show_default=True,
              help="The readers' fetch quota, bytes per second (quotaConsumerByteRate).")
@click.option("--produce-quota", type=click.IntRange(1), default=100 * 1024, show_default=True,
              help="The writers' produce quota, bytes per second (quotaProducerByteRate).")
@click.option("--connections", type=click.IntRange(1), default=6, show_default=True,
              help="Connections a principal may hold (quotaMaxConnections).")
@click.option("--fill-mb", type=click.IntRange(1), default=24, show_default=True,
              help="What the fetch attacks read: this many times 1,000 messages of 1,000 bytes.")
@click.option("--attacks", default=",".join(_QUOTA_ATTACKS), show_default=True, callback=comma_list(_QUOTA_ATTACKS),
              help="fetch-1, fetch-5: 1 MiB fetches on 1 and 5 connections; http-fetch-8: 8 parallel HTTP fetches; "
                   "produce-4m, produce-4m-4: 4 MB batches on 1 and 4 connections; multi-produce: MultiProduce of 8 "
                   "batches of 512 KiB; http-connections: twice --connections long polls at once over HTTP.")
@work_dir_option
@json_option
def bench_quotas(as_json: bool, work_dir: str | None, **kwargs: Any) -> None:
    """Byte-rate quotas under attack: what a principal gets, per attack, against the quota it meets (more
    connections, bigger fetches and batches, parallel HTTP requests, MultiProduce)."""
    from metaq.bench import quotas

    run_and_print(as_json, lambda report: quotas.run(report=report, work_dir=work_dir, **kwargs), quotas.table)


@click.command("security-paths")
@click.option("--requests", type=click.IntRange(1), default=2000, show_default=True,
              help="Requests of each kind per round and broker, one after the other.")
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True)
@work_dir_option
@json_option
def bench_security_paths(as_json: bool, requests: int, rounds: int, work_dir: str | None) -> None:
    """What the quota checks and the audit log add to a request (produce, fetch, a refused produce), beside a broker
    with neither, same run."""
    from metaq.bench import security_paths

    run_and_print(as_json, lambda report: security_paths.run(requests, rounds, report, work_dir),
                  security_paths.table)


@click.command("auth-timing")
@click.option("--rounds", type=click.IntRange(1), default=200, show_default=True)
@click.option("--iterations", type=click.IntRange(4096, 1_000_000), default=100_000, show_default=True,
              help="PBKDF2 iterations of the known user of the HTTP Basic logins.")
@work_dir_option
@json_option
def bench_auth_timing(as_json: bool, rounds: int, iterations: int, work_dir: str | None) -> None:
    """Whether a login's time or answer tells a user name exists: SCRAM and HTTP Basic logins of a known user beside
    an unknown one, and whether an unknown name's salt can be computed."""
    from metaq.bench import auth_timing

    run_and_print(as_json, lambda report: auth_timing.run(rounds, iterations, report, work_dir), auth_timing.table)


COMMANDS = [bench_storage, bench_partitions, bench_large, bench_backlog, bench_delay, bench_redrive, bench_dashboard,
            bench_limits, bench_decode, bench_quotas, bench_security_paths, bench_auth_timing]
