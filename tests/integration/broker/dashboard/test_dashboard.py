"""The web dashboard (``dashboardHttpPort``) in a real headless Chromium against real broker processes.

What an operator sees: the numbers `metaq stats` gives, a group's lag growing while its consumer is
stopped and shrinking when it resumes, charts that move under load, a partition closed (and opened
again) through the page after its confirmation dialog, and JSON errors for bad requests that leave
the broker serving. Every wait is a condition with a deadline.
"""

from __future__ import annotations

import base64
import json
import math
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cli_process import metaq

from metaq.client import Message, connect
from metaq.client.group import ConsumerConfig
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.browser import BrowserMissing, browser_errors, dashboard_url, headless_chromium

UI_TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    try:
        with headless_chromium() as driver:
            yield driver
    except BrowserMissing as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """The module's browser on a blank page, its console emptied: what it logs is this test's."""
    chromium.get("about:blank")
    chromium.get_log("browser")
    yield chromium
    chromium.get("about:blank")  # before the broker stops: the page stops polling it


@pytest.fixture
def dash_broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory({"numPartitions": 2, "unflushThreshold": 0, "dashboardHttpPort": 0})


class BoundedLoad:
    """A producer thread: ``batch`` messages every ``every_s`` to ``topic``, at most ``count_max`` messages
    and ``duration_s_max`` seconds, until :meth:`stop`. ``sent`` counts the acknowledged messages."""

    def __init__(self, servers: str, topic: str, *, batch: int = 10, every_s: float = 0.1, count_max: int = 2000,
                 duration_s_max: float = 60.0) -> None:
        self.servers, self.topic, self.batch, self.every_s = servers, topic, batch, every_s
        self.count_max, self.duration_s_max = count_max, duration_s_max
        self.sent = 0
        self.failed: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"load-{topic}", daemon=True)

    def _run(self) -> None:
        try:
            with connect(self.servers) as session:
                producer = session.create_producer()
                deadline = threading.Event()
                timer = threading.Timer(self.duration_s_max, deadline.set)
                timer.start()
                try:
                    while self.sent < self.count_max and not self._stop.is_set() and not deadline.is_set():
                        n = min(self.batch, self.count_max - self.sent)
                        result = producer.send_batch(self.topic, [b"load %d" % (self.sent + i) for i in range(n)])
                        assert result.success, [r.error for r in result if not r.success][:1]
                        self.sent += n
                        self._stop.wait(self.every_s)  # pacing of the load, not a synchronisation
                finally:
                    timer.cancel()
        except BaseException as exc:
            self.failed.append(exc)

    def __enter__(self) -> BoundedLoad:
        self._thread.start()
        return self

    def finish(self) -> int:
        """Wait until ``count_max`` messages were sent (or ``duration_s_max`` passed)."""
        self._thread.join(self.duration_s_max + 30)
        return self.stop()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the producer thread did not stop"
        assert not self.failed, self.failed
        return self.sent

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- what the page shows ------------------------------------------------------------------------


def open_view(driver: Any, base: str, view: str) -> None:
    if not driver.current_url.startswith(base + "/"):
        driver.get(base + "/")
    driver.execute_script("location.hash = arguments[0]", view)
    wait_until(lambda: driver.execute_script("return !document.getElementById('view-' + arguments[0]).hidden", view),
               UI_TIMEOUT_S, 0.05, f"the {view} view to show")


def text_of(driver: Any, css: str) -> str | None:
    """The visible text of the first element matching ``css``, None while there is none."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        return found[0].text if found else None
    except StaleElementReferenceException:
        return None


def partition_cell(driver: Any, topic: str, partition: str, field: str) -> str | None:
    row = f'#topics-list tr[data-topic="{topic}"][data-partition="{partition}"]'
    return text_of(driver, f'{row} td[data-field="{field}"]')


def group_lags(driver: Any, group: str) -> dict[str, int] | None:
    """partition -> lag as the groups view shows it."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        rows = driver.find_elements(By.CSS_SELECTOR, f'#groups-list tr[data-group="{group}"]')
        out = {row.get_attribute("data-partition"): int(row.find_element(By.CSS_SELECTOR, 'td[data-field="lag"]').text)
               for row in rows}
    except (StaleElementReferenceException, ValueError):
        return None
    return out or None


def cli_stats(broker: BrokerProcess, topic: str) -> dict[str, Any]:
    done = metaq("stats", "--json", "-t", topic, "-s", broker.servers)
    assert done.returncode == 0, done.stderr
    (doc,) = json.loads(done.stdout)
    return dict(doc["topics"][topic]["partitions"])


