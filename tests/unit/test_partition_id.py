"""PartitionId: MetaQ's ``brokerId-partition`` identity, its text form, order and checks."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metaq.client.metadata import Partition
from metaq.errors import InvalidArgument
from metaq.types import BROKER_ID_MAX, Message, PartitionId, SendResult, partition_key

broker_ids = st.integers(0, BROKER_ID_MAX)
numbers = st.integers(0, 2**31 - 1)


def test_text_form_is_broker_dash_partition() -> None:
    assert str(PartitionId(0, 3)) == "0-3"
    assert str(PartitionId(12, 0)) == "12-0"
    assert PartitionId.parse("1-3") == PartitionId(1, 3)
    assert PartitionId.parse(" 7-10 ") == PartitionId(7, 10)


@pytest.mark.parametrize("bad", ["", "3", "1-", "-3", "1--3", "a-3", "1-b", "1-3-4", "1 - 3", "+1-3", "1-3.0",
                                 "123456-1"])
def test_parse_refuses_what_is_not_broker_dash_partition_and_says_the_form(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="brokerId-partition"):
        PartitionId.parse(bad)


def test_parse_refuses_non_text() -> None:
    with pytest.raises(InvalidArgument, match="brokerId-partition"):
        PartitionId.parse(13)  # type: ignore[arg-type]


@pytest.mark.parametrize(("broker", "partition"), [(-1, 0), (BROKER_ID_MAX + 1, 0), (0, -1), (True, 0), (0, 1.0)])
def test_out_of_range_or_non_integer_fields_are_refused(broker: object, partition: object) -> None:
    with pytest.raises(InvalidArgument):
        PartitionId(broker, partition)  # type: ignore[arg-type]


@given(broker_ids, numbers)
def test_text_round_trip(broker: int, partition: int) -> None:
    pid = PartitionId(broker, partition)
    assert PartitionId.parse(str(pid)) == pid
    assert pickle.loads(pickle.dumps(pid)) == pid


@given(st.lists(st.tuples(broker_ids, numbers), max_size=20))
def test_ordered_by_broker_then_partition_like_metaq(pairs: list[tuple[int, int]]) -> None:
    ids = [PartitionId(b, p) for b, p in pairs]
    assert [(i.broker_id, i.partition) for i in sorted(ids)] == sorted(pairs)


def test_numeric_not_textual_order() -> None:
    assert sorted(PartitionId.parse(t) for t in ["10-0", "2-1", "2-0", "1-11", "1-2"]) == [
        PartitionId(1, 2), PartitionId(1, 11), PartitionId(2, 0), PartitionId(2, 1), PartitionId(10, 0)]


def test_frozen_and_hashable() -> None:
    pid = PartitionId(1, 3)
    with pytest.raises(AttributeError):
        pid.partition = 4  # type: ignore[misc]
    assert {pid: "x"}[PartitionId(1, 3)] == "x"
    assert pid != (1, 3) and pid != "1-3"


def test_the_client_partition_is_the_same_identity_with_flags_outside_it() -> None:
    closed = Partition(1, 3, accept_publish=False)
    assert closed == PartitionId(1, 3) == Partition(1, 3)
    assert hash(closed) == hash(PartitionId(1, 3))
    assert {PartitionId(1, 3): "x"}[closed] == "x"
    assert sorted([Partition(2, 0), PartitionId(1, 5), Partition(1, 0)]) == [
        PartitionId(1, 0), PartitionId(1, 5), PartitionId(2, 0)]
    assert type(closed.id) is PartitionId and closed.id == closed
    assert str(closed) == "1-3"


def test_partition_key_accepts_an_id_its_text_or_a_bare_number() -> None:
    assert partition_key(PartitionId(1, 3)) == PartitionId(1, 3)
    assert partition_key("1-3") == PartitionId(1, 3)
    assert partition_key("3") == 3 and partition_key(3) == 3
    for bad in ("x", -1, "1-", True):
        with pytest.raises(InvalidArgument):
            partition_key(bad)


def test_messages_and_send_results_name_their_broker_partition() -> None:
    msg = Message("t", b"x", partition=3, broker_id=2)
    assert msg.partition_id == PartitionId(2, 3)
    assert SendResult(True, 5, 3, 7, None, "t", 2).partition_id == PartitionId(2, 3)
    with pytest.raises(InvalidArgument):
        Message("t", b"unsent").partition_id  # noqa: B018 - not read from a broker


def test_parse_names_the_field_out_of_range() -> None:
    with pytest.raises(InvalidArgument, match=r"'65536-0': broker id must be an integer 0\.\.65535"):
        PartitionId.parse("65536-0")
