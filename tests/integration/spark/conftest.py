"""One SparkSession for the whole Spark suite (starting one costs ~10 s), with format("metaq") registered."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

# Spark's Python workers must be this interpreter (the venv with metaq installed), not python3 on PATH.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""C1 only and the serial collector: the driver JVM of a short local test starts about twice as fast."""


MASTER = "local[2,4]"
"""Two task threads, and four attempts per task as on a cluster (spark.task.maxFailures' default there; local
mode's is one). A task whose Python worker a loaded machine starts too slowly to connect back within Spark's
fixed 10 s ("Python worker failed to connect back") is tried again instead of failing the query: a real bug
fails every attempt, and the exactly-once sink is built for a task's earlier attempts (it rolls them back)."""


def spark_builder(app: str) -> Any:
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master(MASTER).appName(app)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "1g")
            .config("spark.driver.extraJavaOptions", DRIVER_JAVA_OPTIONS)
            .config("spark.sql.session.timeZone", "UTC"))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    import metaq.spark

    session = spark_builder("metaq-spark-tests").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    metaq.spark.register(session)
    yield session
    session.stop()
