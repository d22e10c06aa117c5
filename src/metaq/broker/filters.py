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
type; a filter that cannot be imported is logged and the group gets unfiltered replies. The reply needs
its bytes in memory, so a filtered fetch is never sent with sendfile.

Wiring (the broker's fetch handler, after reading the slice)::

    accept = group_filter(state.settings, req.group)      # None: no filter for this group and topic
    if accept is not None and fslice.size:
        data = fslice.read_bytes(); fslice.release()
        response.records = filter_fetched(data, accept, req.topic, req.partition)
        return response
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

from metaq.errors import ConfigError
from metaq.protocol.records import decode_batch, iter_batches, rebuild_batch
from metaq.types import Message

log = logging.getLogger("metaq.broker.filters")

MessageFilter = Callable[[Message], bool]

_FILTERS: dict[str, MessageFilter] = {}
_WARNED: set[tuple[str, type[BaseException]]] = set()


def load_filter(ref: str) -> MessageFilter:
    """Import ``module:callable`` once; ConfigError names what is wrong."""
    cached = _FILTERS.get(ref)
    if cached is not None:
        return cached
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"consumer filter {ref!r} must be 'module:callable'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"consumer filter {ref!r}: cannot import {module_name!r}: {exc}") from None
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"consumer filter {ref!r}: {module_name!r} has no {attr!r}") from None
    if isinstance(obj, type):
        obj = obj()  # a class: instantiate it once and call the instance
    accept = getattr(obj, "accept", obj)
    if not callable(accept):
        raise ConfigError(f"consumer filter {ref!r} is not callable")
    _FILTERS[ref] = accept
    return accept


_BROKEN: set[str] = set()


def group_filter(settings: object, group: str) -> MessageFilter | None:
    """The server-side filter configured for ``group`` in a topic's settings (``TopicSettings``), if any."""
    if not group:
        return None
    ref = getattr(settings, "group_filters", {}).get(group)
    if not ref:
        return None
    try:
        return load_filter(ref)
    except ConfigError as exc:
        if ref not in _BROKEN:
            _BROKEN.add(ref)
            log.error("%s; group %s gets unfiltered fetches", exc, group)
        return None


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

