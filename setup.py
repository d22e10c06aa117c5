"""The compiled modules: metaq._speedups (src/metaq/_speedups.c; docs/benchmarks.md says why) and
metaq._kafka_speedups (src/metaq/_kafka_speedups.c: the Kafka listener's record conversions, docs/kafka.md).
Everything else is in pyproject.toml. ``optional=True``: without a C compiler the install goes on and metaq uses its
pure-Python SendResult, Message builders and constructor and batch columns (tests/unit/test_send_result_impl.py
fails in CI if the module was not built)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("metaq._speedups", ["src/metaq/_speedups.c"], optional=True),
                   Extension("metaq._kafka_speedups", ["src/metaq/_kafka_speedups.c"], optional=True)])
