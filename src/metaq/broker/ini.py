"""Reading MetaQ's ``server.ini``: sections, keys and values, with errors that name file, line and key.

The reader is our own, line based, rather than :mod:`configparser`, because every refusal has to name
the file and line: ``server.ini:12: unflushTreshold: unknown key in [system]; did you mean
'unflushThreshold'?``. Refusing unknown keys is deliberate: a misspelt durability knob that is silently
ignored is worse than a broker that does not start. A MetaQ user's ``server.ini`` should load unchanged.

The same checks read a ``[topic=NAME]`` section given as key/value pairs (:func:`parse_topic_options`:
CreateTopic's configs, the options stored for a created topic).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metaq.broker.config import BrokerConfig, TopicConfig, ZkConfig
from metaq.broker.options import (
    GROUP_PREFIX,
    SECTION_NAMES,
    SETTABLE,
    STAT_IGNORED,
    SYSTEM_OPTIONS,
    TOPIC_OPTIONS,
    ZK_OPTIONS,
    InvalidValue,
    Option,
    Section,
    by_section,
    convert,
    cross_check,
    group_name,
    suggest,
)
from metaq.errors import ConfigError, InvalidArgument
from metaq.types import validate_topic

__all__ = ["load_broker_config", "load_config", "parse_config", "parse_topic_options", "topic_options_text"]


@dataclass
class _Section:
    header: str
    line: int
    entries: list[tuple[int, str, str]]


_INLINE_COMMENT = re.compile(r"\s[;#]")
"""Where a comment after a value or a section header starts: ``;`` or ``#`` after whitespace. One inside
a word is part of the value (a Quartz ``6#3``, ``superUsers=User:a;User:b``)."""


def _read_ini(text: str, source: str) -> list[_Section]:
    """Sections with their entries and line numbers; only the shape of the file is checked here."""
    sections: list[_Section] = []
    for number, raw in enumerate(text.removeprefix("\ufeff").split("\n"), start=1):
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        comment = _INLINE_COMMENT.search(line)
        if comment is not None:
            line = line[:comment.start()].rstrip()
        if line.startswith("["):
            head, bracket, after = line.partition("]")
            if not bracket:
                raise ConfigError(f"{source}:{number}: {_shown(line)}: section header without a closing ']'; "
                                  "expected [system], [zookeeper] or [topic=NAME]")
            if after:
                raise ConfigError(f"{source}:{number}: {_shown(line)}: found {_shown(after.strip())!r} after the "
                                  f"section header {_shown(head + bracket)}; expected the end of the line or a comment "
                                  "(; or # after a space)")
            sections.append(_Section(head[1:].strip(), number, []))
            continue
        key, eq, value = line.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(f"{source}:{number}: {_shown(line)}: expected key=value, a [section] or a comment")
        if not sections:
            raise ConfigError(f"{source}:{number}: {key}: key outside any section; put it under [system]")
        sections[-1].entries.append((number, key, value.strip()))
    return sections


def _shown(text: str, limit: int = 60) -> str:
    """Text as an error message may quote it: control characters escaped, long names cut."""
    if not text.isprintable():
        text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _section_kind(sec: _Section, source: str) -> tuple[Section, str]:
    head, eq, rest = sec.header.partition("=")
    if sec.header == "system":
        return "system", ""
    if sec.header == "zookeeper":
        return "zookeeper", ""
    if eq and head.strip() == "topic":
        name = rest.strip()
        try:
            validate_topic(name)
        except InvalidArgument as exc:
            raise ConfigError(f"{source}:{sec.line}: [{_shown(sec.header)}]: {exc}") from None
        return "topic", name
    if head.strip().lower() in ("topic", "topics") or sec.header.lower().startswith("topic"):
        guess = re.sub(r"^topics?\s*[=:\s]?\s*", "", sec.header, flags=re.IGNORECASE)
        hint = f"; did you mean '[topic={guess}]'?" if guess else "; a topic section is written [topic=NAME]"
    else:
        hint = suggest(sec.header, ["system", "zookeeper", "topic=NAME"], fmt="[{}]")
    raise ConfigError(
        f"{source}:{sec.line}: [{_shown(sec.header)}]: unknown section (known: [system], [zookeeper], "
        f"[topic=NAME]){hint}"
    )


def _misplaced(key: str, here: str) -> str:
    if key.startswith(GROUP_PREFIX):
        return f"consumer group filters belong in a [topic=NAME] section, not {here}"
    homes = [s for s in SECTION_NAMES if key in by_section(s)]
    if not homes:
        return ""
    home = "[topic=NAME]" if homes == ["topic"] else f"[{homes[0]}]"
    return f"is a {home} option and cannot be set in {here}"


def _unknown_key(key: str, here: str, known: Iterable[str], where: str) -> ConfigError:
    misplaced = _misplaced(key, here)
    key = _shown(key)
    if misplaced:
        return ConfigError(f"{where}: {key}: {misplaced}")
    names = list(known)
    if "group.GROUP" in names and "." in key:
        head, _, tail = key.partition(".")
        if difflib.get_close_matches(head.lower(), ["group"], n=1, cutoff=0.6):
            return ConfigError(f"{where}: {key}: unknown key in {here}; did you mean 'group.{tail}'?")
    plain = [n for n in names if n != "group.GROUP"]
    return ConfigError(f"{where}: {key}: unknown key in {here}{suggest(key, plain)}")


def _entries(
    sec: _Section, source: str, known: Mapping[str, Option], here: str
) -> dict[str, tuple[int, Option, str]]:
    """Key -> (line, option, text) for one section, refusing duplicates and unknown keys."""
    seen: dict[str, tuple[int, Option, str]] = {}
    group_opt = known.get("group.GROUP")
    for number, key, text in sec.entries:
        where = f"{source}:{number}"
        if key in seen:
            raise ConfigError(f"{where}: {key}: set twice in {here} (first at line {seen[key][0]})")
        opt = known.get(key)
        if opt is None and group_opt is not None and key.startswith(GROUP_PREFIX):
            try:
                group_name(key[len(GROUP_PREFIX):])
            except InvalidValue as exc:
                raise ConfigError(f"{where}: {key}: {exc}") from None
            opt = group_opt
        if opt is None:
            raise _unknown_key(key, here, known, where)
        seen[key] = (number, opt, text)
    return seen


def _absolute(path: Path, base_dir: Path | None) -> Path:
    return path if path.is_absolute() or base_dir is None else base_dir / path


def parse_config(text: str, source: str = "<string>", base_dir: Path | None = None) -> BrokerConfig:
    """Parse the text of a ``server.ini``. ``source`` names it in errors.

    ``base_dir`` is where a relative ``dataPath`` is anchored (:func:`load_config` passes the file's
    directory); without it a relative path stays relative to the current directory.
    """
    sections = _read_ini(text, source)
    warnings: list[str] = []
    system: dict[str, tuple[int, Option, str]] = {}
    zk_section: _Section | None = None
    zk_entries: dict[str, tuple[int, Option, str]] = {}
    topics: dict[str, TopicConfig] = {}
    first_line: dict[str, int] = {}

    for sec in sections:
        kind, name = _section_kind(sec, source)
        label = f"[{sec.header}]" if kind != "topic" else f"[topic={name}]"
        ident = label if kind != "topic" else f"topic={name}"
        if ident in first_line:
            raise ConfigError(
                f"{source}:{sec.line}: {label}: section appears twice (first at line {first_line[ident]})"
            )
        first_line[ident] = sec.line
        if kind == "system":
            system = _entries(sec, source, SYSTEM_OPTIONS, "[system]")
        elif kind == "zookeeper":
            zk_section, zk_entries = sec, _entries(sec, source, ZK_OPTIONS, "[zookeeper]")
        else:
            topics[name] = _topic_config(name, _entries(sec, source, TOPIC_OPTIONS, label), source)

    stat_lines = [number for sec in sections for number, key, _ in sec.entries if key == "stat"]
    if stat_lines:
        warnings.append(f"{source}:{stat_lines[0]}: stat: {STAT_IGNORED}")
    values: dict[str, Any] = {o.attr: o.parse(o.default) for o in SETTABLE.values() if o.default is not None}
    where: dict[str, str] = {}
    for key, (number, opt, text) in sorted(system.items(), key=lambda item: item[1][0]):
        loc = f"{source}:{number}: {key}"
        value = convert(opt, text, loc)
        if opt.status == "ignored":
            reason = opt.help.removeprefix("Ignored: ").rstrip(".")
            warnings.append(f"{loc}: MetaQ option accepted but ignored: {reason}")
            continue
        values[opt.attr] = value
        where[key] = loc
    values["data_path"] = _absolute(values["data_path"], base_dir)
    for attr in ("ssl_cert_file", "ssl_key_file", "ssl_ca_file", "sasl_users_file", "acl_file"):
        if values.get(attr) is not None:
            values[attr] = _absolute(values[attr], base_dir)
    cross_check(values, where, warnings)

    zookeeper = None
    if zk_section is not None:
        zk_values: dict[str, Any] = {}
        for key, (number, opt, text) in zk_entries.items():
            zk_values[opt.attr] = convert(opt, text, f"{source}:{number}: {key}")
        if zk_values.get("enable", True):
            if "connect" not in zk_values:
                raise ConfigError(
                    f"{source}:{zk_section.line}: zk.zkConnect: required in [zookeeper] "
                    "(remove the section, or set zk.zkEnable=false, for embedded mode)"
                )
            for attr in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
                if zk_values.get(attr) is not None:
                    zk_values[attr] = _absolute(zk_values[attr], base_dir)
            if zk_values.get("set_acl") and not zk_values.get("sasl_user"):
                raise ConfigError(f"{source}:{zk_section.line}: zk.zkSetAcl=true needs zk.zkSaslUser (the ZooKeeper "
                                  "identity the ACLs give metaq's nodes to)")
            if zk_values.get("tls_key_file") is not None and zk_values.get("tls_cert_file") is None:
                raise ConfigError(f"{source}:{zk_section.line}: zk.zkSslKeyFile needs zk.zkSslCertFile")
            zookeeper = ZkConfig(**zk_values)

    return BrokerConfig(**values, topics=topics, zookeeper=zookeeper, warnings=tuple(warnings))


def _topic_config(name: str, entries: Mapping[str, tuple[int, Option, str]], source: str) -> TopicConfig:
    values: dict[str, Any] = {}
    filters: dict[str, str] = {}
    for key, (number, opt, text) in entries.items():
        value = convert(opt, text, f"{source}:{number}: {key}")
        if opt.attr == "group_filters":
            filters[key[len(GROUP_PREFIX):]] = value
        else:
            values[opt.attr] = value
    return TopicConfig(name=name, group_filters=filters, **values)


def parse_topic_options(topic: str, options: Iterable[tuple[str, str]], *, source: str = "configs",
                        filters: bool = True) -> TopicConfig:
    """A ``[topic=NAME]`` section given as (key, value) pairs rather than lines of a file.

    CreateTopic's ``configs`` and the options stored for a created topic are checked by the same
    validator as server.ini, with the same messages; an error names ``source[i]`` (the pair's index)
    instead of a file and line. ``filters=False`` refuses ``group.GROUP`` keys: a server-side filter
    runs code on the broker, so only the operator's server.ini may name one.
    """
    try:
        validate_topic(topic)
    except InvalidArgument as exc:
        raise ConfigError(f"{source}: {exc}") from None
    here = f"[topic={_shown(topic)}]"
    seen: dict[str, int] = {}
    values: dict[str, Any] = {}
    group_filters: dict[str, str] = {}
    group_opt = TOPIC_OPTIONS["group.GROUP"]
    for index, (raw_key, raw_text) in enumerate(options):
        key, text = str(raw_key).strip(), str(raw_text).strip()
        where = f"{source}[{index}]"
        if key in seen:
            raise ConfigError(f"{where}: {_shown(key)}: set twice (first at {source}[{seen[key]}])")
        seen[key] = index
        if key.startswith(GROUP_PREFIX):
            if not filters:
                raise ConfigError(f"{where}: {_shown(key)}: a consumer group filter runs code on the broker; "
                                  f"only server.ini's {here} section may set one")
            try:
                group = group_name(key[len(GROUP_PREFIX):])
            except InvalidValue as exc:
                raise ConfigError(f"{where}: {_shown(key)}: {exc}") from None
            group_filters[group] = convert(group_opt, text, f"{where}: {key}")
            continue
        opt = TOPIC_OPTIONS.get(key)
        if opt is None:
            raise _unknown_key(key, here, TOPIC_OPTIONS, where)
        values[opt.attr] = convert(opt, text, f"{where}: {key}")
    return TopicConfig(name=topic, group_filters=group_filters, **values)


def topic_options_text(config: TopicConfig) -> dict[str, str]:
    """A TopicConfig back as server.ini keys and text values (what :func:`parse_topic_options` reads)."""
    out: dict[str, str] = {}
    for opt in TOPIC_OPTIONS.values():
        if opt.attr == "group_filters":
            continue
        value = getattr(config, opt.attr)
        if value is not None:
            out[opt.key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    for group, ref in sorted(config.group_filters.items()):
        out[f"{GROUP_PREFIX}{group}"] = ref
    return out


def load_config(path: str | Path) -> BrokerConfig:
    """Read and check a ``server.ini``. Errors name the file and line."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration file: {exc.strerror or exc}") from None
    config = parse_config(text, str(path), base_dir=path.resolve().parent)
    return dataclasses.replace(config, source_path=path)




def load_broker_config(path: str | Path | None, overrides: Mapping[str, str]) -> BrokerConfig:
    """server.ini (or the defaults, without a file) with command-line flags applied on top."""
    base = load_config(path) if path else parse_config("", "<defaults>")
    return base.with_overrides(overrides) if overrides else base
