"""Client-side consumer filters (MetaQ's ConsumerMessageFilter): the consumer skips what they refuse.

A filter is ``filter(message) -> bool``, or an object with MetaQ's ``accept(group, message) -> bool``.
A refused message is consumed without calling the listener: its offset is committed like any other.
The messages still cross the network; to save bandwidth, configure a server-side filter for the group
on the broker (``[topic=NAME] group.GROUP=module:callable``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from metaq.types import Message

MessageFilter = Callable[[Message], bool]


class AttributeFilter:
    """Accept messages whose attribute is one of ``attributes`` (None matches a message without one)."""

    def __init__(self, *attributes: str | None) -> None:
        self.attributes = frozenset(attributes)

    def __call__(self, message: Message) -> bool:
        return message.attribute in self.attributes

    def accept(self, group: str, message: Message) -> bool:
        """MetaQ's ``ConsumerMessageFilter.accept(group, message)``: the same test as calling the filter."""
        return self(message)

    def __repr__(self) -> str:
        return f"AttributeFilter({', '.join(map(repr, sorted(self.attributes, key=str)))})"


def as_predicate(group: str, flt: Any) -> MessageFilter | None:
    """A plain predicate from a callable or a MetaQ-style ``accept(group, message)`` object."""
    if flt is None:
        return None
    accept = getattr(flt, "accept", None)
    if callable(accept):
        return lambda message: bool(accept(group, message))
    if callable(flt):
        return lambda message: bool(flt(message))
    raise TypeError(f"a consumer filter must be callable or have accept(group, message), not {flt!r}")
