"""Files on disk (issue 39, hole 10): a broker's data and state files are its user's alone by default.

Segments were 0644 in 0755 directories: any local user could read every message. ``fileUmask`` (default
077) is the broker process's umask; at start dataPath and dataLogPath also lose what it denies, so data an
older broker wrote (0644 files) is out of reach too: others cannot enter the directory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from metaq.client import Message, connect
from metaq.testing import BrokerProcess


def modes(root: Path) -> dict[str, int]:
    """Every file and directory under ``root`` (itself included) -> its permission bits."""
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            out[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return out


def use(proc: BrokerProcess) -> None:
    """Write messages (segments, indexes; the broker's state files are there from its start)."""
    with connect(proc.servers) as session:
        assert session.create_producer().send(Message("orders", b"secret payload")).success


def test_data_and_state_files_are_owner_only_by_default(broker_factory: Callable[..., BrokerProcess]) -> None:
    proc = broker_factory({"numPartitions": 1, "unflushThreshold": 1})
    use(proc)
    proc.stop()
    found = modes(proc.data_dir)
    assert "orders-0/00000000000000000000.log" in found and "consumer_offsets.log" in found, found
    others = {name: oct(mode) for name, mode in found.items() if mode & 0o077}
    assert others == {}, f"readable or writable by others: {others}"


def test_file_umask_sets_what_others_get(broker_factory: Callable[..., BrokerProcess]) -> None:
    proc = broker_factory({"numPartitions": 1, "unflushThreshold": 1, "fileUmask": "027"})
    use(proc)
    proc.stop()
    found = modes(proc.data_dir)
    segment = found["orders-0/00000000000000000000.log"]
    assert segment == 0o640
    assert found["orders-0"] == 0o750 and found["."] == 0o750


def test_an_existing_world_readable_data_path_is_closed_at_start(broker_factory: Callable[..., BrokerProcess],
                                                                  tmp_path: Path) -> None:
    old = broker_factory({"numPartitions": 1, "fileUmask": "022"}, name="broker")  # as brokers wrote before
    use(old)
    old.stop()
    assert stat.S_IMODE(old.data_dir.stat().st_mode) == 0o755
    again = broker_factory({"numPartitions": 1}, name="broker")
    assert stat.S_IMODE(again.data_dir.stat().st_mode) == 0o700
    assert any("mode 0755 -> 0700" in line for line in again.log_lines)
