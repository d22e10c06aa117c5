"""What a broker can say about itself: ApiVersions, Stats, LookupMessage, FindMessages and Verify."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from metaq import __version__
from metaq.broker.core import check_topic_name
from metaq.broker.session import Session
from metaq.errors import InvalidArgument, MessageNotFoundError, StorageError, UnknownPartitionError, UnknownTopicError
from metaq.protocol import messages as m
from metaq.security.acl import ACL_FILE_NAME, AclFile
from metaq.security.credentials import USERS_FILE_NAME, UsersFile
from metaq.storage.checkpoint import StoreReport
from metaq.storage.log import PartitionLog
from metaq.storage.verify import check_partition_files

if TYPE_CHECKING:
    from metaq.broker.core import Broker, Handler


def handle_api_versions(broker: Broker, req: m.ApiVersionsRequest, session: Session | None) -> m.ApiVersionsResponse:
    if session is not None and req.replica_id >= 0:
        session.replica_id = req.replica_id  # checked with the principal at each replica fetch (replica_access)
    apis = [m.ApiVersionRange(key, spec.min_version, spec.max_version) for key, spec in sorted(m.APIS.items())
            if spec.request in broker.handlers]
    return m.ApiVersionsResponse(broker_id=broker.config.broker_id, server_version=__version__, apis=apis)


def handle_stats(broker: Broker, req: m.StatsRequest, session: Session | None) -> m.StatsResponse:
    if req.topic is not None:
        check_topic_name(req.topic)
    snap = broker.stats.snapshot(req.topic)
    snap["broker_id"] = broker.config.broker_id
    snap["waiting_fetches"] = broker.waiters.waiting
    snap["version"] = __version__
    for tname, tstats in snap["topics"].items():
        for pname, pstats in tstats["partitions"].items():
            plog = broker.logs.get(tname, int(pname))
            if plog is not None:
                pstats["log_start_offset"] = plog.log_start_offset
                pstats["log_end_offset"] = plog.log_end_offset
    snap["storage"] = storage_report(broker, req.topic)
    snap["cluster"] = broker.cluster.describe()
    if broker.replication is not None and broker.slave is not None:
        snap["replication"] = broker.replication.describe()
    if broker.ha is not None:
        snap["replica_group"] = broker.ha.describe()
    return m.StatsResponse(stats_json=json.dumps(snap).encode())


def storage_report(broker: Broker, topic: str | None) -> dict[str, Any]:
    """Partitions with something to say about their data: a recovery cut at open, damaged ranges."""
    out: dict[str, Any] = {}
    for plog in sorted(broker.logs.logs(), key=lambda lg: (lg.topic, lg.partition)):
        tname, partition = plog.topic, plog.partition
        if topic is not None and tname != topic:
            continue
        entry: dict[str, Any] = {}
        if not plog.recovery.clean:
            entry["recovery"] = plog.recovery.to_json()
        damaged = plog.damaged_ranges
        if damaged:
            entry["damaged"] = [r.to_json() for r in damaged]
        if entry:
            out[f"{tname}-{partition}"] = entry
    return out


def handle_lookup_message(broker: Broker, req: m.LookupMessageRequest,
                          session: Session | None) -> m.LookupMessageResponse:
    try:
        topic, partition, offset = broker.logs.resolve_message_id(req.message_id)
    except StorageError as exc:
        raise MessageNotFoundError(str(exc)) from None
    plog = broker.logs.get(topic, partition)
    if plog is None or not plog.log_start_offset <= offset < plog.log_end_offset:
        raise MessageNotFoundError(f"message {req.message_id:032x} is no longer stored (retention)")
    return m.LookupMessageResponse(topic=topic, partition=partition, offset=offset)


async def handle_find_messages(broker: Broker, req: m.FindMessagesRequest,
                               session: Session | None) -> m.FindMessagesResponse:
    """Search this broker's partitions of a topic by key and/or time range (in a worker thread)."""
    check_topic_name(req.topic)
    if req.topic not in broker.topics:
        raise UnknownTopicError(f"topic {req.topic!r} does not exist")
    if req.partition < -1:
        raise UnknownPartitionError(f"partition must be >= 0, or -1 for every partition; got {req.partition}")
    if not 1 <= req.max_results <= m.MAX_FIND_RESULTS:
        raise InvalidArgument(f"max_results must be in 1..{m.MAX_FIND_RESULTS}, not {req.max_results}")
    if req.from_ms < -1 or req.to_ms < -1:
        raise InvalidArgument("from_ms and to_ms must be >= 0, or -1 for an open end")
    if req.from_ms >= 0 and req.to_ms >= 0 and req.to_ms < req.from_ms:
        raise InvalidArgument(f"to_ms {req.to_ms} is before from_ms {req.from_ms}")
    targets = [plog for plog in sorted(broker.logs.logs(), key=lambda lg: lg.partition)
               if plog.topic == req.topic and (req.partition < 0 or plog.partition == req.partition)]
    if req.partition >= 0 and not targets:
        raise UnknownPartitionError(f"topic {req.topic!r} has no partition {req.partition} on this broker")

    def search() -> m.FindMessagesResponse:
        resp = m.FindMessagesResponse()
        for plog in targets:
            if plog.closed:
                continue
            found = plog.find_messages(req.key, req.from_ms, req.to_ms, req.max_results)
            resp.messages.extend(m.FoundMessage(plog.partition, offset, message_id, ts, key)
                                 for offset, message_id, key, ts in found.rows)
            resp.truncated = resp.truncated or found.truncated
            resp.scanned_segments += found.scanned_segments
            resp.problems.extend(f"{plog.topic}-{plog.partition}: {p}" for p in found.problems)
        if len(resp.messages) > req.max_results:
            del resp.messages[req.max_results:]
            resp.truncated = True
        return resp

    return await asyncio.get_running_loop().run_in_executor(None, search)


