"""How ``metaq stats`` prints a slave's ``replication`` section (docs/replication.md#lag)."""

from __future__ import annotations

from typing import Any


def replication_lines(doc: dict[str, Any]) -> list[str]:
    """The lines for one broker's Stats document: none unless the broker is a slave.

    A header line (which slave, of which master, its mode and maximum lag), then one tab-separated row per
    followed partition: its ``brokerId-partition``, the slave's log end, the master's log end as of the
    slave's last reply from it, the lag in messages and in ms (``-`` before the first reply), and
    whether it is stalled; a stalled partition's reason follows on a ``#`` line of its own.
    """
    section = doc.get("replication")
    if not isinstance(section, dict):
        return []
    broker_id = section.get("broker_id", doc.get("broker_id"))
    master = section.get("master") or "(none registered: waiting for a master)"
    lines = [f"# replication: slave {section.get('slave_id', '?')} of broker {broker_id} "
             f"({section.get('mode', 'async')}), master {master}, max lag {_num(section.get('max_lag_messages'))} "
             f"messages, {_num(section.get('max_lag_ms'))} ms",
             "topic\tpartition\tslave_end\tmaster_end\tlag_messages\tlag_ms\tstalled"]
    reasons = []
    for topic, partitions in sorted((section.get("partitions") or {}).items()):
        for number, entry in sorted(partitions.items(), key=_by_number):
            name = f"{broker_id}-{number}"
            stalled = str(entry.get("stalled") or "")
            lines.append("\t".join((topic, name, _num(entry.get("log_end_offset")),
                                    _num(entry.get("master_end_offset")), _num(entry.get("lag_messages")),
                                    _num(entry.get("lag_ms")), "yes" if stalled else "no")))
            if stalled:
                reasons.append(f"# stalled {topic} {name}: {stalled}")
    return lines + reasons


def _by_number(item: tuple[str, Any]) -> int:
    return int(item[0]) if item[0].isdigit() else -1


def _num(value: Any) -> str:
    """A Stats figure; ``-`` for the broker's "not known yet" (-1) or a missing one."""
    return str(value) if isinstance(value, int) and value >= 0 else "-"
