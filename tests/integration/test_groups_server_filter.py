"""A server-side group filter (`[topic=…] group.NAME=module:callable`) seen through a real consumer."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import uvloop

from metaq.client import Message, MessageSessionFactory
from metaq.client.group import ConsumerConfig, create_consumer
from metaq.testing.broker import BrokerProcess

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
