"""The broker's configuration: MetaQ's server.ini, read strictly, with errors that say file:line: key."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from metaq.broker.cli_options import click_options, overrides_from_click
from metaq.broker.config import BrokerConfig, TopicConfig, ZkConfig, diff_topics, restart_required
from metaq.broker.cron import next_run_ms, quartz_to_croniter
from metaq.broker.ini import load_config, parse_config
from metaq.broker.options import OPTIONS, STAT_IGNORED, DeletePolicy, options_markdown_rows, parse_delete_policy
from metaq.errors import ConfigError, InvalidArgument

REPO = Path(__file__).resolve().parents[3]

# MetaQ's sample server.ini as the seed documentation shows it. The seed abbreviates the topic
# sections' bodies as "省略..." ("omitted"); they are left empty here.
METAQ_SAMPLE = """\
[system]
brokerId=0
numPartitions=1
serverPort=8123
unflushThreshold=0
unflushInterval=10000
maxSegmentSize=1073741824
maxTransferSize=1048576
deletePolicy=delete,168
deleteWhen=0 0 6,18 * * ?
flushTxLogAtCommit=1
stat=true

;; Update consumers offsets to current max offsets when consumers offsets are out of range of current broker's messages.
;; It must be false in production.But recommend to be true in development or test.
updateConsumerOffsets=true

[zookeeper]
zk.zkConnect=localhost:2181
zk.zkSessionTimeoutMs=30000
zk.zkConnectionTimeoutMs=30000
zk.zkSyncTimeMs=5000

;; Topics section
[topic=test]

