"""Stored SCRAM credentials: the users file of an embedded broker (ZooKeeper mode keeps them in ZooKeeper,
:mod:`metaq.cluster.zookeeper`, in the same JSON form).

The file is JSON, ``{"users": {"alice": {"mechanism": "SCRAM-SHA-256", "salt": ..., "iterations": ...,
"stored_key": ..., "server_key": ...}}}``, written whole to a temporary file and renamed over the old one
(mode 0600), so a broker reading it sees the old or the new version, never half of one. The broker reads
it again whenever its modification time or size changes: ``metaq acl user add`` takes effect at the
next authentication, without a restart.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Final

from metaq.errors import ConfigError
from metaq.security.principal import check_user_name
from metaq.security.scram import ScramCredential

USERS_FILE_NAME: Final = "users.json"


class UsersFile:
    """The users of an embedded broker, in one JSON file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None
        self._users: dict[str, ScramCredential] = {}

    def _read(self) -> dict[str, ScramCredential]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ConfigError(f"cannot read the users file {self.path}: {exc.strerror or exc}") from None
        try:
            doc = json.loads(text)
            users = doc["users"]
            if not isinstance(users, dict):
                raise TypeError("users is not an object")
            return {check_user_name(name): ScramCredential.from_json(cred) for name, cred in users.items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"the users file {self.path} is damaged: {exc}") from None

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
            users = self._read()
            new = name not in users
            users[name] = credential
            self._write(users)
            return new

    def remove(self, name: str) -> bool:
        """Remove ``name``; False if there was no such user."""
        with self._lock:
            users = self._read()
            if users.pop(name, None) is None:
                return False
            self._write(users)
            return True

    def _write(self, users: dict[str, ScramCredential]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"users": {name: cred.to_json() for name, cred in sorted(users.items())}}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(doc, out, indent=1)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
