"""Fixed sample values of every frame, for the golden byte fixtures in ``golden/``.

One request and one response per API and version. The values are chosen so the bytes show mistakes:
fields of the same wire type in one message have different values (so swapping two of them changes
the bytes; ``test_protocol_golden`` checks this), strings include multi-byte UTF-8, numbers include
negatives and values that need every byte, and the nullable encodings appear both null and not.

A ``records`` field is opaque bytes at the frame level, so it carries a fixed blob, not a record batch:
these fixtures do not depend on the record batch format.

Changing a value here changes the fixtures: regenerate them (see ``golden/README.md``).
"""

from __future__ import annotations

from typing import Any

from metaq.protocol import messages as m

CLIENT_ID = "golden-clïent"
"""Not ASCII: its i16 length counts bytes, not characters."""
CORRELATION_ID = 1
"""What a fresh ClientConnection gives its first request."""
RECORDS_BLOB = b"\x00\x01opaque records, not a batch\xfe\xff"
MESSAGE_ID = (7 << 112) | (0x0123456789AB << 64) | 4711
"""Broker 7, a 48-bit partition tag, offset 4711: every byte of the uint128 is used."""

ORDERS = m.OffsetEntry(topic="orders", broker_id=3, partition=0, offset=4711, metadata="at 12:00 ✓", error_code=0)
REFUNDS = m.OffsetEntry(topic="refunds", broker_id=2, partition=1, offset=-1, metadata=None, error_code=22)

