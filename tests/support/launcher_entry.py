"""The warm launcher's test program (tests/infra/services/test_launcher.py): ``main(argv, handover)`` writes what
its process holds and what it was handed."""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def main(argv: list[str], handover: dict[str, Any]) -> int:
    out, sleep = argv[0], float(argv[1])
    time.sleep(sleep)
    with open(out, "w") as f:
        json.dump({"late_imported": "launcher_late" in sys.modules, "handover": handover}, f)
    return 0
