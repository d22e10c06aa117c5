"""The demo's self-check (metaq.pipeline.summary.self_check): a run that saw nothing must fail."""

from __future__ import annotations

from metaq.pipeline.summary import RunTotals, self_check


def test_a_run_where_every_request_is_counted_passes() -> None:
    assert self_check(RunTotals(requests=9124, counted=9124, spark_rows=10_311, spark_batches=14,
                                parquet_same=True)) == []


def test_a_saturated_run_where_spark_processed_nothing_fails() -> None:
    # what the issue saw on a saturated machine: 0 rows, 0 of 9,124 counted, and no PROBLEM line
    problems = self_check(RunTotals(requests=9124, counted=0, spark_rows=0, spark_batches=0, parquet_same=True))
    assert problems == [
        "Spark processed nothing: query 'aggregate' read 0 events in 0 micro-batches (a saturated machine? "
        "see docs/demo.md)",
        "9,124 of 9,124 generated request(s) are missing from the aggregates",
    ]


def test_spark_batches_that_read_no_event_are_nothing_too() -> None:
    problems = self_check(RunTotals(requests=0, counted=0, spark_rows=0, spark_batches=3, parquet_same=True))
    assert problems[0] == "the generator logged no request: nothing was checked"
    assert problems[1].startswith("Spark processed nothing")


def test_missing_extra_and_differing_rows_are_each_a_problem() -> None:
    assert self_check(RunTotals(100, 99, 120, 2, True)) == [
        "1 of 100 generated request(s) are missing from the aggregates"]
    assert self_check(RunTotals(100, 101, 120, 2, True)) == [
        "the aggregates count 1 request(s) more than the 100 generated"]
    assert self_check(RunTotals(100, 100, 120, 2, False)) == ["the Parquet rows differ from the aggregates topic"]