def api(base: str, path: str, body: bytes | None = None, *, method: str = "GET",
        content_type: str | None = "application/json", user: tuple[str, str] | None = None
        ) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": content_type} if content_type and body is not None else {}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(user).encode()).decode()
    request = urllib.request.Request(base + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        assert exc.headers["Content-Type"].startswith("application/json"), exc.headers["Content-Type"]
        return exc.code, json.loads(exc.read())


def confirm(driver: Any, answer: str) -> None:
    """Answer the page's confirmation dialog: ``"ok"`` or ``"cancel"``."""
    from selenium.webdriver.common.by import By

    wait_until(lambda: driver.execute_script("return document.getElementById('confirm').open"), UI_TIMEOUT_S, 0.05,
               "the confirmation dialog")
    driver.find_element(By.ID, f"confirm-{answer}").click()
    wait_until(lambda: not driver.execute_script("return document.getElementById('confirm').open"), UI_TIMEOUT_S,
               0.05, "the confirmation dialog to close")


# -- tests --------------------------------------------------------------------------------------


def test_topics_view_shows_the_offsets_and_counts_metaq_stats_gives(dash_broker: BrokerProcess, browser: Any) -> None:
    base = dashboard_url(dash_broker)
    with connect(dash_broker.servers) as session:
        session.admin().create_topic("orders", 2)
    with BoundedLoad(dash_broker.servers, "orders", batch=7, every_s=0.02, count_max=350, duration_s_max=30) as load:
        open_view(browser, base, "topics")
        wait_until(lambda: partition_cell(browser, "orders", "0-0", "end_offset") not in (None, "0"), UI_TIMEOUT_S,
                   0.05, "the topics view to show orders' first messages")
        sent = load.finish()
    stats = cli_stats(dash_broker, "orders")
    assert sum(p["put_messages"] for p in stats.values()) == sent == 350

    def shown() -> bool:
        return all(partition_cell(browser, "orders", f"0-{p}", "end_offset") == str(stats[str(p)]["log_end_offset"])
                   for p in (0, 1))

    wait_until(shown, UI_TIMEOUT_S, 0.05, "the page to show the end offsets metaq stats gives")
    for p in (0, 1):
        label = f"0-{p}"
        assert partition_cell(browser, "orders", label, "start_offset") == str(stats[str(p)]["log_start_offset"]) == "0"
        assert partition_cell(browser, "orders", label, "messages") == str(stats[str(p)]["put_messages"])
        assert partition_cell(browser, "orders", label, "state") == "open"
        assert partition_cell(browser, "orders", label, "segments") == "1"
    meta = text_of(browser, '#topics-list .block[data-topic="orders"] .meta')
    assert meta is not None and "2 partitions here, 350 messages stored" in meta
    assert text_of(browser, '#broker-facts [data-field="cluster_mode"]') == "standalone"  # as README says
    # the header names the broker
    assert text_of(browser, "#broker-title") == "broker 0"
    assert text_of(browser, '#broker-facts [data-field="role"]') == "master"
    assert browser_errors(browser) == []


def _assert_round_axis(labels: list[str]) -> None:
    """A chart's y labels are 0 and four equal steps of 1, 2, 2.5 or 5 times a power of ten (they were the
    largest value's quarters: 249, 499, 748, 997)."""
    scale = {"k": 1e3, "M": 1e6}
    values = [float(t.split()[0]) * scale.get(t.split()[-1], 1) if " " in t else float(t) for t in labels]
    step = values[1]
    assert len(values) == 5 and all(math.isclose(v, step * i) for i, v in enumerate(values)), labels
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 2.5, 5)), labels


