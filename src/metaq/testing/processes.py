"""What is still running: for tests that check a command left no process behind (Linux /proc)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["alive", "processes_using"]


def _running(proc_dir: Path) -> bool:
    """The process exists and is not a zombie (an orphan's zombie stays until PID 1 reaps it, which a
    container's PID 1 may never do)."""
    try:
        return (proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def alive(pid: int) -> bool:
    return _running(Path("/proc", str(pid)))


def processes_using(directory: str | Path) -> list[str]:
    """Running processes whose command line names ``directory`` (a ZooKeeper's config, a broker's data)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(directory) in cmdline and _running(entry):
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found
