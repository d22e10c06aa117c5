"""metaq as a Spark data source: ``format("metaq")`` for batch and streaming reads and writes.

The only package of metaq that imports pyspark (install the ``spark`` extra)::

    import metaq.spark
    metaq.spark.register(spark)
    df = spark.read.format("metaq").option("servers", "127.0.0.1:8123").option("topic", "t").load()

See docs/spark.md for options, schema, offsets and delivery guarantees.
"""

from __future__ import annotations

from typing import Any

from metaq.spark.errors import DataLossError
from metaq.spark.source import (
    SCHEMA,
    MetaqCommitMessage,
    MetaqDataSource,
    MetaqInputPartition,
)

__all__ = [
    "SCHEMA",
    "DataLossError",
    "MetaqCommitMessage",
    "MetaqDataSource",
    "MetaqInputPartition",
    "register",
]


def register(spark: Any) -> None:
    """Make ``format("metaq")`` available in this SparkSession."""
    spark.dataSource.register(MetaqDataSource)