def test_the_live_chart_and_rates_move_under_load_without_a_reload(dash_broker: BrokerProcess, browser: Any) -> None:
    base = dashboard_url(dash_broker)
    with connect(dash_broker.servers) as session:
        session.admin().create_topic("charted", 2)
    browser.get(base + "/#overview")
    open_view(browser, base, "overview")
    browser.execute_script("window.__notReloaded = true")
    chart = "document.getElementById('chart-rates')"
    wait_until(lambda: browser.execute_script(f"return {chart}.dataset.lastT") not in (None, "0"), UI_TIMEOUT_S, 0.05,
               "the first samples on the chart")
    first_t = browser.execute_script(f"return {chart}.dataset.lastT")
    first_image = browser.execute_script(f"return {chart}.toDataURL()")
    with BoundedLoad(dash_broker.servers, "charted", batch=20, every_s=0.05, count_max=3000, duration_s_max=30):
        rate = wait_until(lambda: (text_of(browser, "#rate-in-msg") or "-") not in ("-", "0"), UI_TIMEOUT_S, 0.05,
                          "a produce rate above 0 on the page")
        assert rate
        wait_until(lambda: browser.execute_script(f"return {chart}.dataset.lastT") != first_t
                   and browser.execute_script(f"return {chart}.toDataURL()") != first_image, UI_TIMEOUT_S, 0.05,
                   "the produce chart to draw new samples")
        history = browser.execute_script("return state.history.map(s => s.in_msg_s)")
        wait_until(lambda: max(browser.execute_script("return state.history.map(s => s.in_msg_s)")) > 0,
                   UI_TIMEOUT_S, 0.05, "a sample with produce traffic in the chart's history")
        assert len(history) >= 1
        ticks = browser.execute_script(f"return {chart}.dataset.ticks").split(",")
        _assert_round_axis(ticks)
    assert browser.execute_script("return window.__notReloaded === true"), "the page reloaded"
    assert "live" in (text_of(browser, "#live") or "")
    assert browser_errors(browser) == []


def test_a_groups_lag_grows_while_its_consumer_is_stopped_and_shrinks_when_it_resumes(
        dash_broker: BrokerProcess, browser: Any) -> None:
    base = dashboard_url(dash_broker)
    config = ConsumerConfig(group="watchers", session_timeout_ms=3000, commit_offset_period_ms=200,
                            max_delay_fetch_ms=200, fetch_runner_count=2)
    consumed = threading.Semaphore(0)
    with connect(dash_broker.servers) as session:
        session.admin().create_topic("lagging", 2)
        with BoundedLoad(dash_broker.servers, "lagging", batch=5, every_s=0.05, count_max=2000,
                         duration_s_max=90) as load:
            with session.create_consumer(config) as consumer:
                consumer.subscribe("lagging", 64 * 1024, lambda message: consumed.release())
                consumer.complete_subscribe()
                open_view(browser, base, "groups")
                wait_until(lambda: group_lags(browser, "watchers") is not None, UI_TIMEOUT_S, 0.05,
                           "the group's partitions on the page")
            # the consumer is stopped: the producer goes on, the lag shown grows
            def lag_shown() -> int:
                return sum((group_lags(browser, "watchers") or {}).values())

            wait_until(lambda: lag_shown() >= 40, UI_TIMEOUT_S, 0.05, "the lag to grow while the consumer is stopped")
            low = lag_shown()
            wait_until(lambda: lag_shown() >= low + 40, UI_TIMEOUT_S, 0.05, "the lag to keep growing")
            sent = load.stop()
        # resumed: the lag shrinks to nothing
        with session.create_consumer(config) as consumer:
            consumer.subscribe("lagging", 64 * 1024, lambda message: consumed.release())
            consumer.complete_subscribe()
            wait_until(lambda: group_lags(browser, "watchers") == {"0-0": 0, "0-1": 0}, 30, 0.05,
                       "the lag to come back to 0 once the consumer resumed")
    stats = cli_stats(dash_broker, "lagging")
    assert sum(p["put_messages"] for p in stats.values()) == sent
    for p in (0, 1):
        row = f'#groups-list tr[data-group="watchers"][data-partition="0-{p}"]'
        committed = text_of(browser, f'{row} td[data-field="committed"]')
        assert committed == str(stats[str(p)]["log_end_offset"])
    # the lag chart drew the group
    lags = browser.execute_script("return state.history.map(s => s.lag.watchers || 0)")
    assert max(lags) >= low + 40 and lags[-1] == 0
    assert browser_errors(browser) == []


