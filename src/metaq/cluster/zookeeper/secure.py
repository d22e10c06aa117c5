"""``metaq cluster secure``: the ACLs of :mod:`metaq.cluster.zk_security` put on a tree that was made without them.

A cluster that ran with open znodes (no ``zk.zkSetAcl``) keeps them open after its brokers turn ACLs on:
ZooKeeper gives a node its ACL when it is made, and the persistent ones (users, the ACL document, replica
groups, offsets) stay. This walks every node under the root once, as Kafka's ``zookeeper-security-migration``
does, and sets each node's ACL to what a broker with ACLs on would have made it with, the session's identity
as owner. Consumer groups' nodes belong to their consumers: they are left as they are unless
``group_owner`` names the ZooKeeper user of those consumers.

It needs ZooKeeper's ADMIN permission on each node: an open node gives it to anyone, a node already owned
by the brokers' identity to that identity; a node owned by someone else is reported, never skipped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kazoo.exceptions import KazooException, NoAuthError, NoNodeError

from metaq.cluster.registry import RegistryError
from metaq.cluster.zk_security import AclEntry, acl_for
from metaq.cluster.zookeeper.session import ZooKeeperSession, entries_of, kazoo_acl

MAX_NODES = 1_000_000
"""A walk stops (and says so) past this many nodes: a root given by mistake ("/") must not run forever."""


@dataclass
class SecureReport:
    changed: list[tuple[str, tuple[AclEntry, ...], tuple[AclEntry, ...]]] = field(default_factory=list)
    """(path, ACL before, ACL after) of each node whose ACL was set (or would be, in a dry run)."""
    unchanged: int = 0
    left_open: list[str] = field(default_factory=list)
    """Consumer group nodes left as they were (no group owner given)."""
    failed: list[tuple[str, str]] = field(default_factory=list)
    """(path, why) of nodes whose ACL could not be read or set."""


def secure_tree(session: ZooKeeperSession, *, group_owner: str | None = None, dry_run: bool = False) -> SecureReport:
    identity = session.security.identity
    if identity is None:
        raise RegistryError("securing the tree needs a ZooKeeper identity to own it: give the brokers' ZooKeeper "
                            "user (--zk-user, METAQ_ZK_PASSWORD)")
    paths = session.paths
    client = session.client
    report = SecureReport()
    group_prefix = paths.consumers + "/"
    todo = [paths.root] if paths.root else []
    seen = 0
    while todo:
        path = todo.pop()
        seen += 1
        if seen > MAX_NODES:
            report.failed.append((path, f"stopped after {MAX_NODES} nodes"))
            break
        try:
            children = client.get_children(path)
            current_acl, stat = client.get_acls(path)
        except NoNodeError:
            continue  # gone meanwhile (an ephemeral node)
        except NoAuthError:
            report.failed.append((path, "not readable by this identity"))
            continue
        except KazooException as exc:
            report.failed.append((path, f"{type(exc).__name__}: {exc}"))
            continue
        todo.extend(f"{path}/{c}" for c in sorted(children, reverse=True))
        if path.startswith(group_prefix):
            if group_owner is None:
                report.left_open.append(path)
                continue
            wanted = acl_for(path, paths, ("sasl", group_owner))
        else:
            wanted = acl_for(path, paths, identity)
        current = entries_of(current_acl)
        if set(current) == set(wanted):
            report.unchanged += 1
            continue
        if not dry_run:
            try:
                client.set_acls(path, kazoo_acl(wanted), version=stat.aversion)
            except NoNodeError:
                continue
            except NoAuthError:
                report.failed.append((path, f"no ADMIN permission (its ACL: "
                                            f"{', '.join(str(e) for e in current)})"))
                continue
            except KazooException as exc:
                report.failed.append((path, f"{type(exc).__name__}: {exc}"))
                continue
        report.changed.append((path, current, wanted))
    return report
