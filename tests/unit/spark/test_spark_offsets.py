"""Option parsing and offset arithmetic of the Spark source (no Spark, no broker)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metaq.errors import ConfigError
from metaq.spark.offsets import (
    Bounds,
    OffsetRange,
    batch_ranges,
    cap_to_max_rows,
    parse_stream_offset,
    resolve_spec,
    split_ranges,
    stream_offset,
)
from metaq.spark.options import ReadOptions, WriteOptions, parse_offset_spec
from metaq.types import PartitionId


def P(text: str) -> PartitionId:
    return PartitionId.parse(text)


def on0(values: dict[int, int]) -> dict[PartitionId, int]:
    """Positions of broker 0's partitions, by number (the single-broker case)."""
    return {PartitionId(0, p): v for p, v in values.items()}


BOUNDS = {P("0-0"): Bounds(0, 10), P("0-1"): Bounds(5, 50), P("0-2"): Bounds(0, 0)}
TWO_BROKERS = {P("1-0"): Bounds(0, 10), P("1-1"): Bounds(0, 20), P("2-0"): Bounds(3, 30), P("2-5"): Bounds(0, 7)}


# -- offset specs --------------------------------------------------------------------------------

def test_spec_keywords() -> None:
    assert parse_offset_spec(None, "startingOffsets", "t", "earliest") == "earliest"
    assert parse_offset_spec(" Latest ", "startingOffsets", "t", "earliest") == "latest"
    assert parse_offset_spec("earliest", "startingOffsets", "t", "latest") == "earliest"


def test_spec_json_is_sorted_by_partition() -> None:
    spec = parse_offset_spec('{"t": {"2": 7, "0": -2, "10": -1}}', "startingOffsets", "t", "earliest")
    assert spec == {0: -2, 2: 7, 10: -1}
    assert list(spec) == [0, 2, 10]  # type: ignore[arg-type]


def test_spec_json_takes_broker_partition_and_bare_numbers() -> None:
    spec = parse_offset_spec('{"t": {"10-0": 1, "2-1": 7, " 2-0": -2, "5": 3}}', "startingOffsets", "t", "earliest")
    assert spec == {5: 3, P("2-0"): -2, P("2-1"): 7, P("10-0"): 1}
    assert list(spec) == [5, P("2-0"), P("2-1"), P("10-0")]  # type: ignore[arg-type]


@pytest.mark.parametrize("raw, fragment", [
    ("{not json", "neither 'earliest', 'latest' nor JSON"),
    ("[1, 2]", "must be an object"),
    ('{"other": {"0": 1}}', "names topic(s) ['other']"),
    ('{"t": [1]}', "must be an object"),
    ('{"t": {"x": 1}}', "partition 'x' is not brokerId-partition (e.g. '0-3') or a partition number"),
    ('{"t": {"-1": 1}}', "partition '-1' is not brokerId-partition"),
    ('{"t": {"1-": 1}}', "partition '1-' is not brokerId-partition"),
    ('{"t": {"0": "5"}}', "must be an integer"),
    ('{"t": {"0": 1.5}}', "must be an integer"),
    ('{"t": {"0": true}}', "must be an integer"),
    ('{"t": {"0": -3}}', "is invalid"),
    ("yesterday", "neither"),
])
def test_malformed_spec_names_the_option(raw: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=r"^option 'startingOffsets': ") as info:
        parse_offset_spec(raw, "startingOffsets", "t", "earliest")
    assert fragment in str(info.value)


def test_earliest_not_allowed_as_an_end() -> None:
    with pytest.raises(ConfigError, match="option 'endingOffsets'"):
        parse_offset_spec("earliest", "endingOffsets", "t", "latest", allow_earliest=False)
    with pytest.raises(ConfigError, match="option 'endingOffsets'"):
        parse_offset_spec('{"t": {"0": -2}}', "endingOffsets", "t", "latest", allow_earliest=False)


