"""The warm launcher's test program (tests/infra/services/test_launcher.py): ``main(argv)`` writes what its process holds."""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    out, sleep = argv[0], float(argv[1])
    time.sleep(sleep)
    with open(out, "w") as f:
        json.dump({"late_imported": "launcher_late" in sys.modules}, f)
    return 0
