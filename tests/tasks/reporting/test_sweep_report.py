"""The sweep report (sweepflow.tasks.reporting.sweep_report): one self-contained, interactive HTML page. Its
structure, the data it embeds for its script (curves, every varying hyperparameter on an axis, log axes, trial
colours, importances), the leaderboard's order and wording, a legend that names each trial once, edge cases, and
the page as a headless Chromium renders it (SVG plots drawn, a highlight and a brushed range applied from the
URL fragment, as hovering and dragging would)."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import replace
from html.parser import HTMLParser
from typing import Any

import numpy as np
import pytest
from matplotlib.image import imread

from sweepflow.tasks.reporting.importance import MAX_TRIALS, MIN_TRIALS, param_importances
from sweepflow.tasks.reporting.report_data import (
    DRAWN_BEST,
    MAX_DRAWN_TRIALS,
    curve_band,
    drawn_trials,
    pareto_data,
    trial_curve,
)
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


def _data(text: str) -> dict[str, Any]:
    """The JSON the page embeds for its script."""
    found = re.search(r'<script type="application/json" id="sweep-data">(.*?)</script>', text, re.S)
    assert found, "no embedded data"
    return json.loads(found.group(1))


def _legend(text: str) -> list[str]:
    """The trial ids of the learning curves' legend, in its order (each entry once per trial)."""
    found = re.search(r'<ul class="legend"[^>]*>(.*?)</ul>', text, re.S)
    return re.findall(r'<li data-trial="([^"]+)"', found.group(1)) if found else []


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("report")
    return write_sweep_report(
        _sweep(), out_dir=str(out), search_space=SPACE, title="CIFAR-10 sweep", links=LINKS
    )


@pytest.fixture(scope="module")
def page(report: dict[str, str]) -> tuple[str, _Page, dict[str, Any]]:
    text, parsed = _parse(report["html"])
    return text, parsed, _data(text)


# --------------------------------------------------------------------------------------------------
# One file, self-contained
# --------------------------------------------------------------------------------------------------


def test_writes_one_page(report: dict[str, str]) -> None:
    assert set(report) == {"html"}  # no PNGs: the page draws its plots (pbt.png only for PBT sweeps)
    assert os.path.basename(report["html"]) == HTML_NAME
    assert os.path.getsize(report["html"]) > 10_000
    assert os.listdir(os.path.dirname(report["html"])) == [HTML_NAME]  # nothing half-written left behind


def test_page_fetches_nothing_and_its_links_open_in_a_new_tab(page) -> None:
    text, parsed, _ = page
    scripts = [attrs for tag, attrs in parsed.tags if tag == "script"]
    assert scripts == [{"type": "application/json", "id": "sweep-data"}, {}]  # the data and the inline code
    assert not [tag for tag, attrs in parsed.tags if "src" in attrs or tag in ("link", "iframe", "img")]
    assert "@import" not in text and "url(" not in text  # no CSS that loads fonts or images
    for api in ("fetch(", "XMLHttpRequest", "import(", "WebSocket", "sendBeacon", "innerHTML", "eval("):
        assert api not in text, api
    allowed = {url for name, url in LINKS.items() if name != "run_url_template"}
    allowed |= {RUN_URL.replace("{run_id}", t.run_id) for t in _sweep().trials}
    anchors = [attrs for tag, attrs in parsed.tags if tag == "a"]
    assert anchors and {a["href"] for a in anchors} <= allowed
    # A sandboxed frame (MLflow's artifact viewer) blanks itself when a link navigates it: every link opens a tab.
    assert all(a["target"] == "_blank" and a["rel"] == "noopener noreferrer" for a in anchors)
    assert not re.search(
        r"""\b(?:src|href)\s*=\s*["']?https?://""", text.replace('href="http://127.0.0.1', "")
    )


def test_header_shows_the_best_trial_and_the_links(page) -> None:
    text, _, _ = page
    assert "<h1>CIFAR-10 sweep</h1>" in text
    best = re.search(r'<section class="best"[^>]*>(.*?)</section>', text, re.S)
    assert best, "no best-trial box"
    box = best.group(1)
    assert "<b>t05</b>" in box and "1.199" in box and "at epoch 4 of 4" in box
    assert "lr" in box and "0.009877" in box  # its sampled config, rounded
    assert f'href="{RUN_URL.replace("{run_id}", "05" + "ab" * 15)}"' in box
    for name, url in LINKS.items():
        if name != "run_url_template":
            assert f'<a href="{url}" target="_blank" rel="noopener noreferrer">{name}</a>' in text
    assert "l2=8" in text  # the fixed parameter, said once


def test_the_page_says_where_it_opens_when_framed(tmp_path) -> None:
    """In MLflow's artifact viewer (a sandboxed frame) the script shows a notice naming the page's own address."""
    url = "http://127.0.0.1:5000/sweepflow/report?run_id=abc&path=report%2Fsweep_report.html"
    files = write_sweep_report(_sweep(), out_dir=str(tmp_path), search_space=SPACE, title="t", page_url=url)
    text, _ = _parse(files["html"])
    notice = re.search(r'<p class="notice" id="framed" hidden>(.*?)</p>', text, re.S)
    assert notice and "cannot open" in notice.group(1) and url.replace("&", "&amp;") in notice.group(1)


# --------------------------------------------------------------------------------------------------
# The data the plots are drawn from
# --------------------------------------------------------------------------------------------------


