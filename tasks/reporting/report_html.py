"""The sweep report's HTML: the page's header, its cards, the leaderboard and the page around them.

Each function returns markup, everything from the data escaped (``html.escape``); hrefs that would run code
(``javascript:`` and the like) are dropped, and links open in a new tab. The plots are empty ``<div>``s the
page's script (report_script.py: static/report.js) draws into from the JSON ``page_html`` embeds
(report_data.py); the style sheet (static/report.css) and the script are inlined, so the page loads nothing.
"""

from __future__ import annotations

import base64
import html
import math
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.colors import to_hex

from sweepflow.tasks.reporting.report_axes import EMPTY_CELL, better, fmt, is_number, sort_key_words
from sweepflow.tasks.reporting.report_data import DRAWN_BEST, STATUS_WORDS, json_for_script
from sweepflow.tasks.reporting.report_script import CSS, SCRIPT
from sweepflow.tasks.sweep.results import SweepResult, TrialResult, TrialStatus
from sweepflow.tasks.tracking.params import varying_params

__all__ = [
    "RUN_URL_TEMPLATE_KEY",
    "best_so_far_card",
    "curves_card",
    "framed_notice",
    "header_html",
    "importance_card",
    "no_trials_notice",
    "page_html",
    "parallel_card",
    "pareto_card",
    "pbt_card",
    "table_html",
]

TABLE_ROWS_SHOWN = 300  # more trials: the rest of the table is shown on request (table_html)
RUN_URL_TEMPLATE_KEY = (
    "run_url_template"  # a `links` key: "{run_id}" in it is replaced by each trial's run id
)

# --------------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------------


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _safe_href(url: str) -> str | None:
    """``url`` unless its scheme runs code when clicked (javascript:, data:, vbscript:)."""
    scheme = url.strip().split(":", 1)[0].lower() if ":" in url else ""
    return None if scheme in ("javascript", "data", "vbscript") else url


def _anchor(url: str, text: str) -> str:
    """A link that opens in a new tab: the page may sit in a sandboxed frame (MLflow's artifact viewer), where a
    link that navigates the frame itself only blanks it."""
    href = _safe_href(url)
    if not href:
        return _e(text)
    return f'<a href="{_e(href)}" target="_blank" rel="noopener noreferrer">{_e(text)}</a>'


def _run_url(links: Mapping[str, str], run_id: str | None) -> str | None:
    template = links.get(RUN_URL_TEMPLATE_KEY)
    if not template or not run_id:
        return None
    # str.replace, not str.format: a URL may hold other braces (templated paths, JSON in a query).
    return template.replace("{run_id}", run_id)


def _status_badge(trial: TrialResult | None, status_value: str) -> str:
    try:
        status: TrialStatus | None = TrialStatus(status_value)
    except ValueError:  # a status this version does not know (a newer sweep's MLflow tag): shown as it is
        status = None
    word = STATUS_WORDS.get(status, str(status_value).lower()) if status else str(status_value).lower()
    title = ""
    if status is TrialStatus.FAILED and trial is not None and trial.error:
        first_line = next((line for line in trial.error.strip().splitlines() if line.strip()), "")
        title = f' title="{_e(first_line.strip())}"'
    css = status.value.lower() if status else "unknown"
    return f'<span class="status status-{_e(css)}"{title}>{_e(word)}</span>'