async def handle_verify(broker: Broker, req: m.VerifyRequest, session: Session | None) -> m.VerifyResponse:
    """Scrub partitions (every byte and index entry) in a worker thread; reads go on meanwhile."""
    if req.topic is not None:
        check_topic_name(req.topic)
        if req.topic not in broker.topics:
            raise UnknownTopicError(f"topic {req.topic!r} does not exist")
    if req.partition < -1:
        raise UnknownPartitionError(f"partition must be >= 0, or -1 for every partition; got {req.partition}")
    targets = [plog for plog in sorted(broker.logs.logs(), key=lambda lg: (lg.topic, lg.partition))
               if (req.topic is None or plog.topic == req.topic)
               and (req.partition < 0 or plog.partition == req.partition)]
    if req.topic is not None and req.partition >= 0 and not targets:
        raise UnknownPartitionError(f"topic {req.topic!r} has no partition {req.partition} on this broker")
    loop = asyncio.get_running_loop()
    reports = await loop.run_in_executor(None, lambda: [_verify_partition(plog) for plog in targets
                                                        if not plog.closed])
    if req.topic is None:  # the whole broker: the stores beside the segments too
        reports += await loop.run_in_executor(None, lambda: [r.to_json() for r in verify_stores(broker)])
    return m.VerifyResponse(report_json=json.dumps(reports).encode())


def _verify_partition(plog: PartitionLog) -> dict[str, Any]:
    """A partition's report: its segments and indexes, then its epoch history and producer snapshots."""
    report = plog.verify().to_json()
    problems = check_partition_files(plog.directory)
    if problems:
        report["file_problems"] = problems
        report["ok"] = False
    return report


def verify_stores(broker: Broker) -> list[StoreReport]:
    """Check every record of the stores beside the segments as they are on disk (blocking; nothing modified):
    the offsets log, the transaction log, the delay store's targets, and in embedded mode the users and ACL
    files."""
    reports = [broker.groups.store.verify()]
    if broker.transactions is not None:
        reports.append(broker.transactions.txlog.verify())
    if broker.delay.root.is_dir():
        reports.append(broker.delay.verify())
    if broker.cluster.mode != "zookeeper":
        config = broker.config
        users = UsersFile(config.sasl_users_file or config.data_path / USERS_FILE_NAME)
        acls = AclFile(config.acl_file or config.data_path / ACL_FILE_NAME)
        for name, path, check in (("users", users.path, users.check), ("acls", acls.path, acls.check)):
            if path.exists():
                report = StoreReport(name, str(path))
                report.records, report.damaged = check()
                reports.append(report)
    return reports


HANDLERS: dict[type, Handler] = {
    m.ApiVersionsRequest: handle_api_versions,
    m.StatsRequest: handle_stats,
    m.LookupMessageRequest: handle_lookup_message,
    m.VerifyRequest: handle_verify,
    m.FindMessagesRequest: handle_find_messages,
}
