"""Network namespaces for partition tests: each broker on a host of its own, links cut by blackhole routes.

A cut on loopback can only stall a whole process (SIGSTOP) or a link through a proxy; a real partition cuts
one path and leaves the others. :class:`Namespaces` makes a Linux bridge with an address of its own in this
(the root) namespace, and N namespaces, each joined to it by a veth pair and given an address on the
bridge's subnet. The test and ZooKeeper stay in the root namespace (ZooKeeper on a second bridge address,
:attr:`Namespaces.zookeeper_host`, so that cutting a broker from ZooKeeper leaves its path to the test's
clients); a broker runs in a namespace (:class:`NamespacedBroker`, ``ip netns exec``) bound to its address.
:meth:`Namespaces.cut` adds a blackhole route on both sides of a link (packets dropped, nothing refused:
what a cable pulled or a firewall DROP does), :meth:`Namespaces.heal` removes it.

Needs root (CAP_NET_ADMIN) and ``ip`` from iproute2: :func:`unavailable` says why they cannot be made, so a
test can skip with that reason. Every name carries this process's id, so parallel runs do not collide, and
:meth:`Namespaces.close` removes everything it made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from metaq.testing.broker import BrokerProcess

__all__ = ["NamespacedBroker", "Namespaces", "unavailable"]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (None: they can): not root, no ``ip``, or the kernel says no."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    name = f"mqprobe{os.getpid()}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip() or made.returncode}"
    _ip("netns", "del", name, check=False)
    veth = f"mqp{os.getpid() % 100000}"
    made = _ip("link", "add", veth, "type", "veth", "peer", "name", veth + "x", check=False)
    if made.returncode != 0:
        return f"cannot make a veth pair: {made.stderr.strip() or made.returncode}"
    _ip("link", "del", veth, check=False)
    return None


class Namespaces:
    """``count`` namespaces on one bridge; host ``i`` (0-based) is at :meth:`address` ``(i)``."""

    def __init__(self, count: int) -> None:
        self.count = count
        tag = os.getpid() % 100000
        self.bridge = f"mqbr{tag}"
        self.names = [f"mq{tag}n{i}" for i in range(count)]
        self._veths = [f"mq{tag}v{i}" for i in range(count)]
        self.subnet = f"10.{20 + tag % 200}.{tag % 250}"
        self.bridge_host = f"{self.subnet}.1"
        """The root namespace's address on the bridge: the test's clients talk from it."""
        self.zookeeper_host = f"{self.subnet}.2"
        """A second root-namespace address: ZooKeeper listens on it alone, so a broker can be cut from it only."""
        self._cuts: set[tuple[int, str]] = set()
        self._made = False

    def address(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"

    def create(self) -> Namespaces:
        self._made = True
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_host}/24", "dev", self.bridge)
        _ip("addr", "add", f"{self.zookeeper_host}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (name, veth) in enumerate(zip(self.names, self._veths, strict=True)):
            _ip("netns", "add", name)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", name, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")
        return self

    def exec_prefix(self, i: int) -> list[str]:
        """The command prefix that runs a program in namespace ``i``."""
        return ["ip", "netns", "exec", self.names[i]]

    def _route(self, action: str, i: int, target: str) -> None:
        _ip("-n", self.names[i], "route", action, "blackhole", f"{target}/32")

    def cut(self, i: int, j: int) -> None:
        """Cut the link between hosts ``i`` and ``j`` (both ways)."""
        for a, b in ((i, j), (j, i)):
            self._route("add", a, self.address(b))
            self._cuts.add((a, self.address(b)))

    def cut_from_zookeeper(self, i: int) -> None:
        """Cut host ``i`` from ZooKeeper only (it still reaches the other hosts and the test's clients)."""
        self._route("add", i, self.zookeeper_host)
        self._cuts.add((i, self.zookeeper_host))

    def isolate(self, i: int) -> None:
        """Cut host ``i`` from every other host and from ZooKeeper; the test's clients still reach it."""
        for j in range(self.count):
            if j != i:
                self.cut(i, j)
        self.cut_from_zookeeper(i)

    def heal(self) -> None:
        """Remove every cut."""
        for i, target in sorted(self._cuts):
            _ip("-n", self.names[i], "route", "del", "blackhole", f"{target}/32", check=False)
        self._cuts.clear()

    def close(self) -> None:
        if not self._made:
            return
        for name in self.names:
            _ip("netns", "del", name, check=False)
        for veth in self._veths:
            _ip("link", "del", veth, check=False)
        _ip("link", "del", self.bridge, check=False)
        self._made = False

    def __enter__(self) -> Namespaces:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()


class NamespacedBroker(BrokerProcess):
    """A :class:`BrokerProcess` in namespace ``index`` of ``namespaces``, bound to that host's address."""

    def __init__(self, namespaces: Namespaces, index: int, data_dir: str | Path, *, config_text: str,
                 args: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(data_dir, {"hostName": namespaces.address(index)}, config_text=config_text, args=args,
                         **kwargs)
        self.namespaces = namespaces
        self.index = index

    def command(self) -> list[str]:
        return self.namespaces.exec_prefix(self.index) + super().command()
