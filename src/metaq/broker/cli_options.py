"""The broker's [system] options as click flags: ``metaq broker --serverPort 0 --unflushThreshold 1``.

One flag per settable [system] option of the table (:mod:`metaq.broker.options`), checked by the same
converter as server.ini; the flags given become overrides applied on top of the file
(:meth:`metaq.broker.config.BrokerConfig.with_overrides`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from metaq.broker.options import SETTABLE, InvalidValue, Option

__all__ = ["BrokerHelp", "click_options", "help_all_option", "overrides_from_click"]

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


COMMON_FLAGS = ("--config", "--dataPath", "--serverPort", "--hostName", "--brokerId", "--numPartitions",
                "--unflushThreshold", "--httpPort", "--dashboardHttpPort", "--help-all", "--help")
"""What ``metaq broker --help`` shows in full: what a first broker needs; the rest is listed by group."""

FLAG_GROUPS: dict[str, tuple[str, ...]] = {
    "Storage and flushing": ("unflushInterval", "maxSegmentSize", "maxTransferSize", "deletePolicy", "deleteWhen",
                             "maxMessageSize", "maxBatchSize", "dataLogPath", "verifyAfterUncleanStart", "maxOpenFiles",
                             "syncfs", "syncfsMinPartitions", "syncfsQuietMinPartitions", "syncInlineMaxPartitions",
                             "loadMessageStoresInParallel", "fileUmask"),
    "Topics": ("acceptPublish", "acceptSubscribe", "autoCreateTopics", "stat", "updateConsumerOffsets",
               "maxDelayInSeconds"),
    "Connections and limits": ("kafkaPort", "maxConnections", "connectionIdleTimeoutSeconds",
                               "connectionHandshakeTimeoutSeconds", "maxWaitingFetches",
                               "maxWaitingFetchesPerConnection", "maxFrameSize", "maxPartialFramesSize"),
    "TLS": ("sslPort", "kafkaSslPort", "sslCertFile", "sslKeyFile", "sslCaFile", "sslClientAuth", "sslHttp",
            "sslReplication"),
    "Authentication and ACLs": ("authRequired", "saslUsersFile", "httpBasicAuthOverPlaintext", "aclEnabled", "aclFile",
                                "superUsers", "replicationUser"),
    "Quotas": ("quotaProducerByteRate", "quotaConsumerByteRate", "quotaMaxConnections", "quotaOverrides"),
    "Replication and HA": ("slave", "slave-config", "slave-id", "syncReplication", "minInSyncSlaves",
                           "inSyncMaxLagMs", "degradeToAsync", "autoFailover"),
    "Transactions": ("flushTxLogAtCommit", "maxCheckpoints", "checkpointInterval", "maxTxTimeoutTimerCapacity",
                     "maxTxTimeoutInSeconds", "transactionTimeOut", "transactionCheckInterval",
                     "transactionCheckMax"),
    "Process": ("event-loop", "mallocTrimThreshold", "mallocMmapThreshold"),
}
"""The other flags of ``metaq broker``, by subject, as ``--help`` names them (``--help-all`` describes each).
A flag in no group is listed under "Other", so a new option is never hidden."""


class BrokerHelp(click.Command):
    """``metaq broker --help``: the common flags in full, the other ~80 by group; ``--help-all``: every flag."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if ctx.meta.get("metaq.help_all"):
            super().format_options(ctx, formatter)
            return
        params = [p for p in self.get_params(ctx) if isinstance(p, click.Option)]
        common = [p for p in params if set(p.opts) & set(COMMON_FLAGS)]
        with formatter.section("Common options"):
            formatter.write_dl([_first_sentence(row) for p in common if (row := p.get_help_record(ctx)) is not None])
        listed = {f"--{flag}" for flags in FLAG_GROUPS.values() for flag in flags}
        others = sorted(o for p in params if not set(p.opts) & set(COMMON_FLAGS)
                        for o in p.opts[:1] if o not in listed)
        groups = [(title, [f"--{flag}" for flag in flags]) for title, flags in FLAG_GROUPS.items()]
        with formatter.section("More flags (every server.ini [system] key; `metaq broker --help-all` describes "
                               "each, docs/configuration.md too)"):
            formatter.write_dl([(title, " ".join(flags)) for title, flags in [*groups, ("Other", others)] if flags])


def _first_sentence(row: tuple[str, str]) -> tuple[str, str]:
    """A flag's help cut to its first sentence, its default kept (``--help-all`` has the rest)."""
    name, text = row
    default = re.search(r"\[(server\.ini )?default: [^\]]*\]$", text)
    first = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
    if default is not None and default.group(0) not in first:
        first = f"{first.rstrip()} {default.group(0)}"
    return name, first


def _print_help_all(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    ctx.meta["metaq.help_all"] = True
    click.echo(ctx.get_help(), color=ctx.color)
    ctx.exit()


help_all_option = click.option("--help-all", is_flag=True, expose_value=False, is_eager=True,
                               callback=_print_help_all, help="Show every flag with its meaning and default, and exit.")


def overrides_from_click(kwargs: Mapping[str, object]) -> dict[str, str]:
    """The flags actually given, as MetaQ key -> text, ready for :meth:`BrokerConfig.with_overrides`."""
    return {o.key: str(kwargs[o.attr]) for o in SETTABLE.values() if kwargs.get(o.attr) is not None}