[topic=meta-test]
"""


def ms(year: int, month: int, day: int, hour: int, minute: int, tz: tzinfo = UTC) -> int:
    return int(datetime(year, month, day, hour, minute, tzinfo=tz).timestamp() * 1000)


def refused(text: str, source: str = "server.ini") -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source)
    return str(info.value)


# -- defaults ---------------------------------------------------------------------------------------


def test_defaults_are_metaqs() -> None:
    c = parse_config("")
    assert c.broker_id == 0
    assert c.data_path == Path.home() / "meta"
    assert c.server_port == 8123
    assert c.num_partitions == 1
    assert c.unflush_threshold == 1000
    assert c.unflush_interval_ms == 10000
    assert c.max_segment_bytes == 1024**3
    assert c.max_transfer_bytes == 1024**2
    assert c.delete_policy == "delete,168"
    assert c.delete_when == "0 0 6,18 * * ?"
    assert (c.accept_publish, c.accept_subscribe) == (True, True)
    assert (c.stat, c.update_consumer_offsets, c.load_message_stores_in_parallel) == (False, False, False)
    assert c.topics == {} and c.zookeeper is None and c.warnings == ()


def test_metaq_extension_defaults_and_loopback_host() -> None:
    c = parse_config("")
    assert c.host_name == "127.0.0.1"
    assert c.max_message_bytes == 1024**2
    assert c.max_batch_bytes == 16 * 1024**2
    assert c.auto_create_topics is True
    assert c.max_connections == 10000 and c.max_waiting_fetches == 10000
    assert c.max_frame_bytes >= c.max_batch_bytes + 64 * 1024


def test_every_settable_system_option_is_a_broker_config_field() -> None:
    fields = {f.name for f in dataclasses.fields(BrokerConfig)}
    system = {o.attr for o in OPTIONS if "system" in o.sections and o.status != "ignored"}
    assert system == fields - {"topics", "zookeeper", "source_path", "warnings"}
    topic_attrs = {o.attr for o in OPTIONS if "topic" in o.sections}
    assert topic_attrs == {f.name for f in dataclasses.fields(TopicConfig)} - {"name"}
    zk_attrs = {o.attr for o in OPTIONS if "zookeeper" in o.sections}
    assert zk_attrs == {f.name for f in dataclasses.fields(ZkConfig)}


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        parse_config("").server_port = 1  # type: ignore[misc]


# -- MetaQ's own sample -----------------------------------------------------------------------------


def test_metaq_sample_server_ini_parses() -> None:
    c = parse_config(METAQ_SAMPLE, "server.ini")
    assert c.unflush_threshold == 0
    assert c.max_segment_bytes == 1073741824
    assert c.stat is True and c.update_consumer_offsets is True
    assert c.zookeeper == ZkConfig(connect="localhost:2181")
    assert set(c.topics) == {"test", "meta-test"}
    assert c.topic_settings("test").unflush_threshold == 0
    # flushTxLogAtCommit is MetaQ's transaction log knob, and metaq's (docs/transactions.md): no warning.
    # stat is accepted, and the operator told that it changes nothing (metaq's statistics are always on)
    assert c.warnings == ("server.ini:12: stat: MetaQ option accepted but without effect: metaq keeps real-time "
                          "statistics for every topic whatever stat says (metaq stats, /metrics)",)
    assert c.flush_tx_log_at_commit == 1


def test_every_ignored_metaq_key_is_accepted_with_a_warning() -> None:
    ignored = {"quartzThreadCount": "5", "getProcessThreadCount": "80", "putProcessThreadCount": "80"}
    text = "[system]\n" + "".join(f"{k}={v}\n" for k, v in ignored.items())
    c = parse_config(text, "s.ini")
    assert [w.split(":")[2].strip() for w in c.warnings] == list(ignored)
    assert c == parse_config("")


def test_max_open_files_is_auto_unless_set_to_a_number() -> None:
    """auto (the default; 0 in the config): the budget follows the open-files limit at start."""
    assert parse_config("").max_open_files == 0
    assert parse_config("[system]\nmaxOpenFiles=auto\n").max_open_files == 0
    assert parse_config("[system]\nmaxOpenFiles=AUTO\n").max_open_files == 0
    assert parse_config("[system]\nmaxOpenFiles=16384\n").max_open_files == 16384
    assert refused("[system]\nmaxOpenFiles=8\n") == (
        "server.ini:2: maxOpenFiles: 8 is out of range; it must be between 16 and 1000000, or auto")
    assert "or auto" in refused("[system]\nmaxOpenFiles=many\n")


def test_dashboard_http_port_is_off_unless_set() -> None:
    assert parse_config("").dashboard_http_port is None  # not MetaQ's 8120: brokers on one host would collide
    assert parse_config("[system]\ndashboardHttpPort=8120\n").dashboard_http_port == 8120
    c = parse_config("[system]\ndashboardHttpPort=0\n")
    assert c.dashboard_http_port == 0 and c.warnings == ()
    assert refused("[system]\ndashboardHttpPort=70000\n") == (
        "server.ini:2: dashboardHttpPort: 70000 is out of range; it must be between 0 and 65535")


def test_ignored_keys_are_still_checked() -> None:
    assert refused("[system]\nquartzThreadCount=0\n").startswith("server.ini:2: quartzThreadCount: ")


def test_transaction_keys_are_real_options() -> None:
    c = parse_config("[system]\nflushTxLogAtCommit=2\nmaxCheckpoints=5\ncheckpointInterval=1000\n"
                     "maxTxTimeoutTimerCapacity=10\nmaxTxTimeoutInSeconds=30\ndataLogPath=/var/meta-tx\n")
    assert (c.flush_tx_log_at_commit, c.max_checkpoints, c.checkpoint_interval_ms, c.max_tx_timeout_timer_capacity,
            c.max_tx_timeout_s, str(c.tx_log_dir)) == (2, 5, 1000, 10, 30, "/var/meta-tx")
    assert c.warnings == ()
    assert refused("[system]\nflushTxLogAtCommit=7\n") == (
        "server.ini:2: flushTxLogAtCommit: 7 is out of range; it must be between 0 and 2")


def test_comments_blank_lines_whitespace_crlf_and_bom() -> None:
    text = "\ufeff; comment\r\n# another\r\n\r\n  [ system ]  \r\n  serverPort =  9000  \r\n"
    assert parse_config(text).server_port == 9000


def test_booleans() -> None:
    for text, value in [("true", True), ("YES", True), ("1", True), ("false", False), ("No", False), ("0", False)]:
        assert parse_config(f"[system]\nstat={text}\n").stat is value


def test_unflush_threshold_may_be_zero_or_negative_for_group_commit() -> None:
    assert parse_config("[system]\nunflushThreshold=-1\n").unflush_threshold == -1
    assert parse_config("[system]\nunflushThreshold=0\n").unflush_threshold == 0


# -- sizes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1024*1024", 1024 * 1024),
        ("1024 * 1024 * 1024", 1024**3),
        ("1g", 1024**3),
        ("64K", 64 * 1024),
        ("512m", 512 * 1024**2),
        ("2*512m", 1024**3),
        ("4096", 4096),
    ],
)
def test_sizes(text: str, value: int) -> None:
    assert parse_config(f"[system]\nmaxSegmentSize={text}\n").max_segment_bytes == value


@pytest.mark.parametrize("text", ["1024**2", "abc", "-1", "1.5g", "1t", "0x10", "1024*", "(1024)", "1e6"])
def test_bad_sizes_are_refused(text: str) -> None:
    message = refused(f"[system]\nmaxSegmentSize={text}\n")
    assert message.startswith("server.ini:2: maxSegmentSize: ")


def test_size_bounds() -> None:
    assert "out of range" in refused("[system]\nmaxSegmentSize=0\n")
    assert "out of range" in refused("[system]\nmaxSegmentSize=2g\n")  # MetaQ's Java int
    assert "empty value" in refused("[system]\nmaxSegmentSize=\n")


# -- errors: file:line: key: problem, and did you mean ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[system]\nunflushTreshold=1\n",
         "server.ini:2: unflushTreshold: unknown key in [system]; did you mean 'unflushThreshold'?"),
        ("[system]\nserverport=1\n", "server.ini:2: serverport: unknown key in [system]; did you mean 'serverPort'?"),
        ("[systen]\n", "server.ini:1: [systen]: unknown section (known: [system], [zookeeper], [topic=NAME]); "
                       "did you mean '[system]'?"),
        ("[zookeper]\n", "did you mean '[zookeeper]'?"),
        ("[topic:orders]\n", "did you mean '[topic=orders]'?"),
        ("[topics=orders]\n", "did you mean '[topic=orders]'?"),
        ("[topic=x]\nnumPartition=2\n", "server.ini:2: numPartition: unknown key in [topic=x]; "
                                        "did you mean 'numPartitions'?"),
        ("[topic=x]\ngruop.billing=a:b\n", "server.ini:2: gruop.billing: unknown key in [topic=x]; "
                                           "did you mean 'group.billing'?"),
        ("[zookeeper]\nzkConnect=localhost:2181\n", "server.ini:2: zkConnect: unknown key in [zookeeper]; "
                                                    "did you mean 'zk.zkConnect'?"),
        ("[system]\nserverPort=1\nserverPort=2\n", "server.ini:3: serverPort: set twice in [system] (first at line 2)"),
        ("[topic=x]\n[topic=x]\n", "server.ini:2: [topic=x]: section appears twice (first at line 1)"),
        ("[system]\n[system]\n", "server.ini:2: [system]: section appears twice (first at line 1)"),
        ("[topic=x]\nserverPort=1\n", "server.ini:2: serverPort: is a [system] option and cannot be set in [topic=x]"),
        ("[system]\nzk.zkConnect=h:1\n", "server.ini:2: zk.zkConnect: is a [zookeeper] option"),
        ("[system]\ngroup.a=m:f\n", "server.ini:2: group.a: consumer group filters belong in a [topic=NAME] section"),
        ("serverPort=1\n", "server.ini:1: serverPort: key outside any section"),
        ("[system]\njunk\n", "server.ini:2: junk: expected key=value"),
        ("[system\n", "server.ini:1: [system: section header without a closing ']'"),
        ("[zookeeper ; no bracket\n", "server.ini:1: [zookeeper: section header without a closing ']'"),
        ("[system]\nbrokerId=1025\n", "server.ini:2: brokerId: 1025 is out of range; it must be between 0 and 1024"),
        ("[system]\nbrokerId=-1\n", "server.ini:2: brokerId: -1 is out of range"),
        ("[system]\nserverPort=70000\n", "server.ini:2: serverPort: 70000 is out of range"),
        ("[system]\nunflushInterval=0\n", "server.ini:2: unflushInterval: 0 is out of range"),
        ("[system]\nnumPartitions=0\n", "server.ini:2: numPartitions: 0 is out of range"),
        ("[system]\nacceptPublish=maybe\n", "server.ini:2: acceptPublish: 'maybe' is not a boolean"),
        ("[system]\nhostName=a b\n", "server.ini:2: hostName: 'a b' is not an IP address or host name"),
        ("[system]\nserverPort=8123;main port\n", "server.ini:2: serverPort: '8123;main port' is not an integer; "
         "write digits, optionally a product such as 60*60*1000 (in server.ini a comment starts with ; or # after "
         "a space)"),
        ("[system] zookeeper\n", "server.ini:1: [system] zookeeper: found 'zookeeper' after the section header "
                                 "[system]; expected the end of the line or a comment"),
        ("[system]\ndataPath=\n", "server.ini:2: dataPath: empty value"),
        ("[topic=x]\ngroup.a=not-a-callable\n", "server.ini:2: group.a: 'not-a-callable' is not module:callable"),
        ("[topic=x]\ngroup.a=m:\n", "server.ini:2: group.a: 'm:' is not module:callable"),
        ("[topic=x]\ngroup.a/b=m:f\n", "server.ini:2: group.a/b: consumer group name 'a/b'"),
        ("[topic=x]\ngroup.a=m:f\ngroup.a=m:g\n", "server.ini:3: group.a: set twice in [topic=x] (first at line 2)"),
        ("[zookeeper]\nzk.zkSyncTimeMs=5000\n", "server.ini:1: zk.zkConnect: required in [zookeeper]"),
        ("[zookeeper]\nzk.zkConnect=localhost:99999\n", "server.ini:2: zk.zkConnect: port 99999 is outside 1..65535"),
        ("[zookeeper]\nzk.zkConnect=a:1\nzk.zkRoot=meta\n", "server.ini:3: zk.zkRoot: 'meta' must be an absolute"),
        ("[system]\nmaxMessageSize=32m\n", "server.ini:2: maxMessageSize: maxMessageSize (33554432) is larger than "
                                           "maxBatchSize (16777216)"),
        ("[system]\nmaxFrameSize=16m\n", "server.ini:2: maxFrameSize: maxFrameSize (16777216) must be at least "
                                         "maxBatchSize + 64k"),
    ],
)
def test_bad_input_names_file_line_and_key(text: str, expected: str) -> None:
    message = refused(text)
    assert expected in message
    assert re.match(r"server\.ini:\d+: ", message)


def test_cross_check_names_the_later_of_the_two_keys() -> None:
    message = refused("[system]\nmaxBatchSize=1m\nmaxMessageSize=2m\n")
    assert message.startswith("server.ini:3: maxMessageSize: ")
    message = refused("[system]\nmaxMessageSize=2m\nmaxBatchSize=1m\n")
    assert message.startswith("server.ini:3: maxBatchSize: ")


def test_transfer_size_below_message_size_is_a_warning_like_metaq_documents() -> None:
    c = parse_config("[system]\nmaxTransferSize=1k\n", "s.ini")
    assert len(c.warnings) == 1 and c.warnings[0].startswith("s.ini:2: maxTransferSize: ")


@pytest.mark.parametrize(
    ("name", "problem"),
    [("../x", "contains '/'"), ("a\x00b", "contains '\\x00'"), ("x" * 300, "300 characters"), ("", "empty"),
     ("..", "not allowed")],
)
def test_bad_topic_names_are_refused(name: str, problem: str) -> None:
    message = refused(f"[system]\nstat=true\n[topic={name}]\nstat=false\n")
    assert message.startswith("server.ini:3: [topic=")
    assert problem in message
    assert "\x00" not in message and len(message) < 300


def test_topic_settings_refuses_bad_names_at_runtime() -> None:
    with pytest.raises(InvalidArgument):
        parse_config("").topic_settings("../etc")


# -- topics -----------------------------------------------------------------------------------------


TOPICS = """\
[system]
numPartitions=2
unflushThreshold=100
deletePolicy=delete,48

