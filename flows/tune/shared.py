"""``tune.with_parameters`` objects on the cluster: sent to every Dask worker once (``SharedParameters``, a
worker plugin), read by each rank from its worker's copy (``SharedValue``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin


class SharedParameters(WorkerPlugin):
    """``tune.with_parameters`` objects, sent to every Dask worker once as a worker plugin (and to a worker that
    joins or is restarted later: Dask hands registered plugins to every new worker). Not ``client.scatter``: Dask's
    active memory manager drops the extra replicas of scattered data within seconds, and a restarted worker has
    none, so ranks would fetch the objects per trial, or wait on a key nobody told the scheduler they need."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.name = f"sweepflow-with-parameters-{uuid.uuid4().hex[:12]}"
        self.values = dict(values)


class SharedValue:
    """One ``with_parameters`` object as a rank reads it: its worker's copy, from the ``SharedParameters`` plugin
    named ``plugin`` (the reference is what travels with each trial, not the object)."""

    def __init__(self, plugin: str, name: str) -> None:
        self.plugin, self.name = plugin, name

    def get(self) -> Any:
        """The object, from this worker's copy.

        Raises:
            RuntimeError: not on a Dask worker of the experiment that shared it, or that experiment has ended.
        """
        from distributed import get_worker

        try:
            plugin = get_worker().plugins[self.plugin]
        except (ValueError, KeyError) as exc:  # not on a worker, or the experiment that shared it has ended
            raise RuntimeError(
                f"tune.with_parameters object {self.name!r} is only available on the Dask workers of the "
                "experiment that shared it, while it runs; call the trainable through tune.run / Tuner.fit"
            ) from exc
        return plugin.values[self.name]