def test_every_trial_is_embedded_with_its_curve(page) -> None:
    _, _, data = page
    assert (data["metric"], data["mode"], data["better"], data["best"]) == ("val_loss", "min", "lower", "t05")
    trials = {t["id"]: t for t in data["trials"]}
    assert list(trials) == ["t00", "t01", "t02", "t03", "t04", "t05"]
    assert trials["t00"]["curve"] == [[1, 2.1], [2, 1.6], [3, 1.31234567], [4, 1.2]]
    assert trials["t01"]["curve"] == [[1, 2.3], [2, 1.9], [4, 1.45]]  # its NaN report skipped
    assert trials["t04"]["curve"] == [] and trials["t04"]["error"] == OOM.splitlines()[0]
    assert trials["t05"]["bestPoint"] == [4, 1.1987654]
    assert [trials[i]["status"] for i in ("t00", "t02", "t04")] == ["completed", "stopped", "failed"]
    assert trials["t02"]["config"] == {
        "l1": "4",
        "lr": "0.09123",
        "batch_size": "32",
    }  # as the table prints them
    colors = [t["color"] for t in data["trials"]]
    assert (
        len(set(colors)) == len(colors) and data["colorBy"] == "trial"
    )  # one colour per trial, in every plot
    assert data["curvesLog"] is False


def test_parallel_coordinates_have_an_axis_per_hyperparameter_and_log_axes(page) -> None:
    _, _, data = page
    axes = {a["name"]: a for a in data["axes"]}
    assert list(axes) == ["l1", "lr", "batch_size", "best val_loss"]  # the space's order, the value last
    assert [a["scale"] for a in data["axes"]] == ["log", "log", "categorical", "linear"]
    # Positions are the ParamAxis ones: lr by ratio over the searched range 1e-4..1e-1.
    lr = axes["lr"]["pos"]
    assert lr["t01"] == pytest.approx(math.log10(0.000123456789 / 1e-4) / 3, abs=1e-6)
    assert [label for _, label in axes["lr"]["ticks"]] == ["0.0001", "0.001", "0.01", "0.1"]
    assert axes["batch_size"]["pos"] == {"t00": 0, "t01": 1, "t02": 0, "t03": 1, "t04": 0, "t05": 1}
    metric = axes["best val_loss"]["pos"]
    assert metric["t04"] is None  # failed before any report: no line
    assert metric["t05"] == 0 and metric["t02"] == 1  # 1.199 is the bottom, 2.6 the top


def test_every_varying_hyperparameter_gets_an_axis(tmp_path) -> None:
    """Not only the first few: five sampled parameters, and a config value outside the space that differs."""
    space = {
        **SPACE,
        "momentum": {"type": "uniform", "low": 0.8, "high": 0.99},
        "dropout": {"type": "choice", "values": [0.0, 0.25, 0.5]},
        "warmup": {"type": "randint", "low": 0, "high": 5},
    }
    trials = tuple(
        _trial(
            i,
            [2.0 - 0.1 * i, 1.5 - 0.1 * i],
            TrialStatus.COMPLETED,
            {
                "l1": 4 * 2 ** (i % 3),
                "lr": 10.0 ** -(i + 1),
                "batch_size": 32,
                "momentum": 0.8 + 0.03 * i,
                "dropout": 0.25 * (i % 3),
                "warmup": i % 5,
                "optimizer": ["sgd", "adam"][i % 2],
            },
        )
        for i in range(4)
    )
    files = write_sweep_report(
        SweepResult(trials=trials, metric="val_loss", mode="min"),
        out_dir=str(tmp_path),
        search_space=space,
        title="many",
    )
    text, _ = _parse(files["html"])
    data = _data(text)
    names = [a["name"] for a in data["axes"]]
    assert names == ["l1", "lr", "batch_size", "momentum", "dropout", "warmup", "optimizer", "best val_loss"]
    scales = {a["name"]: a["scale"] for a in data["axes"]}
    assert scales["momentum"] == "linear" and scales["optimizer"] == "categorical" and scales["lr"] == "log"
    assert "Log axes for log-sampled parameters (l1, lr)" in text


def test_the_table_the_axes_and_the_importances_agree_on_what_varied(tmp_path) -> None:
    """One answer (tracking.params.varying_params): a config value outside the space that some trials lack
    varied (a table column and an axis; no importance, which needs every trial's value), a constant did not
    (neither), a nested value that differs is a table column but has no axis."""
    trials = tuple(
        _trial(
            i,
            [2.0 - 0.1 * i, 1.5 - 0.13 * i * i],
            TrialStatus.COMPLETED,
            {"l1": 4 * 2 ** (i % 3), "lr": 10.0 ** -(i + 1), "batch_size": 32, "seed": 7,
             "opt": {"name": "sgd"}, "sched": {"gamma": 0.1 * i}, **({"warm": 1} if i < 2 else {})},
        )
        for i in range(5)
    )
    files = write_sweep_report(SweepResult(trials=trials, metric="val_loss", mode="min"), out_dir=str(tmp_path),
                               search_space=SPACE, title="agree")
    text, parsed = _parse(files["html"])
    data = _data(text)
    assert [a["name"] for a in data["axes"]] == ["l1", "lr", "batch_size", "warm", "best val_loss"]
    config_columns = [h for h in parsed.header if h in ("l1", "lr", "batch_size", "seed", "opt", "sched", "warm", "l2")]
    assert config_columns == ["l1", "lr", "batch_size", "sched", "warm"]
    assert set(data["importance"]["values"]) == {"l1", "lr"}


def test_best_so_far_follows_the_order_trials_ended(page) -> None:
    _, _, data = page
    b = data["bestSoFar"]
    # ended: t02 (2.6), t00 (1.2), t01 (1.45), t04 (failed), t03 (1.8), t05 (1.199)
    assert b["order"] == ["t02", "t00", "t01", "t04", "t03", "t05"]
    assert b["running"] == [2.6, 1.2, 1.2, 1.2, 1.2, pytest.approx(1.1987654)]


def test_importances_are_computed_for_the_finished_trials(page) -> None:
    text, _, data = page
    values = data["importance"]["values"]
    assert set(values) == {"l1", "lr", "batch_size"}
    assert sum(values.values()) == pytest.approx(1.0) and all(v >= 0 for v in values.values())
    assert list(values.values()) == sorted(values.values(), reverse=True)  # largest first
    assert (
        "5 finished trials" in data["importance"]["note"]
    )  # completed and stopped early; not the failed one
    bars = re.findall(r'<li data-param="([^"]+)">', text)
    assert bars == list(values)