def header_html(
    result: SweepResult,
    title: str,
    best: TrialResult | None,
    links: Mapping[str, str],
    fixed: Mapping[str, Any],
    *,
    first_objective: bool = False,
) -> str:
    """The page's header: title, what ranks the trials, counts, links, fixed parameters, the best trial.
    ``first_objective``: the experiment has no metric of its own and ``result`` is ranked by the first of its
    search's objectives (``sweep_report.ranked_by``), which the header says."""
    counts = {status: sum(t.status is status for t in result.trials) for status in TrialStatus}
    parts = [f"{len(result.trials)} trial{'s' if len(result.trials) != 1 else ''}"]
    parts += [f"{n} {STATUS_WORDS[s]}" for s, n in counts.items() if n and s is not TrialStatus.NOT_STARTED]
    if result.not_started or counts[TrialStatus.NOT_STARTED]:
        parts.append(f"{result.not_started + counts[TrialStatus.NOT_STARTED]} not started (time budget)")
    starts = [t.started_at for t in result.trials if t.started_at is not None]
    ends = [t.ended_at for t in result.trials if t.ended_at is not None]
    if starts and ends and max(ends) >= min(starts):
        parts.append(f"{(max(ends) - min(starts)) / 60:.1f} min wall time")
    meta = " · ".join(parts)
    ranking = (
        f"Ranked by <b>{_e(result.metric)}</b> ({_e(result.mode)}: {_e(better(result.mode))} is better), the first "
        "of the search's objectives; its Pareto front below"
        if first_objective
        else f"Selection metric <b>{_e(result.metric)}</b> ({_e(better(result.mode))} is better)"
    )
    out = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="meta">{ranking} · {_e(meta)} · generated {_e(time.strftime("%Y-%m-%d %H:%M:%S %Z"))}</p>',
    ]
    anchors = [_anchor(url, name) for name, url in links.items() if name != RUN_URL_TEMPLATE_KEY and url]
    if anchors:
        out.append('<ul class="links">' + "".join(f"<li>{a}</li>" for a in anchors) + "</ul>")
    if fixed:
        values = ", ".join(f"{k}={fmt(v)}" for k, v in fixed.items())
        out.append(f'<p class="meta">Fixed for every trial: <code>{_e(values)}</code></p>')
    side = ""
    if best is not None:
        # The fixed parameters are listed once below; here only what this trial's sampling chose.
        chosen = {k: v for k, v in best.config.items() if k not in fixed}
        rows = "".join(f"<dt>{_e(k)}</dt><dd>{_e(fmt(v))}</dd>" for k, v in chosen.items())
        run_url = _run_url(links, best.run_id)
        run = ""
        if best.run_id:
            run = (
                f" · MLflow run <code>{_anchor(run_url, best.run_id) if run_url else _e(best.run_id)}</code>"
            )
        side = (
            f'<section class="best" data-trial="{_e(best.trial_id)}">'
            f"<div>Best trial <b>{_e(best.trial_id)}</b> {_status_badge(best, best.status.value)}{run}</div>"
            f'<div class="value">best {_e(result.metric)} = {_e(fmt(best.best))}'
            f" <small>at epoch {_e(fmt(best.best_epoch))} of {_e(best.epochs)}</small></div>"
            f"<dl>{rows}</dl></section>"
        )
    elif result.trials:
        side = (
            f'<p class="notice">No trial reported a value of {_e(result.metric)}: there is no best trial.</p>'
        )
    return f'<header class="top"><div>{"".join(out)}</div>{side}</header>'


def _ordered_columns(
    frame: pd.DataFrame, metric: str, sampled: Sequence[str], varying: Collection[str]
) -> list[str]:
    """Key columns, then the sampled hyperparameters, then the other config values that varied (``varying``:
    the trials' top-level config names, ``tracking.params.varying_params``) and the rest; the MLflow run id
    last. Resource columns that are all zero (nothing measured) or all empty say nothing and are dropped."""
    key = [c for c in ("trial", "status", f"best_{metric}", "best_epoch", "epochs") if c in frame.columns]
    config_cols = [c for c in frame.columns if c.startswith("config/")]
    hyper = [f"config/{p}" for p in sampled if f"config/{p}" in frame.columns]
    varying_config = [c for c in config_cols if c not in hyper and c.removeprefix("config/") in varying]
    rest = [c for c in frame.columns if c not in key and not c.startswith("config/") and c != "mlflow_run_id"]
    rest = [c for c in rest if not _all_empty_or_zero(frame[c])]
    tail = (
        ["mlflow_run_id"] if "mlflow_run_id" in frame.columns and frame["mlflow_run_id"].notna().any() else []
    )
    return key + hyper + varying_config + rest + tail


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float | np.floating) and math.isnan(value))


def _all_empty_or_zero(column: pd.Series) -> bool:
    values = [v for v in column if not _is_missing(v)]
    return not values or all(is_number(v) and float(v) == 0.0 for v in values)


