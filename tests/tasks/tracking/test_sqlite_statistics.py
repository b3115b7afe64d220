"""Planner statistics of an MLflow server on SQLite (sweepflow.tasks.tracking.sqlite_statistics): when they are
refreshed (pure), that a refresh turns the runs table's metric-sorted query from a scan per run into an index
look-up (MLflow's own SQL, captured from its store), and that sweepflow's MLflow app refreshes them by itself."""

from __future__ import annotations

import sqlite3
import threading
import time

from mlflow_server import run_mlflow_server, sqlite_store
from sqlalchemy import event

from sweepflow.infra.services.local import mlflow_app_args
from sweepflow.tasks.tracking.sqlite_statistics import (
    GROWTH,
    MIN_RUNS,
    analysis_due,
    start_statistics_keeper,
)


def test_statistics_are_refreshed_at_first_then_as_runs_grow_by_a_tenth() -> None:
    assert not analysis_due(MIN_RUNS - 1, None)  # a small store: any plan is fast
    assert analysis_due(MIN_RUNS, None)
    assert not analysis_due(1000, 1000) and not analysis_due(int(1000 * GROWTH) - 1, 1000)
    assert analysis_due(int(1000 * GROWTH), 1000)


def _store_with_a_sweep(directory, trials: int):
    """An MLflow SQLite store holding a parent run and ``trials`` child runs, each with its best_val_accuracy."""
    from mlflow.entities import Metric, RunTag
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    uri = sqlite_store(directory)
    store = SqlAlchemyStore(uri, str(directory / "artifacts"))
    experiment = store.create_experiment("stats")
    parent = store.create_run(experiment, "u", 0, [], "parent").info.run_id
    for i in range(trials):
        run = store.create_run(experiment, "u", i, [RunTag("mlflow.parentRunId", parent)], f"trial_{i}")
        store.log_batch(run.info.run_id, [Metric("best_val_accuracy", i / trials, i, 1)], [], [])
    return uri, store, experiment, parent


def _runs_table_plan(store, experiment: str, parent: str) -> str:
    """SQLite's plan for the query MLflow's store runs for the sweep's runs table (best first by the metric)."""
    from mlflow.entities import ViewType

    statements = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        statements.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", capture)
    try:
        store.search_runs(
            [experiment],
            f"tags.mlflow.parentRunId = '{parent}'",
            ViewType.ACTIVE_ONLY,
            max_results=100,
            order_by=["metrics.`best_val_accuracy` DESC"],
        )
    finally:
        event.remove(store.engine, "before_cursor_execute", capture)
    statement, parameters = next((s, p) for s, p in statements if "latest_metrics" in s and "ORDER BY" in s)
    with store.engine.connect() as connection:
        rows = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).fetchall()
    return "\n".join(str(row[-1]) for row in rows)


def test_a_refresh_turns_the_runs_tables_scan_per_run_into_an_index_look_up(tmp_path) -> None:
    _, store, experiment, parent = _store_with_a_sweep(tmp_path, MIN_RUNS + 30)
    before = _runs_table_plan(store, experiment, parent)
    assert "SCAN anon_1" in before, before  # the metric's rows read once per run: quadratic in the trials
    stop = threading.Event()
    keeper = start_statistics_keeper(store, every_s=0.05, stop=stop)
    assert keeper is not None
    try:
        deadline = time.monotonic() + 30
        while "AUTOMATIC COVERING INDEX" not in (after := _runs_table_plan(store, experiment, parent)):
            assert time.monotonic() < deadline, after
            time.sleep(0.1)
    finally:
        stop.set()
        keeper.join(timeout=10)
    assert "SCAN anon_1" not in after, after


def test_any_other_store_gets_no_thread() -> None:
    class FileStore:  # MLflow's file store has no SQL engine
        pass

    assert start_statistics_keeper(FileStore()) is None


def test_sweepflows_mlflow_app_analyzes_a_grown_store_when_it_starts(tmp_path) -> None:
    _store_with_a_sweep(tmp_path, MIN_RUNS)
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as connection:  # MLflow itself never analyzes
        assert not connection.execute("SELECT name FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchall()
    with run_mlflow_server(str(tmp_path), extra_args=tuple(mlflow_app_args("sweepflow"))):
        deadline = time.monotonic() + 60
        while True:
            with sqlite3.connect(db, timeout=30) as connection:
                tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
                stats = (
                    connection.execute("SELECT count(*) FROM sqlite_stat1 WHERE tbl = 'runs'").fetchone()[0]
                    if "sqlite_stat1" in tables
                    else 0
                )
            if stats:
                break
            assert time.monotonic() < deadline, "the server wrote no statistics of its runs table within 60 s"
            time.sleep(0.5)
