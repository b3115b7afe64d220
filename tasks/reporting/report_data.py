"""The sweep report's data: everything the page's script draws, as JSON-ready data the page embeds.

``report_data`` gives each trial its colour (the same in every plot), its curve of the selection metric and its
best point; each parallel-coordinates axis its ticks and every trial's position on it (``ParamAxis``,
report_axes.py); the sweep's best value as trials ended; the hyperparameter importances (importance.py); and for
a multi-objective sweep its Pareto front on the first two objectives (``pareto_data``).
``json_for_script`` serialises it so that it cannot end the ``<script>`` element it sits in. Pure: built and
tested without a browser.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import to_hex, to_rgb

from sweepflow.tasks.reporting.importance import Importances, param_importances
from sweepflow.tasks.reporting.report_axes import (
    LOG_TYPES,
    axis_params,
    better,
    fmt,
    is_number,
    make_axis,
)
from sweepflow.tasks.sweep.results import SweepResult, TrialResult, TrialStatus, pareto_front

__all__ = [
    "DRAWN_BEST",
    "Curve",
    "MAX_DRAWN_TRIALS",
    "MAX_LEGEND_TRIALS",
    "STATUS_WORDS",
    "curve_band",
    "drawn_trials",
    "json_for_script",
    "pareto_data",
    "report_data",
    "trial_curve",
]

MAX_LEGEND_TRIALS = 20  # more trials than this: coloured by their best value, not each named in a legend
# More trials than this: the plots draw a sample of them (the DRAWN_BEST best, the rest spread evenly over the
# other ranks), and the learning curves a band of every trial's values. A browser draws a few hundred SVG lines
# at once; at 10,000 the page stopped answering before its plots appeared. The table still lists every trial.
MAX_DRAWN_TRIALS = 300
DRAWN_BEST = 100

STATUS_WORDS = {
    TrialStatus.COMPLETED: "completed",
    TrialStatus.STOPPED: "stopped early",
    TrialStatus.FAILED: "failed",
    TrialStatus.NOT_STARTED: "not started",
    TrialStatus.INTERRUPTED: "interrupted",
}
NO_VALUE_COLOR = "#8c959f"  # a trial without a value of the metric, when colours say the value

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
        t.trial_id: to_hex(cmap(norm(float(t.best)))) if is_number(t.best) else NO_VALUE_COLOR for t in trials
    }, "best"


def _best_scale(result: SweepResult) -> tuple[Any, Any]:
    """(value -> [0, 1], colour map): darker is better, so the good trials stand out on white."""
    bests = [float(t.best) for t in result.trials if is_number(t.best)] or [0.0]
    lo, hi = min(bests), max(bests)
    if hi <= lo:
        pad = abs(lo) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    return (lambda v: (v - lo) / (hi - lo)), colormaps["viridis" if result.mode == "min" else "viridis_r"]


def drawn_trials(result: SweepResult) -> frozenset[str] | None:
    """The trials the plots draw one by one: None (all of them) up to ``MAX_DRAWN_TRIALS`` trials; beyond, the
    ``DRAWN_BEST`` best by their best value and ``MAX_DRAWN_TRIALS - DRAWN_BEST`` more at evenly spaced ranks
    through the rest (the worst included), so the sample spans the sweep's spread of results and not only its top;
    the sweep's best trial always. Trials without a value of the metric have no line to draw and are left out."""
    if len(result.trials) <= MAX_DRAWN_TRIALS:
        return None
    sign = -1.0 if result.mode == "max" else 1.0
    ranked = sorted(
        (t for t in result.trials if is_number(t.best)), key=lambda t: (sign * float(t.best), t.index)  # type: ignore[arg-type]
    )
    rest = ranked[DRAWN_BEST:]
    spread = min(len(rest), MAX_DRAWN_TRIALS - DRAWN_BEST)
    picks = {int(round(i)) for i in np.linspace(0, len(rest) - 1, spread)} if spread else set()
    drawn = {t.trial_id for t in ranked[:DRAWN_BEST]} | {rest[i].trial_id for i in picks}
    best = result.best()
    if best is not None:
        drawn.add(best.trial_id)
    return frozenset(drawn)


