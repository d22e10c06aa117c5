"""The broker's [system] options as click flags: ``metaq broker --serverPort 0 --unflushThreshold 1``.

One flag per settable [system] option of the table (:mod:`metaq.broker.options`), checked by the same
converter as server.ini; the flags given become overrides applied on top of the file
(:meth:`metaq.broker.config.BrokerConfig.with_overrides`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from metaq.broker.options import SETTABLE, InvalidValue, Option

__all__ = ["click_options", "overrides_from_click"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _click_check(opt: Option) -> Callable[[click.Context, click.Parameter, str | None], str | None]:
    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            try:
                opt.parse(value.strip())
            except InvalidValue as exc:
                raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
        return value

    return check


def click_options() -> Callable[[_F], _F]:
    """A decorator adding one flag per [system] option: ``--serverPort`` (and ``--server-port``).

    Every flag defaults to None, so only the flags given override the file; the parameter names are
    the BrokerConfig attribute names (``server_port``). Turn them back into MetaQ keys with
    :func:`overrides_from_click` and apply them with :meth:`BrokerConfig.with_overrides`.
    """

    def decorate(func: _F) -> _F:
        for opt in reversed(list(SETTABLE.values())):
            decls = [opt.flag] + ([f"--{opt.kebab}"] if opt.kebab != opt.key else [])
            func = click.option(
                *decls,
                opt.attr,
                default=None,
                metavar=opt.kind.upper(),
                callback=_click_check(opt),
                help=f"{opt.help} [server.ini default: {opt.default_text}]",
            )(func)
        return func

    return decorate


def overrides_from_click(kwargs: Mapping[str, object]) -> dict[str, str]:
    """The flags actually given, as MetaQ key -> text, ready for :meth:`BrokerConfig.with_overrides`."""
    return {o.key: str(kwargs[o.attr]) for o in SETTABLE.values() if kwargs.get(o.attr) is not None}
