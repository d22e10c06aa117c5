"""`metaq acl add|remove|list` (ACL entries) and `metaq acl user add|remove|list` (SASL/SCRAM users).

Both are written where the brokers read them, not through a broker (so the first user can be made
before any broker would let anyone in): the users file of an embedded broker (``--data-path`` or
``--users-file``; the broker re-reads it when it changes), or ZooKeeper in cluster mode (``-z``; every
broker reads it at each authentication). Only the hashed credential is stored (salt, iterations,
StoredKey, ServerKey). The password comes from METAQ_PASSWORD or a prompt, never from an argument.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import click

from metaq.cli.options import DEFAULT_ZK_ROOT, zk_security_config, zk_security_of, zk_security_options
from metaq.cluster.registry import RegistryError, UserAclStore
from metaq.errors import ConfigError, MetaqError
from metaq.security.acl import (
    ACL_FILE_NAME,
    CLUSTER_NAME,
    OPERATIONS,
    AclEntry,
    AclFile,
    decode_acls,
    encode_acls,
)
from metaq.security.credentials import USERS_FILE_NAME, UsersFile
from metaq.security.principal import check_user_name
from metaq.security.scram import DEFAULT_ITERATIONS, MAX_ITERATIONS, MIN_ITERATIONS, ScramCredential, make_credential


class _Store(Protocol):
    def put(self, name: str, credential: ScramCredential) -> bool: ...
    def remove(self, name: str) -> bool: ...
    def names(self) -> list[str]: ...


class _ZooKeeperUsers:
    def __init__(self, store: UserAclStore) -> None:
        self.store = store

    def put(self, name: str, credential: ScramCredential) -> bool:
        return self.store.write_user(name, json.dumps(credential.to_json()).encode())

    def remove(self, name: str) -> bool:
        return self.store.delete_user(name)

    def names(self) -> list[str]:
        return self.store.list_users()


@contextmanager
def _zookeeper(zk_connect: str, zk_root: str) -> Iterator[UserAclStore]:
    """The users and ACLs of the cluster in ZooKeeper, for the time of one command."""
    from metaq.cluster.zookeeper import ZooKeeperRegistry

    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    security = click.get_current_context().meta.get(_ZK_SECURITY)
    try:
        registry = ZooKeeperRegistry(zk_connect, zk_root, connection_timeout_ms=10_000, watch_cluster=False,
                                     read_only=True, security=security)
        registry.start()
    except MetaqError as exc:  # ZooKeeper unreachable, a root that is no ZooKeeper path
        raise click.ClickException(str(exc)) from None
    try:
        yield registry.user_acl_store()
    except (RegistryError, ConfigError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        registry.close()


@contextmanager
def _store(data_path: str | None, users_file: str | None, zk_connect: str | None, zk_root: str) -> Iterator[_Store]:
    given = [x for x in (data_path, users_file, zk_connect) if x]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --data-path (embedded broker), --users-file, or --zk-connect "
                               "(cluster mode)")
    if zk_connect:
        with _zookeeper(zk_connect, zk_root) as store:
            yield _ZooKeeperUsers(store)
        return
    path = Path(users_file) if users_file else Path(data_path or ".").expanduser() / USERS_FILE_NAME
    yield UsersFile(path)


def _store_options(file_name: str, file_option: str, file_help: str) -> Callable[[Any], Any]:
    """Where the users or ACLs are kept: an embedded broker's file, or ZooKeeper in cluster mode."""
    def decorate(fn: Any) -> Any:
        options = [
            click.option("--data-path", default=None, help=f"Embedded broker: its dataPath ({file_name} in it)."),
            click.option(file_option, default=None, help=file_help),
            click.option("-z", "--zk-connect", default=None, envvar="METAQ_ZK_CONNECT",
                         help="Cluster mode: ZooKeeper host:port[,host:port] (env METAQ_ZK_CONNECT)."),
            click.option("--zk-root", default=DEFAULT_ZK_ROOT, show_default=True, envvar="METAQ_ZK_ROOT"),
        ]
        for option in reversed(options):
            fn = option(fn)
        return zk_security_options(_keep_zk_security(fn))
    return decorate


