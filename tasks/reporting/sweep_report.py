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
- Population Based Training sweeps: the mutated hyperparameters over time and who copied whom (a PNG);
- the leaderboard, best first, with links to each trial's MLflow run.

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

The PBT plot is drawn on matplotlib's Agg canvas directly (``Figure``, never pyplot): no display is needed, and
no global figure state is shared between threads (Prefect runs tasks in threads).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from sweepflow.tasks.reporting.importance import Importances, param_importances
from sweepflow.tasks.reporting.report_script import CSS, SCRIPT
from sweepflow.tasks.sweep.results import SweepResult, TrialResult, TrialStatus, flat_config

__all__ = ["HTML_NAME", "ParamAxis", "axis_positions", "make_axis", "report_data", "write_sweep_report"]

HTML_NAME = "sweep_report.html"
RUN_URL_TEMPLATE_KEY = (
    "run_url_template"  # a `links` key: "{run_id}" in it is replaced by each trial's run id
)
MAX_LEGEND_TRIALS = 20  # more trials than this: coloured by their best value, not each named in a legend
LOG_TYPES = frozenset({"loguniform", "pow2"})  # sampled uniformly over the exponent: shown on log axes
CATEGORICAL_TYPES = frozenset({"choice", "grid"})
NUMERIC_TYPES = frozenset({"uniform", "quniform", "randn", "loguniform", "randint", "qrandint", "pow2"})
INTEGER_TYPES = frozenset({"randint", "qrandint", "pow2"})

STATUS_WORDS = {
    TrialStatus.COMPLETED: "completed",
    TrialStatus.STOPPED: "stopped early",
    TrialStatus.FAILED: "failed",
    TrialStatus.NOT_STARTED: "not started",
}
DPI = 100
EMPTY_CELL = "—"
NO_VALUE_COLOR = "#8c959f"  # a trial without a value of the metric, when colours say the value

# --------------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    """A real, finite number (bools are not: ``True`` is no hyperparameter value to place on an axis)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        return False
    return math.isfinite(float(value))


def _fmt(value: Any) -> str:
    """A value as a person reads it: floats to 4 significant digits, missing values as a dash."""
    if value is None:
        return EMPTY_CELL
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        if math.isnan(value):
            return EMPTY_CELL
        return f"{float(value):.4g}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


def _better(mode: str) -> str:
    return "higher" if mode == "max" else "lower"


def _sort_key_words(metric: str, mode: str) -> str:
    return f"best {metric} ({_better(mode)} is better)"


