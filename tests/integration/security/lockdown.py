"""A broker locked down as docs/security.md says, and the principals of issue 39, for the security tests.

TLS only (``serverPort=-1``, ``sslPort``), SCRAM users, ACLs (``aclEnabled``, ``superUsers=User:root``), the HTTP
API and the dashboard over HTTPS, quotas, the limits before authentication and the audit log. The principals:

- ``root``: a super-user;
- ``alice``: may produce to ``orders``;
- ``bob``: may consume ``audit`` and use group ``bob-group`` (and write ``%DLQ%bob-group``, as every
  dead-lettering consumer must);
- ``carol``: no ACL at all.

Topics ``orders``, ``audit`` and ``payroll`` exist, one partition each.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli_process import metaq
from http_client import Reply, check_reply

from metaq.client.blocking import BlockingClient
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.net.tls import ClientTls
from metaq.protocol import messages as m
from metaq.security.acl import ACL_FILE_NAME, AclEntry, AclFile
from metaq.security.credentials import USERS_FILE_NAME, UsersFile
from metaq.security.scram import make_credential
from metaq.testing import BrokerProcess
from metaq.testing.certs import Pki, make_pki

PASSWORDS = {"root": "root pw", "alice": "alice pw", "bob": "bob pw", "carol": "carol pw"}
TOPICS = ("orders", "audit", "payroll")


def acl(where: list[str], *args: str) -> None:
    """``metaq acl ARGS WHERE`` (the CLI, as an operator changes ACLs)."""
    done = metaq("acl", *args, *where)
    assert done.returncode == 0, done.stderr


def add_user(where: list[str], name: str, password: str) -> None:
    done = metaq("acl", "user", "add", name, *where, env={**os.environ, "METAQ_PASSWORD": password})
    assert done.returncode == 0, done.stderr


def allow(data: Path, principal: str, resource_type: str, name: str, *operations: str, prefix: bool = False) -> None:
    """An ACL entry written as ``metaq acl add`` writes it (in-process: the CLI's own tests start it)."""
    store = AclFile(data / ACL_FILE_NAME)
    for op in operations:
        store.update("add", AclEntry(principal, resource_type, name, op, "allow", "prefix" if prefix else "literal"))


def lock_down(data: Path, pki: Pki) -> dict[str, Any]:
    """Users and ACLs into ``data``; the broker options of a locked-down broker."""
    users = UsersFile(data / USERS_FILE_NAME)
    for user, password in PASSWORDS.items():
        users.put(user, make_credential(password))
    allow(data, "User:alice", "topic", "orders", "produce")
    allow(data, "User:bob", "topic", "audit", "consume")
    allow(data, "User:bob", "group", "bob-group", "consume")
    allow(data, "User:bob", "topic", "%DLQ%bob-group", "produce", "consume")
    return {"serverPort": -1, "sslPort": 0, "sslCertFile": str(pki.server_cert), "sslKeyFile": str(pki.server_key),
            "sslCaFile": str(pki.ca), "authRequired": True, "aclEnabled": True, "superUsers": "User:root",
            "httpPort": 0, "dashboardHttpPort": 0, "numPartitions": 1, "unflushThreshold": 0, "auditLog": True}


@dataclass
class LockedDown:
    """A running locked-down broker and how each principal reaches it."""

    broker: BrokerProcess
    pki: Pki

    @property
    def servers(self) -> str:
        return f"127.0.0.1:{self.broker.tls_port}"

    @property
    def address(self) -> tuple[str, int]:
        assert self.broker.tls_port is not None
        return "127.0.0.1", self.broker.tls_port

    def tls(self) -> ClientTls:
        return ClientTls(str(self.pki.ca))

    def client(self, user: str) -> BlockingClient:
        return BlockingClient(self.servers, tls=self.tls(), username=user, password=PASSWORDS[user])

    def settings(self, user: str | None, password: str | None = None) -> ConnectionSettings:
        return ConnectionSettings("lockdown-test", 10.0, 30.0, 16, 64 << 20, ssl_context=self.tls().context(),
                                  sasl_username=user, sasl_password=password or (PASSWORDS[user] if user else None))

    @contextmanager
    def connection(self, user: str | None) -> Iterator[BlockingConnection]:
        conn = BlockingConnection.open(self.address, self.settings(user))
        try:
            yield conn
        finally:
            conn.close()

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.pki.ca))

    def http(self, method: str, path: str, user: str | None, body: Any = None, *, base: str | None = None,
             password: str | None = None, headers: dict[str, str] | None = None, timeout_s: float = 60.0) -> Reply:
        """An HTTPS request to the HTTP API (``base``: another server of the broker, the dashboard)."""
        hdrs = dict(headers or {})
        if user is not None:
            token = base64.b64encode(f"{user}:{password or PASSWORDS.get(user, 'x')}".encode()).decode()
            hdrs["Authorization"] = f"Basic {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        url = (base or str(self.broker.http_url)) + path
        req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=self.ssl_context()) as resp:
                return Reply(resp.status, resp.read(), resp.headers)
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, exc.read(), exc.headers)

    def documented(self, method: str, template: str, reply: Reply) -> None:
        """Assert the OpenAPI description (/openapi.json) documents ``reply`` for ``method template``."""
        doc = self.http("GET", "/openapi.json", None).json
        check_reply(doc, method, template, reply)

    @property
    def dashboard(self) -> str:
        assert self.broker.metrics_url is not None
        return self.broker.metrics_url.rsplit("/metrics", 1)[0]

    def audit_lines(self) -> list[str]:
        return [line.split("metaq.audit: ", 1)[1] for line in self.broker.log_lines if "metaq.audit: " in line]


def start_locked_down(broker_factory: Callable[..., BrokerProcess], tmp_path: Path,
                      more: dict[str, Any] | None = None, *, topics: tuple[str, ...] = TOPICS) -> LockedDown:
    pki = make_pki(tmp_path / "pki")
    options = lock_down(tmp_path / "broker", pki)
    broker = broker_factory({**options, **(more or {})})
    locked = LockedDown(broker, pki)
    with locked.client("root") as root:
        for topic in topics:
            root.request(m.CreateTopicRequest(topic, 1, []))
    return locked
