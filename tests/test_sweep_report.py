"""The sweep report (sweepflow.tasks.reporting.sweep_report): files, a self-contained HTML page, the leaderboard's
order and wording, non-blank plots, log axes, edge cases, and the page as a headless Chromium renders it."""

from __future__ import annotations

import math
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from browser import screenshot
from matplotlib.image import imread

from sweepflow.tasks.reporting.sweep_report import HTML_NAME, axis_positions, make_axis, write_sweep_report
from sweepflow.tasks.sweep.results import SweepResult, TrialResult, TrialStatus

SPACE = {
    "l1": {"type": "pow2", "low": 4, "high": 16},
    "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
    "batch_size": {"type": "choice", "values": [32, 64]},
    "l2": 8,
}
RUN_URL = "http://127.0.0.1:5000/#/experiments/1/runs/{run_id}"
LINKS = {
    "MLflow parent run": "http://127.0.0.1:5000/#/experiments/1/runs/parent0123",
    "Prefect flow run": "http://127.0.0.1:4200/runs/flow-run/4f1c",
    "run_url_template": RUN_URL,
}
T0 = 1_760_000_000.0
OOM = (
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\nTraceback (most recent call last):\n  ..."
)


def _trial(
    i: int,
    losses: list[float],
    status: TrialStatus,
    config: dict,
    *,
    mode: str = "min",
    metric: str = "val_loss",
    error: str | None = None,
    ended_at: float | None = None,
) -> TrialResult:
    history = [
        {"training_iteration": e, "epoch": e, metric: loss, "accuracy": 0.5 + 0.1 * e}
        for e, loss in enumerate(losses, start=1)
    ]
    return TrialResult.from_history(
        history,
        metric=metric,
        mode=mode,
        trial_id=f"t{i:02d}",
        index=i,
        name=f"train_{i:02d}",
        config={**config, "l2": 8},
        status=status,
        run_id=f"{i:02d}" + "ab" * 15,
        error=error,
        started_at=T0 + 10 * i,
        ended_at=T0 + 10 * i + 7 * len(losses) + 1 if ended_at is None else ended_at,
    )


def _sweep(mode: str = "min") -> SweepResult:
    """6 trials, up to 4 epochs: 3 completed, 2 stopped early by ASHA after 1-2 epochs, 1 failed before any
    report. One history has a NaN report (skipped in plots, not the best)."""
    c = TrialStatus.COMPLETED
    trials = [
        _trial(0, [2.1, 1.6, 1.31234567, 1.2], c, {"l1": 8, "lr": 0.0123456789, "batch_size": 32}),
        _trial(1, [2.3, 1.9, math.nan, 1.45], c, {"l1": 16, "lr": 0.000123456789, "batch_size": 64}),
        _trial(2, [2.6], TrialStatus.STOPPED, {"l1": 4, "lr": 0.0912345, "batch_size": 32}),
        _trial(3, [2.2, 1.8], TrialStatus.STOPPED, {"l1": 8, "lr": 0.00345678, "batch_size": 64}),
        _trial(4, [], TrialStatus.FAILED, {"l1": 16, "lr": 0.0456789, "batch_size": 32}, error=OOM),
        _trial(5, [2.0, 1.5, 1.25, 1.1987654], c, {"l1": 4, "lr": 0.00987654, "batch_size": 64}),
    ]
    if mode == "max":  # accuracy-like: the same trials, higher is better
        trials = [
            TrialResult.from_history(
                [{**r, "val_loss": 1 / r["val_loss"]} for r in t.history],
                metric="val_loss",
                mode="max",
                **{
                    k: getattr(t, k)
                    for k in ("trial_id", "index", "name", "config", "status", "run_id", "error")
                },
            )
            for t in trials
        ]
    return SweepResult(trials=tuple(trials), metric="val_loss", mode=mode)