# --------------------------------------------------------------------------------------------------
# Parallel-coordinates axes (pure: no drawing, so the scaling is testable on its own)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamAxis:
    """One vertical axis of the parallel-coordinates plot: how its values map to [0, 1], and its ticks.

    ``scale`` is "linear", "log" (``low``/``high`` are then log10 of the range, so equal ratios are equal
    distances) or "categorical" (``categories``: the value labels, bottom to top).
    """

    name: str
    scale: str
    low: float = 0.0
    high: float = 1.0
    categories: tuple[str, ...] = ()
    base: int = 10  # log axes: tick at powers of this (2 for pow2 parameters)
    integer: bool = False

    def position(self, value: Any) -> float:
        """Where ``value`` sits on the axis, in [0, 1]; NaN when it cannot be placed (missing, wrong type)."""
        if self.scale == "categorical":
            label = _fmt(value)
            if label not in self.categories:
                return math.nan
            if len(self.categories) == 1:
                return 0.5
            return self.categories.index(label) / (len(self.categories) - 1)
        if not _is_number(value):
            return math.nan
        x = float(value)
        if self.scale == "log":
            if x <= 0:
                return math.nan
            x = math.log10(x)
        if self.high <= self.low:  # one distinct value: the middle, rather than a division by zero
            return 0.5
        return (x - self.low) / (self.high - self.low)

    def ticks(self) -> list[tuple[float, str]]:
        """(position, label) pairs: real values of the parameter, never the normalised positions."""
        if self.scale == "categorical":
            step = max(1, math.ceil(len(self.categories) / 12))  # at most ~12 labels on an axis stay readable
            return [(self.position(c), c) for c in self.categories[::step]]
        if self.high <= self.low:
            value = 10**self.low if self.scale == "log" else self.low
            return [(0.5, _fmt(value))]
        values = self._log_tick_values() if self.scale == "log" else self._linear_tick_values()
        return [(self.position(v), _fmt(v)) for v in values]

    def _linear_tick_values(self) -> list[float]:
        locator = MaxNLocator(nbins=5, integer=self.integer)
        eps = (self.high - self.low) * 1e-9
        return [
            float(v)
            for v in locator.tick_values(self.low, self.high)
            if self.low - eps <= v <= self.high + eps
        ]

    def _log_tick_values(self) -> list[float]:
        lo, hi = 10**self.low, 10**self.high
        if self.base == 2:
            exps = range(math.ceil(math.log2(lo) - 1e-9), math.floor(math.log2(hi) + 1e-9) + 1)
            values = [2.0**e for e in exps]
            step = max(1, math.ceil(len(values) / 8))
            return values[::step]
        decades = range(math.ceil(self.low - 1e-9), math.floor(self.high + 1e-9) + 1)
        values = [10.0**e for e in decades]
        if len(values) < 3:  # less than two decades: 1-2-5 steps, or the ticks would be one or two
            values = [
                m * 10.0**e
                for e in range(math.floor(self.low) - 1, math.ceil(self.high) + 1)
                for m in (1, 2, 5)
                if lo * (1 - 1e-9) <= m * 10.0**e <= hi * (1 + 1e-9)
            ]
        if len(values) < 2:
            values = [lo, hi]
        step = max(1, math.ceil(len(values) / 8))
        return values[::step]


def make_axis(name: str, domain: Any, observed: Sequence[Any]) -> ParamAxis:
    """The axis of parameter ``name`` sampled from ``domain`` (the search-space entry), given the values trials
    actually got. Numeric ranges cover both the domain's bounds and the observed values, so every trial fits
    and the plot shows where in the searched range the trials landed."""
    kind = domain.get("type") if isinstance(domain, Mapping) else None
    numbers = [float(v) for v in observed if _is_number(v)]
    non_numbers = [v for v in observed if v is not None and not _is_number(v)]

    # Values that are no numbers (lists, strings) can only be categories, whatever the domain says.
    if kind in CATEGORICAL_TYPES or non_numbers or (kind not in NUMERIC_TYPES and not numbers):
        declared = list(domain.get("values", [])) if kind in CATEGORICAL_TYPES else []
        labels: list[str] = []
        for value in [*declared, *observed]:  # the domain's order first: it is the order the user wrote
            label = _fmt(value)
            if value is not None and label not in labels:
                labels.append(label)
        return ParamAxis(name=name, scale="categorical", categories=tuple(labels))

    bounds = [
        float(domain[k]) for k in ("low", "high") if isinstance(domain, Mapping) and _is_number(domain.get(k))
    ]
    log = kind in LOG_TYPES
    values = [v for v in [*bounds, *numbers] if v > 0] if log else [*bounds, *numbers]
    if log and not values:  # nothing positive to take a log of: fall back rather than fail the report
        log, values = False, [*bounds, *numbers]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if log:
        lo, hi = math.log10(lo), math.log10(hi)
    return ParamAxis(
        name=name,
        scale="log" if log else "linear",
        low=lo,
        high=hi,
        base=2 if kind == "pow2" else 10,
        integer=kind in INTEGER_TYPES,
    )


def axis_positions(values: Sequence[Any], domain: Any) -> list[float]:
    """Each value's position in [0, 1] on a parallel-coordinates axis for ``domain`` (a search-space entry).

    ``axis_positions([1e-4, 1e-3, 1e-2], {"type": "loguniform", "low": 1e-4, "high": 1e-1})`` is
    ``[0, 1/3, 2/3]``: log-sampled parameters are spaced by ratio.
    """
    axis = make_axis("", domain, values)
    return [axis.position(v) for v in values]