def test_importances_need_a_few_finished_trials(tmp_path) -> None:
    trials = (
        _trial(0, [1.0, 0.8], TrialStatus.COMPLETED, {"l1": 8, "lr": 1e-3, "batch_size": 32}),
        _trial(1, [1.2], TrialStatus.STOPPED, {"l1": 4, "lr": 1e-2, "batch_size": 64}),
        _trial(2, [], TrialStatus.FAILED, {"l1": 16, "lr": 1e-4, "batch_size": 32}, error="boom"),
    )
    files = write_sweep_report(
        SweepResult(trials=trials, metric="val_loss", mode="min"),
        out_dir=str(tmp_path),
        search_space=SPACE,
        title="few",
    )
    text, _ = _parse(files["html"])
    assert _data(text)["importance"]["values"] == {}
    assert (
        f"Not computed: 2 finished trials with a value; hyperparameter importances need at least {MIN_TRIALS}."
        in text
    )


def test_importances_of_a_large_sweep_come_from_a_seeded_sample_and_still_find_what_matters() -> None:
    """Past MAX_TRIALS finished trials fANOVA fits a seeded random sample (its cost grows faster than the
    trials): the same numbers every time, the note says so, and the parameter that drives the value leads."""
    rng = np.random.default_rng(1)
    n = MAX_TRIALS * 3
    configs = [{"lr": float(10 ** rng.uniform(-4, -1)), "l1": int(rng.choice([4, 8, 16]))} for _ in range(n)]
    bests = [math.log10(c["lr"]) + 0.01 * c["l1"] + float(rng.normal(0, 0.05)) for c in configs]

    def importances():
        return param_importances(configs, bests, ["lr", "l1"], log_params=frozenset({"lr"}), mode="min")

    first = importances()
    assert first == importances()
    assert list(first.values) == ["lr", "l1"] and first.values["lr"] > 0.9, first.values
    assert f"a random sample of {MAX_TRIALS} of the {n} finished trials" in first.note


def test_the_legend_names_each_trial_once_best_first(page) -> None:
    text, _, data = page
    # Best first, as the table; t04 has no curve, so no line to name.
    assert _legend(text) == ["t05", "t00", "t01", "t03", "t02"]
    assert text.count("★ best") == 1 and re.search(r'<li data-trial="t05" class="is-best">', text)


# --------------------------------------------------------------------------------------------------
# The leaderboard
# --------------------------------------------------------------------------------------------------


def test_leaderboard_is_best_first_and_says_by_what(page) -> None:
    _, parsed, _ = page
    assert "Trials, best first by best val_loss (lower is better)" in parsed.headings
    assert parsed.header[:5] == ["trial", "status", "best_val_loss", "best_epoch", "epochs"]
    assert parsed.header[5:8] == [
        "l1",
        "lr",
        "batch_size",
    ]  # the sampled hyperparameters, in the space's order
    assert "l2" not in parsed.header  # fixed: said in the header, not repeated on every row
    assert parsed.header[-1] == "MLflow run"
    # best values: t05 1.199, t00 1.2, t01 1.45, t03 1.8, t02 2.6; the failed trial without one last
    assert _column(parsed, "trial") == ["t05", "t00", "t01", "t03", "t02", "t04"]
    assert _column(parsed, "best_val_loss") == ["1.199", "1.2", "1.45", "1.8", "2.6", "—"]
    rows = [attrs.get("data-trial") for tag, attrs in parsed.tags if tag == "tr" and "data-trial" in attrs]
    assert rows == _column(parsed, "trial")  # each row says its trial: the plots' hover highlights it


def test_floats_are_rounded_to_four_significant_digits(page) -> None:
    text, parsed, _ = page
    assert _column(parsed, "lr") == ["0.009877", "0.01235", "0.0001235", "0.003457", "0.09123", "0.04568"]
    table = text[
        text.index("<table>") : text.index("</table>")
    ]  # the data for the plots keeps full precision
    assert "0.0123456789" not in table and "1.31234567" not in table and "1.1987654" not in table
    numbers = [
        cell for row in parsed.body_rows for cell in row[2:-1] if re.fullmatch(r"-?[\d.]+(e[-+]\d+)?", cell)
    ]
    assert numbers and all(len(re.sub(r"e.*|[-.]|^0+", "", n).lstrip("0")) <= 4 for n in numbers)


def test_statuses_are_worded_and_failures_explained(page) -> None:
    _, parsed, _ = page
    statuses = dict(zip(_column(parsed, "trial"), _column(parsed, "status"), strict=True))
    assert statuses == {
        "t05": "completed",
        "t00": "completed",
        "t01": "completed",
        "t03": "stopped early",
        "t02": "stopped early",
        "t04": "failed",
    }
    failed_row = _column(parsed, "trial").index("t04")
    status_cell = parsed.cell_attrs[1:][failed_row][parsed.header.index("status")]
    assert status_cell["span.title"] == OOM.splitlines()[0]


def test_run_ids_link_to_mlflow_only_with_a_template(page, tmp_path) -> None:
    _, parsed, _ = page
    runs = parsed.header.index("MLflow run")
    trials = {t.trial_id: t for t in _sweep().trials}
    for trial_id, attrs in zip(_column(parsed, "trial"), parsed.cell_attrs[1:], strict=True):
        assert attrs[runs]["a.href"] == RUN_URL.replace("{run_id}", trials[trial_id].run_id)

    plain = write_sweep_report(_sweep(), out_dir=str(tmp_path), search_space=SPACE, title="no links")
    text, parsed = _parse(plain["html"])
    assert "<a " not in text
    assert _column(parsed, "MLflow run")[0] == trials["t05"].run_id[:8]


