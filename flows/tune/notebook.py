"""``JupyterNotebookReporter``: the trials table as HTML in a Jupyter notebook, updated in place while the
experiment runs, and at its end the final table with a link to each trial's MLflow run.

In a notebook ``tune.run`` and ``Tuner.fit`` pick it when no ``progress_reporter`` is given, as Ray does. The
reporter sees the trials through the experiment's callback hooks (``sweepflow.tune.callback``), which run in the
notebook's kernel: one output display, made at the first trial's start and updated (``update_display_data``) at
most every ``max_report_frequency`` seconds, then once more with the final table when the experiment ends.
Outside a notebook it prints the final table, as ``CLIReporter`` does, with each trial's MLflow run.
"""

from __future__ import annotations

import html
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any

import pandas as pd

from sweepflow.tune.callback import Callback
from sweepflow.tune.reporter import CLIReporter

#: What every result carries besides the trainable's own metrics: not inferred as metric columns (Ray's too).
AUTO_FILLED = frozenset(
    {
        "config", "trial_id", "experiment_tag", "timestamp", "done", "should_checkpoint", "training_iteration",
        "time_total_s", "time_this_iter_s", "time_since_restore", "iterations_since_restore", "timesteps_total",
        "episodes_total", "date", "hostname", "node_ip", "pid", "epoch",
    }
)
#: Columns never cut to ``max_column_length``: a trial's name is how it is found in MLflow and Prefect.
_WHOLE = frozenset({"Trial name", "status"})


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ``ZMQInteractiveShell``; not a terminal IPython)."""
    ipython = sys.modules.get("IPython")  # a kernel has imported it; without it, this is no notebook
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and any(c.__name__ == "ZMQInteractiveShell" for c in type(shell).__mro__)


class JupyterNotebookReporter(CLIReporter, Callback):
    """Ray Tune's ``JupyterNotebookReporter``: the trials table as HTML in the notebook, updated in place.

    The table shows each trial's name, status, parameter and metric columns; a line above it counts the trials
    by status and names the best one so far (with ``metric``/``mode``, or the experiment's). The final table,
    when the experiment has ended, links each trial to its MLflow run, and lists the failed trials' errors.

    Differs from Ray: the display is made when the experiment's first trial starts (Ray makes it when the
    reporter is created), so a reporter made in one cell shows in the cell that runs the experiment; it is
    updated on the trials' events (start, report, end), at most every ``max_report_frequency`` seconds, not on a
    timer; there is no system-info line (memory, resources); ``print_intermediate_tables=False`` leaves only the
    final table. Outside a notebook it warns, as Ray does, and prints the final table as text.

    Args:
        overwrite: clear the cell's earlier output when the table first shows.
        metric_columns: the reported metrics to show (a dict maps each to its header); default: the first
            ``infer_limit`` metrics of each trial's last result.
        parameter_columns: the config keys to show (``"a/b"`` for nested keys; a dict maps each to its
            header); default: the keys the search varies.
        total_samples: how many trials the experiment proposes (default: what the experiment says).
        max_progress_rows: at most this many trials in the table (the rest are counted below it).
        max_error_rows: at most this many failed trials in the final table's error list.
        max_column_length: longer headers and values are cut to this many characters.
        max_report_frequency: at most one update of the table every this many seconds.
        infer_limit: how many metrics to show when ``metric_columns`` is not given.
        print_intermediate_tables: False: no table while the experiment runs, only the final one.
        metric: the metric naming the best trial so far (default: the experiment's).
        mode: ``"min"`` or ``"max"``, for ``metric``.
        sort_by_metric: list the ended trials best first by ``metric``.
    """

    def __init__(
        self,
        *,
        overwrite: bool = True,
        metric_columns: Sequence[str] | dict[str, str] | None = None,
        parameter_columns: Sequence[str] | dict[str, str] | None = None,
        total_samples: int | None = None,
        max_progress_rows: int = 20,
        max_error_rows: int = 20,
        max_column_length: int = 20,
        max_report_frequency: int = 5,
        infer_limit: int = 3,
        print_intermediate_tables: bool | None = None,
        metric: str | None = None,
        mode: str | None = None,
        sort_by_metric: bool = False,
    ) -> None:
        super().__init__(metric_columns=metric_columns, parameter_columns=parameter_columns)
        if mode not in (None, "min", "max"):
            raise ValueError(f"JupyterNotebookReporter(mode={mode!r}): use 'min' or 'max'")
        if (metric is None) != (mode is None):
            raise ValueError("JupyterNotebookReporter: give metric and mode together, or neither (the experiment's)")
        self.overwrite = overwrite
        self.total_samples = total_samples
        self.max_progress_rows = max_progress_rows
        self.max_error_rows = max_error_rows
        self.max_column_length = max_column_length
        self.max_report_frequency = max_report_frequency
        self.infer_limit = infer_limit
        self.print_intermediate_tables = print_intermediate_tables
        self.metric, self.mode = metric, mode
        self.sort_by_metric = sort_by_metric
        self.searched: tuple[str, ...] = ()  # the experiment's searched keys, the default parameter columns
        self._handle: Any = None  # IPython's DisplayHandle, once the table shows
        self._shown_at: float | None = None
        self._lock = threading.Lock()
        if not in_notebook():
            warnings.warn(
                "JupyterNotebookReporter is used outside a Jupyter notebook: the final table is printed as text; "
                "pass progress_reporter=CLIReporter() there instead",
                stacklevel=2,
            )

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (``Tuner.restore`` saves the run config): without the display and the lock."""
        return {**self.__dict__, "_handle": None, "_shown_at": None, "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def set_search_properties(self, metric: str | None, mode: str | None) -> bool:
        """The experiment's metric and mode, used when the reporter was given none (as in Ray)."""
        if self.metric is None and metric is not None and mode is not None:
            self.metric, self.mode = metric, mode
        return True

    # ---- while the experiment runs: the experiment's callback hooks
    def setup(self, stop: Any = None, num_samples: int | None = None, total_num_samples: int | None = None, **info: Any) -> None:
        """A new experiment: a new display (the previous experiment's table stays where it is)."""
        self.total_samples = self.total_samples or total_num_samples
        self._handle, self._shown_at = None, None

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Show the table (updated if it is time)."""
        self._live(trials)

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any) -> None:
        """Show the table (updated if it is time)."""
        self._live(trials)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Show the table (updated if it is time)."""
        self._live(trials)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Show the table (updated if it is time)."""
        self._live(trials)

    def _live(self, trials: Sequence[Any]) -> None:
        if self.print_intermediate_tables is False or not in_notebook():
            return
        with self._lock:
            now = time.monotonic()
            if self._shown_at is not None and now - self._shown_at < self.max_report_frequency:
                return
            self._shown_at = now
            self._show(self.html(trials, self.searched))

    # ---- when the experiment has ended
    def report(self, trials: Sequence[Any], searched: Sequence[str] = (), links: dict[str, str] | None = None) -> None:
        """The final table: in a notebook, the display updated with it (each trial linked to its MLflow run:
        ``links``, trial id -> URL); elsewhere printed as text. Called by the experiment when it has ended."""
        if not in_notebook():
            frame = pd.DataFrame(self._rows(trials, searched, links or {}, html_cells=False))
            print(self._heading(trials) + "\n" + frame.to_string(index=False), flush=True)
            return
        with self._lock:
            self._show(self.html(trials, searched, links=links or {}, final=True))
            self._handle = None  # the next experiment shows its own table

    def html(
        self, trials: Sequence[Any], searched: Sequence[str] = (), *, links: dict[str, str] | None = None, final: bool = False
    ) -> str:
        """The table as HTML: a heading line (counts, best trial so far), the trials, and when ``final`` the
        failed trials' errors."""
        shown = self._ordered(trials)[: self.max_progress_rows]
        frame = pd.DataFrame(self._rows(shown, searched or self.searched, links or {}, html_cells=True))
        parts = [f"<h3>{'Trial status' if final else 'Trial progress'}</h3>", f"<p>{html.escape(self._heading(trials))}</p>"]
        parts.append(frame.to_html(index=False, escape=False, border=0))
        if len(trials) > len(shown):
            parts.append(f"<p>... {len(trials) - len(shown)} more trials not shown (max_progress_rows={self.max_progress_rows})</p>")
        failed = [t for t in trials if t.status == "ERROR"][: self.max_error_rows] if final else []
        if failed:
            items = "".join(
                f"<li><b>{html.escape(t.trial_id)}</b>: {html.escape((t.error_msg or '').splitlines()[0] if t.error_msg else '')}</li>"
                for t in failed
            )
            parts.append(f"<p>Failed trials:</p><ul>{items}</ul>")
        return "<div class='trial-progress'>" + "".join(parts) + "</div>"

    def _show(self, content: str) -> None:
        from IPython.display import HTML, clear_output, display  # in a kernel: IPython is there

        if self._handle is None:
            if self.overwrite:
                clear_output(wait=True)
            self._handle = display(HTML(content), display_id=True)
        else:
            self._handle.update(HTML(content))

    def _heading(self, trials: Sequence[Any]) -> str:
        line = self.heading(trials, self.total_samples)
        best = self._best(trials)
        if best is not None:
            line += f" | best trial: {best.trial_id} with {self.metric}={_cell(best.last_result.get(self.metric))}"
        return line

    def _score(self, trial: Any) -> float | None:
        value = trial.last_result.get(self.metric) if self.metric else None
        return float(value) if isinstance(value, int | float) and value == value else None

    def _best(self, trials: Sequence[Any]) -> Any:
        scored = [t for t in trials if self._score(t) is not None]
        if not scored:
            return None
        pick = max if self.mode == "max" else min
        return pick(scored, key=self._score)

    def _ordered(self, trials: Sequence[Any]) -> list[Any]:
        """Running trials first, then the rest (ended ones best first with ``sort_by_metric``), as Ray orders."""
        running = [t for t in trials if t.status == "RUNNING"]
        rest = [t for t in trials if t.status != "RUNNING"]
        if self.sort_by_metric and self.metric:
            sign = -1.0 if self.mode == "max" else 1.0
            rest.sort(key=lambda t: (self._score(t) is None, sign * (self._score(t) or 0.0)))
        return running + rest

    def _rows(self, trials: Sequence[Any], searched: Sequence[str], links: dict[str, str], *, html_cells: bool) -> list[dict[str, Any]]:
        rows = []
        for trial, row in zip(trials, self.rows(trials, searched), strict=True):
            cells = {k if k in _WHOLE else self._cut(k): _cell(v) if k in _WHOLE else self._cut(_cell(v)) for k, v in row.items()}
            if html_cells:
                cells = {html.escape(k): html.escape(v) for k, v in cells.items()}
            url = links.get(trial.trial_id)
            if links:
                cells["MLflow run"] = (
                    (f'<a href="{html.escape(url)}" target="_blank">{html.escape(trial.mlflow_run_id or "run")}</a>' if url else html.escape(trial.mlflow_run_id or ""))
                    if html_cells
                    else (url or trial.mlflow_run_id or "")
                )
            rows.append(cells)
        return rows

    def _cut(self, text: str) -> str:
        limit = self.max_column_length
        return text if len(text) <= limit or limit < 4 else text[: limit - 3] + "..."

    def _inferred_metrics(self, trial: Any) -> list[str]:
        found = [k for k, v in trial.last_result.items() if k not in AUTO_FILLED and isinstance(v, int | float)]
        if self.metric and self.metric in found:
            found.remove(self.metric)
            found.insert(0, self.metric)
        return found[: self.infer_limit]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def run_links(trials: Sequence[Any], record: Any) -> dict[str, str]:
    """Each trial's MLflow run page (trial id -> URL), where the tracking server has a UI (an http(s) server)."""
    from sweepflow.tasks.tracking.links import MlflowLinks

    if record is None or not record.experiment_id:
        return {}
    links = MlflowLinks.for_tracking_uri(record.tracking_uri)
    urls = {t.trial_id: links.run(record.experiment_id, t.mlflow_run_id) for t in trials if t.mlflow_run_id}
    return {trial_id: url for trial_id, url in urls.items() if url}


def choose(
    progress_reporter: Any, verbose: int, *, metric: str | None, mode: str | None, searched: Sequence[str]
) -> Any:
    """The experiment's reporter: the script's, else in a notebook a ``JupyterNotebookReporter`` (keeping the
    cell's earlier output unless ``verbose`` < 2, as Ray does), else None (``CLIReporter`` at the end). A
    notebook reporter learns the experiment's metric and mode (unless it has its own) and searched keys."""
    reporter = progress_reporter
    if reporter is None and verbose and in_notebook():
        reporter = JupyterNotebookReporter(overwrite=verbose < 2)
    if isinstance(reporter, JupyterNotebookReporter):
        reporter.set_search_properties(metric, mode)
        reporter.searched = tuple(searched)
    return reporter


def with_live(callbacks: Any, reporter: Any, verbose: int) -> Any:
    """``callbacks`` with the notebook reporter's hooks (its table updated as the trials run) after the script's."""
    if not isinstance(reporter, JupyterNotebookReporter) or not verbose:
        return callbacks
    if callbacks is None:
        return [reporter]
    if isinstance(callbacks, list | tuple) and reporter not in callbacks:
        return [*callbacks, reporter]
    return callbacks  # not a list: refused by check_callbacks with its fix
