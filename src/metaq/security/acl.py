"""Access control lists: who may do what to which topic, group or the cluster (docs/security.md).

An :class:`AclEntry` allows or denies one principal (``User:alice``, or ``User:*`` for every
authenticated principal) one operation on the resources whose name equals a pattern (``literal``) or
starts with it (``prefix``). :meth:`Acls.allows` decides:

1. a super-user may do everything;
2. a matching ``deny`` entry refuses, whatever allows it (deny wins);
3. a matching ``allow`` entry permits;
4. nothing matches: refused (no ACL, no access).

Operations: ``produce``, ``consume``, ``describe``, ``admin``, and ``all`` (in an entry: every one of them).
An allowed ``produce``, ``consume`` or ``admin`` also allows ``describe`` of the same resource.

Stored as one JSON document (``{"acls": [...]}``): a file in embedded mode, a ZooKeeper node in cluster
mode. Sans-IO but for :class:`AclFile`.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from metaq.errors import ConfigError

RESOURCE_TYPES: Final = ("topic", "group", "cluster")
OPERATIONS: Final = ("produce", "consume", "describe", "admin", "all")
PATTERN_TYPES: Final = ("literal", "prefix")
PERMISSIONS: Final = ("allow", "deny")
ANY_PRINCIPAL: Final = "User:*"
CLUSTER_NAME: Final = "cluster"
ACL_FILE_NAME: Final = "acls.json"
_IMPLIES_DESCRIBE: Final = frozenset({"produce", "consume", "admin", "describe", "all"})


@dataclass(frozen=True, slots=True)
class AclEntry:
    principal: str
    resource_type: str
    pattern: str
    operation: str
    permission: str = "allow"
    pattern_type: str = "literal"

    def __post_init__(self) -> None:
        if not self.principal.startswith("User:") or len(self.principal) <= len("User:"):
            raise ValueError(f"principal {self.principal!r} is not User:NAME (or User:*)")
        for value, allowed, what in ((self.resource_type, RESOURCE_TYPES, "resource type"),
                                     (self.operation, OPERATIONS, "operation"),
                                     (self.permission, PERMISSIONS, "permission"),
                                     (self.pattern_type, PATTERN_TYPES, "pattern type")):
            if value not in allowed:
                raise ValueError(f"{what} {value!r} is not one of {', '.join(allowed)}")
        if self.resource_type == "cluster" and (self.pattern != CLUSTER_NAME or self.pattern_type != "literal"):
            raise ValueError("a cluster ACL has the literal pattern 'cluster'")
        if not self.pattern:
            raise ValueError("the pattern is empty")

    def matches(self, principal: str, resource_type: str, name: str, operation: str) -> bool:
        if self.principal not in (principal, ANY_PRINCIPAL) or self.resource_type != resource_type:
            return False
        if not (name == self.pattern if self.pattern_type == "literal" else name.startswith(self.pattern)):
            return False
        if self.operation in (operation, "all"):
            return True
        return operation == "describe" and self.permission == "allow" and self.operation in _IMPLIES_DESCRIBE

    def describe(self) -> str:
        kind = f"{self.pattern_type} " if self.resource_type != "cluster" else ""
        return f"{self.permission} {self.principal} {self.operation} on {self.resource_type} {kind}{self.pattern!r}"


class Acls:
    """A set of entries and the super-users: what :meth:`allows` decides (see the module docstring)."""

    def __init__(self, entries: Iterable[AclEntry] = (), super_users: Iterable[str] = ()) -> None:
        self.entries = tuple(dict.fromkeys(entries))
        self.super_users = frozenset(super_users)
        self._cache: dict[tuple[str, str, str, str], bool] = {}

    def allows(self, principal: str, resource_type: str, name: str, operation: str) -> bool:
        if principal in self.super_users:
            return True
        key = (principal, resource_type, name, operation)
        decided = self._cache.get(key)
        if decided is None:
            matching = [e for e in self.entries if e.matches(principal, resource_type, name, operation)]
            decided = bool(matching) and all(e.permission == "allow" for e in matching)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = decided
        return decided

    def to_json(self) -> dict[str, object]:
        return {"acls": [asdict(e) for e in self.entries]}

    @classmethod
    def from_json(cls, doc: object, super_users: Iterable[str] = ()) -> Acls:
        """ValueError when ``doc`` is not what :meth:`to_json` writes."""
        if not isinstance(doc, dict) or not isinstance(doc.get("acls"), list):
            raise ValueError('not an ACL document {"acls": [...]}')
        try:
            return cls((AclEntry(**e) for e in doc["acls"]), super_users)
        except TypeError as exc:
            raise ValueError(f"an ACL entry has unknown or missing fields: {exc}") from None

    def with_entry(self, entry: AclEntry) -> Acls:
        return Acls((*self.entries, entry), self.super_users)

    def without_entry(self, entry: AclEntry) -> Acls:
        return Acls((e for e in self.entries if e != entry), self.super_users)


def parse_super_users(text: str) -> tuple[str, ...]:
    """``User:a;User:b`` (``,`` works too) as principals; ValueError for anything else."""
    out = []
    for part in text.replace(",", ";").split(";"):
        part = part.strip()
        if not part:
            continue
        if not part.startswith("User:") or len(part) <= len("User:") or part == ANY_PRINCIPAL:
            raise ValueError(f"super-user {part!r} is not User:NAME")
        out.append(part)
    return tuple(out)


def decode_acls(data: bytes | str | None, super_users: Iterable[str] = ()) -> Acls:
    """An ACL document's bytes (None or empty: no entries); ConfigError when damaged."""
    if not data:
        return Acls((), super_users)
    try:
        return Acls.from_json(json.loads(data), super_users)
    except ValueError as exc:
        raise ConfigError(f"the ACLs are damaged: {exc}") from None


def encode_acls(acls: Acls) -> bytes:
    return json.dumps(acls.to_json(), indent=1).encode()


class AclFile:
    """The ACLs of an embedded broker in one JSON file, replaced atomically (as the users file is)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def read_bytes(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"cannot read the ACL file {self.path}: {exc.strerror or exc}") from None

    def stamp(self) -> tuple[int, int] | None:
        """What changes when the file does (modification time, size); None when there is no file."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size

    def update(self, change: str, entry: AclEntry) -> bool:
        """``change`` is ``add`` or ``remove``; False when nothing changed (already there / not there)."""
        with self._lock:
            acls = decode_acls(self.read_bytes())
            present = entry in acls.entries
            if (change == "add") == present:
                return False
            acls = acls.with_entry(entry) if change == "add" else acls.without_entry(entry)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(encode_acls(acls))
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            return True
