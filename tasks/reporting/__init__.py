"""Human-facing reports of what a sweep did (``sweep_report``: a self-contained HTML page with plots).

The report module imports matplotlib and pandas; import it where a report is written, not on every import of
``sweepflow.tasks``.
"""