class _Page(HTMLParser):
    """The parts of the page the tests look at: every tag's attributes, the h2 headings, the table's rows."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.headings: list[str] = []
        self.header: list[str] = []
        self.rows: list[list[str]] = []
        self.cell_attrs: list[list[dict[str, str | None]]] = []  # per row: the attributes inside each cell
        self._in: str | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "tr":
            self.rows.append([])
            self.cell_attrs.append([])
        elif tag in ("h2", "td", "th"):
            self._in, self._text = tag, ""
            if tag == "td":
                self.cell_attrs[-1].append(dict(attrs))
        elif self._in == "td":
            self.cell_attrs[-1][-1].update({f"{tag}.{k}": v for k, v in attrs})

    def handle_data(self, data: str) -> None:
        if self._in:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag != self._in:
            return
        text = " ".join(self._text.split())
        if tag == "h2":
            self.headings.append(text)
        elif tag == "th":
            self.header.append(text)
            self.rows[-1].append(text)
        else:
            self.rows[-1].append(text)
        self._in = None

    @property
    def body_rows(self) -> list[list[str]]:
        return [row for row in self.rows if row and row != self.header]


def _parse(path: str) -> tuple[str, _Page]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    page = _Page()
    page.feed(text)
    return text, page


def _column(page: _Page, name: str) -> list[str]:
    i = page.header.index(name)
    return [row[i] for row in page.body_rows]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("report")
    return write_sweep_report(
        _sweep(), out_dir=str(out), search_space=SPACE, title="CIFAR-10 sweep", links=LINKS
    )


# --------------------------------------------------------------------------------------------------
# Files and self-containment
# --------------------------------------------------------------------------------------------------


def test_writes_the_plots_and_the_page(report: dict[str, str]) -> None:
    assert set(report) == {"html", "learning_curves", "parallel_coordinates", "best_so_far"}
    assert os.path.basename(report["html"]) == HTML_NAME
    for name, path in report.items():
        assert os.path.isfile(path) and os.path.getsize(path) > 1000, name
        assert os.path.dirname(path) == os.path.dirname(report["html"])
    assert not [f for f in os.listdir(os.path.dirname(report["html"])) if ".tmp" in f]


def test_page_fetches_nothing_but_links_to_what_it_was_given(report: dict[str, str]) -> None:
    text, page = _parse(report["html"])
    assert "<script" not in text.lower() and "<link" not in text.lower()
    assert "@import" not in text and "url(" not in text  # no CSS that loads fonts or images
    srcs = [attrs["src"] for _, attrs in page.tags if "src" in attrs]
    assert len(srcs) == 3 and all(src.startswith("data:image/png;base64,") for src in srcs)
    allowed = {url for name, url in LINKS.items() if name != "run_url_template"}
    allowed |= {RUN_URL.replace("{run_id}", t.run_id) for t in _sweep().trials}
    hrefs = [attrs["href"] for _, attrs in page.tags if "href" in attrs]
    assert hrefs and set(hrefs) <= allowed
    assert not re.search(
        r"""\b(?:src|href)\s*=\s*["']?https?://""", text.replace('href="http://127.0.0.1', "")
    )


def test_header_shows_the_best_trial_and_the_links(report: dict[str, str]) -> None:
    text, page = _parse(report["html"])
    assert "<h1>CIFAR-10 sweep</h1>" in text
    best = re.search(r'<section class="best">(.*?)</section>', text, re.S)
    assert best, "no best-trial box"
    box = best.group(1)
    assert "<b>t05</b>" in box and "1.199" in box and "at epoch 4 of 4" in box
    assert "lr" in box and "0.009877" in box  # its sampled config, rounded
    assert f'href="{RUN_URL.replace("{run_id}", "05" + "ab" * 15)}"' in box
    for name, url in LINKS.items():
        if name != "run_url_template":
            assert f'<a href="{url}">{name}</a>' in text
    assert "l2=8" in text  # the fixed parameter, said once


# --------------------------------------------------------------------------------------------------
# The leaderboard
# --------------------------------------------------------------------------------------------------


def test_leaderboard_is_best_first_and_says_by_what(report: dict[str, str]) -> None:
    _, page = _parse(report["html"])
    assert "Trials, best first by best val_loss (lower is better)" in page.headings
    assert page.header[:5] == ["trial", "status", "best_val_loss", "best_epoch", "epochs"]
    assert page.header[5:8] == ["l1", "lr", "batch_size"]  # the sampled hyperparameters, in the space's order
    assert "l2" not in page.header  # fixed: said in the header, not repeated on every row
    assert page.header[-1] == "MLflow run"
    # best values: t05 1.199, t00 1.2, t01 1.45, t03 1.8, t02 2.6; the failed trial without one last
    assert _column(page, "trial") == ["t05", "t00", "t01", "t03", "t02", "t04"]
    assert _column(page, "best_val_loss") == ["1.199", "1.2", "1.45", "1.8", "2.6", "—"]


