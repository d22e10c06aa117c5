"""A real, throw-away PostgreSQL server for tests: Debian's ``postgresql`` package, run from a temp dir.

::

    with PostgresServer() as pg:
        storage = PostgresOffsetStorage(pg.conninfo)

``initdb`` and ``pg_ctl`` come from ``/usr/lib/postgresql/<version>/bin`` (the newest installed; install
it with ``scripts/system-deps.sh``). PostgreSQL refuses to run as root, so as root the server runs as
the ``postgres`` system user the package creates (through ``runuser``); as anyone else, as that user.
It listens on 127.0.0.1 at a free port, with trust authentication for the ``metaq`` superuser, fsync
off (the tests check our code, not PostgreSQL's durability), ``max_prepared_transactions=20`` (XA), and
is stopped and deleted on exit.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from metaq.testing.ports import unused_port


class PostgresUnavailable(RuntimeError):
    """PostgreSQL is not installed here (or cannot be started); tests skip on it."""


def postgres_bin_dir() -> Path:
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name)
                  if Path(d).parent.name.isdigit() else 0)
    for d in reversed(dirs):
        if os.access(os.path.join(d, "initdb"), os.X_OK):
            return Path(d)
    raise PostgresUnavailable("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb); "
                              "run scripts/system-deps.sh (apt-get install postgresql)")


class PostgresServer:
    def __init__(self, user: str = "metaq", timeout_s: float = 60.0) -> None:
        self.bin = postgres_bin_dir()
        self.user = user
        self.timeout_s = timeout_s
        self.port = 0
        self.root: Path | None = None
        self._run_as: list[str] = []
        self._owner: pwd.struct_passwd | None = None
        self._opts = ""

    @property
    def conninfo(self) -> str:
        return f"host=127.0.0.1 port={self.port} dbname=postgres user={self.user} connect_timeout=10"

    def _cmd(self, *args: str) -> list[str]:
        return [*self._run_as, *args]

    def _run(self, *args: str) -> None:
        proc = subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=self.timeout_s,
                              stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise PostgresUnavailable(f"{' '.join(args[:2])} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")

    def start(self) -> PostgresServer:
        if os.geteuid() == 0:
            try:
                self._owner = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable("running as root and there is no 'postgres' user to run PostgreSQL as") \
                    from None
            self._run_as = ["runuser", "-u", "postgres", "--"]
        self.root = Path(tempfile.mkdtemp(prefix="metaq-pg-"))
        if self._owner is not None:
            os.chown(self.root, self._owner.pw_uid, self._owner.pw_gid)
        data = self.root / "data"
        self._run(str(self.bin / "initdb"), "-D", str(data), "-U", self.user, "--auth=trust", "-E", "UTF8",
                  "--no-sync")
        last: Exception | None = None
        for _attempt in range(5):  # the free port can be taken between our probe and the server's bind
            self.port = unused_port()
            opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
                    "-c synchronous_commit=off -c full_page_writes=off -c max_prepared_transactions=20")
            try:
                self._run(str(self.bin / "pg_ctl"), "-D", str(data), "-l", str(self.root / "server.log"), "-o", opts,
                          "-w", "-t", str(int(self.timeout_s)), "start")
                self._opts = opts
                return self
            except PostgresUnavailable as exc:
                last = exc
        self.stop()
        raise PostgresUnavailable(f"PostgreSQL did not start: {last}\n{self.log()}")

    def crash_and_restart(self) -> None:
        """Stop the server as a crash would (``-m immediate``: no checkpoint) and start it again on its port."""
        assert self.root is not None
        data = self.root / "data"
        self._run(str(self.bin / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        self._run(str(self.bin / "pg_ctl"), "-D", str(data), "-l", str(self.root / "server.log"), "-o", self._opts,
                  "-w", "-t", str(int(self.timeout_s)), "start")

    def log(self) -> str:
        try:
            return (self.root / "server.log").read_text()[-4000:] if self.root else ""
        except OSError:
            return ""

    def stop(self) -> None:
        if self.root is None:
            return
        data = self.root / "data"
        if (data / "postmaster.pid").exists():
            subprocess.run(self._cmd(str(self.bin / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"),
                           capture_output=True, timeout=self.timeout_s, stdin=subprocess.DEVNULL)
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
