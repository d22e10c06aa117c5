"""docs/kafka.md's examples (kcat, confluent-kafka, kafka-python) run as written against a real broker, with
``localhost:9092`` replaced by its Kafka port: copy-paste examples that work."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from metaq.testing import BrokerProcess

DOC = Path(__file__).resolve().parents[3] / "docs" / "kafka.md"
BLOCK = re.compile(r"```(sh|python)\n(.*?)```", re.S)


def examples() -> list[tuple[str, str]]:
    text = DOC.read_text(encoding="utf-8")
    return BLOCK.findall(text[text.index("## Examples"):])


def test_the_doc_has_the_three_clients_examples() -> None:
    kinds = [kind for kind, _ in examples()]
    assert kinds == ["sh", "python", "python"]


@pytest.mark.parametrize("index", range(3))
def test_each_example_runs_against_a_broker(broker_factory: object, tmp_path: Path, index: int) -> None:
    pytest.importorskip("confluent_kafka")
    pytest.importorskip("kafka")
    broker: BrokerProcess = broker_factory({"kafkaPort": 0, "numPartitions": 2,  # type: ignore[operator]
                                            "unflushThreshold": 0})
    kind, code = examples()[index]
    code = code.replace("localhost:9092", f"127.0.0.1:{broker.kafka_port}").replace("/tmp/lines.txt",
                                                                                  str(tmp_path / "lines.txt"))
    cmd = ["bash", "-euo", "pipefail", "-c", code] if kind == "sh" else [sys.executable, "-c", code]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    if kind == "sh":
        consumed = sorted(line.split(" ", 2)[2] for line in out if line.endswith("source=kcat"))
        assert consumed == ["k1 hello source=kcat", "k2 world source=kcat"]
    elif "confluent_kafka" in code:
        assert sorted(line.split(" ", 2)[2] for line in out) == sorted(
            f"b'customer-{i % 3}' b'order {i}'" for i in range(10))
    else:
        assert sorted(line.split(" ", 2)[2] for line in out) == [f"b'event {i}'" for i in range(5)]
