"""Errors of the Spark source that the driver raises too (kept apart from :mod:`metaq.spark.arrow`, so
that the driver's stream process does not import pyarrow.compute to name them)."""

from __future__ import annotations

from metaq.errors import MetaqError


class DataLossError(MetaqError):
    """Messages the query should read are gone (retention, a truncated or recreated topic)."""


__all__ = ["DataLossError"]
