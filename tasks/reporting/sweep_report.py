"""A sweep's report: one self-contained HTML page with plots, for a person to look at rather than read.

``write_sweep_report`` turns a ``SweepResult`` into static PNG plots and a ``sweep_report.html`` that embeds
them (base64 ``data:`` URIs, inline CSS: it opens offline, from an MLflow artifact view, a mail attachment or
a file share, and fetches nothing). The page shows:

- a header: the title, the best trial (id, best value, epoch, config), the trial counts and any links given
  (MLflow parent run, Prefect flow run, ...);
- learning curves: the selection metric per training iteration, one line per trial, early-stopped trials
  marked where ASHA stopped them, failed trials dashed, the best trial thick;
- parallel coordinates: one axis per sampled hyperparameter plus the best metric, each trial a line coloured
  by its best value (log axes for log-sampled parameters, the values themselves on categorical axes);
- best so far: how the sweep's best value improved as trials ended;
- the leaderboard, best first, with links to each trial's MLflow run.

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
    files["html"]  # reports/sweep-42/sweep_report.html; also "learning_curves", "parallel_coordinates", ...

Plots are drawn on matplotlib's Agg canvas directly (``Figure``, never pyplot): no display is needed, and no
global figure state is shared between threads (Prefect runs tasks in threads).
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps, patheffects
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import Colormap, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from sweepflow.tasks.sweep.results import SweepResult, TrialResult, TrialStatus, flat_config

__all__ = ["HTML_NAME", "ParamAxis", "axis_positions", "make_axis", "write_sweep_report"]

HTML_NAME = "sweep_report.html"
RUN_URL_TEMPLATE_KEY = (
    "run_url_template"  # a `links` key: "{run_id}" in it is replaced by each trial's run id
)
MAX_LEGEND_TRIALS = 20  # more trials than this: lines are coloured by their best value, not named in a legend
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
STOPPED_LABEL = "stopped early (ASHA)"
DPI = 100
EMPTY_CELL = "—"


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


# --------------------------------------------------------------------------------------------------
# Plot data
# --------------------------------------------------------------------------------------------------


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


def _best_cmap(mode: str) -> Colormap:
    # Better = darker: dark lines stand out on the white background, the weak trials fade to yellow-green.
    return colormaps["viridis" if mode == "min" else "viridis_r"]


def _best_norm(bests: Sequence[float]) -> Normalize:
    lo, hi = min(bests), max(bests)
    if hi <= lo:
        pad = abs(lo) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    return Normalize(vmin=lo, vmax=hi)


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
# Plots
# --------------------------------------------------------------------------------------------------


Curve = tuple[TrialResult, np.ndarray, np.ndarray]  # a trial, its training iterations, its metric values


def _curve_colors(curves: Sequence[Curve], mode: str) -> tuple[dict[str, Any], ScalarMappable | None]:
    """A colour per trial: distinct colours when the legend can name every trial; otherwise by best value
    (with the colour scale to explain it), since 200 names in a legend help nobody."""
    if len(curves) <= MAX_LEGEND_TRIALS:
        palette = colormaps["tab10" if len(curves) <= 10 else "tab20"].colors
        return {t.trial_id: palette[i % len(palette)] for i, (t, _, _) in enumerate(curves)}, None
    bests = [float(t.best) for t, _, _ in curves if t.best is not None and _is_number(t.best)]
    cmap, norm = _best_cmap(mode), _best_norm(bests or [0.0])
    colors = {t.trial_id: cmap(norm(t.best)) if _is_number(t.best) else "0.6" for t, _, _ in curves}
    return colors, ScalarMappable(norm=norm, cmap=cmap)


def _draw_curve(ax: Any, curve: Curve, color: Any, *, is_best: bool, many: bool, mode: str) -> Line2D:
    trial, xs, ys = curve
    line = ax.plot(
        xs,
        ys,
        color=color,
        linewidth=3.2 if is_best else 1.4,
        linestyle="--" if trial.status is TrialStatus.FAILED else "-",
        alpha=1.0 if is_best else (0.55 if many else 0.9),
        marker="o" if len(xs) == 1 else None,  # a one-report trial would otherwise be invisible
        markersize=4,
        zorder=4 if is_best else 2,
        label=f"{trial.trial_id} (best)" if is_best else trial.trial_id,
    )[0]
    if trial.status is TrialStatus.STOPPED:  # where ASHA cut it: the point its curve would have gone on from
        ax.plot(
            xs[-1],
            ys[-1],
            marker="x",
            color="black",
            markersize=6 if many else 8,
            markeredgewidth=1.2 if many else 2,
            zorder=5,
        )
    if is_best:
        pick = np.argmax(ys) if mode == "max" else np.argmin(ys)
        ax.plot(
            xs[pick], ys[pick], marker="*", color="gold", markeredgecolor="black", markersize=16, zorder=6
        )
    return line


def _curve_legend(curves: Sequence[Curve], metric: str, best_line: Line2D | None) -> list[Line2D]:
    """The legend's explanation of the marks, for the marks the plot has."""
    statuses = {t.status for t, _, _ in curves}
    entries = []
    if best_line is not None:
        entries.append(
            Line2D(
                [],
                [],
                color=best_line.get_color(),
                linewidth=3.2,
                label=f"best trial: {best_line.get_label().removesuffix(' (best)')}",
            )
        )
        entries.append(
            Line2D(
                [],
                [],
                color="gold",
                marker="*",
                markeredgecolor="black",
                linestyle="none",
                markersize=12,
                label=f"its best {metric}",
            )
        )
    if TrialStatus.STOPPED in statuses:
        entries.append(
            Line2D(
                [],
                [],
                color="black",
                marker="x",
                linestyle="none",
                markersize=8,
                markeredgewidth=2,
                label=STOPPED_LABEL,
            )
        )
    if TrialStatus.FAILED in statuses:
        entries.append(Line2D([], [], color="0.35", linestyle="--", linewidth=1.4, label="failed"))
    return entries