def test_everything_is_escaped(tmp_path) -> None:
    evil = "<img src=x onerror=alert(1)>"
    breakout = "</script><script>alert(1)</script>"
    trial = _trial(
        0, [1.0, 0.5], TrialStatus.FAILED, {"l1": 8, "lr": 1e-3, "batch_size": evil}, error=f'"{evil}'
    )
    trial2 = replace(
        _trial(1, [1.0], TrialStatus.COMPLETED, {"l1": 8, "lr": 1e-2, "batch_size": 32}), name=breakout
    )
    result = SweepResult(trials=(trial, trial2), metric="val_loss", mode="min")
    files = write_sweep_report(
        result,
        out_dir=str(tmp_path),
        search_space=SPACE,
        title=f"</title>{evil}",
        links={'"><script>': "javascript:alert(1)", "run_url_template": RUN_URL},
    )
    text, parsed = _parse(files["html"])
    assert evil not in text and breakout not in text and "javascript:" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert [tag for tag, _ in parsed.tags if tag in ("script", "img")] == [
        "script",
        "script",
    ]  # only the page's
    assert (
        _data(text)["trials"][0]["config"]["batch_size"] == evil
    )  # intact as data, drawn as text by the script


# --------------------------------------------------------------------------------------------------
# Axes (pure)
# --------------------------------------------------------------------------------------------------


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


def _many(n: int) -> SweepResult:
    rng = np.random.default_rng(0)
    trials = []
    for i in range(n):
        lr = float(10 ** rng.uniform(-4, -1))
        status = [TrialStatus.COMPLETED, TrialStatus.STOPPED, TrialStatus.FAILED][i % 3]
        losses = list(
            2.0 / np.arange(1, (5 if status is TrialStatus.COMPLETED else 2)) + abs(math.log10(lr) + 2)
        )
        trials.append(
            _trial(i, losses, status, {"l1": int(rng.choice([4, 8, 16])), "lr": lr, "batch_size": 32})
        )
    return SweepResult(trials=tuple(trials), metric="val_loss", mode="min")


def test_200_trials_are_coloured_by_value_with_every_row(tmp_path) -> None:
    """How long the report takes as trials grow is measured by benchmarks/bench_report.py, not asserted here."""
    files = write_sweep_report(
        _many(200), out_dir=str(tmp_path / "big"), search_space=SPACE, title="200 trials"
    )
    text, parsed = _parse(files["html"])
    assert len(parsed.body_rows) == 200
    data = _data(text)
    assert len(data["trials"]) == 200 and data["colorBy"] == "best"
    assert (
        _legend(text) == [] and 'class="scale-bar"' in text
    )  # 200 names help nobody: the colour scale instead
    best = data["best"]
    dark = next(t["color"] for t in data["trials"] if t["id"] == best)
    assert dark == "#440154"  # viridis' darkest: the best trial


def test_up_to_300_trials_every_trial_is_drawn() -> None:
    assert drawn_trials(_many(MAX_DRAWN_TRIALS)) is None


def test_a_large_sweep_draws_its_best_and_an_even_spread_of_the_rest() -> None:
    result = _many(1000)
    drawn = drawn_trials(result)
    ranked = sorted((t for t in result.trials if t.best is not None), key=lambda t: (t.best, t.index))
    assert drawn is not None and len(drawn) == MAX_DRAWN_TRIALS
    assert {t.trial_id for t in ranked[:DRAWN_BEST]} <= drawn  # the best 100
    assert ranked[-1].trial_id in drawn and result.best().trial_id in drawn  # the worst too, and the best
    ranks = sorted(i for i, t in enumerate(ranked) if t.trial_id in drawn)[DRAWN_BEST:]
    gaps = np.diff(ranks)
    assert gaps.min() >= 2 and gaps.max() - gaps.min() <= 1  # evenly spaced through the other ranks
    # mode max ranks the other way round: the highest bests are drawn
    flipped = SweepResult(
        trials=tuple(replace(t, best=-t.best if t.best is not None else None) for t in result.trials),
        metric="val_loss",
        mode="max",
    )
    assert drawn_trials(flipped) == drawn


def test_the_band_is_every_trials_percentiles_per_iteration() -> None:
    trials = [
        _trial(i, [float(i), float(i) / 2], TrialStatus.COMPLETED, {"l1": 4, "lr": 0.01, "batch_size": 32})
        for i in range(1, 12)
    ] + [_trial(12, [5.0], TrialStatus.STOPPED, {"l1": 4, "lr": 0.01, "batch_size": 32})]
    band = curve_band([trial_curve(t, "val_loss") for t in trials])
    first = np.array([*range(1, 12), 5.0])
    second = np.arange(1, 12) / 2
    assert band == [
        [1.0, *np.percentile(first, [10, 50, 90]).tolist(), 12],
        [2.0, *np.percentile(second, [10, 50, 90]).tolist(), 11],
    ]


def test_a_large_sweeps_page_carries_only_the_drawn_curves_and_shows_300_rows_first(tmp_path) -> None:
    files = write_sweep_report(_many(1000), out_dir=str(tmp_path / "big"), search_space=SPACE, title="1000")
    text, parsed = _parse(files["html"])
    data = _data(text)
    drawn = {t["id"] for t in data["trials"] if t["drawn"]}
    assert len(data["trials"]) == 1000 and data["drawnCount"] == len(drawn) == MAX_DRAWN_TRIALS
    assert all(bool(t["curve"]) <= t["drawn"] for t in data["trials"])  # no curve of an undrawn trial
    assert all(len(a["pos"]) == 1000 for a in data["axes"])  # a brushed range still counts every trial
    assert [b[0] for b in data["curveBand"]] == [1.0, 2.0, 3.0, 4.0] and [b[4] for b in data["curveBand"]] == [1000, 334, 334, 334]
    assert "300 of the 1,000 trials are drawn: the 100 best" in text
    assert "300 of 1,000 trials drawn: hover a line" in text
    # Every trial has its row; the first 300, best first, are shown, the other 700 behind a button.
    rows = [row[0] for row in parsed.body_rows]
    assert len(rows) == 1000 + 1 and rows[-1] == "show the other 700 trials"
    shown, hidden = text.split('<tbody id="more-rows" hidden>')
    assert shown.count("<tr data-trial=") + shown.count('<tr class="best-row"') == 300
    assert hidden.count("<tr data-trial=") == 700


