"""Human-facing reports of what a sweep did: ``sweep_report`` (one self-contained, interactive HTML page; its
axes in ``report_axes``, the data it embeds in ``report_data``, its PBT plot in ``report_plots``, its markup in
``report_html``, its style and script in ``report_script`` (static/report.css, static/report.js), its
hyperparameter importances from ``importance``) and ``report_page`` (the MLflow server route that serves it as
a page of its own).

The report modules import matplotlib, pandas and Optuna; import them where a report is written, not on every
import of ``sweepflow.tasks``.
"""
