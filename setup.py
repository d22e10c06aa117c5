"""The one compiled module, metaq._speedups (src/metaq/_speedups.c; docs/benchmarks.md says why). Everything
else is in pyproject.toml. ``optional=True``: without a C compiler the install goes on and metaq uses its
pure-Python SendResult, Message builders and constructor and batch columns (tests/unit/test_send_result_impl.py
fails in CI if the module was not built)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("metaq._speedups", ["src/metaq/_speedups.c"], optional=True)])