@pytest.mark.browser
def test_a_large_sweeps_page_draws_a_sample_and_opens_a_hidden_row_it_links_to(browser, tmp_path) -> None:
    """A link to a trial in the rows behind the button shows them; a brushed range counts every trial."""
    files = write_sweep_report(_many(1000), out_dir=str(tmp_path / "big"), search_space=SPACE, title="1000")
    text = open(files["html"], encoding="utf-8").read()
    data = _data(text)
    hidden_id = re.search(r'<tbody id="more-rows" hidden>\s*<tr data-trial="([^"]+)"', text).group(1)
    lr = next(a for a in data["axes"] if a["name"] == "lr")["pos"]
    inside = sum(1 for p in lr.values() if p is not None and 0.5 <= p <= 1)
    url = f"file://{os.path.abspath(files['html'])}#highlight={hidden_id}&brush=lr:0.5-1"
    dom = browser.page_showing(url, "data-rendered-ms=", timeout_s=60)
    plots = _plots(dom)
    with_curve = sum(1 for t in data["trials"] if t["curve"])
    assert plots["plot-curves"].count('<g class="trial') == with_curve <= MAX_DRAWN_TRIALS
    assert plots["plot-curves"].count('class="band"') == 1 and 'class="band-median"' in plots["plot-curves"]
    assert f'data-selected="{inside}"' in dom and inside > MAX_DRAWN_TRIALS // 2  # over all 1,000 trials
    assert '<tbody id="more-rows">' in dom and re.search(rf'<tr data-trial="{hidden_id}" class="[^"]*\bhl\b', dom)


# --------------------------------------------------------------------------------------------------
# Edge cases
# --------------------------------------------------------------------------------------------------


def test_a_sweep_without_trials_says_so(tmp_path) -> None:
    result = SweepResult(trials=(), metric="val_loss", mode="min", not_started=3)
    files = write_sweep_report(result, out_dir=str(tmp_path), search_space=SPACE, title="empty")
    assert set(files) == {"html"}
    text, _ = _parse(files["html"])
    assert "No trial ran" in text and "3 were not started (time budget)" in text
    assert "<script" not in text  # nothing to draw


def test_all_failed(tmp_path) -> None:
    trials = (
        _trial(0, [], TrialStatus.FAILED, {"l1": 8, "lr": 1e-3, "batch_size": 32}, error="ValueError: bad"),
        _trial(1, [2.0, math.nan], TrialStatus.FAILED, {"l1": 4, "lr": 1e-2, "batch_size": 64}, error="OOM"),
    )
    result = SweepResult(trials=trials, metric="val_loss", mode="min")
    files = write_sweep_report(result, out_dir=str(tmp_path), search_space=SPACE, title="all failed")
    text, parsed = _parse(files["html"])
    assert "there is no best trial" in text
    assert _column(parsed, "status") == ["failed", "failed"]
    data = _data(text)
    assert data["best"] is None and data["trials"][1]["curve"] == [[1, 2.0]]  # the report before the failure
    assert 'id="plot-curves"' in text and "Not computed: 0 finished trials" in text


def test_all_failed_before_any_report(tmp_path) -> None:
    trials = (_trial(0, [], TrialStatus.FAILED, {"l1": 8, "lr": 1e-3, "batch_size": 32}, error="boom"),)
    result = SweepResult(trials=trials, metric="val_loss", mode="min")
    files = write_sweep_report(result, out_dir=str(tmp_path), search_space=SPACE, title="nothing reported")
    assert set(files) == {"html"}
    text, parsed = _parse(files["html"])
    assert "No trial reported a finite val_loss" in text and 'id="plot-curves"' not in text
    assert _column(parsed, "trial") == ["t00"]


def test_a_single_trial_with_a_single_hyperparameter(tmp_path) -> None:
    space = {"lr": SPACE["lr"], "l2": 8}
    trial = _trial(0, [1.0, 0.8], TrialStatus.COMPLETED, {"lr": 1e-3})
    result = SweepResult(trials=(trial,), metric="val_loss", mode="min")
    files = write_sweep_report(result, out_dir=str(tmp_path), search_space=space, title="one")
    text, _ = _parse(files["html"])
    data = _data(text)
    assert [a["name"] for a in data["axes"]] == ["lr", "best val_loss"]
    assert all(f'id="{plot}"' in text for plot in ("plot-curves", "plot-parallel", "plot-best-so-far"))


def test_nan_reports_are_skipped(tmp_path) -> None:
    trial = _trial(0, [math.nan, 1.0, math.inf, 0.7, math.nan], TrialStatus.COMPLETED, {"l1": 8, "lr": 1e-3})
    other = _trial(1, [math.nan], TrialStatus.STOPPED, {"l1": 4, "lr": 1e-2})
    result = SweepResult(trials=(trial, other), metric="val_loss", mode="min")
    files = write_sweep_report(result, out_dir=str(tmp_path), search_space=SPACE, title="nan")
    text, parsed = _parse(files["html"])
    assert _column(parsed, "best_val_loss") == ["0.7", "—"]
    assert "nan" not in " ".join(_column(parsed, "best_val_loss")).lower()
    assert [t["curve"] for t in _data(text)["trials"]] == [[[2, 1.0], [4, 0.7]], []]
    assert "NaN" not in text and "Infinity" not in text  # the embedded JSON is strict


def test_mode_max_sorts_higher_first(tmp_path) -> None:
    files = write_sweep_report(
        _sweep("max"), out_dir=str(tmp_path), search_space=SPACE, title="max", links=LINKS
    )
    text, parsed = _parse(files["html"])
    assert "Trials, best first by best val_loss (higher is better)" in parsed.headings
    assert _column(parsed, "trial") == ["t05", "t00", "t01", "t03", "t02", "t04"]
    best = [float(v) for v in _column(parsed, "best_val_loss")[:-1]]
    assert best == sorted(best, reverse=True)
    assert "<b>t05</b>" in re.search(r'<section class="best"[^>]*>(.*?)</section>', text, re.S).group(1)
    data = _data(text)
    assert data["better"] == "higher" and data["trials"][5]["bestPoint"] == [4, pytest.approx(1 / 1.1987654)]


