"""What the dashboard's JSON says, built on the event loop from the broker's own state.

The numbers come from :func:`metaq.broker.metrics.take_snapshot` (what ``/metrics`` reports: offsets,
sizes, segments, closed partitions, committed offsets and lag) and the dashboard's history (rates);
group members and owners from the group coordinator. The admin actions build the same protocol
requests the CLI sends (``PartitionState``, an admin ``OffsetCommit`` with no generation) and hand them
to :meth:`metaq.broker.core.Broker.handle`, so validation, durability and refusals are the broker's own.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from metaq import __version__
from metaq import errors as e
from metaq.broker.dashboard.history import History, Rates
from metaq.broker.metrics import COUNTER_FIELDS, Snapshot
from metaq.protocol import messages as m

if TYPE_CHECKING:
    from metaq.broker.core import Broker

STATUS_BY_CODE: dict[int, int] = {
    e.UnknownTopicError.code: 404,
    e.UnknownPartitionError.code: 404,
    e.UnknownGroupError.code: 404,
    e.InvalidTopicError.code: 400,
    e.InvalidRequestError.code: 400,
    e.NotMasterError.code: 409,
    e.IllegalGenerationError.code: 409,
    e.UnknownMemberError.code: 409,
    e.RebalanceInProgressError.code: 409,
    e.NotCoordinatorError.code: 409,
    e.FencedEpochError.code: 409,
    e.BrokerStoppingError.code: 503,
    e.StorageFailureError.code: 503,
    e.DiskFullError.code: 507,
}
"""Wire error code -> HTTP status for what the admin actions can answer; anything else is 500."""

_PUT_MSGS, _GET_MSGS = COUNTER_FIELDS.index("put_messages"), COUNTER_FIELDS.index("get_messages")
PARTITION_LABEL = re.compile(r"^(?:(\d{1,9})-)?(\d{1,9})$")


class DashboardError(Exception):
    """A request the dashboard answers with a 4xx/5xx JSON error: ``{"error": {"status", "name", "message"}}``."""

    def __init__(self, status: int, name: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.name = name
        self.message = message

    def to_json(self) -> dict[str, Any]:
        return {"error": {"status": self.status, "name": self.name, "message": self.message}}

    @classmethod
    def from_code(cls, code: int, message: str | None) -> DashboardError:
        err = e.error_class(code)
        return cls(STATUS_BY_CODE.get(code, 500), err.name, message or err.hint or err.name)


def _rates(history: History, topic: str, label: str) -> dict[str, float]:
    return history.partition_rates.get((topic, label), Rates()).to_json()


def broker_view(broker: Broker, snap: Snapshot, history: History) -> dict[str, Any]:
    cluster = broker.cluster
    doc: dict[str, Any] = {
        "id": snap.broker_id, "role": snap.role, "version": __version__, "uptime_s": round(snap.uptime_s, 1),
        "host": broker.host, "port": broker.port, "data_path": snap.data_path,
        "cluster_mode": getattr(cluster, "mode", "standalone"),
        "connections": snap.connections, "waiting_fetches": snap.waiting_fetches,
        "rates": history.rates.to_json(),
        "fsync": {"count": snap.fsync[1], "mean_ms": round(snap.fsync[2] / snap.fsync[1] * 1000, 3)
                  if snap.fsync[1] else None},
    }
    if snap.replica_group is not None:
        doc["replica_group"] = snap.replica_group
    if snap.replication:
        doc["replication"] = [{"topic": t, "partition": p, "lag_messages": n, "lag_s": s, "stalled": bool(st),
                               "errors": err} for t, p, n, s, st, err in snap.replication]
    return doc


def topics_view(broker: Broker, snap: Snapshot, history: History) -> list[dict[str, Any]]:
    counters = {(topic, label): values for topic, label, values in snap.counters}
    by_topic: dict[str, list[dict[str, Any]]] = {name: [] for name in sorted(broker.topics)}
    for topic, label, start, end, size, segments, closed in snap.logs:
        values = counters.get((topic, label))
        by_topic.setdefault(topic, []).append({
            "partition": label, "start_offset": start, "end_offset": end, "messages": end - start,
            "size_bytes": size, "segments": segments, "state": "closed" if closed else "open",
            "messages_in_total": values[_PUT_MSGS] if values else 0,
            "messages_out_total": values[_GET_MSGS] if values else 0,
            **_rates(history, topic, label)})
    out = []
    for name, partitions in by_topic.items():
        state = broker.topics.get(name)
        total = Rates()
        for p in partitions:
            total.in_msgs += p["in_msg_s"]
            total.in_bytes += p["in_bytes_s"]
            total.out_msgs += p["out_msg_s"]
            total.out_bytes += p["out_bytes_s"]
        out.append({"name": name, "num_partitions": state.num_partitions if state is not None else len(partitions),
                    "messages": sum(p["messages"] for p in partitions),
                    "size_bytes": sum(p["size_bytes"] for p in partitions),
                    "closed": sum(1 for p in partitions if p["state"] == "closed"),
                    **total.to_json(), "partitions": partitions})
    return out


def group_showing(group: dict[str, Any], may_topic: Callable[[str], bool]) -> dict[str, Any]:
    """``group`` (a :func:`groups_view` entry) with only the topics ``may_topic`` allows: its partitions, its
    members' topics and partitions, and its lag over what is left."""
    partitions = [p for p in group["partitions"] if may_topic(p["topic"])]
    members = [{**mb, "topics": [t for t in mb["topics"] if may_topic(t)],
                "owns": [o for o in mb["owns"] if may_topic(o.rsplit(":", 1)[0])]} for mb in group["members"]]
    return {**group, "members": members, "partitions": partitions, "lag": sum(int(p["lag"]) for p in partitions)}