def _sampled_params(search_space: Mapping[str, Any], trials: Sequence[TrialResult]) -> list[str]:
    """The search space's sampled (non-fixed) keys that trials' configs carry, in the search space's order."""
    in_configs = {k for t in trials for k in t.config}
    return [
        name
        for name, domain in search_space.items()
        if isinstance(domain, Mapping) and domain.get("type") not in (None, "constant") and name in in_configs
    ]


def _fixed_params(search_space: Mapping[str, Any], sampled: Sequence[str]) -> dict[str, Any]:
    fixed = {}
    for name, domain in search_space.items():
        if name in sampled:
            continue
        if isinstance(domain, Mapping) and domain.get("type") == "constant":
            fixed[name] = domain.get("value")
        elif not isinstance(domain, Mapping) or "type" not in domain:
            fixed[name] = domain
    return fixed


def _varying_params(search_space: Mapping[str, Any], trials: Sequence[TrialResult]) -> list[str]:
    """The parallel-coordinates axes: the search space's sampled parameters (in its order), then any other
    top-level config value that differs between trials (a space given as code, a value a callback set), so no
    hyperparameter that varied is left out."""
    sampled = _sampled_params(search_space, trials)
    others: list[str] = []
    for t in trials:
        for name, value in t.config.items():
            if name in sampled or name in others or name in search_space or isinstance(value, Mapping):
                continue
            if len({_fmt(u.config.get(name)) for u in trials}) > 1:
                others.append(name)
    return [*sampled, *others]


# --------------------------------------------------------------------------------------------------
# The page's data: what the script draws (pure: built and tested without a browser)
# --------------------------------------------------------------------------------------------------


def _pick(mode: str) -> Any:
    return np.argmax if mode == "max" else np.argmin


def _log_worthy(values: Sequence[float]) -> bool:
    """A log axis when every value is positive and they span more than a factor 100: a diverged trial would
    flatten every other curve on a linear one."""
    return bool(values) and min(values) > 0 and max(values) / min(values) > 100


def _darker(color: str, amount: float = 0.3) -> str:
    """The colour mixed with black: a label in a light palette colour (tab10's olive) stays readable."""
    return to_hex(tuple(c * (1 - amount) for c in to_rgb(color)))


def _trial_colors(result: SweepResult) -> tuple[dict[str, str], str]:
    """A colour per trial, the same in every plot, and what it says ("trial" or "best"): distinct colours when
    the legend can name every trial; otherwise by best value (darker is better), since 200 names help nobody."""
    trials = result.trials
    if len(trials) <= MAX_LEGEND_TRIALS:
        palette = colormaps["tab10" if len(trials) <= 10 else "tab20"].colors
        return {t.trial_id: to_hex(palette[i % len(palette)]) for i, t in enumerate(trials)}, "trial"
    norm, cmap = _best_scale(result)
    return {
        t.trial_id: to_hex(cmap(norm(float(t.best)))) if _is_number(t.best) else NO_VALUE_COLOR
        for t in trials
    }, "best"


def _best_scale(result: SweepResult) -> tuple[Any, Any]:
    """(value -> [0, 1], colour map): darker is better, so the good trials stand out on white."""
    bests = [float(t.best) for t in result.trials if _is_number(t.best)] or [0.0]
    lo, hi = min(bests), max(bests)
    if hi <= lo:
        pad = abs(lo) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    return (lambda v: (v - lo) / (hi - lo)), colormaps["viridis" if result.mode == "min" else "viridis_r"]


