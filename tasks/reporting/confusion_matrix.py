"""The confusion matrix of an evaluation (``sweepflow.tasks.training.evaluate``) as a PNG to log as an artifact.

Drawn in the flow process, from the matrix a worker's evaluation returns: the flow already holds matplotlib (the
sweep report), and the worker that evaluates then needs neither matplotlib nor anything else it does not use.
matplotlib's Agg canvas is used directly, never pyplot: no display is needed, and no global figure state is
shared between threads (Prefect runs tasks in threads).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def plot_confusion_matrix(
    confusion_matrix: Sequence[Sequence[int]],
    class_names: Sequence[str],
    path: str | os.PathLike[str],
    title: str | None = None,
) -> str:
    """Write the confusion matrix (``confusion_matrix[i][j]``: samples of true class ``i`` predicted as ``j``) as
    a PNG at ``path`` (parent dirs created); returns the path.

    Cells show counts, shaded by the share of their true class (row-normalised) so that rare classes'
    mistakes stay visible; class names label both axes. The default title gives the accuracy it implies.
    """
    counts = np.asarray(confusion_matrix, dtype=np.int64)
    class_names = [str(name) for name in class_names]
    n = len(class_names)
    if counts.shape != (n, n):
        raise ValueError(f"confusion_matrix is {counts.shape} but there are {n} class names")
    row_totals = counts.sum(axis=1, keepdims=True)
    shares = np.divide(counts, row_totals, out=np.zeros(counts.shape, dtype=float), where=row_totals > 0)

    side = min(max(4.5, 0.6 * n + 2.5), 24.0)  # grows with the class count so the labels stay legible
    fig = Figure(figsize=(side + 1.0, side), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)  # attaches the Agg canvas: savefig then needs no pyplot or display
    ax = fig.add_subplot()
    image = ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    colorbar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    colorbar.set_label("share of the true class")

    font_size = max(5, min(10, int(120 / max(n, 1))))
    if n <= 30:  # beyond that the numbers would overlap; the shading still tells the story
        for i in range(n):
            for j in range(n):
                ax.text(
                    j,
                    i,
                    str(counts[i, j]),
                    ha="center",
                    va="center",
                    fontsize=font_size,
                    # zeros in grey so the eye goes to the diagonal and to the actual mistakes
                    color="white" if shares[i, j] > 0.5 else ("black" if counts[i, j] else "0.6"),
                )

    long_names = max((len(name) for name in class_names), default=0) > 3
    ax.set_xticks(
        range(n),
        labels=class_names,
        rotation=45 if long_names else 0,
        ha="right" if long_names else "center",
        rotation_mode="anchor",  # rotate about the label's end, so it stays under its column
    )
    ax.set_yticks(range(n), labels=class_names)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    total = int(counts.sum())
    accuracy = float(np.trace(counts)) / total if total else float("nan")
    ax.set_title(title or f"Confusion matrix: accuracy {accuracy:.1%} on {total} samples")

    out = os.fspath(path)
    parent = os.path.dirname(out)
    if parent:
        os.makedirs(parent, exist_ok=True)
    fig.savefig(out, format="png", bbox_inches="tight")  # "tight": long class names are never cut off
    return out