def test_floats_are_rounded_to_four_significant_digits(report: dict[str, str]) -> None:
    text, page = _parse(report["html"])
    assert _column(page, "lr") == ["0.009877", "0.01235", "0.0001235", "0.003457", "0.09123", "0.04568"]
    assert "0.0123456789" not in text and "1.31234567" not in text and "1.1987654" not in text
    numbers = [
        cell for row in page.body_rows for cell in row[2:-1] if re.fullmatch(r"-?[\d.]+(e[-+]\d+)?", cell)
    ]
    assert numbers and all(len(re.sub(r"e.*|[-.]|^0+", "", n).lstrip("0")) <= 4 for n in numbers)


def test_statuses_are_worded_and_failures_explained(report: dict[str, str]) -> None:
    _, page = _parse(report["html"])
    statuses = dict(zip(_column(page, "trial"), _column(page, "status"), strict=True))
    assert statuses == {
        "t05": "completed",
        "t00": "completed",
        "t01": "completed",
        "t03": "stopped early",
        "t02": "stopped early",
        "t04": "failed",
    }
    failed_row = _column(page, "trial").index("t04")
    status_cell = page.cell_attrs[1:][failed_row][page.header.index("status")]
    assert status_cell["span.title"] == OOM.splitlines()[0]


def test_run_ids_link_to_mlflow_only_with_a_template(report: dict[str, str], tmp_path) -> None:
    _, page = _parse(report["html"])
    runs = page.header.index("MLflow run")
    trials = {t.trial_id: t for t in _sweep().trials}
    for trial_id, attrs in zip(_column(page, "trial"), page.cell_attrs[1:], strict=True):
        assert attrs[runs]["a.href"] == RUN_URL.replace("{run_id}", trials[trial_id].run_id)

    plain = write_sweep_report(_sweep(), out_dir=str(tmp_path), search_space=SPACE, title="no links")
    text, page = _parse(plain["html"])
    assert "<a " not in text
    assert _column(page, "MLflow run")[0] == trials["t05"].run_id[:8]


def test_everything_is_escaped(tmp_path) -> None:
    evil = "<img src=x onerror=alert(1)>"
    trial = _trial(
        0, [1.0, 0.5], TrialStatus.FAILED, {"l1": 8, "lr": 1e-3, "batch_size": evil}, error=f'"{evil}'
    )
    trial2 = _trial(1, [1.0], TrialStatus.COMPLETED, {"l1": 8, "lr": 1e-2, "batch_size": 32})
    result = SweepResult(trials=(trial, trial2), metric="val_loss", mode="min")
    files = write_sweep_report(
        result,
        out_dir=str(tmp_path),
        search_space=SPACE,
        title=f"</title>{evil}",
        links={'"><script>': "javascript:alert(1)", "run_url_template": RUN_URL},
    )
    text, page = _parse(files["html"])
    assert evil not in text and "<script" not in text and "javascript:" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert [tag for tag, _ in page.tags if tag == "img"] == ["img"] * 3  # only the plots


# --------------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------------


def _assert_not_blank(path: str) -> np.ndarray:
    pixels = imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 400, pixels.shape
    rgb = pixels[..., :3]
    assert float(rgb.var()) > 0, f"{path} is a single colour"
    rgb8 = np.round(rgb.reshape(-1, 3) * 255).astype(np.uint32)
    # Colours packed into one integer each: np.unique(axis=0) is far slower on a full-page screenshot.
    colours = len(np.unique(rgb8[:, 0] << 16 | rgb8[:, 1] << 8 | rgb8[:, 2]))
    assert colours > 20, f"{path} has only {colours} colours"
    return rgb


def test_plots_are_not_blank(report: dict[str, str]) -> None:
    for name in ("learning_curves", "parallel_coordinates", "best_so_far"):
        rgb = _assert_not_blank(report[name])
        non_white = float((rgb.min(axis=2) < 0.95).mean())
        assert non_white > 0.01, f"{name}: only {non_white:.1%} of the pixels are drawn"