def _trial_data(t: TrialResult, result: SweepResult, color: str, params: Sequence[str]) -> dict[str, Any]:
    xs, ys = _curve(t, result.metric)
    best_point = None
    if len(ys):
        i = int(_pick(result.mode)(ys))
        best_point = [float(xs[i]), float(ys[i])]
    error = ""
    if t.status is TrialStatus.FAILED and t.error:
        error = next((line.strip() for line in t.error.strip().splitlines() if line.strip()), "")
    return {
        "id": t.trial_id,
        "name": t.name,
        "status": t.status.value.lower(),
        "statusWord": STATUS_WORDS.get(t.status, t.status.value.lower()),
        "stopReason": t.stop_reason if t.status is TrialStatus.STOPPED else None,
        "best": float(t.best) if _is_number(t.best) else None,
        "bestLabel": _fmt(t.best) if _is_number(t.best) else None,
        "bestEpoch": t.best_epoch,
        "epochs": t.epochs,
        "color": color,
        "labelColor": _darker(color),
        "curve": [[float(x), float(y)] for x, y in zip(xs, ys, strict=True)],
        "bestPoint": best_point,
        "config": {p: _fmt(t.config.get(p)) for p in params if p in t.config},
        "error": error,
    }


def _axes_data(
    result: SweepResult, search_space: Mapping[str, Any], params: Sequence[str]
) -> list[dict[str, Any]]:
    """One entry per parallel-coordinates axis, the best value last: its scale, its ticks and every trial's
    position on it in [0, 1] (None: it has no value there). Positions come from ``ParamAxis``, so the page draws
    exactly what the tests check."""
    trials = result.trials
    axes = [make_axis(name, search_space.get(name), [t.config.get(name) for t in trials]) for name in params]
    with_value = [t for t in trials if _is_number(t.best)]
    if not axes or not with_value:
        return []
    metric_axis = make_axis(f"best {result.metric}", {"type": "uniform"}, [float(t.best) for t in with_value])  # type: ignore[arg-type]
    out = []
    for axis in [*axes, metric_axis]:
        positions = {}
        for t in trials:
            value = t.best if axis is metric_axis else t.config.get(axis.name)
            pos = axis.position(value) if (axis is not metric_axis or _is_number(value)) else math.nan
            positions[t.trial_id] = None if math.isnan(pos) else round(pos, 6)
        out.append(
            {
                "name": axis.name,
                "scale": axis.scale,
                "ticks": [[round(p, 6), label] for p, label in axis.ticks()],
                "pos": positions,
            }
        )
    return out


def _best_so_far_data(result: SweepResult) -> dict[str, Any] | None:
    ordered = _end_order(result.trials)
    values = [float(t.best) for t in ordered if _is_number(t.best)]
    if not values:
        return None
    pick = max if result.mode == "max" else min
    running: list[float | None] = []
    current: float | None = None
    for t in ordered:
        # Only trials the sweep can select (completed or stopped early) move its best, as in SweepResult.best().
        if t.status.selectable and _is_number(t.best):
            current = float(t.best) if current is None else pick(current, float(t.best))
        running.append(current)
    return {"order": [t.trial_id for t in ordered], "running": running, "log": _log_worthy(values)}


def _importances(result: SweepResult, search_space: Mapping[str, Any], params: Sequence[str]) -> Importances:
    finished = [t for t in result.trials if t.status.selectable and _is_number(t.best)]
    log_params = frozenset(
        p
        for p in params
        if isinstance(search_space.get(p), Mapping) and search_space[p].get("type") in LOG_TYPES
    )
    return param_importances(
        [t.config for t in finished],
        [float(t.best) for t in finished],  # type: ignore[arg-type]
        params,
        log_params=log_params,
        mode=result.mode,
        label=_fmt,
    )


def report_data(result: SweepResult, search_space: Mapping[str, Any]) -> dict[str, Any]:
    """Everything the page's script draws, as JSON-ready data (``importance`` included, computed here)."""
    params = _varying_params(search_space, result.trials)
    colors, color_by = _trial_colors(result)
    best = result.best()
    all_y = [y for t in result.trials for y in _curve(t, result.metric)[1].tolist()]
    importance = _importances(result, search_space, params)
    return {
        "metric": result.metric,
        "mode": result.mode,
        "better": _better(result.mode),
        "best": best.trial_id if best is not None else None,
        "colorBy": color_by,
        "params": params,
        "trials": [_trial_data(t, result, colors[t.trial_id], params) for t in result.trials],
        "curvesLog": _log_worthy(all_y),
        "axes": _axes_data(result, search_space, params),
        "bestSoFar": _best_so_far_data(result),
        "importance": {"values": importance.values, "note": importance.note},
    }


