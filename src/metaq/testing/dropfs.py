"""DropFS: a FUSE file system that keeps only what was synced, for power-loss tests (root, or fusermount3).

A broker's data directory on it behaves as on a disk whose page cache is lost at a power cut: file data
written but not fsynced or fdatasynced, and directory entries (new, renamed, removed names) whose directory
was not fsynced, are held in the daemon's memory only. :meth:`DropFS.power_cut` kills the daemon (its memory
is the lost page cache) and detaches the mount; :meth:`DropFS.start` mounts a new daemon on what was synced.

What survives lives in a backing directory of the host's file system, which is the "disk": a file's synced
bytes in ``<ino>.data`` (written and fdatasynced at each FSYNC that reaches the daemon, so a sync costs a real
one), a directory's synced entries in ``<ino>.dir`` (JSON, replaced atomically at each FSYNCDIR). By
default (``strict_directories``) an fdatasync of a directory does not persist its entries, only an fsync
does: POSIX promises no more, and the FUSE kernel module tells the daemon which one it was. A syncfs(2) of
the mount never reaches the daemon (the kernel sends FUSE_SYNCFS only to virtiofs): it persists nothing,
as on any FUSE file system that keeps its own cache.

The daemon speaks the FUSE kernel protocol itself (``/dev/fuse``, protocol 7.31, no writeback cache: every
write reaches it before write(2) returns), one request at a time; nothing beyond the Python standard library
is needed. Run it as ``python -m metaq.testing.dropfs MOUNTPOINT BACKING``; :class:`DropFS` does that.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# -- the FUSE kernel protocol (include/uapi/linux/fuse.h) ------------------------------------------------

PROTOCOL = (7, 31)
LOOKUP, FORGET, GETATTR, SETATTR = 1, 2, 3, 4
MKNOD, MKDIR, UNLINK, RMDIR, RENAME = 8, 9, 10, 11, 12
OPEN, READ, WRITE, STATFS, RELEASE, FSYNC, FLUSH, INIT = 14, 15, 16, 17, 18, 20, 25, 26
OPENDIR, READDIR, RELEASEDIR, FSYNCDIR, ACCESS, CREATE, INTERRUPT, DESTROY = 27, 28, 29, 30, 34, 35, 36, 38
BATCH_FORGET, RENAME2, SYNCFS = 42, 45, 50
NO_REPLY = {FORGET, BATCH_FORGET, INTERRUPT}

IN_HEADER = struct.Struct("<IIQQIIII")
OUT_HEADER = struct.Struct("<IiQ")
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")
ENTRY_OUT = struct.Struct("<QQQQII")
ATTR_OUT = struct.Struct("<QII")
OPEN_OUT = struct.Struct("<QII")
INIT_IN = struct.Struct("<IIII")
INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")
SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")
READ_IN = struct.Struct("<QQIIQII")
WRITE_IN = READ_IN
WRITE_OUT = struct.Struct("<II")
CREATE_IN = struct.Struct("<IIII")
MKNOD_IN = struct.Struct("<IIII")
MKDIR_IN = struct.Struct("<II")
RENAME_IN = struct.Struct("<Q")
RENAME2_IN = struct.Struct("<QII")
FSYNC_IN = struct.Struct("<QII")
STATFS_OUT = struct.Struct("<QQQQQIIII24x")
DIRENT = struct.Struct("<QQII")

FATTR_MODE, FATTR_SIZE = 1 << 0, 1 << 3
FUSE_BIG_WRITES, FUSE_MAX_PAGES = 1 << 5, 1 << 22
FSYNC_FDATASYNC = 1
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
MAX_WRITE = 1 << 20
VALID_S = 10
"""How long the kernel may cache names and attributes: it alone changes this file system while mounted."""
ROOT = 1


@dataclass
class Node:
    ino: int
    mode: int
    data: bytearray = field(default_factory=bytearray)
    """A file's bytes as processes see them (the page cache)."""
    entries: dict[str, int] = field(default_factory=dict)
    """A directory's names as processes see them."""
    synced_size: int = 0
    dirty: tuple[int, int] | None = None
    """A file's bytes [lo, hi) written since its last sync."""
    entries_dirty: bool = False
    mtime_ns: int = field(default_factory=time.time_ns)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


class FuseError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(os.strerror(code))
        self.code = code