def _plot_learning_curves(result: SweepResult, best: TrialResult | None) -> bytes | None:
    curves: list[Curve] = [(t, *_curve(t, result.metric)) for t in result.trials]
    curves = [c for c in curves if len(c[1])]
    if not curves:
        return None
    colors, scale = _curve_colors(curves, result.mode)
    fig = _new_figure(12, 5.5)
    ax = fig.add_subplot()
    lines, best_line = [], None
    for curve in curves:
        is_best = best is not None and curve[0].trial_id == best.trial_id
        line = _draw_curve(
            ax, curve, colors[curve[0].trial_id], is_best=is_best, many=scale is not None, mode=result.mode
        )
        lines.append(line)
        best_line = line if is_best else best_line
    named = lines if scale is None else []  # every trial by name, only when there are few
    fig.legend(
        handles=_curve_legend(curves, result.metric, best_line) + named,
        loc="outside right upper",
        fontsize=8,
        frameon=False,
    )
    if scale is not None:
        fig.colorbar(scale, ax=ax, label=_sort_key_words(result.metric, result.mode), pad=0.01)

    all_y = np.concatenate([ys for _, _, ys in curves])
    if all_y.min() > 0 and all_y.max() / all_y.min() > 100:
        ax.set_yscale("log")  # a diverged trial would flatten every other curve on a linear axis
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training iteration")
    ax.set_ylabel(result.metric)
    ax.grid(True, alpha=0.3)
    return _png(fig)


def _param_axes(
    result: SweepResult, search_space: Mapping[str, Any], trials: Sequence[TrialResult]
) -> list[ParamAxis]:
    return [
        make_axis(name, search_space[name], [t.config.get(name) for t in trials])
        for name in _sampled_params(search_space, result.trials)
    ]