[topic=orders]
numPartitions=8
unflushThreshold=1
acceptSubscribe=false
deleteWhen=0 30 2 * * ?
group.billing=myapp.filters:only_paid
group.audit = myapp.filters : Everything.check

[topic = logs]
deletePolicy=archive,12h,true
stat=yes
"""


def test_topic_sections_store_only_their_overrides() -> None:
    c = parse_config(TOPICS)
    orders = c.topics["orders"]
    assert orders.num_partitions == 8 and orders.unflush_threshold == 1
    assert orders.unflush_interval_ms is None and orders.delete_policy is None
    assert orders.group_filters == {"billing": "myapp.filters:only_paid", "audit": "myapp.filters:Everything.check"}
    assert c.topics["logs"] == TopicConfig(name="logs", delete_policy="archive,12h,true", stat=True)
    assert c.warnings == (f"<string>:{TOPICS.splitlines().index('stat=yes') + 1}: stat: {STAT_IGNORED}",)


def test_effective_topic_settings() -> None:
    c = parse_config(TOPICS)
    orders = c.topic_settings("orders")
    assert orders.configured is True
    assert (orders.num_partitions, orders.unflush_threshold, orders.unflush_interval_ms) == (8, 1, 10000)
    assert (orders.accept_publish, orders.accept_subscribe) == (True, False)
    assert orders.delete_policy == "delete,48" and orders.delete_when == "0 30 2 * * ?"
    assert orders.group_filters["billing"] == "myapp.filters:only_paid"
    logs = c.topic_settings("logs")
    assert logs.retention == DeletePolicy("archive", 12 * 3_600_000, compress=True)
    assert logs.stat is True and logs.num_partitions == 2
    dynamic = c.topic_settings("never-configured")
    assert dynamic.configured is False
    assert (dynamic.num_partitions, dynamic.unflush_threshold, dynamic.delete_policy) == (2, 100, "delete,48")
    assert dynamic.group_filters == {}


def test_topic_values_are_checked_like_system_values() -> None:
    assert refused("[topic=x]\nunflushInterval=-5\n").startswith("server.ini:2: unflushInterval: ")
    assert refused("[topic=x]\ndeletePolicy=delete\n").startswith("server.ini:2: deletePolicy: ")


# -- deletePolicy -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("delete,168", DeletePolicy("delete", 168 * 3_600_000)),
        ("delete,10s", DeletePolicy("delete", 10_000)),
        ("delete,10m", DeletePolicy("delete", 600_000)),
        ("delete, 10h", DeletePolicy("delete", 36_000_000)),
        ("archive,24", DeletePolicy("archive", 24 * 3_600_000)),
        ("archive,24,true", DeletePolicy("archive", 24 * 3_600_000, compress=True)),
        ("archive,24,false", DeletePolicy("archive", 24 * 3_600_000)),
    ],
)
def test_delete_policy_good(text: str, policy: DeletePolicy) -> None:
    assert parse_delete_policy(text) == policy
    assert parse_config(f"[system]\ndeletePolicy={text}\n").delete_policy == text.replace(" ", "")


@pytest.mark.parametrize(
    "text",
    ["", "delete", "delete,", "delete,abc", "delete,0", "delete,-1", "delete,10d", "delete,1.5",
     "delete,168,true", "archive,24,maybe", "archive,24,true,x", "remove,168", "168,archive,true"],
)
def test_delete_policy_bad(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^deletePolicy: "):
        parse_delete_policy(text)
    assert refused(f"[system]\ndeletePolicy={text}\n").startswith("server.ini:2: deletePolicy: ")


# -- deleteWhen -------------------------------------------------------------------------------------


def test_quartz_default_converted_for_croniter() -> None:
    assert quartz_to_croniter("0 0 6,18 * * ?") == "0 6,18 * * * 0"
    assert quartz_to_croniter("30 15 10 ? * MON-FRI 2027") == "15 10 * * MON-FRI 30 2027"


def test_quartz_days_of_week_count_from_sunday_as_one() -> None:
    assert quartz_to_croniter("0 0 12 ? * 2") == "0 12 * * 1 0"  # Quartz 2 = Monday
    assert quartz_to_croniter("0 0 12 ? * 2-6/2,1") == "0 12 * * 1-5/2,0 0"
    assert quartz_to_croniter("0 0 12 ? * 6#3") == "0 12 * * 5#3 0"  # third Friday
    assert quartz_to_croniter("0 0 12 ? * 6L") == "0 12 * * L5 0"  # last Friday


def test_next_run_of_metaqs_default_schedule() -> None:
    expr = "0 0 6,18 * * ?"
    assert next_run_ms(expr, ms(2026, 11, 22, 5, 0), UTC) == ms(2026, 11, 22, 6, 0)
    assert next_run_ms(expr, ms(2026, 11, 22, 7, 0), UTC) == ms(2026, 11, 22, 18, 0)
    # strictly after: a run exactly at 06:00 is followed by 18:00, one millisecond before still hits 06:00
    assert next_run_ms(expr, ms(2026, 11, 22, 6, 0), UTC) == ms(2026, 11, 22, 18, 0)
    assert next_run_ms(expr, ms(2026, 11, 22, 6, 0) - 1, UTC) == ms(2026, 11, 22, 6, 0)
    assert next_run_ms(expr, ms(2026, 11, 22, 18, 0), UTC) == ms(2026, 11, 23, 6, 0)


def test_next_run_with_quartz_days_seconds_and_zones() -> None:
    sunday = ms(2026, 11, 22, 0, 0)
    assert next_run_ms("0 0 12 ? * 2", sunday, UTC) == ms(2026, 11, 23, 12, 0)
    assert next_run_ms("0 0 12 ? * MON", sunday, UTC) == ms(2026, 11, 23, 12, 0)
    assert next_run_ms("0 15 10 ? * 6L", sunday, UTC) == ms(2026, 11, 27, 10, 15)
    assert next_run_ms("0/15 * * * * ?", sunday + 1, UTC) == sunday + 15_000
    shanghai = pytest.importorskip("zoneinfo").ZoneInfo("Asia/Shanghai")
    assert next_run_ms("0 0 6,18 * * ?", ms(2026, 11, 22, 5, 0, tz=shanghai), shanghai) == ms(
        2026, 11, 22, 6, 0, tz=shanghai
    )


def test_next_run_defaults_to_local_time() -> None:
    after = ms(2026, 11, 22, 7, 0)
    local = datetime.fromtimestamp(next_run_ms("0 0 6,18 * * ?", after) / 1000)
    assert (local.hour, local.minute, local.second) in ((6, 0, 0), (18, 0, 0))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("0 0 6 * *", "has 5 fields"),
        ("0 0 6 1 * MON", "restricts both day-of-month and day-of-week"),
        ("0 0 6 ? * 8", "day of week 8"),
        ("0 0 6 ? * 0", "day of week 0"),
        ("0 0 ? * * *", "'?' is only allowed"),
        ("0 0 25 * * ?", "not a usable Quartz cron expression"),
        ("0 0 0 31 2 ?", "not a usable Quartz cron expression"),
        ("every day", "has 2 fields"),
    ],
)
def test_bad_delete_when(text: str, problem: str) -> None:
    message = refused(f"[system]\ndeleteWhen={text}\n")
    assert message.startswith("server.ini:2: deleteWhen: ")
    assert problem in message
    with pytest.raises(ConfigError):
        next_run_ms(text, 0, UTC)


# -- overrides (CLI flags) --------------------------------------------------------------------------


def test_with_overrides_applies_and_validates() -> None:
    base = parse_config(TOPICS)
    c = base.with_overrides({"serverPort": "0", "maxSegmentSize": "64m", "stat": "true", "dataPath": "~/x"})
    assert [w for w in c.warnings if w.startswith("--stat: ")] == [f"--stat: {STAT_IGNORED}"]
    assert (c.server_port, c.max_segment_bytes, c.stat) == (0, 64 * 1024**2, True)
    assert c.data_path == Path.home() / "x"
    assert c.topics == base.topics
    assert c.topic_settings("never-configured").stat is True
    assert base.server_port == 8123  # the original is untouched


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"unflushThreshold": "many"}, "--unflushThreshold: 'many' is not an integer"),
        ({"unflushTreshold": "1"}, "--unflushTreshold: unknown option; did you mean '--unflushThreshold'?"),
        ({"server-port": "1"}, "--server-port: unknown option; did you mean '--serverPort'?"),
        ({"maxMessageSize": "32m"}, "--maxMessageSize: maxMessageSize (33554432) is larger than maxBatchSize"),
        ({"flushTxLogAtCommit": "7"}, "--flushTxLogAtCommit: 7 is out of range"),
        ({"zk.zkConnect": "h:1"}, "--zk.zkConnect: unknown option"),
    ],
)
def test_with_overrides_errors_name_the_flag(overrides: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("").with_overrides(overrides)
    assert str(info.value).startswith(expected)


def test_overriding_transfer_size_recomputes_its_warning() -> None:
    c = parse_config("[system]\nmaxTransferSize=1k\nquartzThreadCount=1\n", "s.ini")
    assert len(c.warnings) == 2
    fixed = c.with_overrides({"maxTransferSize": "4m"})
    assert len(fixed.warnings) == 1 and "quartzThreadCount" in fixed.warnings[0]
    again = fixed.with_overrides({"maxTransferSize": "2k"})
    assert again.warnings[-1].startswith("--maxTransferSize: ")


def _command() -> click.Command:
    @click.command()
    @click.option("-f", "--config", "config_file", default=None)
    @click_options()
    def cmd(config_file: str | None, **flags: Any) -> None:
        base = parse_config("[system]\nserverPort=9000\n", "s.ini")
        config = base.with_overrides(overrides_from_click(flags))
        click.echo(repr(overrides_from_click(flags)))
        click.echo(f"{config.server_port} {config.stat} {config.max_segment_bytes} {config.data_path}")

    return cmd


def test_click_flags_override_only_what_is_given() -> None:
    runner = CliRunner()
    result = runner.invoke(_command(), [])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["{}", f"9000 False {1024**3} {Path.home() / 'meta'}"]
    result = runner.invoke(_command(), ["--serverPort", "1", "--stat", "yes", "--max-segment-size", "1m"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == "{'serverPort': '1', 'maxSegmentSize': '1m', 'stat': 'yes'}"
    assert result.output.splitlines()[1].startswith(f"1 True {1024**2} ")


def test_click_flags_are_checked_by_click() -> None:
    result = CliRunner().invoke(_command(), ["--unflushInterval", "0"])
    assert result.exit_code == 2
    assert "--unflushInterval" in result.output and "out of range" in result.output


def test_click_flags_cover_every_settable_system_option_and_no_ignored_one() -> None:
    params = {p.name: p for p in _command().params if isinstance(p, click.Option)}
    for opt in OPTIONS:
        settable = "system" in opt.sections and opt.status != "ignored"
        assert (opt.attr in params) is settable, opt.key
        if settable:
            assert f"--{opt.key}" in params[opt.attr].opts
            assert params[opt.attr].default is None
    assert "--load-message-stores-in-parallel" in params["load_message_stores_in_parallel"].opts


# -- reload -----------------------------------------------------------------------------------------


def test_diff_topics() -> None:
    old = parse_config(TOPICS)
    assert not diff_topics(old, parse_config(TOPICS))
    new = parse_config(
        TOPICS.replace("numPartitions=8", "numPartitions=16").replace("[topic = logs]", "[topic=metrics]")
    )
    diff = diff_topics(old, new)
    assert (diff.added, diff.removed, diff.changed) == ({"metrics"}, {"logs"}, {"orders"})
    assert diff.topics == {"metrics", "logs", "orders"}
    assert diff.defaults_changed is False and diff


def test_diff_topics_sees_inherited_changes_and_filters() -> None:
    old = parse_config(TOPICS)
    inherited = parse_config(TOPICS.replace("deletePolicy=delete,48", "deletePolicy=delete,24"))
    diff = diff_topics(old, inherited)
    assert diff.changed == {"orders"}  # orders inherits deletePolicy; logs has its own
    assert diff.defaults_changed is True
    filtered = parse_config(TOPICS.replace("only_paid", "only_refunds"))
    assert diff_topics(old, filtered).changed == {"orders"}


def test_restart_required_lists_system_changes_a_reload_cannot_apply() -> None:
    old = parse_config(METAQ_SAMPLE)
    assert restart_required(old, old.with_overrides({"stat": "false", "numPartitions": "3"})) == []
    new = old.with_overrides({"serverPort": "9999", "maxSegmentSize": "1m"})
    assert restart_required(old, new) == ["serverPort", "maxSegmentSize"]
    assert restart_required(old, parse_config("")) == ["updateConsumerOffsets", "[zookeeper]"]
    moved = parse_config(METAQ_SAMPLE.replace("zk.zkSessionTimeoutMs=30000", "zk.zkSessionTimeoutMs=9000")
                         .replace("localhost:2181", "zk1:2181"))
    assert restart_required(old, moved) == ["zk.zkConnect", "zk.zkSessionTimeoutMs"]


def test_a_reload_keeps_the_running_values_of_restart_options_and_applies_the_rest() -> None:
    from metaq.broker.config import keep_restart_options

    running = parse_config(METAQ_SAMPLE)
    new = dataclasses.replace(running.with_overrides({"maxTransferSize": "2048", "unflushInterval": "500"}),
                              zookeeper=None)
    applied = keep_restart_options(running, new)
    assert applied.max_transfer_bytes == 1048576 and applied.zookeeper == running.zookeeper
    assert applied.unflush_interval_ms == 500
    assert restart_required(running, applied) == []


# -- zookeeper --------------------------------------------------------------------------------------


def test_zookeeper_section() -> None:
    c = parse_config(
        "[zookeeper]\nzk.zkConnect=zk1:2181,zk2:2181,[::1]:2182/metaq\nzk.zkSessionTimeoutMs=10000\nzk.zkRoot=/meta2\n"
    )
    assert c.zookeeper == ZkConfig(
        connect="zk1:2181,zk2:2181,[::1]:2182/metaq", session_timeout_ms=10000, root="/meta2"
    )
    assert parse_config("[zookeeper]\nzk.zkEnable=false\n").zookeeper is None


# -- files ------------------------------------------------------------------------------------------


def test_load_config_names_the_file_and_anchors_relative_data_path(tmp_path: Path) -> None:
    ini = tmp_path / "conf" / "server.ini"
    ini.parent.mkdir()
    ini.write_text("[system]\ndataPath=data\n")
    c = load_config(ini)
    assert c.data_path == tmp_path / "conf" / "data"
    assert c.source_path == ini
    ini.write_text("[system]\n\nunflushTreshold=3\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(ini))}:3: unflushTreshold: "):
        load_config(str(ini))


def test_load_config_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.ini")
    bad = tmp_path / "latin1.ini"
    bad.write_bytes(b"[system]\n; caf\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(bad)


def test_comments_after_a_space_end_a_line_and_inside_a_word_are_part_of_the_value() -> None:
    c = parse_config("[system]      ; the defaults of every topic\n"
                     "serverPort=8123 ; main port\n"
                     "dataPath=/var/meta   # where the partitions are\n"
                     "deleteWhen=0 0 6 ? * 6#3\n"
                     "superUsers=User:a;User:b\t# two principals\n"
                     "[zookeeper] # optional\n"
                     "zk.zkConnect=localhost:2181\n"
                     "[topic=orders]\t; one section per topic\n"
                     "numPartitions=8\n", "s.ini")
    assert (c.server_port, c.data_path, c.delete_when) == (8123, Path("/var/meta"), "0 0 6 ? * 6#3")
    assert c.super_users == ("User:a", "User:b")
    assert c.zookeeper is not None and c.zookeeper.connect == "localhost:2181"
    assert c.topics["orders"].num_partitions == 8


def ini_blocks(page: Path) -> list[tuple[int, str]]:
    """(line, text) of every ```ini block of a Markdown page."""
    blocks: list[tuple[int, str]] = []
    lines = page.read_text(encoding="utf-8").split("\n")
    start = None
    for number, line in enumerate(lines, 1):
        if start is None and line.strip() == "```ini":
            start = number
        elif start is not None and line.strip() == "```":
            blocks.append((start, "\n".join(lines[start:number - 1]) + "\n"))
            start = None
    return blocks


