"""Training functions with a mistake each, for tests/flows/test_preflight.py (importable by the flow process)."""

from __future__ import annotations

from sweepflow.tasks.training.function import with_checks


def two_args(config, data):  # a training function is called with one config dict
    raise AssertionError("never called: the pre-flight check refuses it")


def keyword_only(*, config):
    raise AssertionError("never called: the pre-flight check refuses it")


def _validate(config):
    if config.get("width", 1) < 1:
        raise ValueError(f"config['width'] must be >= 1, got {config['width']!r}")


@with_checks(validate=_validate, reports=("loss",))
def declared(config):
    raise AssertionError("never called in these tests")


def undeclared(config):
    """Reports a metric the sweep does not select by, and declares nothing: caught at its first report."""
    import ddp_runtime

    for epoch in range(1, int(config.get("epochs", 4)) + 1):
        ddp_runtime.report({"epoch": epoch, "loss": 1.0 / epoch})