def _plot_parallel_coordinates(
    result: SweepResult, search_space: Mapping[str, Any], best: TrialResult | None
) -> bytes | None:
    trials = [t for t in result.trials if t.best is not None and _is_number(t.best)]
    params = _param_axes(result, search_space, trials)
    if not trials or not params:
        return None
    bests = [float(t.best) for t in trials]  # type: ignore[arg-type]
    metric_axis = make_axis(f"best {result.metric}", {"type": "uniform"}, bests)
    axes = [*params, metric_axis]
    xs = np.arange(len(axes), dtype=float)

    # Worst first, so the better (darker) lines are drawn over the weaker ones where they cross.
    order = sorted(trials, key=lambda t: float(t.best), reverse=(result.mode == "min"))  # type: ignore[arg-type]
    segments = [
        np.column_stack(
            [xs, [a.position(t.config.get(a.name)) for a in params] + [metric_axis.position(t.best)]]
        )
        for t in order
    ]
    cmap, norm = _best_cmap(result.mode), _best_norm(bests)
    fig = _new_figure(12, 5.5)
    ax = fig.add_subplot()
    colors = cmap(norm(np.array([float(t.best) for t in order])))  # type: ignore[arg-type]
    if len(order) > MAX_LEGEND_TRIALS:
        # Many lines: the weaker a trial, the more transparent, so the good region of the space stands out.
        rank = np.linspace(0.0, 1.0, len(order))  # `order` is worst first
        colors[:, 3] = 0.25 + 0.65 * rank
    ax.add_collection(LineCollection(segments, colors=colors, linewidths=1.4, zorder=2))
    best_index = next(
        (i for i, t in enumerate(order) if best is not None and t.trial_id == best.trial_id), None
    )
    if best is not None and best_index is not None:
        path = segments[best_index]
        ax.plot(
            path[:, 0],
            path[:, 1],
            color=cmap(norm(best.best)),
            linewidth=3.5,
            zorder=4,
            path_effects=[patheffects.withStroke(linewidth=5.5, foreground="black")],
            label=f"best trial: {best.trial_id}",
        )
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=8, frameon=False, borderaxespad=0.2)

    for i, axis in enumerate(axes):
        ax.axvline(i, color="0.25", linewidth=1.0, zorder=1)
        for pos, label in axis.ticks():
            # Labels on a white box, left of their axis (the last axis: right, outside the lines' area), so
            # lines crossing behind them never hide the numbers.
            last = i == len(axes) - 1
            ax.annotate(
                label,
                xy=(i, pos),
                xytext=(5 if last else -5, 0),
                textcoords="offset points",
                ha="left" if last else "right",
                va="center",
                fontsize=8,
                zorder=5,
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
            )
    names = [f"{a.name}\n(log)" if a.scale == "log" else a.name for a in axes]
    ax.set_xticks(xs, names, fontsize=9, rotation=0 if len(axes) <= 7 else 30)
    ax.tick_params(axis="x", length=0)
    ax.set_xlim(-0.02 * len(axes), len(axes) - 1 + 0.02 * len(axes))  # the tick labels sit outside this range
    ax.set_ylim(-0.04, 1.04)
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)
    fig.colorbar(
        ScalarMappable(norm=norm, cmap=cmap),
        ax=ax,
        label=_sort_key_words(result.metric, result.mode),
        pad=0.01,
    )
    return _png(fig)


def _plot_best_so_far(result: SweepResult) -> bytes | None:
    ordered = _end_order(result.trials)
    if not any(t.best is not None for t in ordered):
        return None
    pick = max if result.mode == "max" else min
    xs = np.arange(1, len(ordered) + 1)
    running: list[float] = []
    current: float | None = None
    for t in ordered:
        # Only trials the sweep can select (completed or stopped early) move its best, as in SweepResult.best().
        if t.status.selectable and t.best is not None and _is_number(t.best):
            current = float(t.best) if current is None else pick(current, float(t.best))
        running.append(math.nan if current is None else current)

    fig = _new_figure(12, 4)
    ax = fig.add_subplot()
    ax.step(xs, running, where="post", color="black", linewidth=2, label="best so far", zorder=3)
    styles = {
        TrialStatus.COMPLETED: {"color": "tab:blue", "marker": "o", "label": "completed"},
        TrialStatus.STOPPED: {"color": "tab:orange", "marker": "o", "label": "stopped early"},
        TrialStatus.FAILED: {"color": "tab:red", "marker": "x", "label": "failed (not selectable)"},
    }
    for status, style in styles.items():
        points = [
            (x, float(t.best))
            for x, t in zip(xs, ordered, strict=True)
            if t.status is status and t.best is not None and _is_number(t.best)
        ]
        if points:
            px, py = zip(*points, strict=True)
            ax.scatter(
                px, py, s=28, zorder=4, color=style["color"], marker=style["marker"], label=style["label"]
            )
    all_y = [float(t.best) for t in ordered if t.best is not None and _is_number(t.best)]
    if min(all_y) > 0 and max(all_y) / min(all_y) > 100:
        ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0.5, len(ordered) + 0.5)
    ax.set_xlabel("trials, in the order they ended")
    ax.set_ylabel(f"best {result.metric}")
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    return _png(fig)


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


