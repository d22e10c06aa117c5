"""A pytest plugin for tests against metaq: pytest-timeout's limits scale with a loaded machine.

Enable it with ``pytest_plugins = ["metaq.testing.pytest_plugin"]`` in a conftest.py (metaq's own suite
does). The limit pytest-timeout puts on each test (its ``timeout`` setting, or the test's
``@pytest.mark.timeout``) is multiplied by :func:`metaq.testing.timing.slowness` as the test starts: the
deadlines inside a test scale with the machine (:func:`metaq.testing.timing.scaled`), so the limit around
them must too, or it would fire first. Without pytest-timeout the plugin does nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from metaq.testing.timing import slowness


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> Any:
    factor = slowness()
    if factor <= 1 or not settings.timeout:
        return None  # pytest-timeout's own timer, unchanged
    import pytest_timeout

    return pytest_timeout.pytest_timeout_set_timer(item, settings._replace(timeout=settings.timeout * factor))
