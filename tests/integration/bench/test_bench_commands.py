"""`metaq bench <what>`: every benchmark is a subcommand that answers --help, and a tiny run of each (bounded in
count and time) does what its figures rely on: every message it measured was sent, stored and read back, its
same-run baseline was measured beside it, and it stops what it started. The figures themselves are the
benchmark's business (docs/benchmarks.md), never asserted here."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cli_process import metaq

from metaq.testing import BrokerProcess

SUBCOMMANDS = {"produce", "consume", "e2e", "group", "rebalance", "cluster-refresh", "replication", "read-from",
               "storage", "partitions", "large", "backlog", "delay", "redrive", "dashboard", "limits", "decode",
               "quotas", "security-paths", "auth-timing", "peers", "http", "kafka", "kafka-convert", "logging",
               "spark", "connect", "startup", "goals"}
HISTORY = ("as before", "the old way", "round 1", "issue 13", "scripts/")
"""What a --help says is what the command does now; how it came to be is docs/benchmarks-history.md's."""


def bench_json(*args: str, timeout_s: float = 240) -> dict[str, Any]:
    done = metaq("bench", *args, "--json", timeout_s=timeout_s)
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    assert doc["command"].startswith(f"metaq bench {args[0]} ") and doc["machine"]["cpus"] > 0
    return doc


def test_every_bench_is_a_subcommand_with_a_help_of_what_it_does_now() -> None:
    listed = metaq("bench", "--help")
    assert listed.returncode == 0, listed.stderr
    commands = {line.split()[0] for line in listed.stdout.split("Commands:")[1].splitlines() if line.strip()}
    assert commands >= SUBCOMMANDS, SUBCOMMANDS - commands
    with ThreadPoolExecutor(4) as pool:
        helps = dict(zip(sorted(commands), pool.map(lambda c: metaq("bench", c, "--help"), sorted(commands)),
                         strict=True))
    for command, done in helps.items():
        assert done.returncode == 0 and done.stdout.startswith(f"Usage: metaq bench {command} "), (command, done)
        assert "--json" in done.stdout, command
        text = " ".join(done.stdout.split())
        assert not [word for word in HISTORY if word in text], (command, text)


def test_storage_measures_every_flush_mode_beside_the_raw_disk() -> None:
    doc = bench_json("storage", "--seconds", "0.1", "--max-batches", "50")
    modes = [row["mode"] for row in doc["results"]]
    assert any("group commit" in m for m in modes) and any("unflushThreshold=1 " in m for m in modes)
    assert any("raw disk" in m for m in modes)  # the baseline, same run
    for row in doc["results"]:
        assert "error" in row or row["mb_per_s"] > 0, row


def test_decode_measures_each_case_in_every_round() -> None:
    doc = bench_json("decode", "--batches", "2", "--per-batch", "50", "--reps", "3", "--rounds", "2")
    assert set(doc["msgs_per_cpu_s"]) == {"eager", "eager, keyed", "lazy", "lazy, keyed", "columns",
                                          "columns, keyed"}
    assert all(len(rates) == 2 and min(rates) > 0 for rates in doc["msgs_per_cpu_s"].values())


def test_kafka_convert_runs_the_compiled_conversions_beside_the_python_reference() -> None:
    pytest.importorskip("kafka")
    doc = bench_json("kafka-convert", "--messages", "20", "--repeat", "1")
    compiled = [run["compiled"] for run in doc["runs"]]
    assert compiled in ([True, False], [False])  # the reference always; the compiled code where it is built
    for run in doc["runs"]:
        assert set(run["us_per_message"]) == {"kafka_check", "to_metaq", "validate", "to_kafka"}


def test_partitions_produces_into_few_and_many_and_starts_again_after_a_kill(tmp_path: Path) -> None:
    doc = bench_json("partitions", "--small", "2", "--large", "40", "-n", "2000", "-d", "30", "--apis",
                     "batch,async-sticky", "--fill-bytes", "2e5", "--work-dir", str(tmp_path))
    rows = {(r["partitions"], r["api"]): r for r in doc["produce"]}
    assert set(rows) == {(p, api) for p in (2, 40) for api in ("batch", "async-sticky")}
    assert all(r["messages"] == 2000 and r["failures"] == 0 for r in rows.values())
    assert [r["case"] for r in doc["startup"]] == ["clean (after the fill)", "clean (after SIGTERM)", "after kill -9"]
    assert all(r["ready_s"] > 0 and r["fds"] > 0 for r in doc["startup"])
    assert list(tmp_path.iterdir()) == []  # its data directories are gone with it


def test_large_reads_every_message_and_sends_the_same_files_raw(tmp_path: Path) -> None:
    doc = bench_json("large", "-n", "10", "--size", "100000", "--loops", "uvloop", "-d", "60", "--work-dir",
                     str(tmp_path))
    (run,) = doc["runs"]
    assert run["messages"] >= 10 and run["consume_mb_s"] > 0  # every message (and the preload's warm-up one)
    assert run["sendfile_mb_s"] > 0 and run["pread_mb_s"] > 0 and run["raw_mb_s"] > 0  # the same-run baselines