def test_closing_a_partition_through_the_page_refuses_producers_until_it_is_opened(
        dash_broker: BrokerProcess, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    base = dashboard_url(dash_broker)
    with connect(dash_broker.servers) as session:
        session.admin().create_topic("gated", 2)
        producer = session.create_producer()
        assert producer.send_batch("gated", [b"before"], partition=1).success
        open_view(browser, base, "topics")
        button = '#topics-list tr[data-topic="gated"][data-partition="0-1"] button'
        wait_until(lambda: text_of(browser, button) == "Close", UI_TIMEOUT_S, 0.05, "the Close button of 0-1")
        # cancelled: nothing changes
        browser.find_element(By.CSS_SELECTOR, button).click()
        confirm(browser, "cancel")
        assert api(base, "/api/topics/gated")[1]["partitions"][1]["state"] == "open"
        # confirmed: closed, and a produce to it is refused
        browser.find_element(By.CSS_SELECTOR, button).click()
        confirm(browser, "ok")
        wait_until(lambda: partition_cell(browser, "gated", "0-1", "state") == "closed", UI_TIMEOUT_S, 0.05,
                   "the page to show 0-1 closed")
        assert "is closed" in (text_of(browser, "#notice") or "")
        refused = producer.send_batch("gated", [b"while closed"], partition=1)
        assert not refused.success and "PARTITION_CLOSED" in str(refused[0].error)
        assert partition_cell(browser, "gated", "0-0", "state") == "open"
        # opened again through the page
        wait_until(lambda: text_of(browser, button) == "Open", UI_TIMEOUT_S, 0.05, "the Open button of 0-1")
        browser.find_element(By.CSS_SELECTOR, button).click()
        confirm(browser, "ok")
        wait_until(lambda: partition_cell(browser, "gated", "0-1", "state") == "open", UI_TIMEOUT_S, 0.05,
                   "the page to show 0-1 open again")
        assert producer.send_batch("gated", [b"after"], partition=1).success
    assert cli_stats(dash_broker, "gated")["1"]["put_messages"] == 2
    assert browser_errors(browser) == []


def test_resetting_a_groups_offsets_through_the_page(dash_broker: BrokerProcess, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    base = dashboard_url(dash_broker)
    with connect(dash_broker.servers) as session:
        session.admin().create_topic("replay", 2)
        producer = session.create_producer()
        for p in (0, 1):
            assert producer.send_batch("replay", [b"m%d" % i for i in range(20)], partition=p).success
    done = metaq("group", "reset", "replayers", "replay", "--to", "latest", "-s", dash_broker.servers)
    assert done.returncode == 0, done.stderr
    open_view(browser, base, "groups")
    wait_until(lambda: group_lags(browser, "replayers") == {"0-0": 0, "0-1": 0}, UI_TIMEOUT_S, 0.05,
               "the group at the end of replay")
    form = browser.find_element(By.CSS_SELECTOR, 'form.reset[data-group="replayers"]')
    Select(form.find_element(By.NAME, "topic")).select_by_value("replay")
    Select(form.find_element(By.NAME, "to")).select_by_value("earliest")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    confirm(browser, "ok")
    stats = cli_stats(dash_broker, "replay")
    wanted = {f"0-{p}": stats[str(p)]["log_end_offset"] for p in (0, 1)}
    wait_until(lambda: group_lags(browser, "replayers") == wanted, UI_TIMEOUT_S, 0.05,
               "the lag to be every stored message after the reset to earliest")
    assert sum(wanted.values()) == 40
    assert "reset replayers on replay" in (text_of(browser, "#notice") or "")
    described = metaq("group", "describe", "replayers", "-s", dash_broker.servers)
    assert described.returncode == 0, described.stderr
    assert "\t0\t" in described.stdout  # committed offset 0, as `metaq group describe` shows it too
    assert browser_errors(browser) == []


def test_json_endpoints_answer_bad_input_with_a_4xx_json_error_and_the_broker_keeps_serving(
        dash_broker: BrokerProcess) -> None:
    base = dashboard_url(dash_broker)
    with connect(dash_broker.servers) as session:
        session.admin().create_topic("solid", 2)
    cases: list[tuple[str, str, bytes | None, str | None, int, str]] = [
        ("GET", "/api/topics/nope", None, None, 404, "UNKNOWN_TOPIC"),
        ("GET", "/api/groups/nobody", None, None, 404, "UNKNOWN_GROUP"),
        ("GET", "/api/nothing-here", None, None, 404, "INVALID_REQUEST"),
        ("GET", "/api/history?since=yesterday", None, None, 400, "INVALID_REQUEST"),
        ("POST", "/api/state", b"{}", "application/json", 405, "INVALID_REQUEST"),
        ("POST", "/api/topics/nope/partitions/0/close", b"", None, 404, "UNKNOWN_TOPIC"),
        ("POST", "/api/topics/solid/partitions/7/close", b"", None, 404, "UNKNOWN_PARTITION"),
        ("POST", "/api/topics/solid/partitions/3-0/close", b"", None, 404, "UNKNOWN_PARTITION"),
        ("POST", "/api/topics/solid/partitions/x/close", b"", None, 400, "INVALID_REQUEST"),
        ("POST", "/api/topics/solid/partitions/0/explode", b"", None, 404, "INVALID_REQUEST"),
        ("POST", "/api/topics/..%2Fetc/partitions/0/close", b"", None, 400, "INVALID_TOPIC"),
        ("POST", "/api/groups/g/reset", b'{"topic": "solid", ', "application/json", 400, "INVALID_REQUEST"),
        ("POST", "/api/groups/g/reset", b"\xff\xfe", "application/json", 400, "INVALID_REQUEST"),
        ("POST", "/api/groups/g/reset", b'["solid"]', "application/json", 400, "INVALID_REQUEST"),
        ("POST", "/api/groups/g/reset", b'{"topic": "solid", "to": "yesterday"}', "application/json", 400,
         "INVALID_REQUEST"),
        ("POST", "/api/groups/g/reset", b'{"topic": "solid", "to": -5}', "application/json", 400, "INVALID_REQUEST"),
        ("POST", "/api/groups/g/reset", b'{"topic": "solid", "partitions": "0-0"}', "application/json", 400,
         "INVALID_REQUEST"),
        ("POST", "/api/groups/g/reset", b'{"topic": "nope"}', "application/json", 404, "UNKNOWN_TOPIC"),
        ("POST", "/api/groups/g/reset", b'{"topic": "solid", "partitions": ["0-9"]}', "application/json", 404,
         "UNKNOWN_PARTITION"),
        ("POST", "/api/groups/g/reset", b'{"topic": "solid"}', "text/plain", 415, "INVALID_REQUEST"),
        ("POST", "/api/groups/g/reset", b'{"topic": "' + b"x" * 100_000 + b'"}', "application/json", 413,
         "INVALID_REQUEST"),
        ("POST", "/api/groups/bad%20group%2F/reset", b'{"topic": "solid"}', "application/json", 400,
         "INVALID_REQUEST"),
    ]
    for method, path, body, content_type, status, name in cases:
        got, doc = api(base, path, body, method=method, content_type=content_type)
        assert (got, doc["error"]["name"]) == (status, name), (method, path, doc)
        assert doc["error"]["status"] == status and doc["error"]["message"], doc
    # a reset while the group has an active member is refused (409), as `metaq group reset` is
    config = ConsumerConfig(group="busy", session_timeout_ms=3000, max_delay_fetch_ms=200)
    with connect(dash_broker.servers) as session, session.create_consumer(config) as consumer:
        consumer.subscribe("solid", 64 * 1024, lambda message: None)
        consumer.complete_subscribe()
        wait_until(lambda: len(consumer.assignment()) == 2, UI_TIMEOUT_S, 0.05, "the member to own both partitions")
        got, doc = api(base, "/api/groups/busy/reset", b'{"topic": "solid", "to": "earliest"}', method="POST")
        assert got == 409 and doc["error"]["name"] == "ILLEGAL_GENERATION", doc
        assert "active members" in doc["error"]["message"]
    # still serving: the page, the JSON, /metrics and produce
    assert api(base, "/api/state")[0] == 200
    with urllib.request.urlopen(base + "/metrics", timeout=10) as reply:
        assert b"metaq_broker_info" in reply.read()
    with connect(dash_broker.servers) as session:
        assert session.create_producer().send(Message("solid", b"still here")).success


def test_a_zookeeper_mode_broker_shows_the_whole_cluster_as_metaq_cluster_does(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str, browser: Any) -> None:
    from metaq.client.blocking import BlockingClient
    from metaq.cluster.zookeeper import ZooKeeperRegistry
    from metaq.protocol.records import encode_values
    from metaq.types import PartitionId

    brokers = {b: cluster_factory(b, topics="[topic=spread]\nnumPartitions=2\n", dashboardHttpPort=0) for b in (1, 2)}
    everywhere = [PartitionId(b, p) for b in (1, 2) for p in (0, 1)]
    with BlockingClient(brokers[1].servers) as client:  # it routes to each partition's own broker
        wait_until(lambda: client.partitions_for("spread") == everywhere, UI_TIMEOUT_S, 0.05,
                   "both brokers' partitions")
        for pid in everywhere:  # 10 * broker id + partition + 1 messages in each
            client.produce("spread", pid, encode_values([b"x"] * (10 * pid.broker_id + pid.partition + 1),
                                                        1_700_000_000_000))
    registry = ZooKeeperRegistry(zookeeper.connect_string, zk_root, watch_cluster=False).start()
    try:
        registry.register_member("auditors", "auditor-a", ["spread"])
        assert registry.claim("auditors", "spread", PartitionId(2, 1), "auditor-a")
        registry.commit_offsets("auditors", {("spread", PartitionId(1, 0)): 4, ("spread", PartitionId(2, 1)): 20})
        base = dashboard_url(brokers[1])
        open_view(browser, base, "cluster")
        wait_until(lambda: text_of(browser, '#cluster-brokers tr[data-broker="2"] td[data-field="master"]')
                   == brokers[2].servers, UI_TIMEOUT_S, 0.05, "broker 2 in broker 1's cluster view")
        assert text_of(browser, '#cluster-brokers tr[data-broker="1"] td[data-field="master"]') == brokers[1].servers
        row = '#cluster-list tr[data-group="auditors"][data-topic="spread"]'
        wait_until(lambda: text_of(browser, f'{row}[data-partition="2-1"] td[data-field="lag"]') == "2", UI_TIMEOUT_S,
                   0.05, "the group's lag on 2-1 (22 stored, 20 committed)")
        assert text_of(browser, f'{row}[data-partition="1-0"] td[data-field="lag"]') == "7"  # 11 stored, 4 committed
        assert text_of(browser, f'{row}[data-partition="2-1"] td[data-field="owner"]') == "auditor-a"
        # the same numbers `metaq cluster --json` gives
        done = metaq("cluster", "--zk-connect", zookeeper.connect_string, "--zk-root", zk_root, "--json")
        assert done.returncode == 0, done.stderr
        (group,) = [g for g in json.loads(done.stdout)["groups"] if g["group"] == "auditors"]
        shown = api(base, "/api/cluster")[1]
        (same,) = [g for g in shown["groups"] if g["group"] == "auditors"]
        assert same["partitions"] == group["partitions"] and same["lag"] == group["lag"] == 9
        open_view(browser, base, "groups")  # the local groups view says where the groups are
        assert "ZooKeeper mode" in (text_of(browser, "#groups-note") or "")
    finally:
        registry.close()
    assert browser_errors(browser) == []


def test_with_authentication_the_dashboard_asks_for_a_user_and_shows_only_what_it_may_describe(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Any) -> None:
    """With authRequired the page and its API take HTTP Basic credentials of a metaq user (a browser asks for
    them once), /metrics stays open to scrapers; with aclEnabled the topics and groups are those the user may
    describe; admin actions are refused (they would need admin ACLs the dashboard does not check yet)."""
    import os

    from metaq.client.blocking import BlockingClient
    from metaq.protocol.records import encode_values

    data = tmp_path / "broker"
    env = {**os.environ, "METAQ_PASSWORD": "pw"}
    for user in ("alice", "root"):
        assert metaq("acl", "user", "add", user, "--data-path", str(data), env=env).returncode == 0
    done = metaq("acl", "add", "--principal", "User:alice", "--topic", "a", "-o", "consume", "--data-path", str(data))
    assert done.returncode == 0, done.stderr
    broker = broker_factory({"numPartitions": 1, "dashboardHttpPort": 0, "authRequired": "true",
                             "aclEnabled": "true", "superUsers": "User:root", "httpBasicAuthOverPlaintext": "true"})
    broker.allow_log(r"HTTP authentication from .* failed")
    with BlockingClient(broker.servers, username="root", password="pw") as root:
        for topic in ("a", "b"):
            root.produce(topic, "0-0", encode_values([b"x"], 1))
    base = dashboard_url(broker)
    status, body = api(base, "/api/topics")
    assert status == 401 and body["error"]["name"] == "SASL_AUTHENTICATION_FAILED", body
    assert api(base, "/api/topics", user=("alice", "wrong"))[0] == 401
    status, body = api(base, "/api/topics", user=("alice", "pw"))
    assert status == 200 and [t["name"] for t in body["topics"]] == ["a"], body
    assert api(base, "/api/topics/b", user=("alice", "pw"))[0] == 404  # not hers to see
    assert sorted(t["name"] for t in api(base, "/api/topics", user=("root", "pw"))[1]["topics"]) == ["a", "b"]
    with urllib.request.urlopen(base + "/metrics", timeout=10) as reply:
        assert reply.status == 200
    status, body = api(base, "/api/topics/a/partitions/0/close", b"{}", method="POST", user=("root", "pw"))
    assert status == 403 and body["error"]["name"] == "AUTHENTICATION_NOT_SUPPORTED", body