DOC_PAGES = sorted([*(REPO / "docs").glob("*.md"), REPO / "README.md"])


@pytest.mark.parametrize("page", DOC_PAGES, ids=[p.name for p in DOC_PAGES])
def test_every_ini_example_of_the_docs_loads_as_pasted(page: Path, tmp_path: Path) -> None:
    for line, text in ini_blocks(page):
        ini = tmp_path / "server.ini"
        ini.write_text(text, encoding="utf-8")
        try:
            load_config(ini)
        except ConfigError as exc:
            raise AssertionError(f"{page.name}, the ini block at line {line}: {exc}") from None


def test_the_configuration_page_has_its_example() -> None:
    [(_, text)] = ini_blocks(REPO / "docs" / "configuration.md")
    c = parse_config(text, "configuration.md")
    assert c.zookeeper is not None and c.topics["orders"].group_filters == {"billing": "myapp.filters:paid_only"}


def test_example_server_ini_loads() -> None:
    c = load_config(REPO / "examples" / "server.ini")
    assert c.zookeeper is None
    assert len(c.topics) == 2
    assert c.warnings == ()


def test_docs_table_agrees_with_the_option_table() -> None:
    docs = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    for opt in OPTIONS:
        assert f"`{opt.key}`" in docs, opt.key
    for row in options_markdown_rows():
        assert row in docs, f"docs/configuration.md lacks or differs from this row:\n{row}"


