"""Ray's own example scripts on Ray 2.60 and on sweepflow, one after the other, example by example: a table of
seconds, the ratio, and where sweepflow's time went.

    .venv/bin/python benchmarks/ray_examples.py --ray-venv /tmp/ray-2.60 [--wheel ray-2.60.0-....whl]
        [--timeout 600] [--no-ray] [NAME ...]

What runs:

* Ray Tune's and Ray Train's examples from the Ray wheel (``pip download ray==2.60.0 --no-deps``; fetched into
  a temporary directory when ``--wheel`` is not given) that run without internet or extra libraries, plus the
  PBT DCGAN pair; and the Ray 2 examples of this repository's ``examples/`` (Ray's documentation code with
  its imports changed): those run on Ray with the imports changed back (their ``# was:`` comments).
* On Ray: the example as Ray ships it, in the Ray venv (``--ray-venv``: a venv with ``ray[tune,train]==2.60.0``;
  built there when it has no Ray: ``RAY_REQUIREMENTS``). Each script's ``ray.init()`` starts its own local Ray
  cluster, as it does for a Ray user.
* On sweepflow: the same text with its imports rewritten (``REWRITES``: ``ray.tune`` -> ``sweepflow.tune``,
  ``ray.train`` -> ``ddp_runtime``, ``ray.put``/``get`` -> ``ddp_runtime``; ``ray.init``/``ray.shutdown``
  dropped) in this interpreter's venv. The local services are started first, once, and timed on their own
  line (a user's first script starts them; later ones reuse them for an hour).
* Data stand-ins, the same on both: an example that downloads MNIST reads scikit-learn's digits instead
  (``offline_mnist.py``), and its pre-trained scoring model is a fresh ``Net()``'s weights, written beside it.

Each example runs with ``--smoke-test`` when it takes one, Ray first, then sweepflow, so the two figures of
a row are taken minutes apart at most. "Where sweepflow's time went" splits its wall time using its own log's
timestamps: before the experiment's flow run began (interpreter, imports, the script's own module-level work,
connecting to the services), the flow run, and after it; and the worker-seconds its trials used. Ray's
examples and code never enter this repository: they are read from the wheel at run time.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)
RAY_REQUIREMENTS = (
    "ray[tune,train]==2.60.0",
    "torch",
    "torchvision",
    "filelock",
    "scipy",
    "matplotlib",
    "scikit-learn",
    "optuna",
)

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
    (
        r"^(\s*)import ray\.train\s*$",
        r"\1import ddp_runtime",
    ),  # Ray Train's getting-started: ray.train.X below
    (r"\bimport ray\.data\b", "import ddp_runtime.data"),
    (r"\bfrom ray\.data\b", "from ddp_runtime.data"),
    (r"\bray\.data\.", "ddp_runtime.data."),
    (r"\bray\.train\.", "ddp_runtime."),
    (r"\bray\.tune\.", "sweepflow.tune."),
    (r"\bray\.(put|get|wait)\(", r"ddp_runtime.\1("),
    (r"^(\s*)import ray\s*$", r"\1import ddp_runtime"),
]

# The MNIST stand-in, on both systems: an example package's common module reads digits, not a download, and
# its scoring model sits beside it (``MODEL_PATH``); the example imports that copy, not the installed one.
MNIST_STAND_IN: list[tuple[str, str]] = [
    (r"^import torchvision\.datasets as dset$", "import offline_mnist as dset  # stand-in: no download"),
    (
        r"^MODEL_PATH = .*$",
        'MODEL_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mnist_cnn.pt")',
    ),
    (r"\bfrom ray\.tune\.examples\.pbt_dcgan_mnist\.common import", "from common import"),
]


@dataclass(frozen=True)
class Example:
    """One example script: ``source`` is ``wheel:<member>`` (Ray's) or ``repo:<path>`` (this repository's port);
    ``stand_ins`` rewrite its data access on both systems; ``model_from`` names the module whose ``Net`` gives
    the weights file ``MODEL_PATH`` points at."""

    source: str
    stand_ins: tuple[tuple[str, str], ...] = ()
    model_from: str | None = None
    extra_files: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        return os.path.basename(self.source.partition(":")[2])


_TUNE = "wheel:ray/tune/examples/"
_DCGAN = dict(stand_ins=tuple(MNIST_STAND_IN), model_from="common", extra_files=("offline_mnist.py",))
EXAMPLES = [
    Example(_TUNE + "tune_basic_example.py"),
    Example(_TUNE + "async_hyperband_example.py"),
    Example(_TUNE + "hyperband_function_example.py"),
    Example(_TUNE + "hyperband_example.py"),
    Example(_TUNE + "pbt_function.py"),
    Example(_TUNE + "pbt_example.py"),
    Example(_TUNE + "pb2_example.py"),
    Example(_TUNE + "optuna_example.py"),
    Example(_TUNE + "optuna_define_by_run_example.py"),
    Example(_TUNE + "optuna_multiobjective_example.py"),
    Example(_TUNE + "custom_func_checkpointing.py"),
    Example(_TUNE + "logging_example.py"),
    Example(_TUNE + "pbt_dcgan_mnist/pbt_dcgan_mnist_trainable.py", **_DCGAN),
    # Ray 2.60's copy reads config["checkpoint_interval"], which its param_space lacks: every trial fails with
    # KeyError on both systems (and the script exits 0). Given the key, on both, as its Ray sibling examples do.
    Example(
        _TUNE + "pbt_dcgan_mnist/pbt_dcgan_mnist_func.py",
        **{
            **_DCGAN,
            "stand_ins": (
                *MNIST_STAND_IN,
                (
                    r'^(\s*)"mnist_model_ref": mnist_model_ref,\n(\s*)\},$',
                    r'\1"mnist_model_ref": mnist_model_ref,\n\1"checkpoint_interval": 5,\n\2},',
                ),
            ),
        },
    ),
    Example("wheel:ray/train/examples/pytorch/torch_linear_example.py"),
    Example("repo:examples/ray_train_getting_started.py"),
    # Ray 2's Tuner(TorchTrainer(...)) pattern: Ray 2.60 refuses it with its default Ray Train v2 ("Improper
    # 'run' - not string nor trainable"); with RAY_TRAIN_V2_ENABLED=0 it did not finish within 600 s here.
    Example("repo:examples/ray_tuner_torch_trainer.py"),
    Example("repo:examples/ray_tune_function_trainable.py"),
]


def ported(text: str) -> str:
    """The script with its Ray imports changed (``REWRITES``)."""
    for pattern, replacement in REWRITES:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    return text


def unported(text: str) -> str:
    """One of this repository's ports back in Ray's spelling: each line marked ``# was: <Ray's line>`` becomes
    that line (``... import ...`` marks keep the port's continuation: a parenthesised import)."""
    out = []
    for line in text.splitlines():
        code, marker, was = line.partition("# was: ")
        if not marker or not code.strip():
            out.append(line)
            continue
        was = was.strip()
        if was.endswith("..."):
            head = was.removesuffix("...").rstrip()
            tail = code.split(" import ", 1)[1] if " import " in code else ""
            out.append(f"{head} {tail}".rstrip())
        else:
            out.append(was)
    # What `import ddp_runtime  # was: import ray.train` left spelled ddp_runtime.<name> in the code.
    return re.sub(r"(?<![\w.`])ddp_runtime\.(?=\w)", "ray.train.", "\n".join(out)) + "\n"


def restyled(text: str, rewrites: tuple[tuple[str, str], ...]) -> str:
    for pattern, replacement in rewrites:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    return text


def wheel_path(given: str | None, scratch: str) -> str:
    if given:
        return given
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "ray==2.60.0", "--no-deps", "-q", "-d", scratch], check=True
    )
    return next(os.path.join(scratch, f) for f in os.listdir(scratch) if f.endswith(".whl"))