_ZK_SECURITY = "metaq.zk_security"


def _keep_zk_security(fn: Any) -> Any:
    """The ZooKeeper security flags, kept in the click context for :func:`_zookeeper` (as the brokers' ZooKeeper
    user, nodes made get the ACLs of docs/security.md#zookeeper)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, zk_user: str | None, zk_tls: bool, zk_ca_file: str | None, zk_cert_file: str | None,
                zk_key_file: str | None, **kwargs: Any) -> Any:
        options = zk_security_config(zk_user, zk_tls, zk_ca_file, zk_cert_file, zk_key_file)
        click.get_current_context().meta[_ZK_SECURITY] = zk_security_of(options)
        return fn(*args, **kwargs)

    return wrapper


_where = _store_options(USERS_FILE_NAME, "--users-file", "Embedded broker: its saslUsersFile.")


@click.group("acl")
def acl_group() -> None:
    """ACLs (who may do what to which topic, group or the cluster) and users (SASL/SCRAM); docs/security.md."""


@acl_group.group("user")
def user_group() -> None:
    """Add, remove and list users (hashed SCRAM-SHA-256 credentials)."""


def _name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return check_user_name(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


@user_group.command("add")
@click.argument("name", callback=_name)
@click.option("--iterations", type=click.IntRange(MIN_ITERATIONS, MAX_ITERATIONS), default=DEFAULT_ITERATIONS,
              show_default=True, help="PBKDF2 iterations of the stored credential.")
@_where
def user_add(name: str, iterations: int, data_path: str | None, users_file: str | None, zk_connect: str | None,
             zk_root: str) -> None:
    """Add user NAME, or change its password (from METAQ_PASSWORD, else asked twice)."""
    password = os.environ.get("METAQ_PASSWORD") or click.prompt(f"password for {name}", hide_input=True,
                                                                 confirmation_prompt=True, err=True)
    credential = make_credential(password, iterations=iterations)
    with _store(data_path, users_file, zk_connect, zk_root) as store:
        new = store.put(name, credential)
    click.echo(f"{'added' if new else 'changed the password of'} user {name}", err=True)


@user_group.command("remove")
@click.argument("name", callback=_name)
@_where
def user_remove(name: str, data_path: str | None, users_file: str | None, zk_connect: str | None,
                zk_root: str) -> None:
    """Remove user NAME (its open connections stay authenticated until they close)."""
    with _store(data_path, users_file, zk_connect, zk_root) as store:
        if not store.remove(name):
            raise click.ClickException(f"no user {name!r}")
    click.echo(f"removed user {name}", err=True)


@user_group.command("list")
@_where
def user_list(data_path: str | None, users_file: str | None, zk_connect: str | None, zk_root: str) -> None:
    """The user names, one a line."""
    with _store(data_path, users_file, zk_connect, zk_root) as store:
        for name in store.names():
            click.echo(name)


# -- ACL entries -------------------------------------------------------------------------------------


class _AclStore(Protocol):
    def update(self, change: str, entry: AclEntry) -> bool: ...
    def entries(self) -> tuple[AclEntry, ...]: ...


class _FileAcls:
    def __init__(self, path: Path) -> None:
        self.file = AclFile(path)

    def update(self, change: str, entry: AclEntry) -> bool:
        return self.file.update(change, entry)

    def entries(self) -> tuple[AclEntry, ...]:
        return decode_acls(self.file.read_bytes(), source=str(self.file.path)).entries


class _ZooKeeperAcls:
    def __init__(self, store: UserAclStore) -> None:
        self.store = store

    def update(self, change: str, entry: AclEntry) -> bool:
        while True:  # a version-checked write: two admins at once do not lose each other's change
            data, version = self.store.read_acls()
            acls = decode_acls(data)
            if (change == "add") == (entry in acls.entries):
                return False
            acls = acls.with_entry(entry) if change == "add" else acls.without_entry(entry)
            if self.store.write_acls(encode_acls(acls), version):
                return True

    def entries(self) -> tuple[AclEntry, ...]:
        return decode_acls(self.store.read_acls()[0]).entries


@contextmanager
def _acl_store(data_path: str | None, acl_file: str | None, zk_connect: str | None,
               zk_root: str) -> Iterator[_AclStore]:
    given = [x for x in (data_path, acl_file, zk_connect) if x]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --data-path (embedded broker), --acl-file, or --zk-connect "
                               "(cluster mode)")
    if zk_connect:
        with _zookeeper(zk_connect, zk_root) as store:
            yield _ZooKeeperAcls(store)
        return
    try:
        yield _FileAcls(Path(acl_file) if acl_file else Path(data_path or ".").expanduser() / ACL_FILE_NAME)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


_acl_where = _store_options(ACL_FILE_NAME, "--acl-file", "Embedded broker: its aclFile.")


def _entry_options(fn: Any) -> Any:
    options = [
        click.option("--principal", required=True, help="User:NAME (a SCRAM user or a certificate CN), or User:*."),
        click.option("--topic", default=None, help="The topic (or topic prefix, with --prefix)."),
        click.option("--group", default=None, help="The consumer group (or prefix, with --prefix)."),
        click.option("--cluster", is_flag=True, help="The cluster itself (stats, reload, verify, promote)."),
        click.option("--prefix", is_flag=True, help="The name is a prefix: every topic/group starting with it."),
        click.option("-o", "--operation", "operations", multiple=True, required=True,
                     type=click.Choice(OPERATIONS), help="What is allowed (or denied); repeat for several."),
        click.option("--deny", is_flag=True, help="A deny entry (deny beats any allow)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return _acl_where(fn)


def _entries(principal: str, topic: str | None, group: str | None, cluster: bool, prefix: bool,
             operations: tuple[str, ...], deny: bool) -> list[AclEntry]:
    resources = [(t, n) for t, n in (("topic", topic), ("group", group), ("cluster", CLUSTER_NAME if cluster else None))
                 if n]
    if len(resources) != 1:
        raise click.UsageError("give exactly one of --topic, --group and --cluster")
    (resource_type, name), = resources
    if prefix and resource_type == "cluster":
        raise click.UsageError("--prefix applies to --topic and --group")
    try:
        return [AclEntry(principal, resource_type, name, op, "deny" if deny else "allow",
                         "prefix" if prefix else "literal") for op in dict.fromkeys(operations)]
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@acl_group.command("add")
@_entry_options
def acl_add(principal: str, topic: str | None, group: str | None, cluster: bool, prefix: bool,
            operations: tuple[str, ...], deny: bool, data_path: str | None, acl_file: str | None,
            zk_connect: str | None, zk_root: str) -> None:
    """Add ACL entries (brokers with aclEnabled apply them within a second)."""
    with _acl_store(data_path, acl_file, zk_connect, zk_root) as store:
        for entry in _entries(principal, topic, group, cluster, prefix, operations, deny):
            added = store.update("add", entry)
            click.echo(f"{'added' if added else 'already there'}: {entry.describe()}", err=True)


@acl_group.command("remove")
@_entry_options
def acl_remove(principal: str, topic: str | None, group: str | None, cluster: bool, prefix: bool,
               operations: tuple[str, ...], deny: bool, data_path: str | None, acl_file: str | None,
               zk_connect: str | None, zk_root: str) -> None:
    """Remove ACL entries (exactly as they were added)."""
    with _acl_store(data_path, acl_file, zk_connect, zk_root) as store:
        for entry in _entries(principal, topic, group, cluster, prefix, operations, deny):
            if not store.update("remove", entry):
                raise click.ClickException(f"no such entry: {entry.describe()}")
            click.echo(f"removed: {entry.describe()}", err=True)


@acl_group.command("list")
@_acl_where
def acl_list(data_path: str | None, acl_file: str | None, zk_connect: str | None, zk_root: str) -> None:
    """Every ACL entry, one a line."""
    with _acl_store(data_path, acl_file, zk_connect, zk_root) as store:
        for entry in store.entries():
            click.echo(entry.describe())