def _json_for_script(data: Mapping[str, Any]) -> str:
    """JSON that cannot end the ``<script>`` element it sits in, whatever a trial's name or error says."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _curve(trial: TrialResult, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """The trial's finite ``metric`` values against their training iteration (NaN/inf reports are skipped)."""
    xs: list[float] = []
    ys: list[float] = []
    for i, report in enumerate(trial.history, start=1):
        value = report.get(metric)
        if not _is_number(value):
            continue
        x = report.get("training_iteration", report.get("epoch", i))
        xs.append(float(x) if _is_number(x) else float(i))
        ys.append(float(value))
    return np.asarray(xs), np.asarray(ys)


def _end_order(trials: Sequence[TrialResult]) -> list[TrialResult]:
    """Trials in the order they ended. Without an end time for every trial, the list order (SweepResult keeps
    trials in the order they finished); mixing the two would put the untimed ones at arbitrary places."""
    if trials and all(t.ended_at is not None for t in trials):
        return sorted(trials, key=lambda t: t.ended_at)  # type: ignore[arg-type, return-value]
    return list(trials)


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # attaches the Agg canvas: savefig needs no pyplot or display
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", facecolor="white")
    fig.clear()  # the figure holds every line's data: free it now rather than at garbage collection
    return buf.getvalue()


# --------------------------------------------------------------------------------------------------
# Population Based Training (a PNG: the lineage has no interaction to offer)
# --------------------------------------------------------------------------------------------------


def _pbt_params(trials: Sequence[TrialResult]) -> list[str]:
    """The numeric hyperparameters PBT changed in some trial (nested names joined by '/'), at most four."""
    changed: list[str] = []
    for t in trials:
        first = flat_config(t.config_history[0]["config"]) if t.config_history else {}
        for entry in t.config_history[1:]:
            for name, value in flat_config(entry["config"]).items():
                if _is_number(value) and first.get(name) != value and name not in changed:
                    changed.append(name)
    return sorted(changed)[:4]


def _plot_pbt(result: SweepResult, trial_colors: Mapping[str, str]) -> bytes | None:
    """Population Based Training: each mutated hyperparameter of each trial over its reports (a step line that
    changes at its exploits), and below, who copied whom: an arrow from the donor's row to the recipient's at
    the report it happened."""
    trials = sorted((t for t in result.trials if len(t.config_history) > 1), key=lambda t: t.index)
    if not trials:
        return None
    shown = sorted({t.trial_id for t in trials} | {e["donor"] for t in trials for e in t.config_history[1:]})
    everyone = sorted((t for t in result.trials if t.trial_id in shown), key=lambda t: t.index)
    params = _pbt_params(everyone)
    fig = _new_figure(12, 2.6 * (len(params) + 1))
    axes = fig.subplots(len(params) + 1, 1, sharex=True, squeeze=False)[:, 0]
    colors = {t.trial_id: trial_colors.get(t.trial_id, "black") for t in everyone}  # as in the other plots
    for ax, name in zip(axes, params, strict=False):
        for t in everyone:
            history = t.config_history or ({"iteration": 0, "config": t.config},)
            xs = [int(e["iteration"]) for e in history] + [max(t.epochs, int(history[-1]["iteration"]))]
            ys = [flat_config(e["config"]).get(name) for e in history]
            ys = [float(y) if _is_number(y) else math.nan for y in ys]
            ax.step(
                xs, [*ys, ys[-1]], where="post", color=colors[t.trial_id], linewidth=1.6, label=t.trial_id
            )
            ax.scatter(xs[1:-1], ys[1:], color=colors[t.trial_id], s=18, zorder=3)
        values = [
            v
            for t in everyone
            for e in t.config_history
            for k, v in flat_config(e["config"]).items()
            if k == name
        ]
        positive = [float(v) for v in values if _is_number(v) and v > 0]
        if positive and len(positive) == len(values) and max(positive) / min(positive) > 20:
            ax.set_yscale("log")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
    lineage = axes[-1]
    rows = {t.trial_id: i for i, t in enumerate(everyone)}
    for t in everyone:
        lineage.hlines(
            rows[t.trial_id], 0, max(t.epochs, 1), color=colors[t.trial_id], linewidth=1.2, alpha=0.6
        )
        for entry in t.config_history[1:]:
            x, donor = int(entry["iteration"]), entry["donor"]
            lineage.annotate(
                "",
                xy=(x, rows[t.trial_id]),
                xytext=(x, rows.get(donor, rows[t.trial_id])),
                arrowprops={"arrowstyle": "->", "color": colors.get(donor, "black"), "lw": 1.2},
            )
    lineage.set_yticks(range(len(everyone)), [t.trial_id for t in everyone], fontsize=8)
    lineage.set_ylim(-0.5, len(everyone) - 0.5)
    lineage.set_ylabel("copied from → to")
    lineage.set_xlabel("reports (training_iteration)")
    lineage.grid(True, axis="x", alpha=0.3)
    lineage.xaxis.set_major_locator(MaxNLocator(integer=True))
    if params:
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right upper", fontsize=8, frameon=False)
    return _png(fig)


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


