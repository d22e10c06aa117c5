"""A server-side group filter (`[topic=…] group.NAME=module:callable`) seen through a real consumer."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import uvloop

from metaq.client import Message, MessageSessionFactory, connect
from metaq.client.group import ConsumerConfig, create_consumer
from metaq.client.sync import SyncSessionFactory
from metaq.errors import InvalidRequestError
from metaq.testing.broker import BrokerProcess, wait_until

FILTER_MODULE = '''
def only_vip(message):
    return message.attribute == "vip"
'''


def test_server_side_filter_sends_only_matching_messages_and_the_group_moves_past_the_rest(tmp_path: Path) -> None:
    (tmp_path / "mq_filters.py").write_text(FILTER_MODULE)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    config = "[system]\nnumPartitions=2\n\n[topic=news]\nnumPartitions=2\ngroup.vips=mq_filters:only_vip\n"
    with BrokerProcess(tmp_path / "b", config_text=config, env=env) as broker:

        async def main() -> None:
            session = await MessageSessionFactory.connect(broker.servers)
            producer = session.create_producer()
            for i in range(40):
                await producer.send(Message("news", b"%d" % i, attribute="vip" if i % 4 == 0 else "plain"))
            await producer.flush()
            got: list[bytes] = []
            everything: list[bytes] = []
            cfg = dict(recover_dir=tmp_path / "r", commit_offset_period_ms=200, max_delay_fetch_ms=300)
            vips = create_consumer(session, ConsumerConfig(group="vips", **cfg)).subscribe(  # type: ignore[arg-type]
                "news", 4096, lambda msg: got.append(bytes(msg.data)))
            others = create_consumer(session, ConsumerConfig(group="all", **cfg)).subscribe(  # type: ignore[arg-type]
                "news", 4096, lambda msg: everything.append(bytes(msg.data)))
            await vips.complete_subscribe()
            await others.complete_subscribe()
            deadline = time.monotonic() + 20
            while not (len(everything) == 40 and all(v[2] == 20 for v in vips.positions().values())):
                assert time.monotonic() < deadline, (len(everything), vips.positions())
                await asyncio.sleep(0.01)
            assert sorted(got) == sorted(b"%d" % i for i in range(0, 40, 4))
            assert vips.stats.filtered == 0  # the broker did it: nothing was sent to be dropped here
            await vips.close()
            await others.close()
            await session.close()

        uvloop.run(main())


def module_env(directory: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(directory), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize(("ref", "why"), [
    ("cfg_no_such_filters:paid_only", "cannot import 'cfg_no_such_filters'"),
    ("cfg_start_filters:paid", "'cfg_start_filters' has no 'paid'"),
])
def test_a_filter_that_cannot_be_loaded_refuses_the_start_in_one_line(tmp_path: Path, ref: str, why: str) -> None:
    (tmp_path / "cfg_start_filters.py").write_text("def paid_only(message):\n    return True\n")
    ini = tmp_path / "server.ini"
    ini.write_text(f"[system]\ndataPath={tmp_path / 'data'}\n[topic=orders]\ngroup.billing={ref}\n")
    done = subprocess.run([sys.executable, "-m", "metaq.broker", "--serverPort", "0", "-f", str(ini)],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**os.environ, **module_env(tmp_path)})
    assert done.returncode == 1 and "ready" not in done.stdout and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"Error: [topic=orders] group.billing: consumer filter '{ref}': "
                                                     f"{why}"), done.stderr


ORDERS_FILTER = "def accept(message):\n    return message.attribute == {!r}\n"


def read_as(session: SyncSessionFactory, group: str) -> list[str | None]:
    """The attributes of what ``group`` is sent of topic orders, from the start."""
    consumer = session.create_pull_consumer()
    return [m.attribute for m in consumer.iterate("orders", 0, "earliest", stop_at_end=True, group=group)]


@pytest.mark.parametrize("how", ["sighup", "admin"])
def test_a_reload_imports_a_changed_filter_module_and_refuses_a_filter_that_cannot_be_loaded(
        tmp_path: Path, how: str) -> None:
    module = tmp_path / "cfg_orders_filters.py"
    module.write_text(ORDERS_FILTER.format("paid"))
    config = "[system]\nnumPartitions=1\n[topic=orders]\ngroup.billing=cfg_orders_filters:{}\n"
    with BrokerProcess(tmp_path / "b", config_text=config.format("accept"), env=module_env(tmp_path)) as broker:
        broker.allow_log(r"reload of .* refused: \[topic=orders\] group\.billing: .*has no 'nothing'")

        def reload(session: SyncSessionFactory) -> None:
            if how == "admin":
                session.admin().reload()
                return
            done = len([line for line in broker.log_lines if "reload" in line])
            broker.signal(signal.SIGHUP)
            wait_until(lambda: len([line for line in broker.log_lines if "reload" in line]) > done, 30,
                       message="the reload to be logged")

        with connect(broker.servers) as session:
            attributes = ["paid", "refund", "plain", None] * 5
            assert session.create_producer().send_batch("orders", [
                Message("orders", b"%d" % i, attribute=a) for i, a in enumerate(attributes)]).success
            assert read_as(session, "billing") == ["paid"] * 5
            assert read_as(session, "others") == attributes

            module.write_text(ORDERS_FILTER.format("refund"))  # the module changed, server.ini did not
            reload(session)
            assert read_as(session, "billing") == ["refund"] * 5

            broker.config_path.write_text(config.format("nothing"))  # a callable the module does not have
            if how == "admin":
                with pytest.raises(InvalidRequestError, match=r"\[topic=orders\] group\.billing: .*has no 'nothing'"):
                    session.admin().reload()
            else:
                reload(session)
                assert any("refused" in line and "has no 'nothing'" in line for line in broker.log_lines)
            assert read_as(session, "billing") == ["refund"] * 5  # the filter in force is kept, never none
