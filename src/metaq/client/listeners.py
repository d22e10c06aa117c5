"""Callbacks told that a shared piece of client state changed (the metadata cache, the partitions left out).

A session's producers cache what they derive from that state between sends (Producer._hot); they register a
method here and drop their cache when it is called. The references are weak: a producer that is dropped
without being closed does not stay alive, or get called, because of its registration."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any


class ChangeListeners:
    """Bound methods to call, in registration order, when the owner's state changes."""

    __slots__ = ("_refs",)

    def __init__(self) -> None:
        self._refs: list[weakref.WeakMethod[Callable[[], Any]]] = []

    def add(self, method: Callable[[], Any]) -> None:
        self._refs.append(weakref.WeakMethod(method))

    def remove(self, method: Callable[[], Any]) -> None:
        self._refs = [ref for ref in self._refs if ref() not in (None, method)]

    def __len__(self) -> int:
        return sum(1 for ref in self._refs if ref() is not None)

    def changed(self) -> None:
        """Call every live listener (the dead ones are dropped)."""
        if not self._refs:
            return
        dead = False
        for ref in tuple(self._refs):
            method = ref()
            if method is None:
                dead = True
            else:
                method()
        if dead:
            self._refs = [ref for ref in self._refs if ref() is not None]
