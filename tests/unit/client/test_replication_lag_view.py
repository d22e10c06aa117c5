"""How a slave's Stats ``replication`` section reads in `metaq cluster` and `metaq stats`: lags that are
not zero, figures the slave does not know yet (-1), a stalled partition, a section from another version."""

from __future__ import annotations

from typing import Any

from metaq.cli.replication_text import replication_lines
from metaq.client.cluster_status import _slave_status
from metaq.types import PartitionId


def section(**partitions: Any) -> dict[str, Any]:
    return {"role": "slave", "mode": "async", "broker_id": 3, "slave_id": 1, "master": "10.0.0.1:8123",
            "max_lag_messages": 40, "max_lag_ms": 250, "partitions": {"orders": partitions}}


BEHIND = {"log_end_offset": 60, "master_end_offset": 100, "lag_messages": 40, "lag_ms": 250, "stalled": "",
          "last_error": ""}
NEW = {"log_end_offset": 0, "master_end_offset": -1, "lag_messages": -1, "lag_ms": -1, "stalled": "",
       "last_error": "connection refused"}
STALLED = {"log_end_offset": 9, "master_end_offset": 5, "lag_messages": 0, "lag_ms": 0,
           "stalled": "the slave holds offsets up to 9 but the master's log ends at 5", "last_error": ""}


def test_cluster_view_reads_lags_unknowns_and_stalls() -> None:
    status = _slave_status(3, 1, "10.0.0.2:8123", section(**{"10": STALLED, "2": NEW, "0": BEHIND}))
    assert status.following == "10.0.0.1:8123" and status.error is None
    rows = [(str(r.partition), r.log_end, r.master_end, r.lag_messages, r.lag_ms, bool(r.stalled))
            for r in status.partitions]
    assert rows == [("3-0", 60, 100, 40, 250, False), ("3-2", 0, None, None, None, False),
                    ("3-10", 9, 5, 0, 0, True)]  # numeric order; -1 is "not known yet"
    assert status.partitions[1].last_error == "connection refused"
    assert (status.max_lag_messages, status.max_lag_ms) == (40, 250)
    assert status.partitions[0].partition == PartitionId(3, 0)


def test_a_broker_without_a_replication_section_is_reported_not_guessed() -> None:
    status = _slave_status(3, 1, "10.0.0.2:8123", None)
    assert status.partitions == [] and status.error is not None and "no replication section" in status.error


def test_stats_text_rows_and_stalled_reasons() -> None:
    lines = replication_lines({"broker_id": 3, "replication": section(**{"0": BEHIND, "2": NEW, "10": STALLED})})
    assert lines[0] == ("# replication: slave 1 of broker 3 (async), master 10.0.0.1:8123, max lag 40 messages, "
                        "250 ms")
    assert lines[2:5] == ["orders\t3-0\t60\t100\t40\t250\tno", "orders\t3-2\t0\t-\t-\t-\tno",
                          "orders\t3-10\t9\t5\t0\t0\tyes"]
    assert lines[5] == "# stalled orders 3-10: the slave holds offsets up to 9 but the master's log ends at 5"
    assert replication_lines({"broker_id": 1, "topics": {}}) == []  # a master: nothing