def _column_label(column: str, metric: str, last_keys: set[str]) -> str:
    if column.startswith("config/"):
        return column.removeprefix("config/")
    if column == "mlflow_run_id":
        return "MLflow run"
    if column in last_keys:
        return f"last {column}"  # the leaderboard's bare metric names are the last report's values
    return column


def _breakable(label: str) -> str:
    """A header that may wrap after its underscores and spaces ("last val_<wbr>accuracy"): the table's width is
    then its values', so a sweep's many columns fit the page instead of scrolling."""
    return "_<wbr>".join(_e(part) for part in label.split("_"))


def table_html(
    result: SweepResult,
    sampled: Sequence[str],
    links: Mapping[str, str],
    best: TrialResult | None,
    colors: Mapping[str, str],
) -> str:
    frame = result.leaderboard()
    by_id = {t.trial_id: t for t in result.trials}
    last_keys = {k for t in result.trials for k in t.last}
    varying = set(varying_params([t.config for t in result.trials], nested=False))
    columns = _ordered_columns(frame, result.metric, sampled, varying)
    numeric = {c for c in columns if c != "trial" and all(is_number(v) or _is_missing(v) for v in frame[c])}
    head = "".join(
        ('<th class="num">' if c in numeric else "<th>")
        + f"{_breakable(_column_label(c, result.metric, last_keys))}</th>"
        for c in columns
    )
    body = []
    for record in frame.to_dict("records"):
        trial = by_id.get(record.get("trial"))
        cells = []
        for c in columns:
            value = record.get(c)
            if c == "status":
                cells.append(f"<td>{_status_badge(trial, value)}</td>")
            elif c == "trial":
                name = f' title="{_e(trial.name)}"' if trial is not None and trial.name else ""
                color = colors.get(str(value))
                swatch = f'<span class="swatch-cell" style="background:{_e(color)}"></span>' if color else ""
                cells.append(f"<td>{swatch}<b{name}>{_e(value)}</b></td>")
            elif c == "mlflow_run_id":
                run_id = value if isinstance(value, str) and value else None
                url = _run_url(links, run_id)
                text = run_id[:8] if run_id else EMPTY_CELL  # 32 hex digits would dominate the table's width
                cells.append(
                    f'<td title="{_e(run_id or "")}"><code>{_anchor(url, text) if url else _e(text)}</code></td>'
                )
            else:
                css = ' class="num"' if c in numeric else ""  # a dash lines up with the numbers too
                cells.append(f"<td{css}>{_e(fmt(value))}</td>")
        row_class = ' class="best-row"' if best is not None and record.get("trial") == best.trial_id else ""
        body.append(f'<tr{row_class} data-trial="{_e(record.get("trial"))}">{"".join(cells)}</tr>')
    # Past TABLE_ROWS_SHOWN rows, the rest wait in a hidden body behind a button: a browser lays out a table as it
    # parses it, and 10,000 visible rows took it 4 s before the page could answer (hidden: no layout at all).
    shown, more = body[:TABLE_ROWS_SHOWN], body[TABLE_ROWS_SHOWN:]
    rest = ""
    if more:
        hidden_rows = "\n".join(more)
        rest = (
            f'\n<tbody id="more-rows" hidden>\n{hidden_rows}\n</tbody>'
            f'<tbody><tr class="more-row"><td colspan="{len(columns)}"><button type="button" id="show-rows">'
            f"show the other {len(more):,} trials</button></td></tr></tbody>"
        )
    return (
        f'<section class="card"><h2>Trials, best first by {_e(sort_key_words(result.metric, result.mode))}</h2>\n'
        f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead>\n<tbody>\n'
        + "\n".join(shown)
        + f"\n</tbody>{rest}</table></div></section>"
    )


