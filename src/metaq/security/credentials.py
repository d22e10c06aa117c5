"""Stored SCRAM credentials: the users file of an embedded broker (ZooKeeper mode keeps them in ZooKeeper,
:mod:`metaq.cluster.zookeeper`, in JSON form).

The file holds one text line per user, ``{"user": "alice", "mechanism": "SCRAM-SHA-256", "salt": ...,
"iterations": ..., "stored_key": ..., "server_key": ...}`` behind its checksums (:mod:`metaq.framing`), so a
damaged line costs that user only (it cannot log in; an ERROR names it) and never the others. It is
replaced whole (:func:`metaq.fsutil.atomic_write`, mode 0600: temp file, fsync, rename, fsync the
directory), so a broker reading it sees the old or the new version, never half of one; a damaged line
is written back as it is (never dropped without a word) until the user is added or removed again. A file
an earlier version wrote (``{"users": {...}}``) is still read. The broker reads the file again whenever
its modification time or size changes: ``metaq acl user add`` takes effect at the next authentication,
without a restart.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Final

from metaq import framing
from metaq.errors import ConfigError
from metaq.fsutil import atomic_write
from metaq.security.principal import check_user_name
from metaq.security.scram import ScramCredential

USERS_FILE_NAME: Final = "users.json"
STORE: Final = "users"

log = logging.getLogger("metaq.security")


def _key(obj: dict[str, Any]) -> str:
    return str(obj["user"])


class UsersFile:
    """The users of an embedded broker, in one JSON file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None
        self._users: dict[str, ScramCredential] = {}

    def _read(self) -> dict[str, ScramCredential]:
        return self._read_all()[0]

    def _read_all(self) -> tuple[dict[str, ScramCredential], list[framing.LineDamage]]:
        """The users, and the damaged lines (each logged as an ERROR and counted)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}, []
        except OSError as exc:
            raise ConfigError(f"cannot read the users file {self.path}: {exc.strerror or exc}") from None
        if not framing.is_text_lines(data):  # {"users": {...}}, as an earlier version wrote it
            try:
                doc = json.loads(data)
                users = doc["users"]
                if not isinstance(users, dict):
                    raise TypeError("users is not an object")
                return {check_user_name(name): ScramCredential.from_json(cred) for name, cred in users.items()}, []
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"the users file {self.path} is damaged: {exc}") from None
        records, damaged = framing.parse_lines(data, _key)
        out: dict[str, ScramCredential] = {}
        for n, record in enumerate(records):
            try:
                out[check_user_name(record["user"])] = ScramCredential.from_json(
                    {k: v for k, v in record.items() if k != "user"})
            except (ValueError, KeyError, TypeError) as exc:  # intact, but not a user: skipped like damage
                key = str(record.get("user", "?"))
                damaged.append(framing.LineDamage(n + 1, key, None, framing.encode_line(record, key).rstrip(b"\n"),
                                                  f"not a user ({exc})"))
        for d in damaged:
            message = (f"line {d.number} (user {d.describe_key()}) is damaged and skipped: that user cannot log in "
                       "until it is added again (metaq acl user add)")
            log.error("the users file %s: %s", self.path, message)
            framing.DAMAGE.skipped_record(STORE, f"{self.path}: {message}")
        return out, damaged

    def check(self) -> tuple[int, list[str]]:
        """(users, damaged lines) of the file as it is on disk: for verify; modifies nothing."""
        try:
            data = self.path.read_bytes()
        except OSError:
            return 0, []
        if not framing.is_text_lines(data):
            return 0, []
        records, damaged = framing.parse_lines(data, _key)
        return len(records), [f"line {d.number} (user {d.describe_key()}) is damaged" for d in damaged]

    def lookup(self, name: str) -> ScramCredential | None:
        """The credential of ``name`` as the file says now (re-read when it changed); ConfigError if the file
        is unreadable or damaged."""
        with self._lock:
            try:
                st = self.path.stat()
                seen: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
            except FileNotFoundError:
                seen = None
            if seen != self._seen or seen is None:
                self._users = self._read()
                self._seen = seen
            return self._users.get(name)

    def names(self) -> list[str]:
        return sorted(self._read())

    def put(self, name: str, credential: ScramCredential) -> bool:
        """Add or replace ``name``; True if it was new."""
        check_user_name(name)
        with self._lock:
            users, damaged = self._read_all()
            new = name not in users
            users[name] = credential
            self._write(users, [d for d in damaged if d.key != name])
            return new

    def remove(self, name: str) -> bool:
        """Remove ``name``; False if there was no such user (a damaged line of that user is removed too)."""
        with self._lock:
            users, damaged = self._read_all()
            kept = [d for d in damaged if d.key != name]
            if users.pop(name, None) is None and len(kept) == len(damaged):
                return False
            self._write(users, kept)
            return True

    def _write(self, users: dict[str, ScramCredential], damaged: list[framing.LineDamage]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lines = [framing.encode_line({"user": name, **cred.to_json()}, name) for name, cred in sorted(users.items())]
        lines += [d.text + b"\n" for d in damaged]  # never dropped without a word: kept until the user is added again
        atomic_write(self.path, b"".join(lines), mode=0o600,
                     tmp_path=self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp"))