class Model:
    """The file system: what processes see (in memory), and what a sync made durable (the backing directory)."""

    def __init__(self, backing: Path, *, strict_directories: bool = True, real_sync: bool = True) -> None:
        self.backing = backing
        self.strict_directories = strict_directories
        self.real_sync = real_sync
        self.nodes: dict[int, Node] = {}
        self.counts: dict[str, int] = {"fsync": 0, "fdatasync": 0, "fsyncdir": 0, "fdatasyncdir": 0}
        backing.mkdir(parents=True, exist_ok=True)
        numbers = [int(p.name.split(".")[0]) for p in backing.iterdir() if p.name.split(".")[0].isdigit()]
        self.next_ino = max([ROOT, *numbers]) + 1
        self._load(ROOT, stat.S_IFDIR | 0o755)

    def _load(self, ino: int, mode: int) -> None:
        node = Node(ino, mode)
        self.nodes[ino] = node
        if node.is_dir:
            path = self.backing / f"{ino}.dir"
            if path.exists():
                for name, (child, child_mode) in json.loads(path.read_bytes()).items():
                    node.entries[name] = child
                    if child not in self.nodes:
                        self._load(child, child_mode)
        else:
            with contextlib.suppress(FileNotFoundError):
                node.data = bytearray((self.backing / f"{ino}.data").read_bytes())
            node.synced_size = len(node.data)

    # -- names

    def node(self, ino: int) -> Node:
        found = self.nodes.get(ino)
        if found is None:
            raise FuseError(errno.ESTALE)
        return found

    def directory(self, ino: int) -> Node:
        node = self.node(ino)
        if not node.is_dir:
            raise FuseError(errno.ENOTDIR)
        return node

    def lookup(self, parent: int, name: str) -> Node:
        child = self.directory(parent).entries.get(name)
        if child is None:
            raise FuseError(errno.ENOENT)
        return self.node(child)

    def make(self, parent: int, name: str, mode: int) -> Node:
        directory = self.directory(parent)
        if name in directory.entries:
            raise FuseError(errno.EEXIST)
        node = Node(self.next_ino, mode)
        self.next_ino += 1
        self.nodes[node.ino] = node
        directory.entries[name] = node.ino
        directory.entries_dirty = True
        return node

    def remove(self, parent: int, name: str, *, want_dir: bool) -> None:
        directory = self.directory(parent)
        node = self.lookup(parent, name)
        if want_dir and not node.is_dir:
            raise FuseError(errno.ENOTDIR)
        if not want_dir and node.is_dir:
            raise FuseError(errno.EISDIR)
        if want_dir and node.entries:
            raise FuseError(errno.ENOTEMPTY)
        del directory.entries[name]
        directory.entries_dirty = True

    def rename(self, parent: int, name: str, new_parent: int, new_name: str, flags: int) -> None:
        if flags & RENAME_EXCHANGE:
            raise FuseError(errno.EINVAL)
        source, target = self.directory(parent), self.directory(new_parent)
        node = self.lookup(parent, name)
        replaced = target.entries.get(new_name)
        if replaced is not None:
            if flags & RENAME_NOREPLACE:
                raise FuseError(errno.EEXIST)
            old = self.node(replaced)
            if old.is_dir and (not node.is_dir or old.entries):
                raise FuseError(errno.ENOTEMPTY if node.is_dir else errno.EISDIR)
            if node.is_dir and not old.is_dir:
                raise FuseError(errno.ENOTDIR)
        del source.entries[name]
        target.entries[new_name] = node.ino
        source.entries_dirty = target.entries_dirty = True

    # -- data

    def write(self, node: Node, offset: int, data: bytes | memoryview) -> int:
        end = offset + len(data)
        if end > len(node.data):
            node.data.extend(bytes(end - len(node.data)))
        node.data[offset:end] = data
        lo, hi = node.dirty or (offset, end)
        node.dirty = (min(lo, offset), max(hi, end))
        node.mtime_ns = time.time_ns()
        return len(data)

    def truncate(self, node: Node, size: int) -> None:
        if size < len(node.data):
            del node.data[size:]
        else:
            node.data.extend(bytes(size - len(node.data)))
        lo, hi = node.dirty or (size, size)
        node.dirty = (min(lo, size), max(hi, size))
        node.mtime_ns = time.time_ns()

    # -- syncs: what reaches the backing directory

    def sync_file(self, node: Node, datasync: bool) -> None:
        self.counts["fdatasync" if datasync else "fsync"] += 1
        if node.dirty is None:
            return
        lo, hi = node.dirty
        fd = os.open(self.backing / f"{node.ino}.data", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            hi = min(hi, len(node.data))
            if hi > lo:
                os.pwrite(fd, node.data[lo:hi], lo)
            os.ftruncate(fd, len(node.data))
            if self.real_sync:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        node.dirty = None
        node.synced_size = len(node.data)

    def sync_directory(self, node: Node, datasync: bool) -> None:
        self.counts["fdatasyncdir" if datasync else "fsyncdir"] += 1
        if (datasync and self.strict_directories) or not node.entries_dirty:
            return
        document = {name: [ino, self.node(ino).mode] for name, ino in node.entries.items()}
        path = self.backing / f"{node.ino}.dir"
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, json.dumps(document).encode())
            if self.real_sync:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if self.real_sync:
            directory = os.open(self.backing, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        node.entries_dirty = False


class Server:
    """Answers the kernel's requests on a /dev/fuse descriptor from a :class:`Model`."""

    def __init__(self, fd: int, model: Model) -> None:
        self.fd = fd
        self.model = model
        self.uid, self.gid = os.getuid(), os.getgid()

    def serve(self) -> None:
        while True:
            try:
                request = os.read(self.fd, MAX_WRITE + 64 * 1024)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):  # ENOENT: an interrupted request
                    continue
                if exc.errno == errno.ENODEV:  # unmounted
                    return
                raise
            length, opcode, unique, nodeid, _uid, _gid, _pid, _ext = IN_HEADER.unpack_from(request)
            body = memoryview(request)[IN_HEADER.size:length]
            if opcode == DESTROY:
                self._reply(unique, b"")
                return
            try:
                reply = self.handle(opcode, nodeid, body)
            except FuseError as exc:
                self._error(unique, exc.code)
                continue
            except OSError as exc:  # the backing directory failed: the "disk" did
                self._error(unique, exc.errno or errno.EIO)
                continue
            if opcode not in NO_REPLY:
                self._reply(unique, reply)

    def _reply(self, unique: int, payload: bytes) -> None:
        with contextlib.suppress(FileNotFoundError):  # ENOENT: the request was interrupted meanwhile
            os.write(self.fd, OUT_HEADER.pack(OUT_HEADER.size + len(payload), 0, unique) + payload)

    def _error(self, unique: int, code: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.write(self.fd, OUT_HEADER.pack(OUT_HEADER.size, -code, unique))

    def attr(self, node: Node) -> bytes:
        size = len(node.data)
        seconds, nanos = divmod(node.mtime_ns, 1_000_000_000)
        nlink = 2 if node.is_dir else 1
        return ATTR.pack(node.ino, size, (size + 511) // 512, seconds, seconds, seconds, nanos, nanos, nanos,
                         node.mode, nlink, self.uid, self.gid, 0, 4096, 0)

    def entry(self, node: Node) -> bytes:
        return ENTRY_OUT.pack(node.ino, 0, VALID_S, VALID_S, 0, 0) + self.attr(node)

    def attr_out(self, node: Node) -> bytes:
        return ATTR_OUT.pack(VALID_S, 0, 0) + self.attr(node)

    def handle(self, opcode: int, nodeid: int, body: memoryview) -> bytes:
        model = self.model
        if opcode == INIT:
            _major, minor, max_readahead, _flags = INIT_IN.unpack_from(body)
            return INIT_OUT.pack(PROTOCOL[0], min(PROTOCOL[1], minor), max_readahead,
                                 FUSE_BIG_WRITES | FUSE_MAX_PAGES, 16, 12, MAX_WRITE, 1, MAX_WRITE // 4096, 0, 0, 0)
        if opcode == LOOKUP:
            return self.entry(model.lookup(nodeid, _name(body)))
        if opcode in NO_REPLY:
            return b""
        if opcode == GETATTR:
            return self.attr_out(model.node(nodeid))
        if opcode == SETATTR:
            fields = SETATTR_IN.unpack_from(body)
            valid, size, mode = fields[0], fields[3], fields[11]
            node = model.node(nodeid)
            if valid & FATTR_SIZE:
                if node.is_dir:
                    raise FuseError(errno.EISDIR)
                model.truncate(node, size)
            if valid & FATTR_MODE:
                node.mode = (node.mode & ~0o7777) | (mode & 0o7777)
            return self.attr_out(node)
        if opcode == MKDIR:
            mode, _umask = MKDIR_IN.unpack_from(body)
            return self.entry(model.make(nodeid, _name(body[MKDIR_IN.size:]), stat.S_IFDIR | (mode & 0o7777)))
        if opcode == MKNOD:
            mode, _rdev, _umask, _ = MKNOD_IN.unpack_from(body)
            if not stat.S_ISREG(mode):
                raise FuseError(errno.EPERM)
            return self.entry(model.make(nodeid, _name(body[MKNOD_IN.size:]), mode))
        if opcode == CREATE:
            _flags, mode, _umask, _ = CREATE_IN.unpack_from(body)
            node = model.make(nodeid, _name(body[CREATE_IN.size:]), stat.S_IFREG | (mode & 0o7777))
            return self.entry(node) + OPEN_OUT.pack(node.ino, 0, 0)
        if opcode in (UNLINK, RMDIR):
            model.remove(nodeid, _name(body), want_dir=opcode == RMDIR)
            return b""
        if opcode in (RENAME, RENAME2):
            if opcode == RENAME:
                (new_parent,), flags, names = RENAME_IN.unpack_from(body), 0, body[RENAME_IN.size:]
            else:
                new_parent, flags, _ = RENAME2_IN.unpack_from(body)
                names = body[RENAME2_IN.size:]
            old, new = bytes(names).split(b"\0")[:2]
            model.rename(nodeid, old.decode(), new_parent, new.decode(), flags)
            return b""
        if opcode in (OPEN, OPENDIR):
            node = model.node(nodeid)
            if (opcode == OPENDIR) != node.is_dir:
                raise FuseError(errno.ENOTDIR if opcode == OPENDIR else errno.EISDIR)
            return OPEN_OUT.pack(nodeid, 0, 0)
        if opcode == READ:
            _fh, offset, size, *_ = READ_IN.unpack_from(body)
            return bytes(model.node(nodeid).data[offset:offset + size])
        if opcode == WRITE:
            _fh, offset, size, *_ = WRITE_IN.unpack_from(body)
            written = model.write(model.node(nodeid), offset, body[WRITE_IN.size:WRITE_IN.size + size])
            return WRITE_OUT.pack(written, 0)
        if opcode in (RELEASE, RELEASEDIR, FLUSH, ACCESS, SYNCFS):  # nothing to do; syncfs never arrives here
            return b""
        if opcode == FSYNC:
            _fh, flags, _ = FSYNC_IN.unpack_from(body)
            model.sync_file(model.node(nodeid), bool(flags & FSYNC_FDATASYNC))
            return b""
        if opcode == FSYNCDIR:
            _fh, flags, _ = FSYNC_IN.unpack_from(body)
            model.sync_directory(model.directory(nodeid), bool(flags & FSYNC_FDATASYNC))
            return b""
        if opcode == READDIR:
            _fh, offset, size, *_ = READ_IN.unpack_from(body)
            return self.readdir(model.directory(nodeid), offset, size)
        if opcode == STATFS:
            return STATFS_OUT.pack(1 << 24, 1 << 23, 1 << 23, 1 << 20, 1 << 19, 4096, 255, 4096, 0)
        raise FuseError(errno.ENOSYS)

    def readdir(self, node: Node, offset: int, size: int) -> bytes:
        names = [(".", node.ino), ("..", node.ino), *sorted(node.entries.items())]
        out = bytearray()
        for index in range(offset, len(names)):
            name, ino = names[index]
            encoded = name.encode()
            child = self.model.nodes.get(ino)
            kind = (child.mode if child is not None else stat.S_IFREG) >> 12 & 0o17
            record = DIRENT.pack(ino, index + 1, len(encoded), kind) + encoded
            record += bytes(-len(record) % 8)
            if len(out) + len(record) > size:
                break
            out += record
        return bytes(out)


def _name(body: memoryview) -> str:
    raw = bytes(body)
    return raw[:raw.index(b"\0")].decode()


# -- mounting -------------------------------------------------------------------------------------------

MNT_DETACH = 2
MS_NOSUID, MS_NODEV = 2, 4


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mount_fuse(mountpoint: Path) -> int:
    """Open /dev/fuse and mount it on ``mountpoint`` (mount(2) as root, else fusermount3); its descriptor."""
    if os.geteuid() == 0:
        fd = os.open("/dev/fuse", os.O_RDWR)
        options = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
        if _libc().mount(b"dropfs", os.fsencode(mountpoint), b"fuse.dropfs", MS_NOSUID | MS_NODEV, options) != 0:
            code = ctypes.get_errno()
            os.close(fd)
            raise OSError(code, f"mount(2) of a FUSE file system on {mountpoint}: {os.strerror(code)}")
        return fd
    helper = shutil.which("fusermount3")
    if helper is None:
        raise OSError(errno.EPERM, "mounting FUSE needs root or fusermount3 (Debian's fuse3)")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        subprocess.run([helper, "-o", "fsname=dropfs,subtype=dropfs", "--", str(mountpoint)], check=True,
                       env={**os.environ, "_FUSE_COMMFD": str(theirs.fileno())}, pass_fds=(theirs.fileno(),))
        _msg, fds, _flags, _addr = socket.recv_fds(ours, 1, 1)
    if not fds:
        raise OSError(errno.EIO, "fusermount3 passed no descriptor")
    return fds[0]


def unmount(mountpoint: Path) -> None:
    """Detach the mount (lazily: a dead daemon's mount, or one a process still holds, goes too)."""
    if os.geteuid() == 0:
        _libc().umount2(os.fsencode(mountpoint), MNT_DETACH)
        return
    helper = shutil.which("fusermount3")
    if helper is not None:
        subprocess.run([helper, "-u", "-z", "--", str(mountpoint)], capture_output=True, check=False)


def is_mounted(mountpoint: Path) -> bool:
    wanted = os.path.realpath(mountpoint)
    with open("/proc/self/mounts", encoding="utf-8", errors="replace") as mounts:
        return any(line.split()[1] == wanted for line in mounts if len(line.split()) > 1)


def fuse_unavailable() -> str | None:
    """Why a DropFS cannot be mounted here (None: it can): no /dev/fuse, no privilege, a refused mount."""
    if not sys.platform.startswith("linux"):
        return "FUSE tests need Linux"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (the fuse kernel module is not loaded, or the container has no access to it)"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "mounting FUSE needs root or fusermount3 (Debian's fuse3)"
    with tempfile.TemporaryDirectory(prefix="dropfs-probe-") as scratch:
        try:
            with DropFS(Path(scratch) / "mnt", Path(scratch) / "disk", real_sync=False):
                pass
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            return f"cannot mount a FUSE file system here: {exc}"
    return None


class DropFS:
    """A DropFS daemon mounted on ``mountpoint``, keeping what was synced in ``backing`` (see the module doc)."""

    def __init__(self, mountpoint: Path, backing: Path, *, strict_directories: bool = True,
                 real_sync: bool = True, ready_timeout_s: float = 15.0) -> None:
        self.mountpoint = Path(mountpoint)
        self.backing = Path(backing)
        self.strict_directories = strict_directories
        self.real_sync = real_sync
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.power_cuts = 0

    def start(self) -> DropFS:
        """Mount a daemon on the synced state (after :meth:`power_cut`: what a reboot finds)."""
        assert self.proc is None, "already mounted"
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        # the daemon needs only the standard library: run this file itself, wherever metaq is importable
        command = [sys.executable, os.path.abspath(__file__), str(self.mountpoint), str(self.backing)]
        if not self.strict_directories:
            command.append("--directory-datasync-keeps-entries")
        if not self.real_sync:
            command.append("--no-real-sync")
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.proc = proc
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the daemon says "mounted" once mount(2) returned, or why not
        if line.strip() != "mounted":
            rest = proc.stdout.read() if proc.poll() is not None else ""
            self._end(signal.SIGKILL)
            raise RuntimeError(f"DropFS did not mount on {self.mountpoint}: {(line + rest).strip()}")
        deadline = time.monotonic() + self.ready_timeout_s
        while True:  # the first access waits for the daemon's answer to the kernel's INIT
            try:
                os.stat(self.mountpoint)
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.power_cut()
                    raise RuntimeError(f"DropFS on {self.mountpoint} did not answer") from None
                time.sleep(0.01)
        return self

    def power_cut(self) -> None:
        """Kill the daemon (what was not synced is gone with its memory) and detach the mount."""
        self._end(signal.SIGKILL)
        self.power_cuts += 1

    def stop(self) -> None:
        """Unmount cleanly (what was not synced is lost all the same: nothing flushes it)."""
        self._end(signal.SIGTERM)

    def _end(self, sig: int) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        if is_mounted(self.mountpoint):
            unmount(self.mountpoint)

    def __enter__(self) -> DropFS:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m metaq.testing.dropfs MOUNTPOINT BACKING [--directory-datasync-keeps-entries] "
              "[--no-real-sync]", file=sys.stderr)
        return 2
    mountpoint, backing = Path(argv[0]), Path(argv[1])
    model = Model(backing, strict_directories="--directory-datasync-keeps-entries" not in argv,
                  real_sync="--no-real-sync" not in argv)
    try:
        fd = mount_fuse(mountpoint)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"cannot mount: {exc}", flush=True)
        return 1
    print("mounted", flush=True)

    def terminate(_signum: int, _frame: object) -> None:
        unmount(mountpoint)  # the kernel then ends the read below with ENODEV

    signal.signal(signal.SIGTERM, terminate)
    try:
        Server(fd, model).serve()
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
