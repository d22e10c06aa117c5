"""The peers of `metaq bench peers` (metaq.bench.peers), under the name scripts/bench_goals.py imports them by
(``--peers``) from beside itself. Run the peers with `metaq bench peers`."""

from metaq.bench.peers import Servers, run_peer

__all__ = ["Servers", "run_peer"]
