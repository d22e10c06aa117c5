"""XA: metaq and PostgreSQL in one two-phase commit (metaq.client.xa), against a real broker and a real
PostgreSQL (max_prepared_transactions > 0). The coordinator is killed at 20 random steps, the broker is
killed with kill -9 and PostgreSQL crashed between prepare and commit: after recovery the database row and
the message are both there or both absent, every time (docs/transactions.md)."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from metaq.client import connect
from metaq.client.xa import XACoordinator, XAError
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.postgres import PostgresServer, PostgresUnavailable
from metaq.types import Message

psycopg = pytest.importorskip("psycopg")
WORKER = Path(__file__).with_name("xa_worker.py")
STEPS = ["none", "prepared:db", "prepared:mq", "decided", "committed:db", "committed:mq"]
DECIDED = {"none", "decided", "committed:db", "committed:mq"}


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer().start()
    except PostgresUnavailable as exc:
        pytest.fail(f"PostgreSQL is needed here: {exc}")
    try:
        with psycopg.connect(server.conninfo, autocommit=True) as conn:
            conn.execute("CREATE TABLE orders (id integer PRIMARY KEY)")
        yield server
    finally:
        server.stop()


def _orders(pg: PostgresServer) -> set[int]:
    with psycopg.connect(pg.conninfo, autocommit=True) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM orders")}


def _messages(broker: BrokerProcess) -> set[int]:
    with connect(broker.servers) as session:
        consumer = session.create_pull_consumer()
        out = set()
        for p in session.partitions("xa"):
            for batch in consumer.iterate_batches("xa", p, "earliest", stop_at_end=True):
                out.update(int(bytes(msg.data).split(b"-")[1]) for msg in batch)
        return out


def _recover(pg: PostgresServer, broker: BrokerProcess, log_path: Path) -> dict[str, list[str]]:
    with psycopg.connect(pg.conninfo) as db, connect(broker.servers) as session, \
            XACoordinator(log_path, {"db": db, "mq": session.create_producer()}) as coordinator:
        return coordinator.recover()


@pytest.fixture
def xa_broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    broker = broker_factory({"numPartitions": 2})
    with connect(broker.servers) as session:
        session.admin().create_topic("xa", 2)
    return broker


def test_commit_and_rollback_of_a_database_row_and_a_message_together(
        postgres: PostgresServer, xa_broker: BrokerProcess, tmp_path: Path) -> None:
    log_path = tmp_path / "xa.log"
    with psycopg.connect(postgres.conninfo) as db, connect(xa_broker.servers) as session:
        producer = session.create_producer()
        with XACoordinator(log_path, {"db": db, "mq": producer}) as coordinator:
            with coordinator.transaction():
                db.execute("INSERT INTO orders (id) VALUES (1000)")
                producer.send(Message("xa", b"order-1000"))
            with pytest.raises(XAError), coordinator.transaction():
                db.execute("INSERT INTO orders (id) VALUES (1001)")
                producer.send(Message("xa", b"order-1001"))
                raise ValueError("the application changed its mind")
            with pytest.raises(XAError), coordinator.transaction():  # the database refuses at its first statement
                producer.send(Message("xa", b"order-1000"))
                db.execute("INSERT INTO orders (id) VALUES (1000)")
    assert {1000, 1001} & _orders(postgres) == {1000}
    assert {1000, 1001} & _messages(xa_broker) == {1000}
    assert _recover(postgres, xa_broker, log_path) == {"committed": [], "rolled_back": []}


@pytest.mark.slow
def test_the_coordinator_killed_at_20_random_steps_recovers_to_both_or_neither(
        postgres: PostgresServer, xa_broker: BrokerProcess, tmp_path: Path) -> None:
    log_path = tmp_path / "xa.log"
    rng = random.Random(20261123)
    for order in range(1, 21):
        step = rng.choice(STEPS)
        proc = subprocess.run([sys.executable, str(WORKER), postgres.conninfo, xa_broker.servers, str(log_path),
                               str(order), step], capture_output=True, text=True, timeout=120)
        assert proc.returncode == (0 if step == "none" else 9), (step, proc.stderr[-2000:])
        _recover(postgres, xa_broker, log_path)
        in_db, in_mq = order in _orders(postgres), order in _messages(xa_broker)
        assert in_db == in_mq, f"order {order} crashed at {step}: database {in_db}, messages {in_mq}"
        assert in_db == (step in DECIDED), f"order {order} crashed at {step}: committed={in_db}"
    assert _recover(postgres, xa_broker, log_path) == {"committed": [], "rolled_back": []}


def test_a_broker_killed_or_postgresql_crashed_between_prepare_and_commit_still_commits_both(
        postgres: PostgresServer, xa_broker: BrokerProcess, tmp_path: Path) -> None:
    log_path = tmp_path / "xa.log"
    for order, victim in ((2001, "broker"), (2002, "postgres")):
        proc = subprocess.run([sys.executable, str(WORKER), postgres.conninfo, xa_broker.servers, str(log_path),
                               str(order), "decided"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 9, proc.stderr[-2000:]
        if victim == "broker":
            xa_broker.kill()
            xa_broker.start()
        else:
            postgres.crash_and_restart()
        assert order not in _orders(postgres) and order not in _messages(xa_broker)  # prepared, not visible
        result = _recover(postgres, xa_broker, log_path)
        assert sorted(c.split(":", 1)[0] for c in result["committed"]) == ["db", "mq"], result
        assert order in _orders(postgres) and order in _messages(xa_broker)


def _paused_worker(pg: PostgresServer, broker: BrokerProcess, log_path: Path, order: int,
                   signals: Path) -> subprocess.Popen[str]:
    """A coordinator process whose transaction stops with both branches prepared, before its decision."""
    signals.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, str(WORKER), pg.conninfo, broker.servers, str(log_path), str(order),
                             f"pause:{signals}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (signals / "paused").exists() or proc.poll() is not None, timeout_s=60,
                   message="the worker to prepare both branches")
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    return proc


def _resume(proc: subprocess.Popen[str], signals: Path) -> tuple[int, str]:
    (signals / "go").touch()
    _out, err = proc.communicate(timeout=120)
    return proc.returncode, err


def test_recover_by_another_live_coordinator_never_decides_a_prepared_branch(
        postgres: PostgresServer, xa_broker: BrokerProcess, tmp_path: Path) -> None:
    """Two coordinators of the default configuration (each its own log, no name given): one recovers at its
    start-up while the other holds prepared branches. The prepared branches are not its to decide."""
    worker = _paused_worker(postgres, xa_broker, tmp_path / "a" / "xa.log", 3001, tmp_path / "signals")
    try:
        assert _recover(postgres, xa_broker, tmp_path / "b" / "xa.log") == {"committed": [], "rolled_back": []}
    finally:
        rc, err = _resume(worker, tmp_path / "signals")
    assert rc == 0, err[-2000:]
    assert 3001 in _orders(postgres) and 3001 in _messages(xa_broker)


def test_one_log_is_used_by_one_live_coordinator(xa_broker: BrokerProcess, tmp_path: Path) -> None:
    log_path = tmp_path / "xa.log"
    with connect(xa_broker.servers) as session:
        producer = session.create_producer()
        with XACoordinator(log_path, {"mq": producer}) as first:
            with pytest.raises(XAError, match="in use by another live coordinator"):
                XACoordinator(log_path, {"mq": producer})
            gtrid_prefix = first.branch_prefix
        with XACoordinator(log_path, {"mq": producer}) as again:  # the log is free once the first closed
            assert again.branch_prefix == gtrid_prefix  # the same coordinator: it recovers the first's branches


def test_a_branch_decided_by_someone_else_is_reported_by_its_coordinator(
        postgres: PostgresServer, xa_broker: BrokerProcess, tmp_path: Path) -> None:
    """An administrator rolls the database branch back while the coordinator is between prepare and decision:
    the coordinator's commit says which branch was decided elsewhere, not psycopg's UndefinedObject."""
    signals = tmp_path / "signals"
    worker = _paused_worker(postgres, xa_broker, tmp_path / "xa.log", 3002, signals)
    try:
        with psycopg.connect(postgres.conninfo, autocommit=True) as admin:
            gids = [row[0] for row in admin.execute("SELECT gid FROM pg_prepared_xacts")]
            assert len(gids) == 1
            admin.execute(f"ROLLBACK PREPARED '{gids[0]}'")
    finally:
        rc, err = _resume(worker, signals)
    assert rc == 3, err[-2000:]
    assert "XAHeuristicError" in err and "branch 'db'" in err and "decided by someone else" in err, err[-2000:]
    assert err.startswith("XAHeuristicError: "), err[-2000:]  # the coordinator's error (psycopg's is its cause)
    # the decision was COMMIT: the other branch is committed, and the error says the outcome is mixed
    assert 3002 in _messages(xa_broker) and 3002 not in _orders(postgres)
    assert "committed: mq" in err
