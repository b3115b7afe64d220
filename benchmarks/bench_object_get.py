"""The object store's ``get`` inside a trial, on sweepflow (``ddp_runtime.get``) and on Ray 2.60 (``ray.get``), side
by side: the first call (the fetch) and the mean of the next ones, per object.

    .venv/bin/python benchmarks/bench_object_get.py --ray-venv /tmp/ray-2.60 [--calls 200] [--no-ray]

The same script (this file, ``--child``) runs under each system's interpreter: the driver puts three objects
(Ray's PBT DCGAN example's scoring CNN, an 8 MB NumPy array, a small dict), and a one-trial Tune experiment's
function trainable gets each ``--calls`` times, timing every call, as the example does once per batch. The
trainable's worker does not hold the objects (they are placed on the cluster by the driver), so its first
``get`` fetches. Results: benchmarks/RESULTS.md ("The object store's get").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))


def child(system: str, calls: int) -> dict:
    import time

    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    if system == "ray":
        import ray as store
        from ray import tune

        store.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    else:
        import ddp_runtime as store
        from sweepflow import tune

    class Net(nn.Module):  # Ray's pbt_dcgan_mnist/common.py's scoring model (LeNet), 87 KB of weights
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
            self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
            self.fc1 = nn.Linear(320, 50)
            self.fc2 = nn.Linear(50, 10)

        def forward(self, x):
            x = F.relu(F.max_pool2d(self.conv1(x), 2))
            x = F.relu(F.max_pool2d(self.conv2(x), 2))
            return self.fc2(F.relu(self.fc1(x.view(-1, 320))))

    torch.manual_seed(0)
    refs = {
        "CNN module (87 KB)": store.put(Net()),
        "NumPy array, 8 MB": store.put(np.ones(1 << 20)),
        "dict of 3 numbers": store.put({"a": 1, "b": 2.0, "c": [3]}),
    }
    out = tempfile.mkdtemp(prefix="bench-get-")

    def trainable(config):
        times = {}
        for name, ref in config["refs"].items():
            took = []
            for _ in range(config["calls"]):
                started = time.perf_counter()
                store.get(ref)
                took.append(time.perf_counter() - started)
            times[name] = took
        with open(os.path.join(config["out"], "times.json"), "w") as f:
            json.dump(times, f)
        tune.report({"done": 1})

    tune.Tuner(
        trainable,
        param_space={"refs": refs, "calls": calls, "out": out},
        run_config=tune.RunConfig(name=f"bench-get-{os.getpid()}", verbose=0),
    ).fit()
    with open(os.path.join(out, "times.json")) as f:
        return json.load(f)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ray-venv", help="a venv with Ray 2.60 (see ray_examples.py: built there if missing)"
    )
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # Killed (timeout, Ctrl-C from a supervisor): the finally blocks still stop the services started here.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.child:
        print(json.dumps(child(args.child, args.calls)))
        return 0
    if not args.no_ray and not args.ray_venv:
        parser.error("give --ray-venv DIR, or --no-ray")
    sys.path.insert(0, BENCH_DIR)
    from ray_examples import ray_python

    systems = {"sweepflow": sys.executable}
    if not args.no_ray:
        systems["ray"] = ray_python(args.ray_venv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-get-home-") as home:
        env = {**os.environ, "SWEEPFLOW_HOME": home, "RAY_USAGE_STATS_ENABLED": "0"}
        sweepflow = os.path.join(os.path.dirname(sys.executable), "sweepflow")
        subprocess.run([sweepflow, "server", "start"], env=env, check=True, capture_output=True)
        try:
            for system, python in systems.items():
                command = [python, os.path.abspath(__file__), "--child", system, "--calls", str(args.calls)]
                done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
                if done.returncode != 0:
                    raise SystemExit(f"{system} failed:\n{done.stderr[-3000:]}")
                results[system] = json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            subprocess.run([sweepflow, "server", "stop"], env=env, check=False, capture_output=True)
    load = os.getloadavg()
    print(
        f"\nload average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; {args.calls} calls each, in one trial\n"
    )
    print("| object | " + " | ".join(f"{s}: first get / each next get" for s in systems) + " |")
    print("|---|" + "---|" * len(systems))
    for name in results["sweepflow"]:
        cells = []
        for system in systems:
            took = results[system][name]
            rest = sorted(took[1:])
            cells.append(f"{1000 * took[0]:.2f} ms / {1e6 * rest[len(rest) // 2]:.0f} µs (median)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