def _legend_html(data: Mapping[str, Any], order: Sequence[str]) -> str:
    """Each trial once, best first, its colour and how it ended; the best trial tagged (once: its line, not a
    second entry). Many trials: the colour scale instead, since every trial is in the table below anyway."""
    trials = {t["id"]: t for t in data["trials"] if t["curve"]}
    if data["colorBy"] == "best":
        cmap = colormaps["viridis" if data["mode"] == "min" else "viridis_r"]
        stops = ", ".join(to_hex(cmap(x)) for x in np.linspace(0, 1, 7))
        bests = [t["best"] for t in data["trials"] if t["best"] is not None]
        lo, hi = (fmt(min(bests)), fmt(max(bests))) if bests else (EMPTY_CELL, EMPTY_CELL)
        return (
            f'<div class="legend-scale"><div>colour: best {_e(data["metric"])}</div>'
            f'<div class="scale-bar" style="background: linear-gradient(90deg, {stops})"></div>'
            f'<div class="scale-words"><span>{_e(lo)}</span><span>{_e(hi)}</span></div>'
            f'<p class="caption">{_drawn_words(data, len(trials))}: hover a line for its name; all are in the table '
            "below.</p></div>"
        )
    items = []
    for trial_id in order:
        t = trials.get(trial_id)
        if t is None:
            continue
        best = trial_id == data["best"]
        dashed = " dashed" if t["status"] == "failed" else ""
        note = {"stopped": "stopped", "failed": "failed"}.get(t["status"], "")
        css = ' class="is-best"' if best else ""
        items.append(
            f'<li data-trial="{_e(trial_id)}"{css}>'
            f'<span class="swatch{dashed}" style="background:{_e(t["color"])}"></span>{_e(trial_id)}'
            + (' <span class="tag">★ best</span>' if best else "")
            + (f' <span class="dim-status">{note}</span>' if note else "")
            + "</li>"
        )
    return f'<ul class="legend" aria-label="trials">{"".join(items)}</ul>'


def _sampled(data: Mapping[str, Any]) -> bool:
    return data.get("curveBand") is not None


def _drawn_words(data: Mapping[str, Any], lines: int) -> str:
    if not _sampled(data):
        return f"{lines} trials"
    return f"{lines:,} of {len(data['trials']):,} trials drawn"


def _sample_words(data: Mapping[str, Any]) -> str:
    """How a large sweep's plots chose the trials they draw (report_data.drawn_trials)."""
    if not _sampled(data):
        return ""
    return (
        f"{data['drawnCount']:,} of the {len(data['trials']):,} trials are drawn: the {DRAWN_BEST} best and the "
        "rest at evenly spaced ranks below them. "
    )


def _key_html(data: Mapping[str, Any]) -> str:
    """What the marks in the learning curves mean, for the marks the plot has."""
    statuses = {t["status"] for t in data["trials"] if t["curve"]}
    parts = []
    if data["best"] is not None:
        parts.append(
            '<span><svg width="26" height="14"><line x1="1" y1="7" x2="25" y2="7" stroke="#59636e" stroke-width="3.4"/>'
            '<polygon points="13,1 14.6,5 19,5.2 15.6,8 16.8,12.4 13,10 9.2,12.4 10.4,8 7,5.2 11.4,5" fill="#f5c518" '
            f'stroke="#1f2328"/></svg> the best trial, ★ at its best {_e(data["metric"])}</span>'
        )
    if "stopped" in statuses:
        parts.append(
            '<span><svg width="14" height="14"><rect x="3" y="3" width="8" height="8" fill="#fff" stroke="#59636e" '
            'stroke-width="2"/></svg> stopped early (by the scheduler, e.g. ASHA), with its name</span>'
        )
    if "failed" in statuses:
        parts.append(
            '<span><svg width="26" height="14"><line x1="1" y1="7" x2="25" y2="7" stroke="#59636e" stroke-width="1.8" '
            'stroke-dasharray="6 4"/></svg> failed</span>'
        )
    return f'<div class="key">{"".join(parts)}</div>' if parts else ""


def _plot_card(heading: str, caption: str, plot_id: str, *, missing: str | None, extra: str = "") -> str:
    """A section whose plot the script draws into ``plot_id``; ``missing``: said instead when there is nothing
    to draw."""
    if missing is not None:
        return f'<section class="card"><h2>{_e(heading)}</h2><p class="notice">{_e(missing)}</p></section>'
    return (
        f'<section class="card"><h2>{_e(heading)}</h2><p class="caption">{_e(caption)}</p>'
        f'<div class="plot" id="{plot_id}"></div>{extra}</section>'
    )


