"""What every `metaq bench` prints, in one shape: the machine and the hour it ran in, a line per case as it ends,
then a Markdown table (for docs/benchmarks.md); or, with ``--json``, one JSON document with every run kept whole.

A figure means something only beside the machine's state when it was taken (2 shared cores move by tens of
percent within minutes), so each result carries :func:`machine`: the date, the CPUs this process may use, the load
average at the start and at the end, the kernel, Python, and whether the compiled module was loaded.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

Report = Callable[[str], None]
"""Where a bench says what it is doing and what each case gave, one line at a time."""


def quiet(_line: str) -> None:
    """A :data:`Report` that says nothing."""


class BenchError(RuntimeError):
    """A bench cannot run as asked (a peer server not installed, an option out of range for this machine):
    the command prints the message and exits 1, with no traceback."""


def require_known(what: str, given: Iterable[str], known: Iterable[str]) -> None:
    """BenchError unless ``given`` names at least one of ``known`` and nothing else (``what``: "cases"...)."""
    names, choices = list(given), list(known)
    unknown = [name for name in names if name not in choices]
    if unknown or not names:
        raise BenchError(f"unknown {what} {unknown}; known: {', '.join(choices)}" if unknown else f"no {what} given")


def machine() -> dict[str, Any]:
    """The machine and the hour a bench runs in (call it before the run; :func:`finish_machine` after)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 0
    from metaq import _compiled

    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": cpus,
            "load_average_start": round(os.getloadavg()[0], 2), "kernel": platform.release(),
            "python": platform.python_version(), "compiled": _compiled.speedups is not None}


def finish_machine(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with the load average at the end of the run and the time it ended."""
    return {**info, "load_average_end": round(os.getloadavg()[0], 2), "ended": time.strftime("%H:%M UTC",
                                                                                              time.gmtime())}


def machine_line(info: dict[str, Any]) -> str:
    compiled = "" if info.get("compiled", True) else ", without the compiled module"
    end = f" to {info['ended']}" if "ended" in info else ""
    load = f"{info['load_average_start']}" + (f" -> {info['load_average_end']}" if "load_average_end" in info
                                               else "")
    return (f"{info['date']}{end}: {info['cpus']} CPUs, load average {load}, kernel {info['kernel']}, "
            f"Python {info['python']}{compiled}")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]], *, right: Sequence[int] = ()) -> str:
    """A Markdown table; ``right``: the columns (0-based) to align right (figures)."""
    align = ["---:" if i in right else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def each(values: Iterable[float], fmt: str = "{:,.0f}") -> str:
    """Every run's figure, in order: ``"812,000 · 790,500"``."""
    return " · ".join(fmt.format(v) for v in values)


def median(values: Iterable[float]) -> float:
    got = list(values)
    return statistics.median(got) if got else 0.0


def share(part: float, whole: float) -> str:
    """``part`` as a percentage of ``whole`` (empty when there is no whole to compare with)."""
    return f"{part / whole:.0%}" if whole else ""