def test_search_space_without_sampled_parameters(tmp_path) -> None:
    trial = _trial(0, [1.0, 0.9], TrialStatus.COMPLETED, {"l1": 8})
    result = SweepResult(trials=(trial,), metric="val_loss", mode="min")
    files = write_sweep_report(result, out_dir=str(tmp_path), search_space={"l1": 8}, title="fixed only")
    text, _ = _parse(files["html"])
    assert "no hyperparameter was sampled" in text and 'id="plot-curves"' in text
    assert _data(text)["axes"] == []


def test_population_based_training_keeps_its_lineage_plot(tmp_path) -> None:
    c = TrialStatus.COMPLETED
    trials = [
        _trial(
            i,
            [2.0 - 0.1 * i - 0.2 * e for e in range(6)],
            c,
            {"l1": 8, "lr": 10.0 ** -(i + 1), "batch_size": 32},
        )
        for i in range(4)
    ]
    start = {"iteration": 0, "config": dict(trials[0].config)}
    exploit = {"iteration": 2, "config": {**trials[1].config, "lr": 0.02}, "donor": "t01"}
    trials[0] = replace(trials[0], config_history=(start, exploit))
    files = write_sweep_report(
        SweepResult(trials=tuple(trials), metric="val_loss", mode="min"),
        out_dir=str(tmp_path),
        search_space=SPACE,
        title="pbt",
    )
    assert set(files) == {"html", "pbt"}
    rgb = imread(files["pbt"])[..., :3]
    assert rgb.shape[0] > 200 and float((rgb.min(axis=2) < 0.95).mean()) > 0.01  # drawn, not blank
    text, _ = _parse(files["html"])
    assert '<section class="card" id="pbt">' in text and 'src="data:image/png;base64,' in text


# --------------------------------------------------------------------------------------------------
# In a browser
# --------------------------------------------------------------------------------------------------


def _assert_not_blank(path: str) -> np.ndarray:
    rgb = imread(path)[..., :3]
    assert float(rgb.var()) > 0, f"{path} is a single colour"
    return rgb


def _plots(dom: str) -> dict[str, str]:
    """Each plot container's rendered markup, by id."""
    out = {}
    for plot in ("plot-curves", "plot-parallel", "plot-best-so-far"):
        found = re.search(rf'<div class="plot" id="{plot}">(.*?)</div>', dom, re.S)
        out[plot] = found.group(1) if found else ""
    return out


@pytest.mark.browser
def test_the_script_draws_the_plots_and_highlights_a_trial(report: dict[str, str], browser) -> None:
    """``#highlight=t03`` applies what hovering t03 does: its marks in every plot, its legend entry and its table
    row get the class "hl" (the others fade)."""
    url = f"file://{os.path.abspath(report['html'])}#highlight=t03"
    dom = browser.rendered_dom(url, wait_ms=3000)
    assert 'data-rendered="true"' in dom and 'data-highlight="t03"' in dom
    plots = _plots(dom)
    for plot, markup in plots.items():
        assert markup.startswith("<svg"), f"{plot} was not drawn"
        assert re.search(r'<g class="trial hl" data-trial="t03"', markup), f"t03 not highlighted in {plot}"
        assert not re.search(r'<g class="trial[^"]*\bhl\b[^"]*" data-trial="(?!t03)', markup)
    curves = plots["plot-curves"]
    assert curves.count('<g class="trial') == 5  # t04 failed before any report: no line
    assert re.search(r'<g class="trial best-trial" data-trial="t05"', curves)  # the best: drawn once
    assert curves.count("best-star") == 1
    # Early stops: an end mark each, named (t02 after 1 report, t03 after 2).
    assert re.findall(r'data-stop-label="([^"]+)"', curves) == ["t02", "t03"]
    assert curves.count("stop-mark") == 2
    assert plots["plot-parallel"].count('<g class="trial') == 5 and "log scale" in plots["plot-parallel"]
    assert re.search(r'<li data-trial="t03" class="hl">', dom)
    assert re.search(r'<tr data-trial="t03" class="hl">', dom)


@pytest.mark.browser
def test_a_brushed_range_filters_every_plot_and_the_table(report: dict[str, str], page, browser) -> None:
    """``#brush=lr:0.5-1`` is what dragging along the lr axis over its upper half does."""
    _, _, data = page
    lr = next(a for a in data["axes"] if a["name"] == "lr")["pos"]
    inside = {t for t, p in lr.items() if p is not None and 0.5 <= p <= 1}
    assert inside and len(inside) < 6
    dom = browser.rendered_dom(f"file://{os.path.abspath(report['html'])}#brush=lr:0.5-1", wait_ms=3000)
    assert f'data-selected="{len(inside)}"' in dom
    out_rows = set(re.findall(r'<tr[^>]*data-trial="([^"]+)" class="out"', dom))
    assert out_rows == {t.trial_id for t in _sweep().trials} - inside
    brushes = re.findall(r'<rect [^>]*class="brush"[^>]*>', dom)
    shown = [b for b in brushes if "display: none" not in b]
    assert len(brushes) == len(data["axes"]) and len(shown) == 1 and 'height="' in shown[0]  # lr's range


def _pixels_near(rgb: np.ndarray, color: str, tolerance: float = 0.1) -> int:
    target = np.array([int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(rgb - target).max(axis=2) < tolerance).sum())