def cluster_showing(doc: dict[str, Any], may_topic: Callable[[str], bool], may_group: Callable[[str], bool], *,
                    problems: bool) -> dict[str, Any]:
    """The cluster view (ZooKeeper mode) with only the topics and groups allowed; its problems (which name
    topics and groups in words) only to a principal that may describe the cluster."""
    groups = []
    for g in doc.get("groups", ()):
        if may_group(g["group"]):
            partitions = [p for p in g["partitions"] if may_topic(p["topic"])]
            groups.append({**g, "partitions": partitions, "lag": sum(int(p["lag"] or 0) for p in partitions)})
    replication = [{**r, "slaves": [{**sl, "partitions": [p for p in sl["partitions"] if may_topic(p["topic"])]}
                                    for sl in r["slaves"]]} for r in doc.get("replication", ())]
    return {**doc, "topics": [t for t in doc.get("topics", ()) if may_topic(t["topic"])], "groups": groups,
            "replication": replication, "problems": doc.get("problems", []) if problems else []}


def groups_view(broker: Broker, snap: Snapshot) -> list[dict[str, Any]]:
    coordinator = broker.groups
    names = {g for g, *_ in snap.group_offsets} | set(coordinator.groups)
    out = []
    for name in sorted(names):
        group = coordinator.groups.get(name)
        owners = {(tp.topic, str(tp.partition)): member for tp, member in coordinator.owners(name).items()}
        members = []
        if group is not None:
            for mid, mb in sorted(group.members.items()):
                owned = sorted(f"{t}:{p}" for t, ps in mb.assignment.items() for p in ps)
                members.append({"id": mid, "client_id": mb.client_id, "topics": list(mb.topics), "owns": owned})
        ends = {(t, label): end for t, label, _s, end, *_ in snap.logs}
        partitions: list[dict[str, Any]] = [
            {"topic": topic, "partition": label, "owner": owners.get((topic, label)), "committed": offset,
             "end_offset": ends.get((topic, label)), "lag": lag}
            for g, topic, label, offset, lag in snap.group_offsets if g == name]
        out.append({"name": name, "state": group.state if group is not None else "Empty",
                    "generation": group.generation if group is not None else 0, "members": members,
                    "lag": sum(int(p["lag"]) for p in partitions), "partitions": partitions})
    return out


def find(items: list[dict[str, Any]], name: str, what: str, error_name: str) -> dict[str, Any]:
    for item in items:
        if item["name"] == name:
            return item
    raise DashboardError(404, error_name, f"no {what} {name!r} on this broker (known here: "
                         f"{', '.join(sorted(i['name'] for i in items)[:20]) or 'none'})")


# -- admin actions ------------------------------------------------------------------------------


def parse_partition(broker: Broker, text: str) -> int:
    """``brokerId-partition`` of this broker, or a bare partition number -> the partition number."""
    found = PARTITION_LABEL.match(text)
    if found is None:
        raise DashboardError(400, "INVALID_REQUEST", f"partition must be brokerId-partition or a number, not {text!r}")
    own = broker.config.broker_id
    if found.group(1) is not None and int(found.group(1)) != own:
        raise DashboardError(404, e.UnknownPartitionError.name,
                             f"partition {text} belongs to broker {found.group(1)}; this is broker {own}: "
                             "use that broker's dashboard")
    return int(found.group(2))