def _plot_pbt(result: SweepResult) -> bytes | None:
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
    colors = {t.trial_id: colormaps["tab10"](i % 10) for i, t in enumerate(everyone)}
    for ax, name in zip(axes, params, strict=False):
        for t in everyone:
            history = t.config_history or ({"iteration": 0, "config": t.config},)
            xs = [int(e["iteration"]) for e in history] + [max(t.epochs, int(history[-1]["iteration"]))]
            ys = [flat_config(e["config"]).get(name) for e in history]
            ys = [float(y) if _is_number(y) else math.nan for y in ys]
            ax.step(xs, [*ys, ys[-1]], where="post", color=colors[t.trial_id], linewidth=1.6, label=t.trial_id)
            ax.scatter(xs[1:-1], ys[1:], color=colors[t.trial_id], s=18, zorder=3)
        values = [v for t in everyone for e in t.config_history for k, v in flat_config(e["config"]).items() if k == name]
        positive = [float(v) for v in values if _is_number(v) and v > 0]
        if positive and len(positive) == len(values) and max(positive) / min(positive) > 20:
            ax.set_yscale("log")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
    lineage = axes[-1]
    rows = {t.trial_id: i for i, t in enumerate(everyone)}
    for t in everyone:
        lineage.hlines(rows[t.trial_id], 0, max(t.epochs, 1), color=colors[t.trial_id], linewidth=1.2, alpha=0.6)
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

CSS = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --accent: #0969da; --bg-soft: #f6f8fa; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 48px; color: var(--fg); background: #fff;
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1200px; margin: 0 auto; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 32px 0 8px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
a { color: var(--accent); }
.meta { color: var(--muted); margin: 0 0 12px; }
.links { margin: 8px 0 16px; padding: 0; list-style: none; display: flex; flex-wrap: wrap; gap: 8px 16px; }
.links a { font-weight: 600; }
.best { background: var(--bg-soft); border: 1px solid var(--line); border-left: 5px solid #2da44e;
        border-radius: 6px; padding: 12px 16px; margin: 12px 0; }
