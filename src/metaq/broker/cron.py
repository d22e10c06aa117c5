"""MetaQ's ``deleteWhen``: Quartz cron expressions, and when one next fires.

MetaQ schedules retention with Quartz (``sec min hour dom month dow [year]``, ``?`` in one of the day
fields, days of the week 1-7 from Sunday); metaq runs it with croniter, so an expression is turned into
croniter's form first. The broker's retention scheduler asks :func:`next_run_ms`; the option table checks
values with :func:`check_quartz`.
"""

from __future__ import annotations

import re
from datetime import datetime, tzinfo

from croniter import croniter

from metaq.errors import ConfigError, MetaqError

__all__ = ["CronError", "check_quartz", "next_run_ms", "quartz_to_croniter"]


class CronError(MetaqError, ValueError):
    """Not a usable Quartz expression; the message says why, in words a user can act on."""


_QUARTZ_DOW_NUM_RE = re.compile(r"(?<![/#\d])(\d+)")


def _quartz_dow(field_text: str) -> str:
    """Quartz counts days of the week 1 (SUN) to 7 (SAT); cron counts 0 (SUN) to 6 (SAT)."""

    def shift(match: re.Match[str]) -> str:
        n = int(match.group(1))
        if not 1 <= n <= 7:
            raise CronError(f"day of week {n} is outside Quartz's 1 (SUN) to 7 (SAT)")
        return str(n - 1)

    items = []
    for item in field_text.split(","):
        upper = item.upper()
        if upper == "L":  # alone, Quartz's L is the last day of the week: Saturday
            items.append("6")
        elif re.fullmatch(r"\d+L", upper):  # 6L: the last Friday of the month
            items.append("L" + _QUARTZ_DOW_NUM_RE.sub(shift, upper[:-1]))
        else:
            items.append(_QUARTZ_DOW_NUM_RE.sub(shift, item))
    return ",".join(items)


def _quartz_to_croniter(expr: str) -> str:
    fields = expr.split()
    if len(fields) not in (6, 7):
        raise CronError(
            f"{expr!r} has {len(fields)} fields; a Quartz expression has 6 or 7: "
            "second minute hour day-of-month month day-of-week [year]"
        )
    sec, minute, hour, dom, month, dow, *year = fields
    if "?" in (sec, minute, hour, month, *year):
        raise CronError(f"{expr!r}: '?' is only allowed in day-of-month or day-of-week")
    if dom not in ("?", "*") and dow not in ("?", "*"):
        raise CronError(
            f"{expr!r} restricts both day-of-month and day-of-week; "
            "Quartz needs '?' in one of them (for example 0 0 6 ? * MON)"
        )
    dom = "*" if dom == "?" else dom
    dow = "*" if dow in ("?", "*") else _quartz_dow(dow)
    # croniter wants the seconds as the sixth field (year seventh): croniter's own
    # second_at_beginning flag would do this too, but not in every version pyproject allows.
    return " ".join([minute, hour, dom, month, dow, sec, *year])


def check_quartz(text: str) -> str:
    """``text`` with its whitespace normalised, if it is a Quartz expression croniter can schedule.

    Raises :class:`CronError` saying what is wrong (the option table adds file, line and key).
    """
    converted = _quartz_to_croniter(text)
    try:
        croniter(converted, datetime.now()).get_next(datetime)
    except ValueError as exc:  # croniter's errors are ValueErrors; a date error means "never fires"
        raise CronError(f"{text!r} is not a usable Quartz cron expression ({exc})") from None
    except (KeyError, IndexError, TypeError, OverflowError):  # croniter can trip over garbage
        raise CronError(f"{text!r} is not a Quartz cron expression") from None
    return " ".join(text.split())


def quartz_to_croniter(expr: str) -> str:
    """Turn MetaQ's Quartz ``deleteWhen`` (``sec min hour dom month dow [year]``) into croniter's form.

    ``?`` becomes ``*``; days of the week move from Quartz's 1-7 (SUN-SAT) to cron's 0-6; the seconds
    move to the sixth field, where croniter expects them. Raises :class:`ConfigError` when ``expr`` is
    not a Quartz expression.
    """
    try:
        return _quartz_to_croniter(expr.strip())
    except CronError as exc:
        raise ConfigError(f"deleteWhen: {exc}") from None


def next_run_ms(expr: str, after_ms: int, tz: tzinfo | None = None) -> int:
    """When the Quartz cron ``expr`` next fires strictly after ``after_ms`` (epoch milliseconds).

    ``tz`` is the time zone the hours are read in; ``None`` means the broker's local time, as MetaQ's
    Quartz scheduler did (``0 0 6,18 * * ?`` runs at 06:00 and 18:00 on the wall clock).
    """
    try:
        converted = _quartz_to_croniter(expr.strip())
    except CronError as exc:
        raise ConfigError(f"deleteWhen: {exc}") from None
    seconds, millis = divmod(after_ms, 1000)
    start = datetime.fromtimestamp(seconds, tz).replace(microsecond=millis * 1000)
    try:
        nxt = croniter(converted, start).get_next(datetime)
    except ValueError as exc:
        raise ConfigError(f"deleteWhen: {expr!r}: {exc}") from None
    return int(nxt.timestamp()) * 1000 + nxt.microsecond // 1000
