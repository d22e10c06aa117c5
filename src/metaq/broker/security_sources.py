"""Where a broker reads its users and ACLs: the cluster's store in ZooKeeper mode (the registry's
:class:`~metaq.cluster.registry.UserAclStore`), else its own files; and the job that keeps the ACLs in force
(``Broker.acls``, checked by :mod:`metaq.broker.authorization`) in step with the stored ones, re-reading
them every ``ACL_REFRESH_S``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from metaq.errors import ConfigError, MetaqError
from metaq.security.acl import ACL_FILE_NAME, AclFile, decode_acls
from metaq.security.credentials import USERS_FILE_NAME, UsersFile
from metaq.security.scram import ScramCredential

if TYPE_CHECKING:
    from metaq.broker.core import Broker

log = logging.getLogger("metaq.broker.auth")

ACL_REFRESH_S: Final = 1.0


CredentialLookup = Callable[[str], ScramCredential | None]


def credential_lookup(broker: Broker) -> CredentialLookup:
    """Where ``broker`` finds a user's credential (blocking): ZooKeeper in cluster mode, else its users file."""
    store = broker.cluster.registry.user_acl_store()
    if store is not None:
        def from_zookeeper(name: str) -> ScramCredential | None:
            data = store.read_user(name)
            if data is None:
                return None
            try:
                return ScramCredential.from_json(json.loads(data))
            except ValueError as exc:
                raise ConfigError(f"user {name!r} in ZooKeeper is damaged: {exc}") from None

        return from_zookeeper
    config = broker.config
    return UsersFile(config.sasl_users_file or config.data_path / USERS_FILE_NAME).lookup


def acl_source(broker: Broker) -> Callable[[], tuple[object, bytes | None]]:
    """A blocking function giving (a stamp that changes with the ACLs, their bytes) for ``broker``."""
    store = broker.cluster.registry.user_acl_store()
    if store is not None:
        def from_zookeeper() -> tuple[object, bytes | None]:
            data, version = store.read_acls()
            return version, data

        return from_zookeeper
    config = broker.config
    acl_file = AclFile(config.acl_file or config.data_path / ACL_FILE_NAME)

    def from_file() -> tuple[object, bytes | None]:
        stamp = acl_file.stamp()
        return stamp, acl_file.read_bytes() if stamp is not None else None

    return from_file


def acl_source_name(broker: Broker) -> str:
    """Where ``broker``'s ACLs are stored, for messages."""
    if broker.cluster.mode == "zookeeper":
        return "the ACLs in ZooKeeper"
    return str(broker.config.acl_file or broker.config.data_path / ACL_FILE_NAME)


async def refresh_acls(broker: Broker) -> None:
    """Keep ``broker.acls`` in step with the stored ACLs (a background job when aclEnabled is set)."""
    source = acl_source(broker)
    seen: object = object()
    while True:
        try:
            stamp, data = await asyncio.to_thread(source)
            if stamp != seen:
                broker.acls = decode_acls(data, broker.config.super_users, source=acl_source_name(broker))
                log.info("ACLs loaded: %d entries, %d super-users", len(broker.acls.entries),
                         len(broker.acls.super_users))
                seen = stamp
        except (ConfigError, MetaqError, OSError) as exc:
            log.error("ACLs not reloaded, the ones in force stay: %s", exc)
        await asyncio.sleep(ACL_REFRESH_S)