SAMPLES: dict[tuple[str, int], tuple[Any, Any]] = {
    ("ApiVersions", 0): (
        m.ApiVersionsRequest(client_software="metaq-golden/1.0 ✓"),
        m.ApiVersionsResponse(error_code=0, error_message=None, broker_id=7, server_version="0.9.1",
                              apis=[m.ApiVersionRange(5, 1, 3), m.ApiVersionRange(17, 2, 4)]),
    ),
    ("ApiVersions", 1): (
        m.ApiVersionsRequest(client_software="metaq-slave-7 ✓", replica_id=3),
        m.ApiVersionsResponse(error_code=0, error_message=None, broker_id=7, server_version="0.9.1",
                              apis=[m.ApiVersionRange(31, 0, 1), m.ApiVersionRange(5, 1, 3)]),
    ),
    ("Metadata", 0): (
        m.MetadataRequest(topics=None),
        m.MetadataResponse(
            error_code=0, error_message=None,
            brokers=[m.BrokerInfo(1, "broker-a.example", 8123), m.BrokerInfo(2, "10.0.0.2", 8124)],
            topics=[m.TopicInfo("orders", 0, [m.PartitionInfo(0, 1, 0, True, False),
                                              m.PartitionInfo(3, 2, 5, False, True)]),
                    m.TopicInfo("gøne", 3, [])]),
    ),
    ("Metadata", 1): (
        m.MetadataRequest(topics=["orders", "audit"]),
        m.MetadataResponse(
            error_code=0, error_message=None,
            brokers=[m.BrokerInfo(1, "broker-a.example", 8123)],
            topics=[m.TopicInfo("orders", 0, [m.PartitionInfo(0, 1, 0, True, False)]),
                    m.TopicInfo("audit", 0, [m.PartitionInfo(0, 1, 0, False, True)])],
            publish_refused=[m.PublishRefusal("audit", 1, "acceptPublish=false in [topic=audit]")]),
    ),
    ("CreateTopic", 0): (
        m.CreateTopicRequest(topic="orders", num_partitions=8,
                             configs=[m.ConfigEntry("deletePolicy", "delete,72"),
                                      m.ConfigEntry("unflushThreshold", "1")]),
        m.CreateTopicResponse(error_code=0, error_message=None, num_partitions=8),
    ),
    ("DeleteTopic", 0): (
        m.DeleteTopicRequest(topic="old-orders"),
        m.DeleteTopicResponse(error_code=3, error_message="topic 'old-orders' does not exist"),
    ),
    ("Produce", 0): (
        m.ProduceRequest(topic="orders", partition=2, acks=1, timeout_ms=30000, records=RECORDS_BLOB),
        m.ProduceResponse(error_code=0, error_message=None, partition=2, base_offset=4711,
                          base_message_id=MESSAGE_ID, append_time_ms=1_700_000_000_123),
    ),
    ("Produce", 1): (
        m.ProduceRequest(topic="orders", partition=2, acks=1, timeout_ms=30000, transaction_id="tx-✓-42",
                         records=RECORDS_BLOB),
        m.ProduceResponse(error_code=0, error_message=None, partition=2, base_offset=4711,
                          base_message_id=MESSAGE_ID, append_time_ms=1_700_000_000_123),
    ),
    ("Produce", 2): (
        m.ProduceRequest(topic="orders", partition=2, acks=1, timeout_ms=30000, transaction_id="",
                         records=RECORDS_BLOB),
        m.ProduceResponse(error_code=0, error_message=None, partition=2, base_offset=4711,
                          base_message_id=MESSAGE_ID, append_time_ms=1_700_000_000_123, throttle_time_ms=1234),
    ),
    ("Fetch", 0): (
        m.FetchRequest(topic="orders", partition=2, offset=4711, max_bytes=1 << 20, max_wait_ms=500,
                       group="billing"),
        m.FetchResponse(error_code=0, error_message=None, log_start_offset=100, log_end_offset=4800,
                        reset_offset=-1, records=RECORDS_BLOB),
    ),
    ("Fetch", 1): (
        m.FetchRequest(topic="orders", partition=2, offset=4712, max_bytes=1 << 20, max_wait_ms=0, group=""),
        m.FetchResponse(error_code=74, error_message="stored batch at offset 4711 is damaged ✗",
                        log_start_offset=100, log_end_offset=4800, reset_offset=-1, damaged_offset=4711,
                        resume_offset=4716, records=b""),
    ),
    ("Fetch", 2): (
        m.FetchRequest(topic="orders", partition=2, offset=4713, max_bytes=1 << 20, max_wait_ms=500, group="",
                       replica_id=1, replica_epoch=7, last_fetched_epoch=6),
        m.FetchResponse(error_code=0, error_message=None, log_start_offset=100, log_end_offset=4800,
                        reset_offset=-1, damaged_offset=4711, resume_offset=4716, master_epoch=7, high_watermark=4700,
                        records_epoch=5, diverging_epoch=6, diverging_end_offset=4650, records=b""),
    ),
    ("Fetch", 3): (
        m.FetchRequest(topic="orders", partition=2, offset=4714, max_bytes=1 << 20, max_wait_ms=500, group="billing",
                       replica_id=-1, replica_epoch=9, last_fetched_epoch=8),
        m.FetchResponse(error_code=0, error_message=None, log_start_offset=100, log_end_offset=4800,
                        reset_offset=-1, damaged_offset=4711, resume_offset=4716, master_epoch=7, high_watermark=4700,
                        records_epoch=5, diverging_epoch=6, diverging_end_offset=4650, throttle_time_ms=2500,
                        records=RECORDS_BLOB),
    ),
    ("ListOffsets", 0): (
        m.ListOffsetsRequest(topic="orders", partition=2, timestamp_ms=-2),
        m.ListOffsetsResponse(error_code=0, error_message=None, offset=100, log_start_offset=50,
                              log_end_offset=4800),
    ),
    ("JoinGroup", 0): (
        m.JoinGroupRequest(group="billing", member_id="", client_id="billing-worker-1",
                           session_timeout_ms=10_000, rebalance_timeout_ms=30_000,
                           topics=["orders", "refunds"], strategy="range",
                           partitions=[m.TopicAssignment("orders", [m.BrokerPartition(3, 0), m.BrokerPartition(4, 1)]),
                                       m.TopicAssignment("refunds", [m.BrokerPartition(2, 1)])]),
        m.JoinGroupResponse(error_code=0, error_message=None, generation=5, member_id="worker-1-9f2c",
                            members=["worker-1-9f2c", "worker-2-77aa"],
                            assignment=[m.TopicAssignment("orders", [m.BrokerPartition(3, 0), m.BrokerPartition(3, 2)]),
                                        m.TopicAssignment("refunds", [m.BrokerPartition(2, 1)])]),
    ),
    ("Heartbeat", 0): (
        m.HeartbeatRequest(group="billing", generation=5, member_id="worker-1-9f2c"),
        m.HeartbeatResponse(error_code=27, error_message="the group is rebalancing; join again"),
    ),
    ("LeaveGroup", 0): (
        m.LeaveGroupRequest(group="billing", member_id="worker-1-9f2c"),
        m.LeaveGroupResponse(error_code=0, error_message=None),
    ),
    ("OffsetCommit", 0): (
        m.OffsetCommitRequest(group="billing", generation=-1, member_id="", offsets=[ORDERS, REFUNDS]),
        m.OffsetCommitResponse(error_code=0, error_message=None, results=[ORDERS, REFUNDS]),
    ),
    ("OffsetFetch", 0): (
        m.OffsetFetchRequest(group="billing", partitions=[m.TopicPartitionRef("orders", 3, 0),
                                                          m.TopicPartitionRef("refunds", 2, 1)]),
        m.OffsetFetchResponse(error_code=0, error_message=None, offsets=[ORDERS]),
    ),
    ("Stats", 0): (
        m.StatsRequest(topic="orders"),
        m.StatsResponse(error_code=0, error_message=None, stats_json=b'{"uptime_s": 12, "topics": {}}'),
    ),
    ("ListGroups", 0): (
        m.ListGroupsRequest(),
        m.ListGroupsResponse(error_code=0, error_message=None, groups=["billing", "audit"]),
    ),
    ("DescribeGroup", 0): (
        m.DescribeGroupRequest(group="billing"),
        m.DescribeGroupResponse(error_code=0, error_message=None, state="Stable", generation=5, strategy="range",
                                members=[m.GroupMember("worker-1-9f2c", "billing-worker-1", "10.0.0.5",
                                                       [m.TopicAssignment("orders", [m.BrokerPartition(3, 0),
                                                                                     m.BrokerPartition(4, 1)])])]),
    ),
    ("PartitionState", 0): (
        m.PartitionStateRequest(topic="orders", partition=-1, open=False),
        m.PartitionStateResponse(error_code=0, error_message=None),
    ),
    ("Reload", 0): (
        m.ReloadRequest(),
        m.ReloadResponse(error_code=0, error_message=None, changed_topics=["orders"]),
    ),
    ("Reload", 1): (
        m.ReloadRequest(),
        m.ReloadResponse(error_code=0, error_message=None, changed_topics=["orders"],
                         restart_required=["maxTransferSize", "zk.zkConnect"]),
    ),
    ("LookupMessage", 0): (
        m.LookupMessageRequest(message_id=MESSAGE_ID),
        m.LookupMessageResponse(error_code=0, error_message=None, topic="orders", partition=2, offset=4711),
    ),
    ("Verify", 0): (
        m.VerifyRequest(topic="orders", partition=2),
        m.VerifyResponse(error_code=0, error_message=None,
                         report_json=b'[{"topic": "orders", "partition": 2, "ok": true}]'),
    ),
    ("Promote", 0): (
        m.PromoteRequest(replica_id=2, timeout_ms=30_000),
        m.PromoteResponse(error_code=0, error_message=None, new_master=2, epoch=8),
    ),
    ("FindMessages", 0): (
        m.FindMessagesRequest(topic="orders", partition=-1, key=b"order-17", from_ms=1_700_000_000_000, to_ms=-1,
                              max_results=100),
        m.FindMessagesResponse(error_code=0, error_message=None,
                               messages=[m.FoundMessage(partition=2, offset=4711, message_id=MESSAGE_ID,
                                                        timestamp_ms=1_700_000_000_123, key=b"order-17")],
                               truncated=False, scanned_segments=1, problems=["orders-2: damaged"]),
    ),
    ("SaslHandshake", 0): (
        m.SaslHandshakeRequest(mechanism="SCRAM-SHA-256"),
        m.SaslHandshakeResponse(error_code=0, error_message=None, mechanisms=["SCRAM-SHA-256"]),
    ),
    ("SaslAuthenticate", 0): (
        m.SaslAuthenticateRequest(auth_bytes=b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"),
        m.SaslAuthenticateResponse(error_code=0, error_message=None,
                                   auth_bytes=b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
                                   principal="User:user"),
    ),
    ("Transaction", 0): (
        m.TransactionRequest(op=m.TX_PREPARE, transaction_id="tx-✓-42", xid="1:gtrid-ü:bqual", timeout_ms=60000,
                             producer_group="payments"),
        m.TransactionResponse(error_code=0, error_message=None,
                              committed=[m.CommittedBatch(topic="orders", partition=2, base_offset=4711,
                                                          base_message_id=MESSAGE_ID, record_count=-3)],
                              xids=["1:gtrid-ü:bqual", ""]),
    ),
    ("CheckTransactions", 0): (
        m.CheckTransactionsRequest(producer_group="payments-ü", max_wait_ms=5000, max_transactions=100),
        m.CheckTransactionsResponse(error_code=0, error_message=None, transaction_ids=["tx-✓-42", "tx-43"]),
    ),
    ("CheckTransactions", 1): (
        m.CheckTransactionsRequest(producer_group="payments-ü", max_wait_ms=5000, max_transactions=100),
        m.CheckTransactionsResponse(error_code=0, error_message=None, transaction_ids=["tx-✓-42", "tx-43"],
                                    transactions=[
                                        m.HalfTransaction("tx-✓-42", 3, 1_700_000_000_123,
                                                          [m.HalfBatch("orders", 2, RECORDS_BLOB)]),
                                        m.HalfTransaction("tx-43", 1, -1, [])]),
    ),
    ("ListTransactions", 0): (
        m.ListTransactionsRequest(producer_group="payments-ü", max_transactions=1000),
        m.ListTransactionsResponse(error_code=0, error_message=None, live=[
            m.TransactionInfo("tx-✓-42", "prepared", "payments-ü", "tx-✓-42", 1_700_000_000_123, -1, -2,
                              1_700_000_060_123, 2, 3, ["orders-2", "refünds-0"])],
            timed_out=[m.TransactionInfo("tx-43", "rolled back (timed out: open for longer than its timeout of "
                                         "60000 ms)", "", None, 1_700_000_000_000, 1_700_000_060_000, -1, -3, 0,
                                         4, [])],
            checkers=["payments-ü"]),
    ),
    ("MultiFetch", 0): (
        m.MultiFetchRequest(max_wait_ms=5000, min_bytes=1, max_bytes=4 << 20, group="billing-ü",
                            partitions=[m.FetchPartition("orders", 2, 4711, 1 << 20),
                                        m.FetchPartition("refünds", 0, -3, 65536)]),
        m.MultiFetchResponse(error_code=0, error_message=None, partitions=[
            m.FetchedPartition("orders", 2, 0, None, 100, 4800, -1, -2, -3, 4790, RECORDS_BLOB),
            m.FetchedPartition("refünds", 0, 1, "offset -3 is out of range ✗", 7, 9, -4, -5, -6, -7, b""),
        ]),
    ),
    ("MultiFetch", 1): (
        m.MultiFetchRequest(max_wait_ms=5000, min_bytes=1, max_bytes=4 << 20, group="billing-ü",
                            partitions=[m.FetchPartition("orders", 2, 4711, 1 << 20)]),
        m.MultiFetchResponse(error_code=0, error_message=None, throttle_time_ms=2500, partitions=[
            m.FetchedPartition("orders", 2, 0, None, 100, 4800, -1, -2, -3, 4790, RECORDS_BLOB),
        ]),
    ),
    ("MultiProduce", 0): (
        m.MultiProduceRequest(acks=1, timeout_ms=30000, transaction_id="tx-ü", partitions=[
            m.ProducePartition("orders", 3, RECORDS_BLOB), m.ProducePartition("refünds", -1, RECORDS_BLOB)]),
        m.MultiProduceResponse(error_code=0, error_message=None, throttle_time_ms=250, partitions=[
            m.ProducedPartition("orders", 3, 0, None, 4711, (7 << 112) | 4711, 1_700_000_000_123),
            m.ProducedPartition("refünds", 1, 13, "partition refünds-1 is closed ✗", -2, -1, -4),
        ]),
    ),
}
