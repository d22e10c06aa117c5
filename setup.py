"""The compiled modules: metaq._speedups (src/metaq/_speedups.c; docs/compiled.md says what and why) and
metaq._kafka_speedups (src/metaq/_kafka_speedups.c: the Kafka listener's record conversions, docs/kafka.md).
Everything else is in pyproject.toml. ``optional=True``: without a C compiler the install goes on and metaq runs
the Python reference of each compiled piece (tests/unit/test_compiled.py fails in CI if the module was not built)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("metaq._speedups", ["src/metaq/_speedups.c"], optional=True),
                   Extension("metaq._kafka_speedups", ["src/metaq/_kafka_speedups.c"], optional=True)])
