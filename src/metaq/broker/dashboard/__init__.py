"""The web dashboard of a broker, on ``dashboardHttpPort`` beside Prometheus's ``/metrics``.

One aiohttp application on the broker's own event loop (:mod:`.server`) serves:

* ``/metrics``: the Prometheus text format (:mod:`metaq.broker.metrics`);
* ``/``: one HTML page with one script and one stylesheet (``static/``, package data, no build step)
  that polls the JSON below every second and redraws itself, charts included (drawn on ``<canvas>``);
* ``/api/...``: JSON built on the loop from the broker's own state (:mod:`.views`), the rolling
  history the charts draw (:mod:`.history`, sampled once a second by the dashboard itself, never by
  the produce or fetch path), and the admin actions (close/open a partition, reset a group's offsets),
  which go through the broker core's request API exactly as the CLI's requests do.

The port has no authentication: it must be reachable only by trusted operators (docs/operations.md,
"Dashboard").
"""