# -- topic options given as pairs (CreateTopic configs, stored topic options) -----------------------


def test_topic_options_as_pairs_use_the_ini_validator_and_round_trip() -> None:
    from metaq.broker.config import merge_topic_configs
    from metaq.broker.ini import parse_topic_options, topic_options_text

    tc = parse_topic_options("orders", [("acceptPublish", "no"), ("deletePolicy", " archive,7h,true "),
                                        ("numPartitions", "2*2"), ("group.billing", "a.b:c")])
    assert (tc.accept_publish, tc.delete_policy, tc.num_partitions) == (False, "archive,7h,true", 4)
    assert parse_topic_options("orders", topic_options_text(tc).items()) == tc
    with pytest.raises(ConfigError, match=r"^configs\[1\]: deletePolicy: 'bogus': policy 'bogus' is unknown"):
        parse_topic_options("orders", [("stat", "true"), ("deletePolicy", "bogus")])
    with pytest.raises(ConfigError, match=r"^configs\[1\]: stat: set twice"):
        parse_topic_options("orders", [("stat", "true"), ("stat", "false")])
    with pytest.raises(ConfigError, match="runs code on the broker"):
        parse_topic_options("orders", [("group.billing", "a.b:c")], filters=False)
    with pytest.raises(ConfigError, match="contains '/'"):
        parse_topic_options("../x", [])
    section = parse_config("[topic=orders]\nacceptPublish=true\n").topics["orders"]
    merged = merge_topic_configs(tc, section)
    assert (merged.accept_publish, merged.num_partitions, merged.group_filters) == (True, 4, {"billing": "a.b:c"})


# -- glibc's heap thresholds (mallocTrimThreshold, mallocMmapThreshold) ------------------------------


def test_malloc_thresholds_default_to_glibcs_own() -> None:
    c = parse_config("")
    assert (c.malloc_trim_threshold_bytes, c.malloc_mmap_threshold_bytes) == (0, 0)
    c = parse_config("[system]\nmallocTrimThreshold=128m\nmallocMmapThreshold=32m\n")
    assert (c.malloc_trim_threshold_bytes, c.malloc_mmap_threshold_bytes) == (128 << 20, 32 << 20)
    c = parse_config("[system]\nmallocTrimThreshold=1g\nmallocMmapThreshold=4m\n")
    assert (c.malloc_trim_threshold_bytes, c.malloc_mmap_threshold_bytes) == (1 << 30, 4 << 20)


@pytest.mark.parametrize("line", ["mallocMmapThreshold=33554433", "mallocMmapThreshold=64m",
                                  "mallocTrimThreshold=-1", "mallocTrimThreshold=lots"])
def test_malloc_thresholds_glibc_would_refuse_are_refused_at_parse(line: str) -> None:
    assert line.split("=")[0] in refused(f"[system]\n{line}\n")
