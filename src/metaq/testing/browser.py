"""A real headless Chromium for tests of the web dashboard, driven by selenium through chromedriver.

Debian's ``chromium`` and ``chromium-driver`` packages (scripts/system-deps.sh installs them). The
browser is started with a fresh profile and every background service off: on a machine without a
network, Chromium otherwise stalls on lookups (component updates, sync, QUIC probes). Nothing is ever
skipped: a missing browser, driver or selenium raises :class:`BrowserMissing` naming what to install,
which a test reports as a failure.

Also here: where a :class:`~metaq.testing.broker.BrokerProcess` serves its dashboard.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metaq.testing.broker import BrokerProcess

CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")
"""Flags every test browser gets (the profile directory is added per browser)."""
CHROMIUM = os.environ.get("METAQ_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("METAQ_CHROMEDRIVER", "/usr/bin/chromedriver")
PAGE_LOAD_TIMEOUT_S = 30

_DASHBOARD_LINE = re.compile(r"metaq broker metrics (http://\S+)/metrics")


class BrowserMissing(RuntimeError):
    """Chromium, chromedriver or selenium is not installed: the message says how to install it."""


def _check_installed() -> None:
    missing = [f"{what} ({path})" for what, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER))
               if not (os.path.isfile(path) and os.access(path, os.X_OK))]
    if missing:
        raise BrowserMissing(f"the dashboard's browser tests need {' and '.join(missing)}: install Debian's "
                             "chromium and chromium-driver (scripts/system-deps.sh, as root), or point "
                             "METAQ_CHROMIUM / METAQ_CHROMEDRIVER at them")
    try:
        import selenium  # noqa: F401
    except ImportError:
        raise BrowserMissing("the dashboard's browser tests need selenium: pip install -e '.[test]'") from None


@contextmanager
def headless_chromium(*, width: int = 1280, height: int = 900) -> Iterator[Any]:
    """A selenium WebDriver of a fresh headless Chromium; quit and its profile removed on exit."""
    _check_installed()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="metaq-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    except Exception:
        shutil.rmtree(profile, ignore_errors=True)
        raise
    try:
        driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
        yield driver
    finally:
        try:
            driver.quit()
        finally:
            shutil.rmtree(profile, ignore_errors=True)


def dashboard_url(broker: BrokerProcess) -> str:
    """``http://host:port`` of the broker's dashboard (it runs with ``dashboardHttpPort``)."""
    found = [m.group(1) for m in (_DASHBOARD_LINE.search(line) for line in broker.log_lines) if m]
    if not found:
        raise AssertionError("the broker printed no dashboard address (is dashboardHttpPort set?):\n"
                             + "\n".join(broker.log_lines[-50:]))
    return found[-1]


def browser_errors(driver: Any) -> list[str]:
    """Errors the page logged to the browser console (script errors, failed requests)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]
