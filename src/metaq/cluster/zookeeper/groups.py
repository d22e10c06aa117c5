"""The group registry: consumer groups the MetaQ way, in ZooKeeper.

``consumers/<group>/ids/<consumerId>`` (ephemeral, kept by the session) names a member and its topics;
``owners/<topic>/<brokerId-partition>`` (ephemeral, dies with its session: see
:mod:`metaq.cluster.zookeeper.session`) the member fetching a partition; ``offsets/<topic>/<brokerId-partition>``
(persistent) the group's committed offset.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.recipe.watchers import ChildrenWatch

from metaq.cluster import layout
from metaq.cluster.layout import LayoutError
from metaq.cluster.zookeeper.session import ZooKeeperSession
from metaq.errors import InvalidArgument
from metaq.types import PartitionId

log = logging.getLogger("metaq.cluster.zookeeper")


class GroupNodes:
    """Members, owners and offsets of consumer groups (:class:`metaq.cluster.registry.GroupRegistry`'s
    methods, and the reads the group tools make)."""

    def __init__(self, session: ZooKeeperSession) -> None:
        self._session = session
        self.paths = session.paths
        self._lock = session.lock
        self._member_listeners: dict[str, list[Callable[[], None]]] = {}
        """group ids path -> the listeners of its one watch"""

    def register_member(self, group: str, consumer_id: str, topics: Iterable[str]) -> None:
        self._session.keep(self.paths.group_member(group, consumer_id), layout.member_data(sorted(topics)))

    def unregister_member(self, group: str, consumer_id: str) -> None:
        self._session.drop(self.paths.group_member(group, consumer_id))

    def members(self, group: str) -> dict[str, list[str]]:
        path = self.paths.group_ids(group)
        try:
            names = self._session.client.get_children(path)
        except NoNodeError:
            return {}
        out = {}
        for name in names:
            try:
                data, _ = self._session.client.get(f"{path}/{name}")
            except NoNodeError:
                continue
            try:
                out[name] = layout.parse_member_data(data)
            except LayoutError as exc:
                self._session.bad(f"{path}/{name}", str(exc))
        return out

    def watch_members(self, group: str, listener: Callable[[], None]) -> None:
        """One watch per group, however many consumers of it share this session: each gets every change."""
        path = self.paths.group_ids(group)
        with self._lock:
            listeners = self._member_listeners.setdefault(path, [])
            first = not listeners
            listeners.append(listener)
        if not first:
            listener()
            return
        self._session.ensure(path)

        def on_children(_children: list[str]) -> bool:
            if self._session.closed:
                return False
            with self._lock:
                current = list(self._member_listeners.get(path, ()))
            for each in current:
                try:
                    each()
                except Exception:  # one consumer's bug must not starve the others
                    log.exception("group member listener failed")
            return True

        ChildrenWatch(self._session.client, path, on_children)

    def claim(self, group: str, topic: str, partition: PartitionId, owner: str) -> bool:
        path = self.paths.group_owner(group, topic, str(partition))
        data = owner.encode()
        try:
            self._session.create(path, data, ephemeral=True, makepath=True)
        except NodeExistsError:
            # Ours already only if this session made it *for this owner* (two consumers of one group
            # may share a session).
            try:
                held, stat = self._session.client.get(path)
            except NoNodeError:
                return False  # released just now: the caller retries
            if held != data or stat.ephemeralOwner != self._session.session_id:
                return False
        self._session.remember(path, data)
        return True

    def alive(self, group: str, consumer_id: str) -> bool:
        """A round trip to ZooKeeper on this session: True while the member is registered on it (a
        consumer renews its fetch lease with it)."""
        try:
            _, stat = self._session.client.get(self.paths.group_member(group, consumer_id))
        except NoNodeError:
            return False
        return bool(stat.ephemeralOwner == self._session.session_id)

    def release(self, group: str, topic: str, partition: PartitionId, owner: str) -> None:
        path = self.paths.group_owner(group, topic, str(partition))
        self._session.forget(path)
        try:
            data, stat = self._session.client.get(path)
            if data == owner.encode():
                self._session.client.delete(path, version=stat.version)
        except (NoNodeError, BadVersionError, NotEmptyError):
            pass

    def release_all(self, group: str, owner: str) -> None:
        prefix = self.paths.group(group) + "/owners/"
        data = owner.encode()
        mine = [p for p, d in self._session.owned(prefix).items() if d == data]
        for path in mine:
            topic, name = path[len(prefix):].split("/", 1)
            self.release(group, topic, PartitionId.parse(name), owner)

    def owners(self, group: str, topic: str) -> dict[PartitionId, str]:
        path = self.paths.group_owners(group, topic)
        try:
            names = self._session.client.get_children(path)
        except NoNodeError:
            return {}
        out = {}
        for name in names:
            try:
                partition = PartitionId.parse(name)
            except InvalidArgument as exc:
                self._session.bad(f"{path}/{name}", str(exc))
                continue
            with contextlib.suppress(NoNodeError):
                out[partition] = self._session.client.get(f"{path}/{name}")[0].decode(errors="replace")
        return out

    def load_offset(self, group: str, topic: str, partition: PartitionId) -> int | None:
        path = self.paths.group_offset(group, topic, str(partition))
        try:
            data, _ = self._session.client.get(path)
        except NoNodeError:
            return None
        try:
            return layout.parse_offset_data(data)[0]
        except LayoutError as exc:
            self._session.bad(path, str(exc))
            return None

    def commit_offsets(self, group: str, offsets: Mapping[tuple[str, PartitionId], int]) -> None:
        for (topic, partition), offset in offsets.items():
            path = self.paths.group_offset(group, topic, str(partition))
            data = layout.offset_data(offset)
            try:
                self._session.client.set(path, data)
            except NoNodeError:
                try:
                    self._session.create(path, data, makepath=True)
                except NodeExistsError:
                    self._session.client.set(path, data)

    # ------------------------------------------------------------------ reading groups (tools)

    def groups(self) -> list[str]:
        """Every consumer group with a node under ``consumers/`` (members, owners or offsets)."""
        return self._session.children(self.paths.consumers)

    def group_topics(self, group: str) -> list[str]:
        """The topics a group owns partitions of or has offsets for."""
        return sorted(set(self._session.children(f"{self.paths.group(group)}/owners"))
                      | set(self._session.children(f"{self.paths.group(group)}/offsets")))

    def offsets(self, group: str, topic: str) -> dict[PartitionId, int]:
        """Every committed offset of ``group`` in ``topic`` (partition -> next offset to read)."""
        path = self.paths.group_offsets(group, topic)
        out = {}
        for name in self._session.children(path):
            try:
                partition = PartitionId.parse(name)
                data, _ = self._session.client.get(f"{path}/{name}")
                out[partition] = layout.parse_offset_data(data)[0]
            except NoNodeError:
                continue
            except (InvalidArgument, LayoutError) as exc:
                self._session.bad(f"{path}/{name}", str(exc))
        return dict(sorted(out.items()))
