"""Server-side consumer filters: ``[topic=NAME] group.GROUP=module:callable`` in server.ini.

The callable gets each :class:`metaq.types.Message` of a fetch reply and returns true to send it. Only
the kept messages cross the network, which is the point (MetaQ's ConsumerMessageFilter on the broker).

How a filtered fetch reply stays consumable
-------------------------------------------
Each whole batch is decoded and re-encoded with only the kept records, and:

* every kept record keeps its ``offset_delta``, and the batch keeps its base offset and base message id,
  so kept messages keep their offsets and ids exactly;
* the batch keeps its ``last_offset_delta``, so ``base_offset + last_offset_delta + 1`` — the offset a
  consumer fetches next — is still past every message of the batch, the filtered-out ones included;
* a batch whose every message is filtered out becomes a batch with ``record_count`` 0: no messages, but
  it still moves the consumer's next offset past them. Without it a consumer whose whole reply was
  filtered would fetch the same offset forever;
* the CRC is recomputed over the new records (consumers verify it) with the batch's own compression;
* a cut-off tail batch (the reply hit ``max_bytes``) is passed through untouched: the consumer drops it
  anyway and needs to see it to know to fetch a larger reply.

A filter that raises keeps the message (at-least-once beats silent loss) and is logged once per error
type. The reply needs its bytes in memory, so a filtered fetch is never sent with sendfile.

A filter that cannot be loaded fails closed
-------------------------------------------
Every filter server.ini names is imported when the broker starts and again on every reload (SIGHUP,
``metaq admin reload``), before anything else of the new file is applied:

* a module that cannot be imported, a missing callable, or a module that raises while it is imported
  refuses the start (one line, exit 1) or the reload (the reply and an ERROR line say which filter and
  why; the running configuration and filters stay in force). A group is never served unfiltered because
  its filter is missing;
* a module whose source file's content changed since it was imported is imported again from the
  source as it is now (compiled from the file, never from a ``.pyc`` that a same-second, same-size edit
  would leave looking fresh), so editing the module and reloading applies the edit. Packages above it
  are not imported again; a module without a source file (a C extension, a zip) is imported once;
* the filters in force are the broker's (:attr:`metaq.broker.core.Broker.filters`); a fetch of a group
  whose filter is not among them (a broker started without the service, as unit tests do) loads it then, and
  refuses the fetch with INVALID_REQUEST naming the filter when it cannot.

Wiring (the broker's fetch handler, after reading the slice)::

    accept = group_filter(broker.filters, state.settings, req.group)  # None: no filter for this group
    if accept is not None and fslice.size:
        data = fslice.read_bytes(); fslice.release()
        response.records = filter_fetched(data, accept, req.topic, req.partition)
        return response
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from metaq.errors import ConfigError, InvalidRequestError
from metaq.protocol.records import decode_batch, iter_batches, rebuild_batch
from metaq.types import Message

log = logging.getLogger("metaq.broker.filters")

MessageFilter = Callable[[Message], bool]

_WARNED: set[tuple[str, type[BaseException]]] = set()
_SOURCES: dict[str, tuple[str, bytes]] = {}
"""Module name -> (source file, digest of its content) when it was last imported for a filter."""


def _digest(source: bytes) -> bytes:
    return hashlib.blake2b(source, digest_size=16).digest()


def _remember(module: ModuleType) -> None:
    path = getattr(module, "__file__", None)
    spec = getattr(module, "__spec__", None)
    if path and isinstance(getattr(spec, "loader", None), importlib.machinery.SourceFileLoader):
        with contextlib.suppress(OSError):
            _SOURCES[module.__name__] = (path, _digest(Path(path).read_bytes()))


def _import_again(name: str, old: ModuleType, path: str, source: bytes) -> ModuleType:
    """``name`` executed afresh from ``source``, replacing ``old`` in sys.modules (restored on failure)."""
    code = compile(source, path, "exec", dont_inherit=True)  # the file as it is now, not a cached .pyc
    assert old.__spec__ is not None
    module = importlib.util.module_from_spec(old.__spec__)
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        sys.modules[name] = old
        raise
    _SOURCES[name] = (path, _digest(source))
    log.info("consumer filter module %s imported again from %s (its source changed)", name, path)
    return module


def _module(name: str) -> ModuleType:
    """The module, imported; imported again when its source changed since (see the module docstring)."""
    old = sys.modules.get(name)
    seen = _SOURCES.get(name)
    if old is not None and seen is not None:
        path, digest = seen
        source = Path(path).read_bytes()
        return old if _digest(source) == digest else _import_again(name, old, path, source)
    importlib.invalidate_caches()  # a module file created since the last look is found
    module = importlib.import_module(name)
    _remember(module)
    return module


def load_filter(ref: str) -> MessageFilter:
    """The callable ``module:callable`` names (its module imported, again if its source changed);
    ConfigError saying what is wrong."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"consumer filter {ref!r} must be 'module:callable'")
    try:
        module = _module(module_name)
    except ImportError as exc:
        raise ConfigError(f"consumer filter {ref!r}: cannot import {module_name!r}: {exc} (the broker imports "
                          "it from its sys.path: PYTHONPATH, or install the module)") from None
    except OSError as exc:
        raise ConfigError(f"consumer filter {ref!r}: cannot read the source of {module_name!r}: "
                          f"{exc.strerror or exc}: {exc.filename}") from None
    except Exception as exc:  # the module itself failed: a SyntaxError, or code that raised
        raise ConfigError(f"consumer filter {ref!r}: importing {module_name!r} failed: "
                          f"{type(exc).__name__}: {exc}") from None
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"consumer filter {ref!r}: {module_name!r} has no {attr!r}") from None
    if isinstance(obj, type):
        try:
            obj = obj()  # a class: instantiate it once and call the instance
        except Exception as exc:
            raise ConfigError(f"consumer filter {ref!r}: {attr}() failed: {type(exc).__name__}: {exc}") from None
    accept = getattr(obj, "accept", obj)
    if not callable(accept):
        raise ConfigError(f"consumer filter {ref!r} is not callable")
    return cast(MessageFilter, accept)


