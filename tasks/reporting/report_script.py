"""The sweep report page's style sheet and script, inlined into the page (it loads nothing: no CDN, no fonts).

The script draws the plots as SVG from the JSON the page embeds (``<script type="application/json"
id="sweep-data">``, made by report_data.py and written into the page by report_html.py) and makes them
interactive:

- hovering a trial (a curve, a parallel-coordinates line, a best-so-far dot, a legend entry, a leaderboard row)
  highlights it everywhere, with a tooltip; a click pins the highlight, a click on empty space or Esc drops it;
- dragging along a parallel-coordinates axis keeps only the trials inside that range (brushing), in every plot
  and the leaderboard; a click on the axis clears its range;
- the URL fragment does the same without a mouse (and lets a link share a view): ``#highlight=<trial id>``,
  ``#brush=<axis>:<lo>-<hi>`` (positions on the axis, 0 = bottom, 1 = top; several joined by ``;``).

It writes nothing but SVG elements, classes and text (``textContent``), never markup from the data.

Both live beside this module as package data, static/report.css and static/report.js (pyproject.toml's
``[tool.setuptools.package-data]`` puts them in the wheel), read once on import and inlined as they are.
"""

from __future__ import annotations

from importlib.resources import files

__all__ = ["CSS", "SCRIPT"]


def _read(name: str) -> str:
    return files("sweepflow.tasks.reporting").joinpath(f"static/{name}").read_text(encoding="utf-8")


CSS = _read("report.css")
SCRIPT = _read("report.js")
