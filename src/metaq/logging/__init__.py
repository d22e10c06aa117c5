"""MetaQ's log4j appender for Python: a ``logging.Handler`` that publishes log records to a metaq topic.

::

    import logging
    from metaq.logging import MetaqHandler

    handler = MetaqHandler("127.0.0.1:8123", "app-logs", spill_dir="/var/spool/app")
    logging.getLogger().addHandler(handler)
    logging.getLogger("shop.orders").info("order placed", extra={"order_id": 42})

What an application can rely on:

- **emit() never waits for the network.** It formats the record (JSON by default), appends it to a
  bounded in-memory queue and returns. A background thread with its own asyncio loop owns the
  producer and sends what is queued every ``flush_interval_s`` (sooner when ``batch_records`` are
  waiting).
- **A broker that is down, slow or unknown never blocks or crashes the application.** Records that
  could not be sent stay queued and are retried with exponential backoff (``retry_backoff_s`` up to
  ``retry_backoff_max_s``). Problems are written to stderr, at most once per ``error_interval_s``
  (and only while ``logging.raiseExceptions`` is true, as ``Handler.handleError`` does); nothing raises
  into the caller.
- **Memory is bounded.** The queue holds at most ``max_buffered_records`` records, plus the one batch
  the background thread is sending. When it is full, the oldest record is appended to a spill file in
  ``spill_dir`` (at most ``max_spill_bytes`` on disk) or, without ``spill_dir``, dropped;
  ``stats().dropped`` counts what was lost. Spilled records are sent first, oldest first, once the
  broker answers. Spill files left by a handler that is gone (closed with records unsent, or its
  process exited or was killed) are claimed and sent by the next handler of that topic given the same
  ``spill_dir``.
- **What a crash loses.** A spilled record is written to the spill file (handed to the operating
  system, one write per record) before emit() returns, so it survives the application being killed
  (SIGKILL, an abort, the OOM killer). The background thread fsyncs the spill files written since its
  last sync (and ``spill_dir`` itself, for new files) every ``spill_sync_interval_s`` (default 1 s;
  None: never, leaving it to the OS's writeback), so a machine that stops (power loss, kernel panic)
  loses at most the records spilled in the last interval: ``stats().spilled_unsynced`` counts them now.
  Records still in the memory queue (``stats().pending`` minus what is spilled) are lost with the
  process; close() spills them, fsynced.
- **flush(timeout) and close(timeout) drain within a bound** (default ``close_timeout_s``). What
  close() could not send goes to ``spill_dir`` if given, otherwise it is counted as dropped.
- **Delivery is at-least-once.** A batch whose send failed after the broker may have stored it (a
  timeout, a connection lost mid-request) is sent again, so a record can be stored twice around
  broker failures; give records a unique key (``key_func``) when readers must de-duplicate.

Records logged by the handler's own thread (the metaq client's warnings while it retries) are never
queued, which would feed the handler its own failures; they are reported like errors.

The message attribute (what MetaQ consumers filter on) is the record's level name unless
``attribute`` says otherwise; the message timestamp is the time of the logging call.

The package: :mod:`.handler` (the handler and its background thread), :mod:`.spill` (the spill files),
:mod:`.formatter` (the JSON formatter). The names below are its interface.
"""

from metaq.logging.formatter import JsonFormatter
from metaq.logging.handler import HandlerStats, MetaqHandler

__all__ = ["HandlerStats", "JsonFormatter", "MetaqHandler"]
