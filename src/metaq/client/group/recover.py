"""The local recover store: messages that failed ``1 + maxFetchRetries`` times, kept on disk and retried.

MetaQ's RecoverStorageManager. The consumer moves on past such a message (so one bad message does not
stop its partition) and hands it here; a background task offers every stored message to the topic's
listener again every ``recoverMessageIntervalInMills`` until the listener accepts it, across restarts.

Layout: ``<recover_dir>/<group>/<topic>-<brokerId>-<partition>-<offset 20 digits>.msg`` (the message's
``brokerId-partition`` and offset), each file one record batch
holding the one message, stamped with its offset and id, written to a temp file, fsynced, renamed and
the directory fsynced — so a stored message survives a crash and a half-written one never appears.
A message is removed (unlinked) once the listener accepted it. Recovered messages come back in no
particular order relative to the partition's live messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from metaq.errors import CorruptRecordError, InvalidArgument
from metaq.fsutil import atomic_write, fsync_directory, pid_alive
from metaq.protocol.records import decode_batch, encode_messages, stamp
from metaq.types import Message

log = logging.getLogger("metaq.client.group.recover")

RECOVER_MESSAGES_MAX = 100_000
"""Past this many stored messages of one group, a rejected message is dropped (and logged) instead."""

_SAFE = re.compile(r"[^A-Za-z0-9._@-]")
_NAME = re.compile(r"(.+)-(\d+)-(\d+)-(\d{20})\.msg")


class RecoverStore:
    """MetaQ's recover store: messages that kept failing, kept on disk and offered to the listener again.

    One directory per group under ``directory``; see the module docstring for the layout and guarantees."""

    def __init__(self, directory: str | Path, group: str, *, fsync: bool = True,
                 max_messages: int = RECOVER_MESSAGES_MAX) -> None:
        self.directory = Path(directory).expanduser() / _SAFE.sub("_", group)
        self.fsync = fsync
        self.max_messages = max_messages
        self.attempts: dict[str, int] = {}
        """File name -> background deliveries that failed (since this process started)."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metaq-recover")

    # -- blocking parts (run in the store's thread) ------------------------------------------------

    def _name(self, msg: Message) -> str:
        return f"{msg.topic}-{msg.broker_id}-{msg.partition}-{msg.offset:020d}.msg"

    def _put_sync(self, msg: Message) -> bool:
        self.directory.mkdir(parents=True, exist_ok=True)
        if len(os.listdir(self.directory)) >= self.max_messages:
            return False
        raw = bytearray(encode_messages([msg]))
        stamp(raw, msg.offset, msg.id if msg.id >= 0 else 0, msg.append_time_ms)
        path = self.directory / self._name(msg)
        tmp = self.directory / f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        atomic_write(path, bytes(raw), sync=os.fsync if self.fsync else None, tmp_path=tmp)
        return True

    def _sync_dir(self) -> None:
        if self.fsync:
            fsync_directory(self.directory)

    def _list_sync(self) -> list[tuple[str, Message]]:
        if not self.directory.exists():
            return []
        out: list[tuple[str, Message]] = []
        for name in sorted(os.listdir(self.directory)):
            if name.endswith(".tmp"):
                if not _writer_alive(name):
                    with contextlib.suppress(FileNotFoundError):
                        (self.directory / name).unlink()  # a write cut short by a crash
                continue
            match = _NAME.fullmatch(name)
            if match is None:
                continue
            try:
                msgs = decode_batch((self.directory / name).read_bytes(), match.group(1), int(match.group(3)),
                                    broker_id=int(match.group(2)))
            except (OSError, CorruptRecordError) as exc:
                log.error("recover store: cannot read %s (%s); leaving it", name, exc)
                continue
            if len(msgs) == 1:
                out.append((name, msgs[0]))
        return out

    def _remove_sync(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.directory / name).unlink()
        self._sync_dir()

    # -- async API ---------------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., object], *args: object) -> object:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def put(self, msg: Message) -> bool:
        """Store a rejected message durably; False if the store is full (the message is dropped)."""
        if msg.partition < 0 or msg.broker_id < 0 or msg.offset < 0:
            raise InvalidArgument("only a consumed message (with partition and offset) can be recovered")
        return bool(await self._run(self._put_sync, msg))

    async def messages(self) -> list[tuple[str, Message]]:
        """Every stored message with its file name, in file-name order (topic, partition, offset)."""
        result = await self._run(self._list_sync)
        assert isinstance(result, list)
        return result

    async def count(self) -> int:
        """How many messages the store holds."""
        return len(await self.messages())

    async def recover_once(self, deliver: Callable[[Message], Awaitable[bool]]) -> int:
        """Offer every stored message to ``deliver`` once; remove the accepted ones. Returns how many."""
        done = 0
        for name, msg in await self.messages():
            ok = False
            try:
                ok = await deliver(msg)
            except Exception as exc:  # the listener failing again is the expected case here
                log.debug("recover of %s failed again: %s", name, exc)
            if ok:
                await self._run(self._remove_sync, name)
                self.attempts.pop(name, None)
                done += 1
            else:
                self.attempts[name] = self.attempts.get(name, 0) + 1
        return done

    def close(self) -> None:
        """Stop the store's thread (after what it is doing)."""
        self._executor.shutdown(wait=True)


def _writer_alive(tmp_name: str) -> bool:
    """Whether the process that is writing ``<name>.<pid>.<thread>.tmp`` still runs (then leave it be)."""
    parts = tmp_name.split(".")
    try:
        pid = int(parts[-3])
    except (IndexError, ValueError):
        return False
    return pid == os.getpid() or pid_alive(pid)
