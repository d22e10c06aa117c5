"""The demo data pipeline: log events -> MetaqHandler -> metaq -> Spark Structured Streaming -> metaq + Parquet.

- :mod:`metaq.pipeline.generator`: realistic web-access and application log events.
- :mod:`metaq.pipeline.demo`: ``python -m metaq.demo`` (``make demo``): broker, generator, Spark job,
  live and final summaries.
- :mod:`metaq.pipeline.summary`: reading the results back and printing them.
- :mod:`metaq.pipeline.simple`: the Spark-free produce/consume demo (``python -m metaq.demo --simple``).

The Spark code itself is :mod:`metaq.spark.pipeline` (pyspark is imported only under ``metaq.spark``).
"""