def curves_card(data: Mapping[str, Any], order: Sequence[str]) -> str:
    metric = data["metric"]
    if not any(t["curve"] for t in data["trials"]):
        return _plot_card(
            f"Learning curves: {metric}", "", "", missing=f"No trial reported a finite {metric}."
        )
    if _sampled(data):
        lines = (
            f"{metric} at each training iteration. {_sample_words(data)}The grey band holds the middle 80 % of all "
            f"{len(data['trials']):,} trials' values at each iteration (10th to 90th percentile), the dashed line "
            "their median. "
        )
    else:
        lines = f"{metric} at each training iteration, one line per trial. "
    caption = lines + (
        "Hover a line, a legend entry or a table row to see that trial in every plot; click to keep it highlighted."
    )
    return (
        f'<section class="card"><h2>Learning curves: {_e(metric)} per training iteration</h2>'
        f'<p class="caption">{_e(caption)}</p>'
        f'<div class="plot-with-legend"><div class="plot" id="plot-curves"></div>{_legend_html(data, order)}</div>'
        f"{_key_html(data)}</section>"
    )


def parallel_card(data: Mapping[str, Any]) -> str:
    metric = data["metric"]
    if not data["axes"]:
        return _plot_card(
            "Hyperparameters against the best value",
            "",
            "",
            missing=f"Nothing to draw: no trial reported {metric}, or no hyperparameter was sampled.",
        )
    log = [a["name"] for a in data["axes"] if a["scale"] == "log"]
    caption = (
        f"One line per trial through its hyperparameter values and its best {metric} (the last axis). "
        + _sample_words(data)
        + (f"Log axes for log-sampled parameters ({', '.join(log)}). " if log else "")
        + f"Trials without a {metric} value are left out."
    )
    toolbar = (
        '<div class="toolbar"><span class="selection" id="selection">Drag along an axis to keep only the trials in '
        'a range.</span><button type="button" id="clear-brushes" hidden>clear ranges</button></div>'
    )
    return (
        f'<section class="card"><h2>Hyperparameters against the best value</h2><p class="caption">{_e(caption)}</p>'
        f'{toolbar}<div class="plot" id="plot-parallel"></div></section>'
    )


def best_so_far_card(data: Mapping[str, Any]) -> str:
    metric = data["metric"]
    return _plot_card(
        f"Best {metric} so far",
        f"The sweep's best {metric} as trials ended (the step line; failed trials do not count), and each "
        + ("drawn " if _sampled(data) else "")
        + "trial's best: filled completed, hollow stopped early, × failed. "
        + _sample_words(data),
        "plot-best-so-far",
        missing=None if data["bestSoFar"] else f"No trial reported {metric}.",
    )


def importance_card(data: Mapping[str, Any]) -> str:
    importance = data["importance"]
    values: Mapping[str, float] = importance["values"]
    if not values:
        body = f'<p class="caption">{_e(importance["note"])}</p>'
    else:
        top = max(values.values()) or 1.0
        rows = "".join(
            f'<li data-param="{_e(name)}"><span class="name">{_e(name)}</span>'
            f'<span class="bar"><span style="width:{100 * share / top:.1f}%"></span></span>'
            f'<span class="share">{100 * share:.0f}%</span></li>'
            for name, share in values.items()
        )
        body = f'<p class="caption">{_e(importance["note"])}</p><ul class="importance">{rows}</ul>'
    return f'<section class="card" id="importance"><h2>Hyperparameter importance</h2>{body}</section>'


def _objective_words(objective: Mapping[str, Any]) -> str:
    return f'{objective["metric"]} ({objective["mode"]}: {objective["better"]} is better)'