@pytest.mark.browser
def test_report_looks_right_at_1600x1000(report: dict[str, str], page, browser, tmp_path) -> None:
    """The first screen at 1600x1000 (highlighting the best trial, as a hover would): the header, the best trial
    and the learning curves, the best trial's curve drawn thick and starred."""
    _, _, data = page
    shot = browser.screenshot(
        f"file://{os.path.abspath(report['html'])}#highlight=t05",
        str(tmp_path / "sweep_report.png"),
        size=(1600, 1000),
        wait_ms=3000,
    )
    rgb = _assert_not_blank(shot)
    assert rgb.shape[:2] == (1000, 1600)
    # Measured: ~9,000 pixels of t05's colour (its curve and parallel-coordinates line, 4-5 px wide) and ~60 of
    # the star's gold; without the script only its legend swatch and table cell: ~150 and ~20.
    best_color = next(t["color"] for t in data["trials"] if t["id"] == "t05")
    assert _pixels_near(rgb, best_color) > 2000, "the best trial's curve is not drawn"
    assert _pixels_near(rgb, "#f5c518") > 35, "no star at the best trial's best value"


@pytest.mark.browser
def test_the_trials_table_fits_its_box_with_a_pipelines_columns(browser, tmp_path) -> None:
    """Seventeen columns, as a pipeline run's table has (six hyperparameters, its last train_loss, val_loss and
    val_accuracy, timings): at 1280 px the table fits its card, its headers wrapped after their underscores,
    instead of hiding its last columns behind a scroll."""
    sweep = _sweep()
    last = {"train_loss": 0.123456, "val_loss": 0.234567, "val_accuracy": 0.912345, "time_this_iter_s": 1.2345,
            "time_total_s": 12.345}  # fmt: skip
    trials = [
        replace(t, last={**t.last, **last}, config={**t.config, "weight_decay": 1e-4 * t.index, "momentum": 0.9 - 0.01 * t.index})
        for t in sweep.trials
    ]
    space = {**SPACE, "weight_decay": {"type": "loguniform", "low": 1e-5, "high": 1e-2},
             "momentum": {"type": "uniform", "low": 0.5, "high": 0.99}}  # fmt: skip
    out = write_sweep_report(replace(sweep, trials=trials), out_dir=str(tmp_path), search_space=space, title="w", links=LINKS)
    measure = (
        "(() => { const w = document.querySelector('.table-wrap');"
        " if (w) document.body.dataset.table = w.scrollWidth + '/' + w.clientWidth; })()"
    )
    dom = browser.page_showing(f"file://{os.path.abspath(out['html'])}", "data-table=", size=(1280, 900), script=measure)
    needed, box = map(int, re.search(r'data-table="(\d+)/(\d+)"', dom).groups())
    assert needed <= box, f"the table needs {needed} px in a box of {box}"
    assert "last val_<wbr>accuracy" in dom and len(re.findall(r"<th[ >]", dom)) == 17


# --------------------------------------------------------------------------------------------------
# A multi-objective sweep: its Pareto front
# --------------------------------------------------------------------------------------------------

OBJECTIVES = (("loss", "min"), ("gain", "max"))


def _objective_sweep() -> SweepResult:
    """Six trials told (loss, gain): t01, t05 and t03 are the front (by loss); t00 and t02 are beaten by t01; t04
    failed (no point, though its last report would beat every other)."""
    values = [(0.5, 0.2), (0.3, 0.4), (0.6, 0.3), (0.8, 0.9), (0.1, 1.0), (0.4, 0.6)]
    trials = []
    for i, (loss, gain) in enumerate(values):
        t = _trial(i, [1.0, loss], TrialStatus.FAILED if i == 4 else TrialStatus.COMPLETED,
                   {"l1": 4 * (1 + i % 2), "lr": 10 ** -(1 + i / 2), "batch_size": 32}, metric="loss")
        trials.append(replace(t, last={**t.last, "gain": gain}))
    return SweepResult(trials=tuple(trials), metric="loss", mode="min")


def test_the_pareto_fronts_data_is_every_finished_trial_with_the_front_and_its_step_line() -> None:
    data = pareto_data(_objective_sweep().trials, OBJECTIVES)
    assert data["x"] == {"metric": "loss", "mode": "min", "better": "lower"}
    assert data["y"] == {"metric": "gain", "mode": "max", "better": "higher"}
    assert [(p["id"], p["x"], p["y"], p["front"]) for p in data["points"]] == [
        ("t00", 0.5, 0.2, False), ("t01", 0.3, 0.4, True), ("t02", 0.6, 0.3, False), ("t03", 0.8, 0.9, True),
        ("t05", 0.4, 0.6, True),
    ]  # t04 failed: no point
    assert data["front"] == ["t01", "t05", "t03"]  # by loss
    # From each front trial to the next through the corner both dominate (worse loss, worse gain).
    assert data["step"] == [[0.3, 0.4], [0.4, 0.4], [0.4, 0.6], [0.8, 0.6], [0.8, 0.9]]
    assert pareto_data(_objective_sweep().trials, OBJECTIVES[:1]) is None  # one objective: no front to draw
    # Both maximised: the corner is the lower of each pair (the line goes down, then right).
    two = [replace(t, last={"a": a, "b": b}) for t, (a, b) in zip(_objective_sweep().trials[:2], [(1, 5), (2, 3)], strict=True)]
    assert pareto_data(two, (("a", "max"), ("b", "max")))["step"] == [[1, 5], [1, 3], [2, 3]]