def test_log_sampled_parameters_are_spaced_by_ratio() -> None:
    lr = axis_positions([1e-4, 1e-3, 1e-2], SPACE["lr"])
    assert lr == pytest.approx([0.0, 1 / 3, 2 / 3])
    assert np.diff(lr) == pytest.approx([1 / 3, 1 / 3])
    assert axis_positions([4, 8, 16], SPACE["l1"]) == pytest.approx([0.0, 0.5, 1.0])
    # linear and categorical axes for comparison
    assert axis_positions([0.0, 0.25, 1.0], {"type": "uniform", "low": 0, "high": 1}) == pytest.approx(
        [0, 0.25, 1]
    )
    assert axis_positions([64, 32], SPACE["batch_size"]) == [1.0, 0.0]
    assert math.isnan(axis_positions([None, 1e-3], SPACE["lr"])[0])


def test_axes_are_labelled_with_real_values() -> None:
    lr = make_axis("lr", SPACE["lr"], [3e-4, 0.05])
    assert lr.scale == "log"
    assert [label for _, label in lr.ticks()] == ["0.0001", "0.001", "0.01", "0.1"]
    assert [pos for pos, _ in lr.ticks()] == pytest.approx([0, 1 / 3, 2 / 3, 1])
    l1 = make_axis("l1", SPACE["l1"], [4, 16])
    assert [label for _, label in l1.ticks()] == ["4", "8", "16"]
    batch = make_axis("batch_size", SPACE["batch_size"], [64])
    assert batch.scale == "categorical" and [label for _, label in batch.ticks()] == ["32", "64"]
    narrow = make_axis("lr", {"type": "loguniform", "low": 1e-3, "high": 5e-3}, [2e-3])
    assert len(narrow.ticks()) >= 2  # less than a decade still gets ticks
    layers = make_axis("layers", {"type": "choice", "values": [[64, 64], [128]]}, [[128]])
    assert [label for _, label in layers.ticks()] == ["[64, 64]", "[128]"]


def test_200_trials_render_every_row_and_readable_curves(tmp_path) -> None:
    """How long the report takes as trials grow is measured by benchmarks/bench_report.py, not asserted here."""
    rng = np.random.default_rng(0)
    trials = []
    for i in range(200):
        lr = float(10 ** rng.uniform(-4, -1))
        status = [TrialStatus.COMPLETED, TrialStatus.STOPPED, TrialStatus.FAILED][i % 3]
        losses = list(
            2.0 / np.arange(1, (5 if status is TrialStatus.COMPLETED else 2)) + abs(math.log10(lr) + 2)
        )
        trials.append(
            _trial(i, losses, status, {"l1": int(rng.choice([4, 8, 16])), "lr": lr, "batch_size": 32})
        )
    result = SweepResult(trials=tuple(trials), metric="val_loss", mode="min")
    files = write_sweep_report(result, out_dir=str(tmp_path / "big"), search_space=SPACE, title="200 trials")
    _assert_not_blank(files["learning_curves"])
    _, page = _parse(files["html"])
    assert len(page.body_rows) == 200


# --------------------------------------------------------------------------------------------------
# Edge cases
# --------------------------------------------------------------------------------------------------


def test_a_sweep_without_trials_says_so(tmp_path) -> None:
    result = SweepResult(trials=(), metric="val_loss", mode="min", not_started=3)
    files = write_sweep_report(result, out_dir=str(tmp_path), search_space=SPACE, title="empty")
    assert set(files) == {"html"}
    text, _ = _parse(files["html"])
    assert "No trial ran" in text and "3 were not started (time budget)" in text


def test_all_failed(tmp_path) -> None:
    trials = (
        _trial(0, [], TrialStatus.FAILED, {"l1": 8, "lr": 1e-3, "batch_size": 32}, error="ValueError: bad"),
        _trial(1, [2.0, math.nan], TrialStatus.FAILED, {"l1": 4, "lr": 1e-2, "batch_size": 64}, error="OOM"),
    )
    result = SweepResult(trials=trials, metric="val_loss", mode="min")
    files = write_sweep_report(result, out_dir=str(tmp_path), search_space=SPACE, title="all failed")
    text, page = _parse(files["html"])
    assert "there is no best trial" in text
    assert _column(page, "status") == ["failed", "failed"]
    _assert_not_blank(files["learning_curves"])  # the one report that came before the failure