async def _answer(broker: Broker, request: Any) -> Any:
    response = broker.handle(request)
    if inspect.isawaitable(response):
        response = await response
    if response.error_code:
        raise DashboardError.from_code(response.error_code, response.error_message)
    return response


async def set_partition_open(broker: Broker, topic: str, partition_text: str, open_: bool) -> dict[str, Any]:
    """What `metaq topic open/close TOPIC -p N` does: a PartitionState request to this broker."""
    partition = parse_partition(broker, partition_text)
    await _answer(broker, m.PartitionStateRequest(topic=topic, partition=partition, open=open_))
    return {"topic": topic, "partition": f"{broker.config.broker_id}-{partition}",
            "state": "open" if open_ else "closed"}


def parse_reset(body: Any) -> tuple[str, str | int, list[str] | None]:
    """(topic, "earliest" | "latest" | offset, partitions or None) from a reset request's JSON body."""
    if not isinstance(body, dict):
        raise DashboardError(400, "INVALID_REQUEST", 'the body must be a JSON object: {"topic": "T", "to": '
                             '"earliest" | "latest" | offset, "partitions": ["1-0", ...] (optional)}')
    topic = body.get("topic")
    if not isinstance(topic, str) or not topic:
        raise DashboardError(400, "INVALID_REQUEST", '"topic" must be a topic name')
    to = body.get("to", "earliest")
    if isinstance(to, str) and to.isdigit():
        to = int(to)
    if isinstance(to, bool) or not (to in ("earliest", "latest") or (isinstance(to, int) and to >= 0)):
        raise DashboardError(400, "INVALID_REQUEST", f'"to" must be "earliest", "latest" or an offset >= 0, not {to!r}')
    partitions = body.get("partitions")
    if partitions is not None and (not isinstance(partitions, list)
                                   or not all(isinstance(p, str | int) and not isinstance(p, bool)
                                              for p in partitions)):
        raise DashboardError(400, "INVALID_REQUEST", '"partitions" must be a list like ["1-0", "1-2"]')
    return topic, to, None if partitions is None else [str(p) for p in partitions]


async def reset_group(broker: Broker, group: str, body: Any) -> dict[str, Any]:
    """What `metaq group reset GROUP TOPIC --to X [-p ...]` does for this broker's partitions: an admin
    OffsetCommit (no generation), which the coordinator refuses while the group has active members."""
    if getattr(broker.cluster, "mode", "standalone") == "zookeeper":
        raise DashboardError(409, "NOT_COORDINATOR", "in ZooKeeper mode a group's offsets are in ZooKeeper: use "
                             "`metaq group reset --zk-connect ...`")
    topic, to, wanted = parse_reset(body)
    state = broker.topics.get(topic)
    if state is None:
        raise DashboardError(404, e.UnknownTopicError.name, f"topic {topic!r} does not exist on this broker")
    numbers = list(range(state.num_partitions)) if wanted is None else [parse_partition(broker, p) for p in wanted]
    own = broker.config.broker_id
    entries, moved = [], {}
    old = {str(pid): c.offset for (t, pid), c in broker.groups.store.group_offsets(group).items() if t == topic}
    for number in dict.fromkeys(numbers):
        if not 0 <= number < state.num_partitions:
            raise DashboardError(404, e.UnknownPartitionError.name, f"topic {topic!r} has partitions "
                                 f"{own}-0..{own}-{state.num_partitions - 1} here; got {own}-{number}")
        _state, plog = broker.partition_log(topic, number)
        start, end = plog.log_start_offset, plog.log_end_offset
        target = start if to == "earliest" else end if to == "latest" else min(max(int(to), start), end)
        entries.append(m.OffsetEntry(topic, own, number, target))
        moved[f"{own}-{number}"] = {"from": old.get(f"{own}-{number}", -1), "to": target}
    response = await _answer(broker, m.OffsetCommitRequest(group=group, generation=m.NO_GENERATION, member_id="",
                                                           offsets=entries))
    refused = [r for r in response.results if r.error_code]
    if refused:
        raise DashboardError.from_code(refused[0].error_code, response.error_message)
    return {"group": group, "topic": topic, "moved": moved}

