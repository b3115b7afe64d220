"""``CLIReporter``: the trials table Ray Tune prints, printed when the experiment ends (the sweep's progress line
is logged at every change while it runs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd


class CLIReporter:
    """Ray Tune's ``CLIReporter``: the trials table, printed once when the experiment ends.

    Differs from Ray: nothing is printed while trials run (the sweep logs a progress line at every change
    instead), so ``max_report_frequency`` and Ray's other arguments (``max_progress_rows``,
    ``sort_by_metric``, ``metric``, ``mode``, ...) are accepted and ignored.

    Args:
        metric_columns: the reported metrics to show (a dict maps each to its column header); default: every
            metric of each trial's last result.
        parameter_columns: the config keys to show (``"a/b"`` for nested keys; a dict maps each to its
            header); default: the keys the search varies, as Ray does.
        max_report_frequency: accepted for Ray's signature; ignored.
    """
    def __init__(
        self,
        metric_columns: Sequence[str] | dict[str, str] | None = None,
        parameter_columns: Sequence[str] | dict[str, str] | None = None,
        max_report_frequency: int = 5,
        **_ignored: Any,
    ) -> None:
        self.metric_columns = metric_columns
        self.parameter_columns = parameter_columns

    def add_metric_column(self, metric: str, representation: str | None = None) -> None:
        """Show one more reported metric as a column (``representation``: its header, when ``metric_columns``
        is a dict).
        """
        if isinstance(self.metric_columns, dict):
            self.metric_columns[metric] = representation or metric
        else:
            self.metric_columns = [*(self.metric_columns or []), metric]

    def table(self, trials: Sequence[Any], searched: Sequence[str] = ()) -> str:
        """``trials``: ``Trial`` objects (``sweepflow.tune.analysis``); ``searched``: the config paths the search
        varies ("a/b" for nested keys), shown when no ``parameter_columns`` were given (as Ray does)."""
        frame = pd.DataFrame(self.rows(trials, searched))
        return self.heading(trials) + "\n" + frame.to_string(index=False, float_format=lambda v: f"{v:.6g}")

    def heading(self, trials: Sequence[Any], total: int | None = None) -> str:
        """The table's first line: how many trials, by status (``total``: how many the experiment proposes,
        when more than have started)."""
        statuses = pd.Series([t.status for t in trials], dtype=object).value_counts().to_dict()
        count = f"{len(trials)}/{total}" if total and total > len(trials) else str(len(trials))
        return f"Number of trials: {count} ({', '.join(f'{n} {s}' for s, n in statuses.items())})"

    def rows(self, trials: Sequence[Any], searched: Sequence[str] = ()) -> list[dict[str, Any]]:
        """The table's rows, one per trial: its name and status, the parameter columns, the metric columns and
        ``training_iteration``."""
        rows = []
        for t in trials:
            row: dict[str, Any] = {"Trial name": t.trial_id, "status": t.status}
            for key in self.parameter_columns or searched:
                label = self.parameter_columns[key] if isinstance(self.parameter_columns, dict) else key
                row[label] = _at(t.config, key)
            for key in self.metric_columns or self._inferred_metrics(t):
                label = self.metric_columns[key] if isinstance(self.metric_columns, dict) else key
                row[label] = t.last_result.get(key)
            row["training_iteration"] = t.last_result.get("training_iteration")
            rows.append(row)
        return rows

    def _inferred_metrics(self, trial: Any) -> list[str]:
        """The metric columns when ``metric_columns`` is not given: every metric of the trial's last result."""
        return [k for k in trial.last_result if k not in ("config",)]

    def report(self, trials: Sequence[Any], searched: Sequence[str] = ()) -> None:
        """Print ``table(trials, searched)``.

        Unlike Ray's ``report(trials, done, *sys_info)``, the second argument is the searched config keys: it
        is called once, by the experiment, when it has ended.
        """
        print(self.table(trials, searched), flush=True)


def _at(config: dict[str, Any], path: str) -> Any:
    node: Any = config
    for key in path.split("/"):
        node = node.get(key) if isinstance(node, dict) else None
    return node