def test_resolve_spec() -> None:
    assert resolve_spec("earliest", BOUNDS, "startingOffsets") == on0({0: 0, 1: 5, 2: 0})
    assert resolve_spec("latest", BOUNDS, "endingOffsets") == on0({0: 10, 1: 50, 2: 0})
    # unlisted partitions default to earliest for a start and latest for an end
    assert resolve_spec({1: 7, 0: -1}, BOUNDS, "startingOffsets") == on0({0: 10, 1: 7, 2: 0})
    assert resolve_spec({P("0-1"): 7}, BOUNDS, "endingOffsets") == on0({0: 10, 1: 7, 2: 0})
    with pytest.raises(ConfigError, match=r"option 'startingOffsets': partition\(s\) \['9'\] do not exist"):
        resolve_spec({9: 1}, BOUNDS, "startingOffsets")


def test_resolve_spec_over_two_brokers() -> None:
    got = resolve_spec({P("2-0"): 5, 1: 4, 5: -1}, TWO_BROKERS, "startingOffsets")
    assert got == {P("1-0"): 0, P("1-1"): 4, P("2-0"): 5, P("2-5"): 7}  # 1 and 5: only one broker has them
    with pytest.raises(ConfigError, match=r"^option 'startingOffsets': partition 0 is ambiguous: brokers 1, 2 each "
                                          r"have one; name it as brokerId-partition \(1-0, 2-0\)"):
        resolve_spec({0: 1}, TWO_BROKERS, "startingOffsets")
    with pytest.raises(ConfigError, match=r"partition\(s\) \['3-0'\] do not exist; the topic has partitions "
                                          r"\['1-0', '1-1', '2-0', '2-5'\]"):
        resolve_spec({P("3-0"): 1}, TWO_BROKERS, "startingOffsets")
    with pytest.raises(ConfigError, match="partition 1-1 is named twice"):
        resolve_spec({P("1-1"): 1, 1: 2}, TWO_BROKERS, "startingOffsets")


def test_batch_ranges_refuse_end_before_start() -> None:
    assert batch_ranges(on0({0: 2, 1: 5}), on0({0: 4, 1: 5})) == [OffsetRange(P("0-0"), 2, 4),
                                                                    OffsetRange(P("0-1"), 5, 5)]
    with pytest.raises(ConfigError, match="option 'startingOffsets': offset 6 of partition 0-0 is after"):
        batch_ranges(on0({0: 6}), on0({0: 4}))


# -- read and write options ----------------------------------------------------------------------

def test_read_options_defaults() -> None:
    opts = ReadOptions.parse({"topic": "t"})
    assert opts.servers == "127.0.0.1:8123"
    assert opts.starting == "earliest" and opts.ending == "latest"
    assert opts.fail_on_data_loss and opts.max_offsets_per_trigger is None and opts.min_partitions is None


def test_zookeeper_options() -> None:
    opts = ReadOptions.parse({"topic": "t", "zkconnect": "zk1:2181,zk2:2181", "ZKROOT": "meta-dev/"})
    assert (opts.zk_connect, opts.zk_root) == ("zk1:2181,zk2:2181", "/meta-dev")
    assert ReadOptions.parse({"topic": "t", "zkConnect": "zk:2181"}).zk_root == "/meta"
    assert ReadOptions.parse({"topic": "t"}).zk_connect is None
    write = WriteOptions.parse({"topic": "t", "zkConnect": "zk:2181/chroot"})
    assert (write.zk_connect, write.zk_root) == ("zk:2181/chroot", "/meta")
    with pytest.raises(ConfigError, match=r"^option 'zkConnect': give either 'servers' or 'zkConnect'"):
        WriteOptions.parse({"zkConnect": "zk:2181", "servers": "h:1"})


def test_read_options_are_case_insensitive() -> None:
    opts = ReadOptions.parse({"topic": "t", "maxoffsetspertrigger": "10", "FAILONDATALOSS": "false"})
    assert opts.max_offsets_per_trigger == 10 and not opts.fail_on_data_loss