.best .value { font-size: 22px; font-weight: 700; }
.best dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 8px 0 0; }
.best dt { color: var(--muted); }
.best dd { margin: 0; font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.notice { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 6px; padding: 12px 16px; }
figure { margin: 8px 0 0; }
figure img { display: block; width: 100%; max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; }
.table-wrap { overflow-x: auto; border: 1px solid var(--line); border-radius: 6px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { padding: 5px 10px; border-bottom: 1px solid var(--line); white-space: nowrap; text-align: left; }
th { background: var(--bg-soft); position: sticky; top: 0; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.best-row td { background: #dafbe1; font-weight: 600; }
tbody tr:nth-child(even):not(.best-row) td { background: #fbfbfc; }
.status { display: inline-block; padding: 0 8px; border-radius: 10px; font-size: 12px; }
.status-completed { background: #dafbe1; color: #1a7f37; }
.status-stopped { background: #fff1e5; color: #bc4c00; }
.status-failed { background: #ffebe9; color: #cf222e; text-decoration: underline dotted; cursor: help; }
.status-not_started { background: #eaeef2; color: var(--muted); }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _safe_href(url: str) -> str | None:
    """``url`` unless its scheme runs code when clicked (javascript:, data:, vbscript:)."""
    scheme = url.strip().split(":", 1)[0].lower() if ":" in url else ""
    return None if scheme in ("javascript", "data", "vbscript") else url


def _anchor(url: str, text: str) -> str:
    href = _safe_href(url)
    return f'<a href="{_e(href)}">{_e(text)}</a>' if href else _e(text)


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
        out.append(
            '<section class="best">'
            f"<div>Best trial <b>{_e(best.trial_id)}</b> {_status_badge(best, best.status.value)}{run}</div>"
            f'<div class="value">best {_e(result.metric)} = {_e(_fmt(best.best))}'
            f" <small>at epoch {_e(_fmt(best.best_epoch))} of {_e(best.epochs)}</small></div>"
            f"<dl>{rows}</dl></section>"
        )
    elif result.trials:
        out.append(
            f'<p class="notice">No trial reported a value of {_e(result.metric)}: there is no best trial.</p>'
        )
    if fixed:
        values = ", ".join(f"{k}={_fmt(v)}" for k, v in fixed.items())
        out.append(f'<p class="meta">Fixed for every trial: <code>{_e(values)}</code></p>')
    return "\n".join(out)


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
    result: SweepResult, sampled: Sequence[str], links: Mapping[str, str], best: TrialResult | None
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
                cells.append(f"<td><b{name}>{_e(value)}</b></td>")
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
        body.append(f"<tr{row_class}>{''.join(cells)}</tr>")
    return (
        f"<h2>Trials, best first by {_e(_sort_key_words(result.metric, result.mode))}</h2>\n"
        f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead>\n<tbody>\n'
        + "\n".join(body)
        + "\n</tbody></table></div>"
    )


@dataclass(frozen=True)
class _Plot:
    key: str
    heading: str
    caption: str
    png: bytes | None
    missing: str  # said instead of the plot when there is nothing to draw


def _figure_html(plot: _Plot) -> str:
    if plot.png is None:
        return f'<h2>{_e(plot.heading)}</h2>\n<p class="notice">{_e(plot.missing)}</p>'
    data = base64.b64encode(plot.png).decode("ascii")
    return (
        f'<h2>{_e(plot.heading)}</h2>\n<figure><img alt="{_e(plot.heading)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{_e(plot.caption)}</figcaption></figure>"
    )


def _page(title: str, sections: Sequence[str]) -> str:
    body = "\n".join(sections)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(title)}</title>\n<style>{CSS}</style>\n</head>\n"
        f"<body><main>\n{body}\n</main></body></html>\n"
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
) -> dict[str, str]:
    """Write the sweep's plots (PNG) and ``sweep_report.html`` (plots embedded, no external resources) into
    ``out_dir``; return name -> path of each file written.

    ``search_space`` is the sweep's space as in its config (plain values are fixed parameters); it decides the
    parallel-coordinates axes (log for loguniform/pow2, categorical for choice/grid). ``links`` are shown as
    anchors in the header, except ``"run_url_template"`` (with ``{run_id}``), which turns run ids into links.

    The keys are "html" and, when there was something to draw, "learning_curves", "parallel_coordinates",
    "best_so_far" and (Population Based Training) "pbt" (a sweep in which no trial ran gets an HTML page saying so, and no plots).
    """
    links = dict(links or {})
    search_space = dict(search_space or {})
    os.makedirs(out_dir, exist_ok=True)
    best = result.best()
    sampled = _sampled_params(search_space, result.trials)
    fixed = _fixed_params(search_space, sampled)
    sections = [_header_html(result, title, best, links, fixed)]
    written: dict[str, str] = {}

    if not result.trials:
        extra = f": {result.not_started} were not started (time budget)" if result.not_started else ""
        sections.append(
            f'<p class="notice">No trial ran in this sweep{_e(extra)}; there is nothing to plot.</p>'
        )
    else:
        metric = result.metric
        plots = [
            _Plot(
                "learning_curves",
                f"Learning curves: {metric} per training iteration",
                f"One line per trial. × marks where a trial was stopped early (ASHA); dashed lines are failed trials; "
                f"the thick line is the best trial, ★ its best {metric}.",
                _plot_learning_curves(result, best),
                f"No trial reported a finite {metric}.",
            ),
            _Plot(
                "parallel_coordinates",
                "Hyperparameters against the best value",
                f"One line per trial through its hyperparameter values and its best {metric}, coloured by that "
                f"value (darker is better). Log axes for log-sampled parameters. Trials without a {metric} "
                f"value are left out.",
                _plot_parallel_coordinates(result, search_space, best),
                f"Nothing to draw: no trial reported {metric}, or the search space samples no parameter.",
            ),
            _Plot(
                "best_so_far",
                f"Best {metric} so far",
                f"The sweep's best {metric} as trials ended (step line; failed trials do not count), and each "
                f"trial's best (dots).",
                _plot_best_so_far(result),
                f"No trial reported {metric}.",
            ),
        ]
        pbt = _plot_pbt(result)
        if pbt is not None:  # a Population Based Training sweep
            plots.append(
                _Plot(
                    "pbt",
                    "Population Based Training: hyperparameters over time, and who copied whom",
                    "Top: each trial's mutated hyperparameters over its reports (dots: an exploit gave it new "
                    "values). Bottom: an arrow from the donor's row to the trial that continued from its checkpoint, "
                    "at the report it happened.",
                    pbt,
                    "",
                )
            )
        for plot in plots:
            sections.append(_figure_html(plot))
            if plot.png is not None:
                path = os.path.join(out_dir, f"{plot.key}.png")
                _write_bytes(path, plot.png)
                written[plot.key] = path
        sections.append(_table_html(result, sampled, links, best))

    html_path = os.path.join(out_dir, HTML_NAME)
    _write_bytes(html_path, _page(title, sections).encode("utf-8"))
    return {"html": html_path, **written}
