"""What a change of users does to a running broker: connections of a removed user (or one whose password
changed) are closed, the change goes to the audit log, and unknown users' mock credentials follow the stored
users' iteration counts (docs/security.md#authentication-step-by-step).

Users are written outside the broker (``metaq acl user add|remove`` writes the users file, or ZooKeeper in
cluster mode), so a background job looks every :data:`USER_CHECK_S`:

- the stored users: the users file when its stamp changed (embedded mode); ZooKeeper's list of user nodes
  (cluster mode; one round trip), their credentials read when a name appears and every
  :data:`ITERATIONS_REFRESH_S`;
- every principal with connections authenticated by SASL: its credential is looked up again (one round trip per
  principal in cluster mode), and if the user is gone or its StoredKey is not the one the connection
  authenticated with, each of its connections is closed. Kafka reaches the same end with
  ``connections.max.reauth.ms`` (a session must authenticate again); closing at once is simpler and closer.

A connection identified by its client certificate is not touched: its identity is the certificate's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from metaq.broker import audit
from metaq.broker.security_sources import credential_lookup
from metaq.errors import ConfigError, MetaqError
from metaq.security.credentials import USERS_FILE_NAME, UsersFile
from metaq.security.principal import USER_PREFIX

if TYPE_CHECKING:
    from metaq.broker.core import Broker

log = logging.getLogger("metaq.broker.auth")

USER_CHECK_S: Final = 1.0
ITERATIONS_REFRESH_S: Final = 60.0
"""Cluster mode: how often every user's credential is read again for the iteration counts."""

Users = dict[str, tuple[bytes, int]]
"""name -> (StoredKey, iterations) of the stored users."""


class _StoredUsers:
    """The stored users as last read (blocking calls: run in a worker thread)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = broker.cluster.registry.user_acl_store()
        config = broker.config
        self.file = None if self.store is not None else UsersFile(config.sasl_users_file
                                                                   or config.data_path / USERS_FILE_NAME)
        self.stamp: object = None
        self.users: Users = {}
        self.read_all_at = 0.0

    def read(self) -> Users | None:
        """The users if they may have changed since the last call, else None."""
        if self.file is not None:
            stamp = _file_stamp(self.file.path)
            if stamp == self.stamp:
                return None
            self.stamp = stamp
            users: Users = {}
            for name in self.file.names():
                credential = self.file.lookup(name)
                if credential is not None:
                    users[name] = (credential.stored_key, credential.iterations)
            return users
        assert self.store is not None
        names = self.store.list_users()
        every = time.monotonic() - self.read_all_at >= ITERATIONS_REFRESH_S
        if not every and set(names) == set(self.users):
            return None
        if every:
            self.read_all_at = time.monotonic()
        lookup = credential_lookup(self.broker)
        users = {}
        for name in names:
            known = self.users.get(name)
            if known is not None and not every:
                users[name] = known
                continue
            credential = lookup(name)
            if credential is not None:
                users[name] = (credential.stored_key, credential.iterations)
        return users


def _file_stamp(path: Any) -> object:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def audit_user_changes(broker: Broker, before: Users, after: Users) -> None:
    for name in sorted(after.keys() - before.keys()):
        broker.audit(USER_PREFIX + name, "user-add", f"user:{name}", audit.DONE, None)
    for name in sorted(before.keys() - after.keys()):
        broker.audit(USER_PREFIX + name, "user-remove", f"user:{name}", audit.DONE, None)
    for name in sorted(before.keys() & after.keys()):
        if before[name][0] != after[name][0]:
            broker.audit(USER_PREFIX + name, "user-change", f"user:{name}", audit.DONE, None, "a new password")


def close_outdated(broker: Broker, current: Callable[[str], bytes | None]) -> int:
    """Close the SASL-authenticated connections whose user is gone or whose StoredKey changed (``current(name)``:
    the StoredKey stored now, None when the user is gone); how many were closed."""
    closed = 0
    for principal in list(broker.sessions.by_principal):
        name = principal.removeprefix(USER_PREFIX)
        stored = current(name)
        for session in broker.sessions.of(principal):
            if session.credential_key is None or stored == session.credential_key:
                continue
            why = "its user was removed" if stored is None else "its user's password changed"
            log.info("closing the connection of %s from %s: %s", principal, session.peer, why)
            broker.audit(principal, "connection", "cluster", audit.CLOSED, session.peer, why)
            broker.sessions.discard(session)
            if session.close is not None:
                session.close(why)
            closed += 1
    return closed


async def watch_users(broker: Broker) -> None:
    """The background job (with authRequired): see the module docstring."""
    stored = _StoredUsers(broker)
    first = True
    while True:
        try:
            users = await asyncio.to_thread(stored.read)
            if users is not None:
                if not first:
                    audit_user_changes(broker, stored.users, users)
                first = False
                stored.users = users
                broker.user_iterations = [iterations for _key, iterations in users.values()]
            principals = list(broker.sessions.by_principal)
            if principals:
                keys = await asyncio.to_thread(_current_keys, broker, stored, principals)
                close_outdated(broker, keys.get)
        except (ConfigError, MetaqError, OSError) as exc:
            log.error("cannot check the users (removed users' connections stay open meanwhile): %s", exc)
        await asyncio.sleep(USER_CHECK_S)


def _current_keys(broker: Broker, stored: _StoredUsers, principals: list[str]) -> dict[str, bytes]:
    """The StoredKey of each principal's user now (absent: the user is gone)."""
    if stored.file is not None:  # the file was just read: its users are current
        return {name: key for name, (key, _i) in stored.users.items()}
    lookup = credential_lookup(broker)
    out = {}
    for principal in principals:
        name = principal.removeprefix(USER_PREFIX)
        credential = lookup(name)
        if credential is not None:
            out[name] = credential.stored_key
    return out