@pytest.mark.parametrize("options, option", [
    ({}, "topic"),
    ({"topic": "../x"}, "topic"),
    ({"topic": "t", "servers": "host:port"}, "servers"),
    ({"topic": "t", "servers": ""}, "servers"),
    ({"topic": "t", "minPartitions": "0"}, "minPartitions"),
    ({"topic": "t", "maxOffsetsPerTrigger": "many"}, "maxOffsetsPerTrigger"),
    ({"topic": "t", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ({"topic": "t", "maxBytesPerFetch": "10"}, "maxBytesPerFetch"),
    ({"topic": "t", "checkpointLocation": "hdfs://nn/x"}, "checkpointLocation"),
    ({"topic": "t", "zkConnect": "zk:2181", "servers": "h:1"}, "zkConnect"),
    ({"topic": "t", "zkConnect": "zk:port"}, "zkConnect"),
    ({"topic": "t", "zkRoot": "/meta"}, "zkRoot"),
    ({"topic": "t", "zkConnect": "zk:2181", "zkRoot": "/a//b"}, "zkRoot"),
])
def test_bad_read_options_name_the_option(options: dict[str, str], option: str) -> None:
    with pytest.raises(ConfigError, match=f"^option '{option}'"):
        ReadOptions.parse(options)


def test_streaming_latest_needs_a_checkpoint_location(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match="option 'checkpointLocation': required"):
        ReadOptions.parse({"topic": "t", "startingOffsets": "latest"}, streaming=True)
    with pytest.raises(ConfigError, match="option 'checkpointLocation': required"):
        ReadOptions.parse({"topic": "t", "startingOffsets": '{"t": {"0": -1}}'}, streaming=True)
    # batch reads resolve 'latest' once per query: nothing to remember
    ReadOptions.parse({"topic": "t", "startingOffsets": "latest"})
    opts = ReadOptions.parse({"topic": "t", "startingOffsets": "latest", "checkpointLocation": f"file://{tmp_path}"},
                             streaming=True)
    assert opts.start_file() is not None and opts.start_file().startswith(f"{tmp_path}/metaq-source/t-")  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="option 'endingOffsets'"):
        ReadOptions.parse({"topic": "t", "endingOffsets": "latest"}, streaming=True)


@pytest.mark.parametrize("options, option", [
    ({"compression": "snappy"}, "compression"),
    ({"acks": "2"}, "acks"),
    ({"batchBytes": str(64 << 20)}, "batchBytes"),
    ({"topic": "a/b"}, "topic"),
    ({"deliveryGuarantee": "at-most-once"}, "deliveryGuarantee"),
    ({"deliveryGuarantee": "exactly-once", "acks": "0"}, "acks"),
    ({"transactionTimeoutMs": "-1"}, "transactionTimeoutMs"),
])
def test_bad_write_options_name_the_option(options: dict[str, str], option: str) -> None:
    with pytest.raises(ConfigError, match=f"^option '{option}'"):
        WriteOptions.parse(options)


def test_the_sink_is_at_least_once_unless_asked_for_exactly_once() -> None:
    assert not WriteOptions.parse({"topic": "t"}).exactly_once
    opts = WriteOptions.parse({"topic": "t", "deliveryguarantee": "Exactly-Once", "transactionTimeoutMs": "5000",
                               "checkpointlocation": "/ck/a"})
    assert opts.exactly_once and opts.transaction_timeout_ms == 5000
    # the checkpoint names a query's transactions when Spark does not give its id
    assert opts.checkpoint_scope != WriteOptions.parse({"topic": "t", "checkpointLocation": "/ck/b"}).checkpoint_scope


# -- stream offsets ------------------------------------------------------------------------------

def test_stream_offset_text_is_canonical() -> None:
    a = stream_offset("t", {P("10-0"): 1, P("2-0"): 3, P("1-11"): 4, P("1-2"): 5})
    b = stream_offset("t", {P("1-2"): 5, P("10-0"): 1, P("1-11"): 4, P("2-0"): 3})
    # keyed brokerId-partition, in (broker id, partition) order: numeric, not the order of the text
    assert json.dumps(a) == json.dumps(b) == '{"t": {"1-2": 5, "1-11": 4, "2-0": 3, "10-0": 1}}'
    # what Spark hands back (json.loads of the stored text) round-trips to the same text
    assert json.dumps(stream_offset("t", parse_stream_offset(json.loads(json.dumps(a)), "t"))) == json.dumps(a)


def test_checkpoint_of_another_topic_is_refused() -> None:
    with pytest.raises(ConfigError, match="option 'topic'"):
        parse_stream_offset({"other": {"0-0": 1}}, "t")


def test_checkpoint_of_bare_partition_numbers_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"names partition '0', not brokerId-partition .* new checkpoint location"):
        parse_stream_offset({"t": {"0": 1}}, "t")


