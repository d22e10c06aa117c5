"""Failover under load: ``metaq bench failover`` (metaq.bench.failover), kept as a script for older notes.

    .venv/bin/python scripts/bench_failover.py --rounds 20 --faults master-kill
"""

from metaq.cli.bench_cmd import bench_failover

if __name__ == "__main__":
    bench_failover()