def ray_python(venv: str) -> str:
    """The Ray venv's interpreter, the venv made (``RAY_REQUIREMENTS``) when it has no Ray 2.60."""
    python = os.path.join(venv, "bin", "python")
    has_ray = (
        os.path.exists(python)
        and subprocess.run(
            [python, "-c", "import ray, sys; sys.exit(ray.__version__ != '2.60.0')"], capture_output=True
        ).returncode
        == 0
    )
    if not has_ray:
        print(f"building the Ray venv {venv} ({', '.join(RAY_REQUIREMENTS)})", flush=True)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *RAY_REQUIREMENTS], check=True)
    return python


@dataclass
class Run:
    passed: bool
    seconds: float
    last: str
    output: str
    started: float  # time.time() at its start


def materialise(wheel: zipfile.ZipFile, example: Example, workdir: str, *, for_ray: bool) -> str:
    """Write the example (and its sibling modules) into ``workdir`` as it runs on one system; its path."""
    kind, _, where = example.source.partition(":")
    if kind == "repo":
        texts = {os.path.basename(where): open(os.path.join(REPO, where)).read()}
        texts = {n: unported(t) if for_ray else t for n, t in texts.items()}
    else:
        folder = os.path.dirname(where)
        texts = {
            os.path.basename(n): wheel.read(n).decode()
            for n in wheel.namelist()
            if os.path.dirname(n) == folder and n.endswith(".py")
        }
        texts = {n: restyled(t, example.stand_ins) for n, t in texts.items()}
        if not for_ray:
            texts = {n: ported(t) for n, t in texts.items()}
    for name, text in texts.items():
        with open(os.path.join(workdir, name), "w") as f:
            f.write(text)
    for name in example.extra_files:
        shutil.copy(os.path.join(BENCH_DIR, name), workdir)
    return os.path.join(workdir, example.name)


