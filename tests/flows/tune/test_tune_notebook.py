"""``JupyterNotebookReporter``: the trials table as HTML, updated in place while the experiment runs in a notebook,
and at its end linked to each trial's MLflow run; outside a notebook, the final table printed.

The example notebook (``examples/notebooks/tune_quickstart.ipynb``) is executed here in a Jupyter kernel
(nbclient), against this test's services from the environment: its cells define the trainable (no
``__main__`` guard) and run ``tune.run`` with ASHA, ``Tuner.fit`` and the training pipeline."""

from __future__ import annotations

import re
import time

import paths
import pytest

from sweepflow.tasks.sweep.results import TrialResult, TrialStatus
from sweepflow.tune import CLIReporter, JupyterNotebookReporter
from sweepflow.tune.analysis import Trial
from sweepflow.tune.notebook import in_notebook, run_links

NOTEBOOK = paths.ROOT / "examples" / "notebooks" / "tune_quickstart.ipynb"


def _trials() -> list[Trial]:
    def trial(index: int, status: TrialStatus, score: float, error: str | None = None) -> Trial:
        result = TrialResult(
            trial_id=f"t_{index:05d}",
            index=index,
            name=f"t_{index:05d}",
            config={"x": score / 2, "nested": {"lr": 0.01}},
            status=status,
            run_id=f"run{index}",
            last={"score": score, "a_very_long_metric_name_indeed": 1.0, "training_iteration": 3},
            error=error,
        )
        return Trial(result)

    return [
        trial(0, TrialStatus.COMPLETED, 1.5),
        trial(1, TrialStatus.FAILED, 0.5, error="ValueError: <bad> x\nTraceback ..."),
        trial(2, TrialStatus.STOPPED, 2.5),
    ]


def test_the_final_table_links_each_trial_to_its_mlflow_run_and_lists_the_errors():
    with pytest.warns(UserWarning, match="outside a Jupyter notebook"):
        reporter = JupyterNotebookReporter(metric="score", mode="max", sort_by_metric=True, max_column_length=12)
    trials = _trials()
    links = {"t_00000": "http://mlflow:5000/#/experiments/1/runs/run0?a=1&b=2"}
    page = reporter.html(trials, ["x", "nested/lr"], links=links, final=True)
    assert "Number of trials: 3 (" in page and "best trial: t_00002 with score=2.5" in page
    assert '<a href="http://mlflow:5000/#/experiments/1/runs/run0?a=1&amp;b=2" target="_blank">run0</a>' in page
    assert page.index("t_00002") < page.index("t_00000") < page.index("t_00001")  # best first
    assert "a_very_lo..." in page and "a_very_long_metric" not in page  # headers cut to max_column_length
    assert "ValueError: &lt;bad&gt; x" in page and "Traceback" not in page  # escaped, first line only
    assert "<th>nested/lr</th>" in page and "<td>0.01</td>" in page
    long_names = [Trial(TrialResult(trial_id="trainable_ab12c_00000", index=0, name="n", config={}, status=TrialStatus.COMPLETED))]
    assert "trainable_ab12c_00000" in reporter.html(long_names)  # a trial's name is never cut


def test_rows_are_capped_and_metrics_inferred_up_to_the_limit():
    with pytest.warns(UserWarning):
        reporter = JupyterNotebookReporter(max_progress_rows=2, infer_limit=1)
    page = reporter.html(_trials(), ["x"])
    assert "1 more trials not shown (max_progress_rows=2)" in page
    assert "<th>score</th>" in page and "a_very" not in page  # one inferred metric
    assert "Failed trials" not in page  # only in the final table


def test_outside_a_notebook_the_final_table_is_printed_with_the_runs(capsys):
    assert not in_notebook()
    with pytest.warns(UserWarning):
        reporter = JupyterNotebookReporter()
    reporter.report(_trials(), ["x"], links={"t_00002": "http://ui/#/runs/run2"})
    out = capsys.readouterr().out
    assert out.startswith("Number of trials: 3 (")
    assert "http://ui/#/runs/run2" in out and "run0" in out  # a trial without a link shows its run id
    with pytest.raises(ValueError, match="give metric and mode together"):
        JupyterNotebookReporter(metric="score")
    assert isinstance(reporter, CLIReporter)


def test_links_need_a_tracking_server_with_a_ui():
    from sweepflow.tune._internal.runner import ExperimentRecord

    record = ExperimentRecord("http://127.0.0.1:5000", None, "/tmp", "/tmp/exp", experiment_id="7")
    links = run_links(_trials(), record)
    assert links["t_00001"] == "http://127.0.0.1:5000/#/experiments/7/runs/run1?workflowType=machine_learning"
    assert run_links(_trials(), ExperimentRecord("sqlite:///x.db", None, "/tmp", "/tmp/exp", experiment_id="7")) == {}


def _html(message: dict) -> str:
    return message["content"].get("data", {}).get("text/html", "")


@pytest.mark.subprocess
def test_the_quickstart_notebook_runs_with_its_tables_updated_in_place(services, tmp_path):
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")

    class Recording(nbclient.NotebookClient):
        """Keeps every display message the kernel sends, by cell: the live table's updates leave only their
        last state in the executed notebook."""

        def process_message(self, msg, cell, cell_index):
            # Only the reporter's: Prefect's log lines show as rich HTML displays too.
            if msg["msg_type"] in ("display_data", "update_display_data") and "trial-progress" in _html(msg):
                self.displays.setdefault(cell_index, []).append((msg["msg_type"], _html(msg)))
            return super().process_message(msg, cell, cell_index)

    notebook = nbformat.read(str(NOTEBOOK), as_version=4)
    client = Recording(notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.displays = {}
    started = time.monotonic()
    client.execute()
    print(f"notebook: {time.monotonic() - started:.1f} s")
    cells = {i: c for i, c in enumerate(notebook.cells) if c.cell_type == "code"}
    by_source = {next(i for i, c in cells.items() if needle in c.source): name for needle, name in (
        ("tune.run(", "tune.run"), ("Tuner(", "Tuner"), ("training_pipeline(", "pipeline"))}
    for index, name in by_source.items():
        outputs = cells[index].outputs
        text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream" and o.name == "stdout")
        assert not [o for o in outputs if o.output_type == "error"], (name, outputs)
        if name == "pipeline":
            assert "test metrics:" in text, text[-3000:]
            continue
        messages = client.displays.get(index, [])
        kinds = [kind for kind, _ in messages]
        # One display, made as the first trial started, then updated in place (no second display).
        assert kinds[0] == "display_data" and kinds.count("display_data") == 1, (name, kinds)
        assert "update_display_data" in kinds, (name, kinds)
        assert "Trial progress" in messages[0][1] and "RUNNING" in messages[0][1], messages[0][1]
        final = [o for o in outputs if o.output_type == "display_data" and "trial-progress" in o.data.get("text/html", "")]
        assert len(final) == 1, (name, final)
        table = final[0].data["text/html"]
        assert "Trial status" in table and "RUNNING" not in table, table
        urls = re.findall(r'<a href="([^"]+)" target="_blank">', table)
        expected = 3 if name == "tune.run" else 2
        assert len(urls) == expected and all(u.startswith(services["mlflow"]) for u in urls), table
        assert all("/runs/" in u for u in urls), urls
    first_run_text = "".join(o.get("text", "") for o in cells[next(iter(by_source))].outputs if o.get("name") == "stdout")
    assert "best x:" in first_run_text
