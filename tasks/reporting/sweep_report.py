"""A sweep's report: one self-contained, interactive HTML page, for a person to look at rather than read.

``write_sweep_report`` turns a ``SweepResult`` into ``sweep_report.html``: the data the plots need as JSON in the
page, and a script of its own (report_script.py) that draws them as SVG. Inline CSS and script, no ``src``, no
CDN, no fonts: the page opens offline, from a file share, a mail attachment, MLflow's artifact viewer or as a page
of its own from the tracking server (report_page.py), and fetches nothing. It shows:

- a header: the title, the best trial (id, best value, epoch, config), the trial counts and any links given
  (MLflow views, Prefect flow run, ...), all opening in a new tab (``target="_blank"``);
- learning curves: the selection metric per training iteration, one line per trial (each trial once in the
  legend, the best marked there and by a thick line and a star at its best value), trials stopped early
  ending in a square with their name beside it (names pushed apart where ends pile up), failed trials dashed;
- parallel coordinates: an axis per hyperparameter that varied (the search space's sampled ones, and any other
  config value that differs between trials) plus the best value; log axes for log-sampled parameters, the
  values themselves on categorical axes; dragging along an axis keeps only the trials in that range;
- best so far: how the sweep's best value improved as trials ended;
- hyperparameter importance: fANOVA over the finished trials, computed here (importance.py), or a sentence
  saying why not (too few trials);
- a multi-objective sweep (``objectives``: two or more): its Pareto front, a scatter of the finished trials on
  the first two objectives (the front's trials ringed and, for two objectives, joined by a step line) and a
  table of the front's trials;
- Population Based Training sweeps: the mutated hyperparameters over time and who copied whom (a PNG);
- the leaderboard, best first, with links to each trial's MLflow run.

This module writes the files; a module each makes what goes in them: report_axes.py (values as a person reads
them, which hyperparameters are shown, the parallel-coordinates axes), report_data.py (the JSON the page embeds
for its script), report_plots.py (the PBT PNG), report_html.py (the page's markup) and report_script.py (the
page's style sheet and script, static/report.css and static/report.js).

Hovering a trial anywhere (a line, a dot, a legend entry, a table row) highlights it in every plot and the
table; ``#highlight=<trial id>`` in the URL does the same when the page opens.

Usage::

    from sweepflow.tasks.reporting.sweep_report import write_sweep_report

    files = write_sweep_report(
        result,  # the sweep's SweepResult
        out_dir="reports/sweep-42",
        search_space=config["search_space"],  # as in the sweep's config: {"lr": {"type": "loguniform", ...}, ...}
        title="CIFAR-10 sweep 42",
        links={
            "MLflow parent run": "http://127.0.0.1:5000/#/experiments/1/runs/abc",
            "run_url_template": "http://127.0.0.1:5000/#/experiments/1/runs/{run_id}",  # makes run ids links
        },
    )
    files["html"]  # reports/sweep-42/sweep_report.html; "pbt" too for a PBT sweep (pbt.png)

The PBT plot (report_plots.py) is drawn on matplotlib's Agg canvas directly (``Figure``, never pyplot): no
display is needed, and no global figure state is shared between threads (Prefect runs tasks in threads).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sweepflow.tasks.reporting.report_axes import (
    ParamAxis,
    axis_positions,
    fixed_params,
    make_axis,
    sampled_params,
)
from sweepflow.tasks.reporting.report_data import report_data
from sweepflow.tasks.reporting.report_html import (
    best_so_far_card,
    curves_card,
    framed_notice,
    header_html,
    importance_card,
    no_trials_notice,
    page_html,
    parallel_card,
    pareto_card,
    pbt_card,
    table_html,
)
from sweepflow.tasks.reporting.report_plots import plot_pbt
from sweepflow.tasks.sweep.results import SweepResult, best_of

__all__ = [
    "HTML_NAME",
    "ParamAxis",
    "axis_positions",
    "make_axis",
    "ranked_by",
    "report_data",
    "write_sweep_report",
]

HTML_NAME = "sweep_report.html"


def _write_bytes(path: str, data: bytes) -> None:
    # Written aside and renamed: a reader (an artifact upload, a browser refresh) never sees half a file.
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------


def ranked_by(result: SweepResult, metric: str, mode: str) -> SweepResult:
    """``result`` as a sweep selecting by ``metric`` in ``mode`` would hold it: each trial's best value of
    ``metric`` over its reports (``best_of`` on its history) and the epoch it came at. What the report draws for an
    experiment without a metric of its own, by the first of its search's objectives; the experiment's own results
    are left as they are."""
    trials = []
    for t in result.trials:
        best, best_epoch = best_of(t.history, metric, mode)
        trials.append(replace(t, best=best, best_epoch=best_epoch))
    return replace(result, trials=tuple(trials), metric=metric, mode=mode)


def write_sweep_report(
    result: SweepResult,
    *,
    out_dir: str,
    search_space: dict,
    title: str,
    links: dict[str, str] | None = None,
    page_url: str | None = None,
    objectives: Sequence[tuple[str, str]] = (),
) -> dict[str, str]:
    """Write ``sweep_report.html`` (its plots drawn by its own script from data it embeds; nothing external) into
    ``out_dir``, and ``pbt.png`` for a Population Based Training sweep; return name -> path of each file
    written ("html", "pbt").

    ``search_space`` is the sweep's space as in its config (plain values are fixed parameters); it decides the
    parallel-coordinates axes (log for loguniform/pow2, categorical for choice/grid) and which importances are
    judged on a log scale. ``links`` are shown as anchors in the header, except ``"run_url_template"`` (with
    ``{run_id}``), which turns run ids into links. ``page_url``: where the report opens as a page of its own
    (the tracking server's report route), named on the page when it is shown inside a frame. ``objectives``: a
    multi-objective search's (metric, mode) pairs; with two or more, the page draws the sweep's Pareto front, and
    a sweep without a metric of its own (a Tune experiment given none) is ranked and plotted by the first of them
    (``ranked_by``), as the header says.
    """
    first_objective = not result.metric and len(objectives) >= 2
    if first_objective:
        result = ranked_by(result, *objectives[0])
    links = dict(links or {})
    search_space = dict(search_space or {})
    os.makedirs(out_dir, exist_ok=True)
    best = result.best()
    sampled = sampled_params(search_space, result.trials)
    fixed = fixed_params(search_space, sampled)
    sections = [framed_notice(page_url), header_html(result, title, best, links, fixed, first_objective=first_objective)]
    written: dict[str, str] = {}
    data: dict[str, Any] | None = None

    if not result.trials:
        sections.append(no_trials_notice(result))
    else:
        data = report_data(result, search_space, objectives)
        order = [str(r) for r in result.leaderboard()["trial"]]  # best first, as the table
        colors = {t["id"]: t["color"] for t in data["trials"]}
        sections += [
            curves_card(data, order),
            pareto_card(data, result, links),  # a multi-objective sweep's answer; "" otherwise
            parallel_card(data),
            f'<div class="row">{best_so_far_card(data)}{importance_card(data)}</div>',
        ]
        pbt = plot_pbt(result, colors)
        if pbt is not None:  # a Population Based Training sweep
            path = os.path.join(out_dir, "pbt.png")
            _write_bytes(path, pbt)
            written["pbt"] = path
            sections.append(pbt_card(pbt))
        sections.append(table_html(result, sampled, links, best, colors))

    html_path = os.path.join(out_dir, HTML_NAME)
    _write_bytes(html_path, page_html(title, sections, data).encode("utf-8"))
    return {"html": html_path, **written}