def test_all_failed_before_any_report(tmp_path) -> None:
    trials = (_trial(0, [], TrialStatus.FAILED, {"l1": 8, "lr": 1e-3, "batch_size": 32}, error="boom"),)
    result = SweepResult(trials=trials, metric="val_loss", mode="min")
    files = write_sweep_report(result, out_dir=str(tmp_path), search_space=SPACE, title="nothing reported")
    assert set(files) == {"html"}
    text, page = _parse(files["html"])
    assert "No trial reported a finite val_loss" in text
    assert _column(page, "trial") == ["t00"]


def test_a_single_trial_with_a_single_hyperparameter(tmp_path) -> None:
    space = {"lr": SPACE["lr"], "l2": 8}
    trial = _trial(0, [1.0, 0.8], TrialStatus.COMPLETED, {"lr": 1e-3})
    result = SweepResult(trials=(trial,), metric="val_loss", mode="min")
    files = write_sweep_report(result, out_dir=str(tmp_path), search_space=space, title="one")
    assert set(files) == {"html", "learning_curves", "parallel_coordinates", "best_so_far"}
    for name in ("learning_curves", "parallel_coordinates", "best_so_far"):
        _assert_not_blank(files[name])


def test_nan_reports_are_skipped(tmp_path) -> None:
    trial = _trial(0, [math.nan, 1.0, math.inf, 0.7, math.nan], TrialStatus.COMPLETED, {"l1": 8, "lr": 1e-3})
    other = _trial(1, [math.nan], TrialStatus.STOPPED, {"l1": 4, "lr": 1e-2})
    result = SweepResult(trials=(trial, other), metric="val_loss", mode="min")
    files = write_sweep_report(result, out_dir=str(tmp_path), search_space=SPACE, title="nan")
    _, page = _parse(files["html"])
    assert _column(page, "best_val_loss") == ["0.7", "—"]
    assert "nan" not in " ".join(_column(page, "best_val_loss")).lower()
    _assert_not_blank(files["learning_curves"])


def test_mode_max_sorts_higher_first(tmp_path) -> None:
    files = write_sweep_report(
        _sweep("max"), out_dir=str(tmp_path), search_space=SPACE, title="max", links=LINKS
    )
    text, page = _parse(files["html"])
    assert "Trials, best first by best val_loss (higher is better)" in page.headings
    assert _column(page, "trial") == ["t05", "t00", "t01", "t03", "t02", "t04"]
    best = [float(v) for v in _column(page, "best_val_loss")[:-1]]
    assert best == sorted(best, reverse=True)
    assert "<b>t05</b>" in re.search(r'<section class="best">(.*?)</section>', text, re.S).group(1)


def test_search_space_without_sampled_parameters(tmp_path) -> None:
    trial = _trial(0, [1.0, 0.9], TrialStatus.COMPLETED, {"l1": 8})
    result = SweepResult(trials=(trial,), metric="val_loss", mode="min")
    files = write_sweep_report(result, out_dir=str(tmp_path), search_space={"l1": 8}, title="fixed only")
    assert "parallel_coordinates" not in files and "learning_curves" in files
    text, _ = _parse(files["html"])
    assert "samples no parameter" in text


# --------------------------------------------------------------------------------------------------
# In a browser
# --------------------------------------------------------------------------------------------------


@pytest.mark.browser
def test_report_renders_in_headless_chromium(report: dict[str, str], tmp_path) -> None:
    shot = screenshot(f"file://{os.path.abspath(report['html'])}", str(tmp_path / "sweep_report.png"))
    shot = Path(shot)
    assert shot.stat().st_size > 50_000, f"screenshot is only {shot.stat().st_size} bytes"
    rgb = _assert_not_blank(str(shot))
    assert rgb.shape[:2] == (2400, 1280)
    # The page is mostly white with text; its plots are what makes it colourful. Measured at 1280x2400: ~8% of
    # the pixels drawn and ~1.3% colourful with the plots, ~4% and ~0.2% when the images fail to show.
    non_white = float((rgb.min(axis=2) < 0.95).mean())
    colourful = float(((rgb.max(axis=2) - rgb.min(axis=2)) > 0.25).mean())
    assert non_white > 0.06, f"only {non_white:.1%} of the page is drawn"
    assert colourful > 0.006, f"only {colourful:.2%} of the page is in colour: did the plots render?"
