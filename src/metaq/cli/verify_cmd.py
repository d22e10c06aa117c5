"""`metaq admin verify`: have a broker scrub its stored data and print what is damaged.

Exit codes follow fsck's spirit: 0 every partition checked is intact, 1 damage (or an error), 2 usage.
"""

from __future__ import annotations

import json
from typing import Any

import click

from metaq.cli.options import PARTITION, target_options
from metaq.cli.session import holders, open_session, run_async
from metaq.types import PartitionId


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def _describe_store(report: dict[str, Any]) -> list[str]:
    head = f"store {report['store']} of broker {report.get('broker_id', '?')} ({report['path']}): " \
           f"{_plural(report['records'], 'record')} intact"
    if report["ok"]:
        return [f"{head}: ok", *(f"  note: {n}" for n in report.get("notes", []))]
    return [f"{head}: DAMAGED", *(f"  {line}" for line in report["damaged"])]


def _describe(report: dict[str, Any]) -> list[str]:
    if "store" in report:
        return _describe_store(report)
    name = f"{report['topic']}:{report.get('broker_id', '?')}-{report['partition']}"
    head = (f"{name}: {_plural(report['segments'], 'segment')}, {_plural(report['messages'], 'message')} intact "
            f"in offsets {report['log_start_offset']}..{report['log_end_offset'] - 1}")
    if report["ok"]:
        return [f"{head}: ok"]
    lines = [f"{head}: DAMAGED"]
    for r in report["damaged"]:
        lines.append(f"  offsets {r['first_offset']}..{r['resume_offset'] - 1} unreadable "
                     f"({_plural(r['messages'], 'message')} lost if skipped; segment {r['segment_base_offset']}, "
                     f"byte {r['position']}): {r['problem']}")
        lines.append(f"    consumers can resume at offset {r['resume_offset']} (see docs/operations.md)")
    for problem in report["index_problems"]:
        lines.append(f"  index: {problem}")
    for problem in report.get("file_problems", []):
        lines.append(f"  file: {problem}")
    return lines


@click.command("verify")
@target_options
@click.option("-t", "--topic", default=None, help="Only this topic (default: every topic).")
@click.option("-p", "--partition", type=PARTITION, default=None,
              help="Only this partition of --topic: brokerId-partition (a bare number if only one broker has it).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=3600.0, show_default=True,
              help="Seconds to wait for the broker: it reads every stored byte once.")
@click.option("--json", "as_json", is_flag=True, help="Print the broker's reports as JSON.")
@run_async
async def admin_verify(servers: str, topic: str | None, partition: PartitionId | int | None, timeout_s: float,
                       as_json: bool) -> None:
    """Check every stored batch and index entry (checksums, offsets, ids) and list what is damaged.

    Every broker of --servers checks its own partitions and, without --topic, the stores beside them (the
    committed offsets, the transaction log, the delay store's targets, users and ACL files; each partition's
    epoch history and producer snapshots always). Nothing is modified. Exit code 0 when everything checked
    is intact, 1 when something is damaged.
    """
    if partition is not None and topic is None:
        raise click.UsageError("--partition needs --topic")
    async with await open_session(servers) as session:
        admin = session.admin()
        if partition is not None:
            reports = await admin.verify(topic, partition, timeout_s=timeout_s)
        else:
            reports = []
            brokers = await holders(session, topic) if topic is not None else [*await admin.broker_ids()]
            for broker_id in brokers:
                reports += await admin.verify(topic, broker_id=broker_id, timeout_s=timeout_s)
    if as_json:
        click.echo(json.dumps(reports, indent=2))
    else:
        for report in reports:
            for line in _describe(report):
                click.echo(line)
        partitions = [r for r in reports if "store" not in r]
        stores = [r for r in reports if "store" in r]
        damaged = [r for r in partitions if not r["ok"]]
        damaged_stores = [r for r in stores if not r["ok"]]
        lost = sum(r["messages_damaged"] for r in damaged)
        checked = _plural(len(partitions), "partition") + (f" and {_plural(len(stores), 'store')}" if stores else "")
        problems = []
        if damaged:
            problems.append(f"{_plural(len(damaged), 'partition')} with problems, {_plural(lost, 'message')} "
                            "unreadable")
        if damaged_stores:
            records = sum(len(r["damaged"]) for r in damaged_stores)
            problems.append(f"{_plural(records, 'damaged record')} in {', '.join(r['store'] for r in damaged_stores)}")
        rebuilt = sum(len(r.get("index_notes", [])) for r in partitions)
        click.echo(f"checked {checked}: " + ("; ".join(problems) if problems else "all intact")
                   + (f" ({_plural(rebuilt, 'index file')} missing or torn: rebuilt on first use)" if rebuilt else ""))
    if any(not r["ok"] for r in reports):
        raise SystemExit(1)


def register(admin_group: click.Group) -> None:
    admin_group.add_command(admin_verify)
