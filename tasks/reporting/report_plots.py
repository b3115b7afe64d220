"""The sweep report's one picture: Population Based Training's lineage, as a PNG.

The mutated hyperparameters of each trial over its reports, and who copied whom. A PNG rather than a plot the
page's script draws: the lineage has no interaction to offer. Drawn on matplotlib's Agg canvas directly
(``Figure``, never pyplot): no display is needed, and no global figure state is shared between threads (Prefect
runs tasks in threads).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from sweepflow.tasks.reporting.report_axes import is_number
from sweepflow.tasks.sweep.results import SweepResult, TrialResult, flat_config

__all__ = ["DPI", "plot_pbt"]

DPI = 100


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
                if is_number(value) and first.get(name) != value and name not in changed:
                    changed.append(name)
    return sorted(changed)[:4]


def plot_pbt(result: SweepResult, trial_colors: Mapping[str, str]) -> bytes | None:
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
            ys = [float(y) if is_number(y) else math.nan for y in ys]
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
        positive = [float(v) for v in values if is_number(v) and v > 0]
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
