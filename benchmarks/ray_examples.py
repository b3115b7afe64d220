"""Run Ray's own example scripts on sweepflow, their imports changed and nothing else: what a Ray user's script meets.

    .venv/bin/python benchmarks/ray_examples.py [--wheel ray-2.60.0-....whl] [--timeout 600] [NAME ...]

The Ray wheel (``pip download ray --no-deps``; fetched into a temporary directory when ``--wheel`` is not given)
is only read: each example is copied out of it into a temporary directory, its imports rewritten (the table in
``REWRITES``: ``ray.tune`` -> ``sweepflow.tune``, ``ray.train`` -> ``ddp_runtime``, ``ray.data`` ->
``ddp_runtime.data``; ``ray.init``/``ray.shutdown`` dropped: the services are sweepflow's), and run with
``--smoke-test`` when it takes one. Prints one line per example (passed/failed, seconds, the last error line) and
a table for benchmarks/RESULTS.md. Ray's code never enters this repository.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile

# Ray Tune's and Ray Train's examples that run without internet or extra libraries (no Keras, XGBoost,
# LightGBM, Ax, HyperOpt, ...): the ones a PyTorch user of Tune/Train starts from. Not here: torch_quick_start.py
# and torch_fashion_mnist_example.py download FashionMNIST (no internet on this machine).
EXAMPLES = [
    "ray/tune/examples/tune_basic_example.py",
    "ray/tune/examples/async_hyperband_example.py",
    "ray/tune/examples/hyperband_function_example.py",
    "ray/tune/examples/hyperband_example.py",
    "ray/tune/examples/pbt_function.py",
    "ray/tune/examples/pbt_example.py",
    "ray/tune/examples/pb2_example.py",
    "ray/tune/examples/optuna_example.py",
    "ray/tune/examples/optuna_define_by_run_example.py",
    "ray/tune/examples/optuna_multiobjective_example.py",
    "ray/tune/examples/custom_func_checkpointing.py",
    "ray/tune/examples/logging_example.py",
    "ray/train/examples/pytorch/torch_linear_example.py",
    "ray/train/examples/pytorch/torch_regression_example.py",
]

# (pattern, replacement) over the script's text, in order: the import lines a Ray user changes.
REWRITES: list[tuple[str, str]] = [
    (r"^(\s*)ray\.init\(.*$", r"\1pass  # was ray.init(...): sweepflow's services"),
    (r"^(\s*)ray\.shutdown\(\).*$", r"\1pass  # was ray.shutdown()"),
    (r"\bfrom ray\.tune\.examples\.(\w+) import", r"from \1 import"),
    (r"\bfrom ray import tune, train\b", "from sweepflow import tune\nimport ddp_runtime as train"),
    (r"\bfrom ray import train, tune\b", "from sweepflow import tune\nimport ddp_runtime as train"),
    (r"\bfrom ray import tune\b", "from sweepflow import tune"),
    (r"\bfrom ray import train\b", "import ddp_runtime as train"),
    (r"\bfrom ray\.tune\b", "from sweepflow.tune"),
    (r"\bimport ray\.tune as tune\b", "from sweepflow import tune"),
    (r"\bfrom ray\.train\.torch import", "from ddp_runtime.torch import"),
    (r"\bfrom ray\.train import", "from ddp_runtime import"),
    (r"\bimport ray\.train as train\b", "import ddp_runtime as train"),
    (r"\bimport ray\.data\b", "import ddp_runtime.data"),
    (r"\bfrom ray\.data\b", "from ddp_runtime.data"),
    (r"\bray\.data\.", "ddp_runtime.data."),
    (r"\bray\.train\.", "ddp_runtime."),
    (r"\bray\.tune\.", "sweepflow.tune."),
    (r"\bray\.(put|get|wait)\(", r"ddp_runtime.\1("),
    (r"^(\s*)import ray\s*$", r"\1import ddp_runtime"),
]


def ported(text: str) -> str:
    """The script with its Ray imports changed (``REWRITES``)."""
    for pattern, replacement in REWRITES:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    return text


def wheel_path(given: str | None, scratch: str) -> str:
    if given:
        return given
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "ray", "--no-deps", "-q", "-d", scratch], check=True
    )
    return next(os.path.join(scratch, f) for f in os.listdir(scratch) if f.endswith(".whl"))


def run_example(
    wheel: zipfile.ZipFile, member: str, workdir: str, timeout_s: float, env: dict[str, str]
) -> tuple[bool, float, str]:
    """Port ``member`` (and its sibling example modules it imports) into ``workdir``; run it; return (passed,
    seconds, last line of its output)."""
    folder = os.path.dirname(member)
    for name in wheel.namelist():  # its siblings: an example may import another (pbt_function, utils)
        if os.path.dirname(name) == folder and name.endswith(".py"):
            with open(os.path.join(workdir, os.path.basename(name)), "w") as f:
                f.write(ported(wheel.read(name).decode()))
    script = os.path.join(workdir, os.path.basename(member))
    smoke = ["--smoke-test"] if "--smoke-test" in wheel.read(member).decode() else []
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, script, *smoke],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return False, time.perf_counter() - started, f"timed out after {timeout_s:.0f}s"
    seconds = time.perf_counter() - started
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^\w*(Error|Exception)\b", line)]
    last = (errors or lines or [""])[-1][:200]
    return done.returncode == 0, seconds, last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="examples to run (file names); default: all of EXAMPLES")
    parser.add_argument("--wheel", help="a downloaded Ray wheel (default: pip download ray --no-deps)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per example")
    args = parser.parse_args()
    chosen = [m for m in EXAMPLES if not args.names or os.path.basename(m) in args.names]
    with tempfile.TemporaryDirectory(prefix="ray-examples-") as scratch:
        path = wheel_path(args.wheel, scratch)
        rows = []
        # The examples share one private set of local services (started by the first, as a user's first
        # tune.run starts them), stopped at the end.
        env = {**os.environ, "SWEEPFLOW_HOME": os.path.join(scratch, "home")}
        sweepflow = os.path.join(os.path.dirname(sys.executable), "sweepflow")
        try:
            with zipfile.ZipFile(path) as wheel:
                for member in chosen:
                    # Kept until the services stop: the workers the first example starts keep its directory as
                    # their working directory.
                    workdir = os.path.join(scratch, os.path.basename(member).removesuffix(".py"))
                    os.makedirs(workdir)
                    passed, seconds, last = run_example(wheel, member, workdir, args.timeout, env)
                    rows.append((os.path.basename(member), passed, seconds, last))
                    print(
                        f"{'passed' if passed else 'FAILED'} {seconds:6.1f}s {member}"
                        + ("" if passed else f": {last}")
                    )
        finally:
            subprocess.run([sweepflow, "server", "stop"], env=env, check=False, capture_output=True)
    print(f"\n{os.path.basename(path)}\n\n| example | result | seconds |\n|---|---|---|")
    for name, passed, seconds, last in rows:
        print(f"| `{name}` | {'runs' if passed else 'fails: ' + last.replace('|', '/')} | {seconds:.1f} |")
    return 0 if all(passed for _, passed, _, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
