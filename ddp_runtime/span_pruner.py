"""A Dask scheduler plugin that forgets finished spans, so a scheduler that serves sweep after sweep stays flat.

Dask's scheduler groups tasks into spans (``distributed.spans``) and keeps every span it ever made, with the
TaskGroups it aggregated, after their tasks are forgotten (dask/distributed#7977: "Spans currently live forever on
the scheduler"). Tasks not annotated with a span go to the current default span, and a new default span starts
whenever the previous one has finished: with a sweep's groups, that is a new span at almost every trial, ~3 KiB of
scheduler memory each that are never given back (0.3 MiB per 100 trials, benchmarks/bench_load.py).

The plugin, once a minute, forgets the root spans whose TaskGroups have all been forgotten by the scheduler,
except the newest ``keep`` of them (the dashboard's and ``Client.get_metrics``' recent history). A span is only
forgotten when it was found finished at the pass before too, so the workers' heartbeats have usually reported
its last metrics by then. A heartbeat that still carries metrics of a forgotten span must not fail: the
scheduler looks each reported span up by id, and a worker whose heartbeat fails closes for good
("Unexpected exception during heartbeat. Closing worker."). The plugin makes the spans extension drop such
metrics (they belonged to a span nobody can ask about any more).

Our local cluster installs it (``ddp_runtime.cluster.local_cluster``); a cluster of your own takes it with
``dask scheduler --preload ddp_runtime.span_pruner``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback


class FinishedSpanPruner(SchedulerPlugin):
    """Forget finished root spans (and their sub-spans and TaskGroups) beyond the newest ``keep``."""

    name = "ddp-runtime-finished-span-pruner"

    def __init__(self, *, keep: int = 100, interval_s: float = 60.0) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep}: keep at least 1 finished span (the current default span)")
        if interval_s <= 0:
            raise ValueError(f"interval_s={interval_s}: the pruning interval must be positive, in seconds")
        self.keep = keep
        self.interval_s = interval_s
        self._scheduler: Any = None
        self._finished_before: set[str] = set()
        self._callback: PeriodicCallback | None = None

    async def start(self, scheduler: Any) -> None:
        """Called by the scheduler: make heartbeats tolerate forgotten spans, then prune every ``interval_s``
        seconds.
        """
        self._scheduler = scheduler
        extension = scheduler.extensions.get("spans")
        if extension is not None:
            _drop_metrics_of_forgotten_spans(extension)
        if self._callback is None:
            self._callback = PeriodicCallback(self.prune, self.interval_s * 1000)
            self._callback.start()

    async def close(self) -> None:
        """Called by the scheduler as it closes: stop the periodic pruning."""
        if self._callback is not None:
            self._callback.stop()

    def prune(self) -> int:
        """One pass; returns how many spans it forgot."""
        extension = self._scheduler.extensions.get("spans")
        if extension is None:  # a scheduler without spans (older Dask, or the extension removed)
            return 0
        live_groups = {id(group) for group in self._scheduler.task_groups.values()}
        finished = [
            span
            for span in extension.root_spans
            if not any(id(group) in live_groups for group in span.traverse_groups())
        ]
        # root_spans is in creation order: the newest `keep` finished ones stay.
        candidates = finished[: max(0, len(finished) - self.keep)]
        doomed = {
            sub.id for span in candidates if span.id in self._finished_before for sub in span.traverse_spans()
        }
        self._finished_before = {span.id for span in finished}
        if doomed:
            _forget(extension, doomed)
        return len(doomed)


def _drop_metrics_of_forgotten_spans(extension: Any) -> None:
    """Wrap the spans extension's ``heartbeat`` (once per scheduler) so that worker metrics keyed by a span it no
    longer has are dropped instead of raising KeyError. Keys are ``(context, span_id, prefix, activity, unit)``
    (``SpansWorkerExtension.heartbeat``); anything else goes through as it came."""
    if getattr(extension, "_ddp_runtime_forgets_spans", False):
        return
    original = extension.heartbeat

    def heartbeat(ws: Any, data: dict) -> Any:
        spans = extension.spans
        known = {
            key: value
            for key, value in data.items()
            if not (isinstance(key, tuple) and len(key) > 1 and isinstance(key[1], str)) or key[1] in spans
        }
        return original(ws, known)

    extension.heartbeat = heartbeat
    extension._ddp_runtime_forgets_spans = True


def _forget(extension: Any, span_ids: set[str]) -> None:
    """Drop the spans with these ids from every index the spans extension keeps."""
    for span_id in span_ids:
        extension.spans.pop(span_id, None)
    extension.root_spans = [span for span in extension.root_spans if span.id not in span_ids]
    for index_name in ("spans_search_by_name", "spans_search_by_tag"):
        index = getattr(extension, index_name)
        kept: defaultdict[Any, list] = defaultdict(list)
        for key, spans in index.items():
            remaining = [span for span in spans if span.id not in span_ids]
            if remaining:
                kept[key] = remaining
        setattr(extension, index_name, kept)


def dask_setup(scheduler: Any) -> None:
    """``dask scheduler --preload ddp_runtime.span_pruner``: install the plugin with its defaults (the scheduler
    starts its plugins after its preloads)."""
    scheduler.add_plugin(FinishedSpanPruner())
