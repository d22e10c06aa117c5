"""The history checker for fault tests: :mod:`metaq.bench.history` (``metaq bench failover`` checks its runs with
it too), under the name tests have always imported it by."""

from metaq.bench.history import (
    Ack,
    ProduceLoad,
    check_history,
    check_send_order,
    gap_at,
    longest_gap,
    maybe_stored,
    read_back,
)

__all__ = ["Ack", "ProduceLoad", "check_history", "check_send_order", "gap_at", "longest_gap", "maybe_stored",
           "read_back"]
