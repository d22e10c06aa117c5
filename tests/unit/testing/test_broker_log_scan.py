"""What metaq.testing.broker counts as a problem in a broker's output (no broker process needed)."""

from __future__ import annotations

from metaq.testing.broker import log_incidents

OUTPUT = """\
2025-01-01 10:00:00,001 INFO metaq.broker: broker 0 serving 0 topics / 0 partitions from d (opened in 0.01s)
metaq broker ready 127.0.0.1:40000
2025-01-01 10:00:01,002 WARNING metaq.broker.server: closing connection from 127.0.0.1:5: bad frame
2025-01-01 10:00:02,003 ERROR metaq.broker.server: unexpected error handling Fetch
Traceback (most recent call last):
  File "server.py", line 1, in dispatch
ValueError: boom
2025-01-01 10:00:03,004 INFO metaq.broker: stopping: no new connections, finishing in-flight requests
Traceback (most recent call last):
  File "main.py", line 9, in run
KeyError: 'x'
2025-01-01 10:00:04,005 CRITICAL metaq.broker: disk gone
2025-01-01 10:00:05,006 INFO metaq.broker: the word ERROR in a message is not an error record
""".splitlines()


def test_error_records_with_their_traceback_and_bare_tracebacks_are_incidents() -> None:
    incidents = log_incidents(OUTPUT)
    assert [len(i) for i in incidents] == [4, 3, 1]
    assert incidents[0][0].endswith("unexpected error handling Fetch") and incidents[0][-1] == "ValueError: boom"
    assert incidents[1] == ["Traceback (most recent call last):", '  File "main.py", line 9, in run', "KeyError: 'x'"]
    assert incidents[2][0].endswith("CRITICAL metaq.broker: disk gone")


def test_warnings_and_info_are_not_incidents() -> None:
    assert log_incidents([line for line in OUTPUT if " ERROR " not in line and " CRITICAL " not in line
                          and not line.startswith(("Traceback", "  File", "ValueError", "KeyError"))]) == []