def _header_html(
    result: SweepResult,
    title: str,
    best: TrialResult | None,
    links: Mapping[str, str],
    fixed: Mapping[str, Any],
) -> str:
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
    out = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="meta">Selection metric <b>{_e(result.metric)}</b> ({_e(_better(result.mode))} is better) · '
        f"{_e(meta)} · generated {_e(time.strftime('%Y-%m-%d %H:%M:%S %Z'))}</p>",
    ]
    anchors = [_anchor(url, name) for name, url in links.items() if name != RUN_URL_TEMPLATE_KEY and url]
    if anchors:
        out.append('<ul class="links">' + "".join(f"<li>{a}</li>" for a in anchors) + "</ul>")
    if fixed:
        values = ", ".join(f"{k}={_fmt(v)}" for k, v in fixed.items())
        out.append(f'<p class="meta">Fixed for every trial: <code>{_e(values)}</code></p>')
    side = ""
    if best is not None:
        # The fixed parameters are listed once below; here only what this trial's sampling chose.
        chosen = {k: v for k, v in best.config.items() if k not in fixed}
        rows = "".join(f"<dt>{_e(k)}</dt><dd>{_e(_fmt(v))}</dd>" for k, v in chosen.items())
        run_url = _run_url(links, best.run_id)
        run = ""
        if best.run_id:
            run = (
                f" · MLflow run <code>{_anchor(run_url, best.run_id) if run_url else _e(best.run_id)}</code>"
            )
        side = (
            f'<section class="best" data-trial="{_e(best.trial_id)}">'
            f"<div>Best trial <b>{_e(best.trial_id)}</b> {_status_badge(best, best.status.value)}{run}</div>"
            f'<div class="value">best {_e(result.metric)} = {_e(_fmt(best.best))}'
            f" <small>at epoch {_e(_fmt(best.best_epoch))} of {_e(best.epochs)}</small></div>"
            f"<dl>{rows}</dl></section>"
        )
    elif result.trials:
        side = (
            f'<p class="notice">No trial reported a value of {_e(result.metric)}: there is no best trial.</p>'
        )
    return f'<header class="top"><div>{"".join(out)}</div>{side}</header>'


def _ordered_columns(frame: pd.DataFrame, metric: str, sampled: Sequence[str]) -> list[str]:
    """Key columns, then the sampled hyperparameters, then the other config values and the rest; the MLflow run
    id last. Resource columns that are all zero (nothing measured) or all empty say nothing and are dropped."""
    key = [c for c in ("trial", "status", f"best_{metric}", "best_epoch", "epochs") if c in frame.columns]
    config_cols = [c for c in frame.columns if c.startswith("config/")]
    hyper = [f"config/{p}" for p in sampled if f"config/{p}" in frame.columns]
    varying_config = [c for c in config_cols if c not in hyper and frame[c].astype(str).nunique() > 1]
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
    return not values or all(_is_number(v) and float(v) == 0.0 for v in values)


