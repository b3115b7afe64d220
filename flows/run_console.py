"""What ``sweepflow run`` prints of a flow that failed: Prefect's console lines without tracebacks (``--debug``
shows them; the flow run's log in Prefect keeps them whole), and the command that finishes a run whose stages
after the sweep failed."""

from __future__ import annotations

import argparse
import contextlib
import logging
import shlex
from collections.abc import Iterator


class _NoTraceback(logging.Formatter):
    """A console formatter that writes a record's message without its traceback, and says where it is."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        if not record.exc_info:
            return self.inner.format(record)
        saved = record.exc_info, record.exc_text
        record.exc_info = record.exc_text = None  # restored below: the API's handler logs the traceback
        try:
            return self.inner.format(record) + " (traceback: --debug, or this flow run's log in the Prefect UI)"
        finally:
            record.exc_info, record.exc_text = saved


@contextlib.contextmanager
def console_tracebacks(*, shown: bool) -> Iterator[None]:
    """While the flow runs in this command: Prefect's console lines of a failed task or flow run without their
    tracebacks unless ``shown`` (``--debug``). The flow run's log (Prefect's API handler) keeps them whole, and
    the command ends with its own sentence."""
    loggers = (logging.getLogger(), logging.getLogger("prefect"))  # Prefect's console handler is the root's
    handlers = [] if shown else [h for lg in loggers for h in lg.handlers if isinstance(h, logging.StreamHandler)]
    before = [h.formatter for h in handlers]
    for handler in handlers:
        handler.setFormatter(_NoTraceback(handler.formatter))
    try:
        yield
    finally:
        for handler, formatter in zip(handlers, before, strict=True):
            handler.setFormatter(formatter)


def finish_command(args: argparse.Namespace, parent_run_id: str, *, sets: int = 0) -> str:
    """The command that resumes ``parent_run_id`` with this command's settings: ``sweepflow run``, its
    ``--config`` and ``--no-server``, then ``--resume``. The ``sets`` ``--set`` values are not repeated (they
    may hold credentials): the command says to give the same ones."""
    words = ["sweepflow", "run"]
    if args.config:
        words += ["--config", shlex.quote(str(args.config))]
    if args.no_server:
        words.append("--no-server")
    words += ["--resume", parent_run_id]
    return " ".join(words) + (f" with the same {sets} --set option(s)" if sets else "")