def test_backlog_reads_the_whole_backlog_off_the_disk_and_produces_beside_each_reader(tmp_path: Path) -> None:
    doc = bench_json("backlog", "--gb", "0.005", "--produce-seconds", "0.5", "-d", "60", "--work-dir", str(tmp_path))
    assert doc["consume"]["messages"] == doc["messages"] > 0  # every message of the backlog read back
    assert doc["disk_mb_s"] > 0 and doc["disk_side_by_side_mb_s"] > 0
    assert doc["raw_fetch"]["bytes"] == doc["raw_fetch_cached"]["bytes"] > 0
    produce = doc["produce"]
    assert list(produce) == ["alone", "a consumer, backlog off the page cache",
                             "a raw fetch, backlog off the page cache", "a raw fetch, backlog in the page cache"]
    assert all(r["msgs_per_s"] > 0 for r in produce.values())


def test_delay_delivers_every_pending_message_and_none_early(tmp_path: Path) -> None:
    doc = bench_json("delay", "--sends", "300", "--pending", "1000", "--window", "2", "--lead", "4",
                     "--work-dir", str(tmp_path))
    assert doc["delivered_read_back"] == 1000 and doc["early"] == 0
    assert len(doc["throughput_msg_s"]["plain"]) == len(doc["throughput_msg_s"]["delayed"]) == 2
    assert "warning" not in doc, doc["warning"]  # every message was sent before the first was due


def test_redrive_sends_every_dead_letter_back_beside_its_dry_run(tmp_path: Path) -> None:
    doc = bench_json("redrive", "-n", "200", "--rounds", "1", "--work-dir", str(tmp_path))
    (run,) = doc["runs"]  # the bench checks both commands counted all 200
    assert run["dry_run_msgs_per_s"] > 0 and run["redrive_msgs_per_s"] > 0


def test_dashboard_measures_each_case_while_its_http_side_is_polled(tmp_path: Path) -> None:
    doc = bench_json("dashboard", "--rounds", "1", "-n", "20000", "-d", "5", "--scrape-interval", "0.2",
                     "--topics", "1", "--partitions", "3", "--requests", "2", "--work-dir", str(tmp_path))
    runs = {r["case"]: r for r in doc["runs"]}
    assert set(runs) == {"no-port", "scraped", "page-open"}
    assert all(r["messages"] == 20000 for r in runs.values())
    for case in ("scraped", "page-open"):
        assert runs[case]["requests"] > 0 and runs[case]["request_errors"] == 0, runs[case]
    assert doc["api_state"]["partitions"] == 3 and doc["api_state"]["bytes"] > 0


def test_limits_a_broker_under_both_attacks_keeps_serving_others(tmp_path: Path) -> None:
    doc = bench_json("limits", "--frames", "2", "--frame-mib", "2", "--lockout-cap-s", "20", "--work-dir",
                     str(tmp_path))
    assert doc["partial_frames"]["produce_after_ok"]  # a normal produce served beside the unfinished frames
    polls = doc["abandoned_long_polls"]
    assert isinstance(polls["lockout_after_close_s"], float)  # served again once the attackers closed


def test_quotas_runs_each_attack_asked_for_against_its_quota(tmp_path: Path) -> None:
    doc = bench_json("quotas", "--seconds", "0.5", "--fetch-quota", "1000000", "--produce-quota", "4000000",
                     "--connections", "5", "--fill-mb", "2", "--attacks", "fetch-5,produce-4m,http-connections",
                     "--work-dir", str(tmp_path))
    rows = {r["attack"]: r for r in doc["attacks"]}
    assert list(rows) == ["fetch-5", "produce-4m"]  # in the order asked, and only those
    assert rows["fetch-5"]["quota_bytes_per_s"] == 1_000_000 and rows["produce-4m"]["quota_bytes_per_s"] == 4_000_000
    assert all(r["bytes_per_s"] > 0 for r in rows.values())  # each attack was served (its rate is the figure)
    held = doc["http_connections"]
    assert held["parallel"] == 10 and held["served"] + held["refused"] == 10
    assert list(tmp_path.iterdir()) == []


def test_security_paths_times_each_kind_of_request_on_each_broker(tmp_path: Path) -> None:
    doc = bench_json("security-paths", "--requests", "20", "--rounds", "2", "--work-dir", str(tmp_path))
    us = doc["us_per_request"]
    assert list(us) == ["off", "quotas", "audit"]  # the baseline beside both, same run
    assert all(len(us[b][kind]) == 2 and min(us[b][kind]) > 0 for b in us for kind in ("produce", "fetch", "refused"))


def test_auth_timing_logs_in_as_known_and_unknown_users_every_round(tmp_path: Path) -> None:
    doc = bench_json("auth-timing", "--rounds", "4", "--iterations", "4096", "--work-dir", str(tmp_path))
    assert set(doc["ms"]) == {"sasl known", "sasl unknown", "basic known (big)", "basic unknown"}
    assert all(0 < row["p10"] <= row["median"] <= row["p90"] for row in doc["ms"].values())
    assert 0 <= doc["unknown_salts_computable"] <= 4


