"""benchmarks/bench_searchers.py runs as RESULTS.md says, on a small budget: every searcher proposes configs of the
shared space that the objective can score, and the tables print."""

from __future__ import annotations

import subprocess
import sys

import paths


def test_the_searcher_benchmark_runs_and_prints_both_tables():
    done = subprocess.run(
        [sys.executable, str(paths.ROOT / "benchmarks" / "bench_searchers.py"), "--budget", "6", "--seeds", "2",
         "--timing-trials", "101",
         "--gp-timing-trials", "6"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for name in ("random", "OptunaSearch (TPE)", "HyperOptSearch (TPE)", "NevergradSearch (1+1)",
                 "ZOOptSearch (ASRacos)", "TuneBOHB", "AxSearch (Sobol, then GP)"):
        assert sum(line.startswith(name + " ") for line in out.splitlines()) == 2, out  # a row in each table
    assert "best value found in 6 trials" in out and "seconds per suggestion over 101 trials" in out