def load_filters(topics: Mapping[str, Any]) -> dict[str, MessageFilter]:
    """Every filter of ``topics`` (name -> TopicConfig), loaded: ref -> callable. ConfigError naming the
    topic, the group and the reason for the first that cannot be loaded."""
    loaded: dict[str, MessageFilter] = {}
    for topic, section in sorted(topics.items()):
        for group, ref in sorted(section.group_filters.items()):
            if ref in loaded:
                continue
            try:
                loaded[ref] = load_filter(ref)
            except ConfigError as exc:
                raise ConfigError(f"[topic={topic}] group.{group}: {exc}") from None
    return loaded


def group_filter(filters: dict[str, MessageFilter], settings: object, group: str) -> MessageFilter | None:
    """The server-side filter configured for ``group`` in a topic's settings (``TopicSettings``), if any,
    from ``filters`` (the broker's, ref -> callable; one missing there is loaded into it). A filter that
    cannot be loaded refuses the fetch (InvalidRequestError): the group is never served unfiltered."""
    if not group:
        return None
    ref = getattr(settings, "group_filters", {}).get(group)
    if not ref:
        return None
    accept = filters.get(ref)
    if accept is None:
        try:
            accept = filters[ref] = load_filter(ref)
        except ConfigError as exc:
            log.error("%s; fetches of group %s are refused until it loads", exc, group)
            raise InvalidRequestError(f"{exc}; the broker refuses group {group}'s fetches until its filter "
                                      "loads (fix the module or server.ini, then metaq admin reload)") from None
    return accept



def _keep(accept: MessageFilter, msg: Message) -> bool:
    try:
        return bool(accept(msg))
    except Exception as exc:  # a broken filter must not lose messages
        key = (getattr(accept, "__qualname__", repr(accept)), type(exc))
        if key not in _WARNED:
            _WARNED.add(key)
            log.warning("consumer filter %s raised %s: %s; keeping the message", key[0], type(exc).__name__, exc)
        return True


def filter_fetched(records: bytes | bytearray | memoryview, accept: MessageFilter, topic: str = "",
                   partition: int = -1) -> bytes:
    """The fetch body with only the messages ``accept`` keeps (see the module docstring)."""
    view = memoryview(records)
    out: list[bytes] = []
    end = 0
    for pos, header in iter_batches(view):
        batch = view[pos:pos + header.total_bytes]
        messages = decode_batch(batch, topic, partition, header, verify=False)
        kept = [msg for msg in messages if _keep(accept, msg)]
        out.append(bytes(batch) if len(kept) == len(messages) else rebuild_batch(batch, header, kept))
        end = pos + header.total_bytes
    out.append(bytes(view[end:]))  # a cut-off tail, untouched
    return b"".join(out)