# -- admission control ---------------------------------------------------------------------------

def test_cap_shares_rows_by_backlog() -> None:
    start = on0({0: 0, 1: 100, 2: 5})
    latest = on0({0: 300, 1: 200, 2: 5})
    assert cap_to_max_rows(start, latest, 1000) == latest
    capped = cap_to_max_rows(start, latest, 40)
    assert capped == on0({0: 30, 1: 110, 2: 5})
    assert sum(capped[p] - start[p] for p in start) == 40


def test_cap_always_makes_progress() -> None:
    capped = cap_to_max_rows(on0({0: 0, 1: 0, 2: 0}), on0({0: 5, 1: 5, 2: 5}), 1)
    assert sum(capped.values()) == 1


def test_cap_keeps_a_truncated_partition_at_its_latest() -> None:
    assert cap_to_max_rows(on0({0: 50, 1: 0}), on0({0: 10, 1: 100}), 10) == on0({0: 10, 1: 10})


@given(st.dictionaries(st.integers(0, 20), st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1),
       st.integers(1, 3000))
def test_cap_properties(parts: dict[int, tuple[int, int]], max_rows: int) -> None:
    start = {PartitionId(p % 3, p): min(a, b) for p, (a, b) in parts.items()}
    latest = {PartitionId(p % 3, p): max(a, b) for p, (a, b) in parts.items()}
    capped = cap_to_max_rows(start, latest, max_rows)
    assert set(capped) == set(latest)
    taken = sum(capped[p] - start[p] for p in start)
    available = sum(latest[p] - start[p] for p in start)
    assert taken == min(max_rows, available)
    assert all(start[p] <= capped[p] <= latest[p] for p in start)
    assert capped == cap_to_max_rows(dict(start), dict(latest), max_rows)


# -- splitting -----------------------------------------------------------------------------------

def test_split_without_min_partitions_drops_empty_ranges() -> None:
    ranges = [OffsetRange(P("0-0"), 0, 10), OffsetRange(P("0-1"), 4, 4)]
    assert split_ranges(ranges, None) == [OffsetRange(P("0-0"), 0, 10)]
    assert split_ranges(ranges, 1) == [OffsetRange(P("0-0"), 0, 10)]


def test_split_by_size() -> None:
    pieces = split_ranges([OffsetRange(P("1-0"), 0, 90), OffsetRange(P("2-0"), 100, 110)], 10)
    assert pieces[:2] == [OffsetRange(P("1-0"), 0, 10), OffsetRange(P("1-0"), 10, 20)]
    assert len([p for p in pieces if p.partition == P("1-0")]) == 9
    assert [p for p in pieces if p.partition == P("2-0")] == [OffsetRange(P("2-0"), 100, 110)]
    assert len(pieces) == 10


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 5000)), min_size=1, max_size=8),
       st.integers(1, 64))
def test_split_properties(spans: list[tuple[int, int]], min_partitions: int) -> None:
    ranges = [OffsetRange(PartitionId(p % 2, p), s, s + n) for p, (s, n) in enumerate(spans)]
    pieces = split_ranges(ranges, min_partitions)
    for r in ranges:
        mine = [x for x in pieces if x.partition == r.partition]
        covered = [o for x in mine for o in (x.start, x.end)]
        if r.size == 0:
            assert not mine
            continue
        assert mine[0].start == r.start and mine[-1].end == r.end
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
        assert all(x.size > 0 for x in mine)
        assert covered
    total = sum(r.size for r in ranges)
    assert len(pieces) >= min(min_partitions, total)