def pareto_card(data: Mapping[str, Any], result: SweepResult, links: Mapping[str, str]) -> str:
    """A multi-objective sweep's Pareto front: the script's scatter of the finished trials on the first two
    objectives (``data["pareto"]``, report_data.pareto_data), then a table of the front's trials (their value of
    every objective, their varying hyperparameters, their MLflow run). Empty without two objectives."""
    pareto = data.get("pareto")
    if not pareto:
        return ""
    x, y, objectives = pareto["x"], pareto["y"], pareto["objectives"]
    heading = f"Pareto front: {x['metric']} against {y['metric']}"
    if not pareto["front"]:
        return _plot_card(heading, "", "", missing="No finished trial reported a finite value of every objective.")
    more = len(objectives) > 2
    caption = (
        f"Every finished trial at its last reported {_objective_words(x)} and {_objective_words(y)}. The "
        + ("trials no other beats on all of " + ", ".join(o["metric"] for o in objectives) + " (the front) are "
           "ringed; shown here on the first two objectives."
           if more else "trials no other beats on both (the front) are ringed and joined by the step line.")
    )
    by_id = {t.trial_id: t for t in result.trials}
    colors = {t["id"]: t["color"] for t in data["trials"]}
    params = list(data["params"])
    head = (
        "<th>trial</th>"
        + "".join(f'<th class="num">{_breakable(o["metric"])} <small>({_e(o["mode"])})</small></th>' for o in objectives)
        + "".join(f"<th>{_breakable(p)}</th>" for p in params)
        + "<th>MLflow run</th>"
    )
    rows = []
    for trial_id in pareto["front"]:
        t = by_id[trial_id]
        swatch = f'<span class="swatch-cell" style="background:{_e(colors.get(trial_id, ""))}"></span>'
        url = _run_url(links, t.run_id)
        run = (t.run_id or "")[:8] or EMPTY_CELL  # as in the trials table: 32 hex digits would dominate
        rows.append(
            f'<tr data-trial="{_e(trial_id)}"><td>{swatch}<b>{_e(trial_id)}</b></td>'
            + "".join(f'<td class="num">{_e(fmt(t.last.get(o["metric"])))}</td>' for o in objectives)
            + "".join(f"<td>{_e(fmt(t.config.get(p)))}</td>" for p in params)
            + f'<td title="{_e(t.run_id or "")}"><code>{_anchor(url, run) if url else _e(run)}</code></td></tr>'
        )
    n = len(pareto["front"])
    return (
        f'<section class="card" id="pareto"><h2>{_e(heading)}</h2><p class="caption">{_e(caption)}</p>'
        '<div class="plot" id="plot-pareto"></div>'
        f'<h3>The front: {n} trial{"s" if n != 1 else ""}, by {_e(x["metric"])}</h3>'
        f'<div class="table-wrap"><table class="front"><thead><tr>{head}</tr></thead><tbody>'
        + "".join(rows)
        + "</tbody></table></div></section>"
    )


def pbt_card(png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        '<section class="card" id="pbt"><h2>Population Based Training: hyperparameters over time, and who copied '
        'whom</h2><p class="caption">Top: each trial\'s mutated hyperparameters over its reports (dots: an exploit '
        "gave it new values). Bottom: an arrow from the donor's row to the trial that continued from its "
        "checkpoint, at the report it happened.</p>"
        f'<figure><img alt="Population Based Training lineage" src="data:image/png;base64,{data}"></figure></section>'
    )


def framed_notice(page_url: str | None) -> str:
    """Shown by the script when the page sits in a frame (MLflow's artifact viewer sandboxes it: no link opens
    there): where the page opens on its own."""
    where = (
        f" Open it as a page of its own: {_anchor(page_url, page_url)} (copy the address if the link does not open)."
        if page_url
        else " Download it (the viewer's download button) and open the file for working links."
    )
    return f'<p class="notice" id="framed" hidden>This report is shown inside another page, where its links cannot open.{where}</p>'


def no_trials_notice(result: SweepResult) -> str:
    """Said instead of the plots when no trial ran (a time budget may have left every trial unstarted)."""
    extra = f": {result.not_started} were not started (time budget)" if result.not_started else ""
    return f'<p class="notice">No trial ran in this sweep{_e(extra)}; there is nothing to plot.</p>'


def page_html(title: str, sections: Sequence[str], data: Mapping[str, Any] | None) -> str:
    body = "\n".join(sections)
    scripts = ""
    if data is not None:
        scripts = (
            f'<script type="application/json" id="sweep-data">{json_for_script(data)}</script>\n'
            f"<script>{SCRIPT}</script>\n"
        )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(title)}</title>\n<style>{CSS}</style>\n</head>\n"
        f'<body><main>\n{body}\n</main><div id="tip" hidden></div>\n'
        '<noscript><p class="notice">The plots are drawn by this page\'s script: allow JavaScript to see them.'
        "</p></noscript>\n"
        f"{scripts}</body></html>\n"
    )
