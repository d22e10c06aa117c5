"""Where a broker reads its users and ACLs: the cluster's store in ZooKeeper mode (the registry's
:class:`~metaq.cluster.registry.UserAclStore`), else its own files; and the job that keeps the ACLs in force
(``Broker.acls``, checked by :mod:`metaq.broker.authorization`) in step with the stored ones, re-reading
them every ``ACL_REFRESH_S`` (each change written to the audit log); and the secret unknown users' mock SCRAM
credentials are derived from (:func:`mock_secret`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from metaq.broker import audit
from metaq.errors import ConfigError, MetaqError
from metaq.fsutil import atomic_write
from metaq.security.acl import ACL_FILE_NAME, AclFile, Acls, decode_acls
from metaq.security.credentials import USERS_FILE_NAME, UsersFile
from metaq.security.scram import MockCredentials, ScramCredential

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


MOCK_SECRET_FILE: Final = ".mock-credentials.secret"
"""Beside the users file (embedded mode): the secret unknown users' mock credentials are derived from."""


def mock_secret(broker: Broker) -> bytes:
    """The secret of :class:`~metaq.security.scram.MockCredentials` (blocking): in ZooKeeper in cluster mode (the
    same for every broker), else in a file beside the users file (0600), made on first use."""
    store = broker.cluster.registry.user_acl_store()
    if store is not None:
        return store.shared_secret(lambda: os.urandom(32))
    config = broker.config
    users = Path(config.sasl_users_file or config.data_path / USERS_FILE_NAME)
    for directory in dict.fromkeys((users.parent, config.data_path)):
        path = directory / MOCK_SECRET_FILE
        try:
            data = path.read_bytes()
            if len(data) >= 32:
                return data
        except FileNotFoundError:
            pass
        except OSError:
            continue
        try:
            directory.mkdir(parents=True, exist_ok=True)
            atomic_write(path, os.urandom(32), mode=0o600, tmp_path=path.with_name(f"{path.name}.{os.getpid()}.tmp"))
            return path.read_bytes()
        except OSError as exc:
            log.warning("cannot keep the mock credential secret in %s: %s", directory, exc)
    log.warning("the mock credential secret lives in memory only: unknown users' salts change at each restart")
    return os.urandom(32)


async def mock_credentials(broker: Broker) -> MockCredentials:
    """The broker's :class:`~metaq.security.scram.MockCredentials` (its secret read or made on first use)."""
    if broker.mock_credentials is None:
        secret = await asyncio.to_thread(mock_secret, broker)
        if broker.mock_credentials is None:
            broker.mock_credentials = MockCredentials(secret, lambda: broker.user_iterations)
    return broker.mock_credentials


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


def _audit_acl_changes(broker: Broker, before: Acls, after: Acls) -> None:
    """The entries added and removed since the ACLs last read (written by ``metaq acl``, outside the broker)."""
    old, new = set(before.entries), set(after.entries)
    for entry in after.entries:
        if entry not in old:
            broker.audit(entry.principal, "acl-add", "acl", audit.DONE, None, entry.describe())
    for entry in before.entries:
        if entry not in new:
            broker.audit(entry.principal, "acl-remove", "acl", audit.DONE, None, entry.describe())


async def refresh_acls(broker: Broker) -> None:
    """Keep ``broker.acls`` in step with the stored ACLs (a background job when aclEnabled is set)."""
    source = acl_source(broker)
    seen: object = object()
    first = True
    while True:
        try:
            stamp, data = await asyncio.to_thread(source)
            if stamp != seen:
                before = broker.acls
                broker.acls = decode_acls(data, broker.config.super_users, source=acl_source_name(broker))
                log.info("ACLs loaded: %d entries, %d super-users", len(broker.acls.entries),
                         len(broker.acls.super_users))
                if first:
                    first = False
                else:
                    _audit_acl_changes(broker, before, broker.acls)
                seen = stamp
        except (ConfigError, MetaqError, OSError) as exc:
            log.error("ACLs not reloaded, the ones in force stay: %s", exc)
        await asyncio.sleep(ACL_REFRESH_S)