Curve = tuple[np.ndarray, np.ndarray]  # a trial's training iterations and its values of the metric at them


def curve_band(curves: Sequence[Curve]) -> list[list[float]]:
    """Every trial's values of the metric (``curves``, from ``trial_curve``) summarised per training iteration,
    for a sweep too large to draw each line: ``[iteration, 10th percentile, median, 90th percentile, trials]`` in
    iteration order. Percentiles need no scale: the band is the same on a log axis."""
    by_x: dict[float, list[float]] = {}
    for xs, ys in curves:
        for x, y in zip(xs.tolist(), ys.tolist(), strict=True):
            by_x.setdefault(x, []).append(y)
    band = []
    for x in sorted(by_x):
        lo, mid, hi = np.percentile(by_x[x], [10, 50, 90]).tolist()
        band.append([x, lo, mid, hi, len(by_x[x])])
    return band


def _trial_data(
    t: TrialResult, result: SweepResult, color: str, params: Sequence[str], curve: Curve, drawn: bool
) -> dict[str, Any]:
    xs, ys = curve
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
        "best": float(t.best) if is_number(t.best) else None,
        "bestLabel": fmt(t.best) if is_number(t.best) else None,
        "bestEpoch": t.best_epoch,
        "epochs": t.epochs,
        "color": color,
        "labelColor": _darker(color),
        # Only a drawn trial's curve: a sampled sweep's page would otherwise carry every report of every trial.
        "curve": [[float(x), float(y)] for x, y in zip(xs, ys, strict=True)] if drawn else [],
        "drawn": drawn,
        "bestPoint": best_point,
        "config": {p: fmt(t.config.get(p)) for p in params if p in t.config},
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
    with_value = [t for t in trials if is_number(t.best)]
    if not axes or not with_value:
        return []
    metric_axis = make_axis(f"best {result.metric}", {"type": "uniform"}, [float(t.best) for t in with_value])  # type: ignore[arg-type]
    out = []
    for axis in [*axes, metric_axis]:
        positions = {}
        for t in trials:
            value = t.best if axis is metric_axis else t.config.get(axis.name)
            pos = axis.position(value) if (axis is not metric_axis or is_number(value)) else math.nan
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
    values = [float(t.best) for t in ordered if is_number(t.best)]
    if not values:
        return None
    pick = max if result.mode == "max" else min
    running: list[float | None] = []
    current: float | None = None
    for t in ordered:
        # Only trials the sweep can select (completed or stopped early) move its best, as in SweepResult.best().
        if t.status.selectable and is_number(t.best):
            current = float(t.best) if current is None else pick(current, float(t.best))
        running.append(current)
    return {"order": [t.trial_id for t in ordered], "running": running, "log": _log_worthy(values)}


def _importances(result: SweepResult, search_space: Mapping[str, Any], params: Sequence[str]) -> Importances:
    finished = [t for t in result.trials if t.status.selectable and is_number(t.best)]
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
        label=fmt,
    )


def _worse(a: float, b: float, mode: str) -> float:
    return min(a, b) if mode == "max" else max(a, b)


