"""``make demo``: ``python -m metaq.demo`` runs the log-analytics pipeline on metaq and Spark.

``python -m metaq.demo --simple`` runs the Spark-free producer/consumer demo instead. The code is in
:mod:`metaq.pipeline` (see docs/demo.md).
"""

from __future__ import annotations

from metaq.pipeline.demo import main

if __name__ == "__main__":
    raise SystemExit(main())