def _column_label(column: str, metric: str, last_keys: set[str]) -> str:
    if column.startswith("config/"):
        return column.removeprefix("config/")
    if column == "mlflow_run_id":
        return "MLflow run"
    if column in last_keys:
        return f"last {column}"  # the leaderboard's bare metric names are the last report's values
    return column


def _table_html(
    result: SweepResult,
    sampled: Sequence[str],
    links: Mapping[str, str],
    best: TrialResult | None,
    colors: Mapping[str, str],
) -> str:
    frame = result.leaderboard()
    by_id = {t.trial_id: t for t in result.trials}
    last_keys = {k for t in result.trials for k in t.last}
    columns = _ordered_columns(frame, result.metric, sampled)
    numeric = {c for c in columns if c != "trial" and all(_is_number(v) or _is_missing(v) for v in frame[c])}
    head = "".join(
        ('<th class="num">' if c in numeric else "<th>")
        + f"{_e(_column_label(c, result.metric, last_keys))}</th>"
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
                cells.append(f"<td{css}>{_e(_fmt(value))}</td>")
        row_class = ' class="best-row"' if best is not None and record.get("trial") == best.trial_id else ""
        body.append(f'<tr{row_class} data-trial="{_e(record.get("trial"))}">{"".join(cells)}</tr>')
    return (
        f'<section class="card"><h2>Trials, best first by {_e(_sort_key_words(result.metric, result.mode))}</h2>\n'
        f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead>\n<tbody>\n'
        + "\n".join(body)
        + "\n</tbody></table></div></section>"
    )


def _legend_html(data: Mapping[str, Any], order: Sequence[str]) -> str:
    """Each trial once, best first, its colour and how it ended; the best trial tagged (once: its line, not a
    second entry). Many trials: the colour scale instead, since every trial is in the table below anyway."""
    trials = {t["id"]: t for t in data["trials"] if t["curve"]}
    if data["colorBy"] == "best":
        cmap = colormaps["viridis" if data["mode"] == "min" else "viridis_r"]
        stops = ", ".join(to_hex(cmap(x)) for x in np.linspace(0, 1, 7))
        bests = [t["best"] for t in data["trials"] if t["best"] is not None]
        lo, hi = (_fmt(min(bests)), _fmt(max(bests))) if bests else (EMPTY_CELL, EMPTY_CELL)
        return (
            f'<div class="legend-scale"><div>colour: best {_e(data["metric"])}</div>'
            f'<div class="scale-bar" style="background: linear-gradient(90deg, {stops})"></div>'
            f'<div class="scale-words"><span>{_e(lo)}</span><span>{_e(hi)}</span></div>'
            f'<p class="caption">{len(trials)} trials: hover a line for its name; all are in the table below.</p></div>'
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


def _curves_card(data: Mapping[str, Any], order: Sequence[str]) -> str:
    metric = data["metric"]
    if not any(t["curve"] for t in data["trials"]):
        return _plot_card(
            f"Learning curves: {metric}", "", "", missing=f"No trial reported a finite {metric}."
        )
    caption = (
        f"{metric} at each training iteration, one line per trial. Hover a line, a legend entry or a table row to "
        "see that trial in every plot; click to keep it highlighted."
    )
    return (
        f'<section class="card"><h2>Learning curves: {_e(metric)} per training iteration</h2>'
        f'<p class="caption">{_e(caption)}</p>'
        f'<div class="plot-with-legend"><div class="plot" id="plot-curves"></div>{_legend_html(data, order)}</div>'
        f"{_key_html(data)}</section>"
    )


def _parallel_card(data: Mapping[str, Any]) -> str:
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


def _best_so_far_card(data: Mapping[str, Any]) -> str:
    metric = data["metric"]
    return _plot_card(
        f"Best {metric} so far",
        f"The sweep's best {metric} as trials ended (the step line; failed trials do not count), and each trial's "
        "best: filled completed, hollow stopped early, × failed.",
        "plot-best-so-far",
        missing=None if data["bestSoFar"] else f"No trial reported {metric}.",
    )


def _importance_card(data: Mapping[str, Any]) -> str:
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


def _pbt_card(png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        '<section class="card" id="pbt"><h2>Population Based Training: hyperparameters over time, and who copied '
        'whom</h2><p class="caption">Top: each trial\'s mutated hyperparameters over its reports (dots: an exploit '
        "gave it new values). Bottom: an arrow from the donor's row to the trial that continued from its "
        "checkpoint, at the report it happened.</p>"
        f'<figure><img alt="Population Based Training lineage" src="data:image/png;base64,{data}"></figure></section>'
    )


def _framed_notice(page_url: str | None) -> str:
    """Shown by the script when the page sits in a frame (MLflow's artifact viewer sandboxes it: no link opens
    there): where the page opens on its own."""
    where = (
        f" Open it as a page of its own: {_anchor(page_url, page_url)} (copy the address if the link does not open)."
        if page_url
        else " Download it (the viewer's download button) and open the file for working links."
    )
    return f'<p class="notice" id="framed" hidden>This report is shown inside another page, where its links cannot open.{where}</p>'


def _page(title: str, sections: Sequence[str], data: Mapping[str, Any] | None) -> str:
    body = "\n".join(sections)
    scripts = ""
    if data is not None:
        scripts = (
            f'<script type="application/json" id="sweep-data">{_json_for_script(data)}</script>\n'
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


def _write_bytes(path: str, data: bytes) -> None:
    # Written aside and renamed: a reader (an artifact upload, a browser refresh) never sees half a file.
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------


def write_sweep_report(
    result: SweepResult,
    *,
    out_dir: str,
    search_space: dict,
    title: str,
    links: dict[str, str] | None = None,
    page_url: str | None = None,
) -> dict[str, str]:
    """Write ``sweep_report.html`` (its plots drawn by its own script from data it embeds; nothing external) into
    ``out_dir``, and ``pbt.png`` for a Population Based Training sweep; return name -> path of each file
    written ("html", "pbt").

    ``search_space`` is the sweep's space as in its config (plain values are fixed parameters); it decides the
    parallel-coordinates axes (log for loguniform/pow2, categorical for choice/grid) and which importances are
    judged on a log scale. ``links`` are shown as anchors in the header, except ``"run_url_template"`` (with
    ``{run_id}``), which turns run ids into links. ``page_url``: where the report opens as a page of its own
    (the tracking server's report route), named on the page when it is shown inside a frame.
    """
    links = dict(links or {})
    search_space = dict(search_space or {})
    os.makedirs(out_dir, exist_ok=True)
    best = result.best()
    sampled = _sampled_params(search_space, result.trials)
    fixed = _fixed_params(search_space, sampled)
    sections = [_framed_notice(page_url), _header_html(result, title, best, links, fixed)]
    written: dict[str, str] = {}
    data: dict[str, Any] | None = None

    if not result.trials:
        extra = f": {result.not_started} were not started (time budget)" if result.not_started else ""
        sections.append(
            f'<p class="notice">No trial ran in this sweep{_e(extra)}; there is nothing to plot.</p>'
        )
    else:
        data = report_data(result, search_space)
        order = [str(r) for r in result.leaderboard()["trial"]]  # best first, as the table
        colors = {t["id"]: t["color"] for t in data["trials"]}
        sections += [
            _curves_card(data, order),
            _parallel_card(data),
            f'<div class="row">{_best_so_far_card(data)}{_importance_card(data)}</div>',
        ]
        pbt = _plot_pbt(result, colors)
        if pbt is not None:  # a Population Based Training sweep
            path = os.path.join(out_dir, "pbt.png")
            _write_bytes(path, pbt)
            written["pbt"] = path
            sections.append(_pbt_card(pbt))
        sections.append(_table_html(result, sampled, links, best, colors))

    html_path = os.path.join(out_dir, HTML_NAME)
    _write_bytes(html_path, _page(title, sections, data).encode("utf-8"))
    return {"html": html_path, **written}