def write_model(example: Example, workdir: str, python: str) -> None:
    """The scoring model's weights file the example loads (``MODEL_PATH``): a fresh ``Net()``'s, seeded."""
    if example.model_from is None:
        return
    code = (
        f"import torch; torch.manual_seed(0); import {example.model_from} as m; "
        "torch.save(m.Net().state_dict(), m.MODEL_PATH)"
    )
    subprocess.run([python, "-c", code], cwd=workdir, check=True, env={**os.environ, "PYTHONPATH": workdir})


def run_script(python: str, script: str, timeout_s: float, env: dict[str, str]) -> Run:
    smoke = ["--smoke-test"] if "--smoke-test" in open(script).read() else []
    workdir = os.path.dirname(script)
    env = {**env, "PYTHONPATH": workdir}  # Ray's workers import the example's siblings (common.py) from here
    started, wall = time.time(), time.perf_counter()
    try:
        done = subprocess.run(
            [python, script, *smoke], cwd=workdir, capture_output=True, text=True, timeout=timeout_s, env=env
        )
    except subprocess.TimeoutExpired as exc:
        output = (
            (exc.stdout or b"").decode(errors="replace")
            if isinstance(exc.stdout, bytes)
            else exc.stdout or ""
        )
        return Run(False, time.perf_counter() - wall, f"timed out after {timeout_s:.0f}s", output, started)
    seconds = time.perf_counter() - wall
    output = done.stderr + done.stdout
    lines = [line for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^\w*(Error|Exception)\b", line)]
    # A Tuner.fit whose trials all failed still exits 0 (on both): count trials in ERROR as a failure.
    errored = re.findall(r"\b(\d+) ERROR\b", output)
    passed = done.returncode == 0 and not any(int(n) for n in errored)
    last = (errors or lines or [""])[-1][:200]
    if done.returncode == 0 and not passed:
        last = f"{max(int(n) for n in errored)} trial(s) in ERROR: {last}"
    return Run(passed, seconds, last, output, started)


_STAMP = re.compile(r"^(\d\d):(\d\d):(\d\d\.\d+) \| \w+ +\| Flow run '[^']*' - (.*)$", re.MULTILINE)


def where_time_went(run: Run) -> str:
    """From sweepflow's log: seconds before its flow run began, in it, after it; trials' worker-seconds."""
    stamps = [(m.group(4), m.groups()[:3]) for m in _STAMP.finditer(run.output)]
    if not stamps:
        return "no flow run in its output"
    day = datetime.datetime.fromtimestamp(run.started)

    def at(hms: tuple[str, str, str]) -> float:
        h, m, s = hms
        moment = day.replace(hour=int(h), minute=int(m), second=0, microsecond=0).timestamp() + float(s)
        return moment + 86400 if moment < run.started - 60 else moment

    begun = [at(t) for text, t in stamps if text.startswith("Beginning flow run")]
    ended = [at(t) for text, t in stamps if text.startswith("Finished in state")]
    trials = re.findall(r"used ([\d.]+) worker-seconds", run.output)
    if not begun or not ended:
        return "flow run without a start or an end in its output"
    before, inside = begun[0] - run.started, ended[-1] - begun[0]
    after = run.started + run.seconds - ended[-1]
    used = f"; trials {sum(float(t) for t in trials):.1f} worker-s" if trials else ""
    runs = f" ({len(begun)} flow runs)" if len(begun) > 1 else ""
    return f"before {before:.1f} s, flow{runs} {inside:.1f} s, after {after:.1f} s{used}"


def ray_running_time(run: Run) -> str:
    found = re.findall(r"Total running time: ([\dhms .]+?)\s*$", run.output, flags=re.MULTILINE)
    return f"Tune's running time {found[-1]}" if found else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="examples to run (file names); default: all of EXAMPLES")
    parser.add_argument(
        "--wheel", help="a downloaded Ray 2.60 wheel (default: pip download ray==2.60.0 --no-deps)"
    )
    parser.add_argument("--ray-venv", help="a venv with Ray 2.60 (built there if it has none)")
    parser.add_argument("--no-ray", action="store_true", help="sweepflow only")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per example and system")
    args = parser.parse_args()
    # Killed (timeout, Ctrl-C from a supervisor): the finally blocks still stop the services started here.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not args.no_ray and not args.ray_venv:
        parser.error("give --ray-venv DIR (a venv with Ray 2.60, built there if missing), or --no-ray")
    chosen = [e for e in EXAMPLES if not args.names or e.name in args.names]
    python_ray = None if args.no_ray else ray_python(args.ray_venv)
    sweepflow = os.path.join(os.path.dirname(sys.executable), "sweepflow")
    load = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ray-examples-") as scratch:
        path = wheel_path(args.wheel, scratch)
        env = {**os.environ, "SWEEPFLOW_HOME": os.path.join(scratch, "home"), "RAY_USAGE_STATS_ENABLED": "0"}
        try:
            started = time.perf_counter()
            subprocess.run([sweepflow, "server", "start"], env=env, check=True, capture_output=True)
            services_s = time.perf_counter() - started
            print(f"sweepflow's local services started in {services_s:.1f}s", flush=True)
            with zipfile.ZipFile(path) as wheel:
                for example in chosen:
                    runs = {}
                    for system in ("ray", "sweepflow") if python_ray else ("sweepflow",):
                        # Kept until the services stop: their workers may still have it as a working directory.
                        workdir = os.path.join(scratch, system, example.name.removesuffix(".py"))
                        os.makedirs(workdir)
                        script = materialise(wheel, example, workdir, for_ray=system == "ray")
                        python = python_ray if system == "ray" else sys.executable
                        write_model(example, workdir, python)
                        runs[system] = run = run_script(python, script, args.timeout, env)
                        print(
                            f"{system:9} {'passed' if run.passed else 'FAILED'} {run.seconds:6.1f}s {example.name}"
                            + ("" if run.passed else f": {run.last}"),
                            flush=True,
                        )
                    rows.append((example, runs))
        finally:
            subprocess.run([sweepflow, "server", "stop"], env=env, check=False, capture_output=True)
    print(
        f"\n{os.path.basename(path)}; load average at the start {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; "
        f"sweepflow's services started once first: {services_s:.1f} s\n"
    )
    print(
        "| example | Ray 2.60 s | sweepflow s | ratio | where sweepflow's time went |\n|---|---:|---:|---:|---|"
    )
    totals = [0.0, 0.0]
    for example, runs in rows:
        ours, theirs = runs["sweepflow"], runs.get("ray")
        if theirs is not None and theirs.passed and ours.passed:
            totals[0] += theirs.seconds
            totals[1] += ours.seconds
        ray_cell = (
            "-" if theirs is None else (f"{theirs.seconds:.1f}" if theirs.passed else f"fails: {theirs.last}")
        )
        our_cell = f"{ours.seconds:.1f}" if ours.passed else f"fails: {ours.last}"
        ratio = (
            f"{ours.seconds / theirs.seconds:.2f}x"
            if theirs is not None and theirs.passed and ours.passed
            else "-"
        )
        went = where_time_went(ours) + (
            f" (Ray: {ray_running_time(theirs)})" if theirs and ray_running_time(theirs) else ""
        )
        print(f"| `{example.name}` | {ray_cell} | {our_cell} | {ratio} | {went.replace('|', '/')} |")
    if python_ray and totals[0]:
        print(
            f"| **sum** (both passed) | {totals[0]:.1f} | {totals[1]:.1f} | {totals[1] / totals[0]:.2f}x | |"
        )
    return 0 if all(runs["sweepflow"].passed for _, runs in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