def test_a_multi_objective_sweeps_report_draws_its_front_and_lists_its_trials(tmp_path) -> None:
    files = write_sweep_report(_objective_sweep(), out_dir=str(tmp_path), search_space=SPACE, title="two",
                               links=LINKS, objectives=OBJECTIVES)
    text, parsed = _parse(files["html"])
    assert "Pareto front: loss against gain" in parsed.headings and 'id="plot-pareto"' in text
    assert "loss (min: lower is better) and gain (max: higher is better)" in text
    assert _data(text)["pareto"]["front"] == ["t01", "t05", "t03"]
    front = re.search(r'<table class="front">(.*?)</table>', text, re.S).group(1)
    table = _Page()
    table.feed(front)
    assert table.header == ["trial", "loss (min)", "gain (max)", "l1", "lr", "batch_size", "MLflow run"]
    assert table.body_rows == [
        ["t01", "0.3", "0.4", "8", "0.03162", "32", "01ababab"],
        ["t05", "0.4", "0.6", "8", "0.0003162", "32", "05ababab"],
        ["t03", "0.8", "0.9", "8", "0.003162", "32", "03ababab"],
    ]
    assert f'href="{RUN_URL.replace("{run_id}", "01" + "ab" * 15)}"' in front  # each links its MLflow run
    # One objective (or none): no such section.
    single = write_sweep_report(_objective_sweep(), out_dir=str(tmp_path / "one"), search_space=SPACE, title="one")
    text, parsed = _parse(single["html"])
    assert not any(h.startswith("Pareto") for h in parsed.headings) and _data(text)["pareto"] is None


def test_a_front_over_three_objectives_is_shown_on_the_first_two_without_a_step_line(tmp_path) -> None:
    sweep = _objective_sweep()
    sweep = replace(sweep, trials=tuple(replace(t, last={**t.last, "time": float(t.index)}) for t in sweep.trials))
    three = (*OBJECTIVES, ("time", "min"))
    data = pareto_data(sweep.trials, three)
    assert data["front"] == ["t01", "t05", "t00", "t03"] and data["step"] == []  # t00, beaten on two, is fastest
    files = write_sweep_report(sweep, out_dir=str(tmp_path), search_space=SPACE, title="three", objectives=three)
    text, _ = _parse(files["html"])
    assert "no other beats on all of loss, gain, time (the front) are ringed; shown here on the first two" in text


def _unranked_objective_sweep() -> SweepResult:
    """``_objective_sweep`` as a Tune experiment without a metric of its own holds it (Ray's multi-objective
    example): no best values, no order; every report has both objectives, and t03's loss was lowest at its first
    report (0.2), though its last (0.8, what the search was told and the front is drawn by) is the worst."""
    trials = []
    for t in _objective_sweep().trials:
        history = [{**r, "gain": t.last["gain"]} for r in t.history]
        if t.trial_id == "t03":
            history[0]["loss"] = 0.2
        trials.append(replace(t, history=tuple(history), best=None, best_epoch=None))
    return SweepResult(trials=tuple(trials), metric=None, mode="max")


def test_a_multi_objective_sweep_without_a_metric_is_ranked_by_its_first_objective(tmp_path) -> None:
    """No metric of its own (Ray's multi-objective example), two objectives: the report ranks and plots by the
    first (each trial's best loss over its reports), says so, and draws the front as before; the sweep's results
    are left as they were."""
    sweep = _unranked_objective_sweep()
    files = write_sweep_report(sweep, out_dir=str(tmp_path), search_space=SPACE, title="two", links=LINKS,
                               objectives=OBJECTIVES)
    text, parsed = _parse(files["html"])
    assert ("Ranked by <b>loss</b> (min: lower is better), the first of the search's objectives; its Pareto "
            "front below") in text and "Selection metric" not in text
    data = _data(text)
    assert (data["metric"], data["mode"]) == ("loss", "min")
    bests = {t["id"]: (t["best"], t["bestEpoch"]) for t in data["trials"]}
    assert bests == {"t00": (0.5, 2), "t01": (0.3, 2), "t02": (0.6, 2), "t03": (0.2, 1), "t04": (0.1, 2),
                     "t05": (0.4, 2)}
    # The best trial is the best finished one by its best loss (t04, lower, failed), at the epoch it came.
    best = re.search(r'<section class="best" data-trial="([^"]+)".*?</section>', text, re.S)
    assert best.group(1) == "t03" and "best loss = 0.2" in best.group(0) and "at epoch 1 of 2" in best.group(0)
    assert "Trials, best first by best loss (lower is better)" in parsed.headings
    table = re.search(r'<section class="card"><h2>Trials, best first.*?</table>', text, re.S).group(0)
    table = re.findall(r'<tr[^>]* data-trial="([^"]+)"', table)
    assert table == ["t04", "t03", "t01", "t05", "t00", "t02"]
    assert data["pareto"]["front"] == ["t01", "t05", "t03"]  # by the last values, as the search was told
    assert "Pareto front: loss against gain" in parsed.headings
    assert all(t.best is None for t in sweep.trials) and sweep.metric is None  # the caller's results unchanged
    # A metric of its own: the header names it as before; one objective and no metric: nothing to rank by here
    # (record_sweep writes no report then).
    ranked = write_sweep_report(_objective_sweep(), out_dir=str(tmp_path / "m"), search_space=SPACE, title="m",
                                objectives=OBJECTIVES)
    text, _ = _parse(ranked["html"])
    assert "Selection metric <b>loss</b> (lower is better)" in text and "first of the search" not in text


@pytest.mark.browser
def test_the_script_draws_the_pareto_front(browser, tmp_path) -> None:
    """Every finished trial a point, the front's three ringed and joined by the step line, axes named with their
    direction; ``#highlight=`` reaches the front's points and table rows too."""
    files = write_sweep_report(_objective_sweep(), out_dir=str(tmp_path), search_space=SPACE, title="two",
                               links=LINKS, objectives=OBJECTIVES)
    dom = browser.rendered_dom(f"file://{os.path.abspath(files['html'])}#highlight=t05", wait_ms=3000)
    plot = re.search(r'<div class="plot" id="plot-pareto">(.*?)</div>', dom, re.S).group(1)
    assert plot.startswith("<svg")
    assert plot.count('<g class="trial') == 5 and plot.count("front-mark") == 3
    assert sorted(re.findall(r'data-trial="([^"]+)"[^>]*data-front="true"', plot)) == ["t01", "t03", "t05"]
    assert plot.count('class="pareto-step"') == 1
    assert "loss (min: lower is better)" in plot and "gain (max: higher is better)" in plot
    assert re.search(r'<g class="trial hl" data-trial="t05"', plot)
    assert re.search(r'<tr data-trial="t05" class="hl">', dom)