def test_startup_runs_each_command_to_its_end_beside_a_baseline(tmp_path: Path) -> None:
    src = str(Path(__file__).resolve().parents[3] / "src")
    doc = bench_json("startup", "--runs", "1", "--baseline", src, "--work-dir", str(tmp_path))
    rows = doc["cases"]
    assert [(r["command"].split(" (")[0], r["code"]) for r in rows][:4] == [
        ("metaq --version", "this"), ("metaq --version", "baseline"), ("metaq --help", "this"),
        ("metaq --help", "baseline")]
    assert len(rows) == 12 and all(len(r["wall_ms"]) == 1 and r["wall_best_ms"] > 0 for r in rows)


def test_goals_runs_each_goal_once_a_round_and_keeps_every_result() -> None:
    doc = bench_json("goals", "--rounds", "2", "--only", "batch,send_async", "--scale", "0.01", timeout_s=600)
    assert doc["trees"] == ["this tree"] and doc["peers"] == {}
    for goal, messages in (("batch", 30_000), ("send_async", 10_000)):  # the counts scaled by 0.01
        runs = doc["runs"]["this tree"][goal]
        assert len(runs) == 2
        assert all(r["messages"] == messages and r["failures"] == 0 and r["msgs_per_s"] > 0 for r in runs), runs


def test_goals_refuses_an_unknown_goal_naming_the_known_ones() -> None:
    done = metaq("bench", "goals", "--only", "send_sync")
    assert done.returncode == 2  # a usage error, before anything runs
    assert "send_sync" in done.stderr and all(g in done.stderr for g in ("batch", "send_async", "e2e_sync"))


def test_group_delivers_every_message_to_the_group() -> None:
    doc = bench_json("group", "--members", "1", "-n", "2000", "--partitions", "2", "--fetch", "both", "-d", "60")
    assert [(r["members"], r["fetch"]) for r in doc["runs"]] == [(1, "single"), (1, "multi")]
    assert all(r["delivered"] >= r["messages"] == 2000 for r in doc["runs"])


def test_connect_opens_plaintext_tls_and_scram_connections(broker_factory: Callable[..., BrokerProcess],
                                                           tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    from metaq.testing.certs import make_pki

    pki = make_pki(tmp_path / "pki")
    added = metaq("acl", "user", "add", "bench", "--data-path", str(tmp_path / "broker"),
                  env={**os.environ, "METAQ_PASSWORD": "bench secret"})
    assert added.returncode == 0, added.stderr
    broker = broker_factory({"sslPort": 0, "sslCertFile": str(pki.server_cert), "sslKeyFile": str(pki.server_key)})
    done = metaq("bench", "connect", broker.servers, f"127.0.0.1:{broker.tls_port}", "--ca-file", str(pki.ca),
                 "--user", "bench", "-n", "5", "--json", env={**os.environ, "METAQ_PASSWORD": "bench secret"})
    assert done.returncode == 0, done.stderr
    kinds = json.loads(done.stdout)["connect_ms"]
    assert list(kinds) == ["plaintext", "TLS", "TLS + SCRAM-SHA-256"]  # each opened (and authenticated) 5 times
    assert all(k["p50"] > 0 for k in kinds.values())


@pytest.mark.slow  # a ZooKeeper and three clusters
def test_replication_keeps_the_slave_identical_to_its_master(tmp_path: Path) -> None:
    doc = bench_json("replication", "--series", "1", "-n", "20000", "-d", "30", "--work-dir", str(tmp_path),
                     timeout_s=600)
    runs = {r["mode"]: r for r in doc["runs"]}
    assert set(runs) == {"none", "async", "sync"}
    assert all(r["messages"] == 20000 and r["failures"] == 0 for r in runs.values())
    assert runs["async"]["identical_end_offsets"] and runs["sync"]["identical_end_offsets"]


@pytest.mark.slow  # a ZooKeeper, a master and its slave
def test_read_from_reads_both_replicas_and_a_dead_slave_loses_nothing(tmp_path: Path) -> None:
    doc = bench_json("read-from", "--series", "2", "-n", "20000", "--work-dir", str(tmp_path), timeout_s=600)
    assert sorted(r["read_from"] for r in doc["reads"]) == ["master", "master", "slave", "slave"]
    assert all(r["messages"] == 20000 for r in doc["reads"])
    killed = doc["slave_killed"]
    assert killed["exactly_once_in_order"] and killed["received"] == killed["sent"] > 0


@pytest.mark.slow
@pytest.mark.spark
def test_spark_reads_and_writes_every_row() -> None:
    pytest.importorskip("pyspark")
    doc = bench_json("spark", "--rows", "2000", "--repeat", "1", "--cases", "batch-read,copy-exactly-once",
                     timeout_s=600)
    assert [r["what"].split()[0] for r in doc["runs"]] == ["batch", "stream"]  # the copy checks every row arrived
    assert all(r["rows_per_s_median"] > 0 for r in doc["runs"])