def pareto_data(trials: Sequence[TrialResult], objectives: Sequence[tuple[str, str]]) -> dict[str, Any] | None:
    """A multi-objective sweep's Pareto front as the report draws it, on the first two objectives: every
    finished trial with a finite value of both as a point (its last report's values, what the search was told),
    the front's trials (``results.pareto_front`` over all the objectives, as recorded on the parent run) marked,
    and for two objectives the step line joining them: from each front trial to the next by x, through the
    corner both dominate, which bounds the region the front dominates. None with fewer than two objectives."""
    if len(objectives) < 2:
        return None
    (xm, xmode), (ym, ymode) = objectives[0], objectives[1]
    front = pareto_front(trials, objectives)
    on_front = {t.trial_id for t in front}
    points = [
        {"id": t.trial_id, "x": float(t.last[xm]), "y": float(t.last[ym]), "front": t.trial_id in on_front}
        for t in trials
        if t.status.selectable and is_number(t.last.get(xm)) and is_number(t.last.get(ym))
    ]
    ordered = sorted((p for p in points if p["front"]), key=lambda p: (p["x"], p["y"]))
    step: list[list[float]] = []
    if len(objectives) == 2:  # with more, the front projected on two objectives is no staircase
        for i, p in enumerate(ordered):
            if i:
                q = ordered[i - 1]
                step.append([_worse(q["x"], p["x"], xmode), _worse(q["y"], p["y"], ymode)])
            step.append([p["x"], p["y"]])
    return {
        "x": {"metric": xm, "mode": xmode, "better": better(xmode)},
        "y": {"metric": ym, "mode": ymode, "better": better(ymode)},
        "objectives": [{"metric": m, "mode": d, "better": better(d)} for m, d in objectives],
        "points": points,
        "front": [p["id"] for p in ordered],  # by the first objective's value
        "step": step,
        "xLog": _log_worthy([p["x"] for p in points]),
        "yLog": _log_worthy([p["y"] for p in points]),
    }


def report_data(
    result: SweepResult, search_space: Mapping[str, Any], objectives: Sequence[tuple[str, str]] = ()
) -> dict[str, Any]:
    """Everything the page's script draws, as JSON-ready data (``importance`` included, computed here);
    ``objectives``: a multi-objective sweep's (metric, mode) pairs, whose Pareto front is drawn (``pareto``)."""
    params = axis_params(search_space, result.trials)
    colors, color_by = _trial_colors(result)
    best = result.best()
    curves = [trial_curve(t, result.metric) for t in result.trials]  # once: the lines, the band, the log test
    all_y = [y for _, ys in curves for y in ys.tolist()]
    importance = _importances(result, search_space, params)
    drawn = drawn_trials(result)
    return {
        "metric": result.metric,
        "mode": result.mode,
        "better": better(result.mode),
        "best": best.trial_id if best is not None else None,
        "colorBy": color_by,
        "params": params,
        "trials": [
            _trial_data(t, result, colors[t.trial_id], params, curve, drawn is None or t.trial_id in drawn)
            for t, curve in zip(result.trials, curves, strict=True)
        ],
        "drawnCount": len(result.trials) if drawn is None else len(drawn),
        "curveBand": curve_band(curves) if drawn is not None else None,
        "curvesLog": _log_worthy(all_y),
        "axes": _axes_data(result, search_space, params),
        "bestSoFar": _best_so_far_data(result),
        "importance": {"values": importance.values, "note": importance.note},
        "pareto": pareto_data(result.trials, objectives),
    }


def json_for_script(data: Mapping[str, Any]) -> str:
    """JSON that cannot end the ``<script>`` element it sits in, whatever a trial's name or error says."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def trial_curve(trial: TrialResult, metric: str) -> Curve:
    """The trial's finite ``metric`` values against their training iteration (NaN/inf reports are skipped)."""
    xs: list[float] = []
    ys: list[float] = []
    for i, report in enumerate(trial.history, start=1):
        value = report.get(metric)
        if not is_number(value):
            continue
        x = report.get("training_iteration", report.get("epoch", i))
        xs.append(float(x) if is_number(x) else float(i))
        ys.append(float(value))
    return np.asarray(xs), np.asarray(ys)


def _end_order(trials: Sequence[TrialResult]) -> list[TrialResult]:
    """Trials in the order they ended. Without an end time for every trial, the list order (SweepResult keeps
    trials in the order they finished); mixing the two would put the untimed ones at arbitrary places."""
    if trials and all(t.ended_at is not None for t in trials):
        return sorted(trials, key=lambda t: t.ended_at)  # type: ignore[arg-type, return-value]
    return list(trials)
