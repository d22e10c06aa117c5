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

Stored as one JSON document (``{"acls": [...]}``) in a ZooKeeper node in cluster mode; in embedded mode,
a file of one text line per entry behind its checksums (:mod:`metaq.framing`), whose key is the entry's
permission and principal (``deny User:alice``). A damaged line never widens access: a lost ``allow``
entry only refuses what it allowed; a lost ``deny`` entry refuses its principal everything; a lost
entry whose key cannot be read refuses everyone but the super-users; each until the line is repaired (an
ERROR names it: delete the line, add the entry again). Damaged lines are written back as they are by
changes, never dropped without a word. A file an earlier version wrote (``{"acls": [...]}``) is still
read. Sans-IO but for :class:`AclFile`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from metaq import framing
from metaq.errors import ConfigError
from metaq.fsutil import atomic_write

RESOURCE_TYPES: Final = ("topic", "group", "cluster")
OPERATIONS: Final = ("produce", "consume", "describe", "admin", "all")
PATTERN_TYPES: Final = ("literal", "prefix")
PERMISSIONS: Final = ("allow", "deny")
ANY_PRINCIPAL: Final = "User:*"
CLUSTER_NAME: Final = "cluster"
ACL_FILE_NAME: Final = "acls.json"
_IMPLIES_DESCRIBE: Final = frozenset({"produce", "consume", "admin", "describe", "all"})
STORE: Final = "acls"

log = logging.getLogger("metaq.security")


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

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    def describe(self) -> str:
        kind = f"{self.pattern_type} " if self.resource_type != "cluster" else ""
        return f"{self.permission} {self.principal} {self.operation} on {self.resource_type} {kind}{self.pattern!r}"


class Acls:
    """A set of entries and the super-users: what :meth:`allows` decides (see the module docstring)."""

    def __init__(self, entries: Iterable[AclEntry] = (), super_users: Iterable[str] = (), *,
                 refused: Iterable[str] = (), damaged: Iterable[framing.LineDamage] = ()) -> None:
        self.entries = tuple(dict.fromkeys(entries))
        self.super_users = frozenset(super_users)
        self.refused = frozenset(refused)
        """Principals refused everything because an entry of theirs is damaged (``User:*``: everyone)."""
        self.damaged = tuple(damaged)
        """The damaged lines of the file these came from (written back as they are by a change)."""
        self._cache: dict[tuple[str, str, str, str], bool] = {}

    def allows(self, principal: str, resource_type: str, name: str, operation: str) -> bool:
        if principal in self.super_users:
            return True
        if self.refused and (principal in self.refused or ANY_PRINCIPAL in self.refused):
            return False
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
        return Acls((*self.entries, entry), self.super_users, refused=self.refused, damaged=self.damaged)

    def without_entry(self, entry: AclEntry) -> Acls:
        return Acls((e for e in self.entries if e != entry), self.super_users, refused=self.refused,
                    damaged=self.damaged)


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


def decode_acls(data: bytes | str | None, super_users: Iterable[str] = (), *, source: str = "the ACL file") -> Acls:
    """The ACLs of a JSON document's bytes (a ZooKeeper node, or a file an earlier version wrote) or of an ACL
    file's lines (None or empty: no entries). A damaged JSON document is a ConfigError; a damaged line refuses
    what it may have denied (see the module docstring), logged as an ERROR naming it."""
    if not data:
        return Acls((), super_users)
    raw = data.encode() if isinstance(data, str) else data
    if framing.is_text_lines(raw):
        return _decode_lines(raw, super_users, source)
    try:
        return Acls.from_json(json.loads(raw), super_users)
    except ValueError as exc:
        raise ConfigError(f"the ACLs are damaged: {exc}") from None


def _key(obj: dict[str, Any]) -> str:
    return f"{obj['permission']} {obj['principal']}"


def _decode_lines(data: bytes, super_users: Iterable[str], source: str) -> Acls:
    records, damaged = framing.parse_lines(data, _key)
    entries = []
    for n, record in enumerate(records):
        try:
            entries.append(AclEntry(**record))
        except (TypeError, ValueError) as exc:  # intact, but not an entry: as damaged, its key known
            key = f"{record.get('permission')} {record.get('principal')}"
            damaged.append(framing.LineDamage(n + 1, key, None, framing.encode_line(record, key).rstrip(b"\n"),
                                              f"not an ACL entry ({exc})"))
    refused = set()
    for d in damaged:
        permission, _, principal = (d.key or "").partition(" ")
        if d.key is not None and permission == "allow":
            cost = f"{principal} is no longer allowed what it allowed"
        elif d.key is not None and permission == "deny" and principal.startswith("User:"):
            refused.add(principal)
            cost = f"{principal} is refused everything until the line is repaired"
        else:
            refused.add(ANY_PRINCIPAL)
            cost = "what it denied cannot be read, so everyone but the super-users is refused until it is repaired"
        message = f"line {d.number} (a {d.describe_key()} entry) is damaged and skipped: {cost} " \
                  "(delete the line, then add the entry again with metaq acl add)"
        log.error("%s: %s", source, message)
        framing.DAMAGE.skipped_record(STORE, f"{source}: {message}")
    return Acls(entries, super_users, refused=refused, damaged=damaged)


def encode_acls(acls: Acls) -> bytes:
    """The JSON document of a ZooKeeper node."""
    return json.dumps(acls.to_json(), indent=1).encode()


def encode_acl_lines(acls: Acls) -> bytes:
    """The lines of an ACL file; its damaged lines kept as they are."""
    lines = [framing.encode_line(e.to_dict(), f"{e.permission} {e.principal}") for e in acls.entries]
    return b"".join(lines) + b"".join(d.text + b"\n" for d in acls.damaged)


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
            acls = decode_acls(self.read_bytes(), source=str(self.path))
            present = entry in acls.entries
            if (change == "add") == present:
                return False
            acls = acls.with_entry(entry) if change == "add" else acls.without_entry(entry)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, encode_acl_lines(acls), mode=0o600,
                         tmp_path=self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp"))
            return True

    def check(self) -> tuple[int, list[str]]:
        """(entries, damaged lines) of the file as it is on disk: for verify; modifies nothing."""
        data = self.read_bytes()
        if not data or not framing.is_text_lines(data):
            return 0, []
        records, damaged = framing.parse_lines(data, _key)
        return len(records), [f"line {d.number} (a {d.describe_key()} entry) is damaged" for d in damaged]
