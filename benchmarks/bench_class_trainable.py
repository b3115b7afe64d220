"""A class ``Trainable`` on sweepflow and on Ray 2.60, side by side: what a step costs beyond the step itself, with
no checkpoint and with checkpoints of 1, 10 and 100 MB, and what a PBT exploit's copy costs.

    .venv/bin/python benchmarks/bench_class_trainable.py --ray-venv /tmp/ray-2.60 [--steps 8] [--step-s 1.0]
        [--sizes 1,10,100] [--no-ray]

The same script (this file, ``--child``) runs under each system's interpreter, its ``tune`` imported from
``ray`` or from ``sweepflow``; only that line differs. The Trainable's ``step()`` burns a fixed amount of
Python CPU work (calibrated once, in a plain process, to ``--step-s``) and writes its start and end times to a
file; ``save_checkpoint`` writes its state (``size`` MB of random bytes) as one ``.npy`` file; ``load_checkpoint``
reads it back and records how long that took. Measured, per system:

* **plain**: the same object's ``step()`` called ``--steps`` times in a plain process (no Tune);
* **no checkpoint**: one trial of ``--steps`` steps; its steps' span (first start to last end) against plain's,
  and the mean gap between a step's end and the next one's start (the report's round trip);
* **checkpoint N MB**: every step checkpointed (``checkpoint_frequency=1``): the mean gap, minus the
  no-checkpoint gap, is what saving, persisting and recording one checkpoint of that size costs;
* **PBT exploit, N MB**: two trials (one CPU each), ``PopulationBasedTraining(perturbation_interval=2)``,
  checkpoints every 2 steps: the gaps at the steps where a trial took another's checkpoint (its
  ``load_checkpoint`` ran), and ``load_checkpoint``'s own time.

Ray's ``ray.init()`` starts a local Ray cluster per run; sweepflow's local services are started once, first.
Results: benchmarks/RESULTS.md ("Class trainables").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))


def burn(iterations: int) -> int:
    """Pure-Python CPU work (no BLAS threads): the step's body."""
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


def calibrate(step_s: float) -> int:
    """Iterations of ``burn`` that take ``step_s`` here, in a plain process."""
    n = 200_000
    while True:
        started = time.perf_counter()
        burn(n)
        took = time.perf_counter() - started
        if took > 0.2:
            return int(n * step_s / took)
        n *= 2


# ----------------------------------------------------------------------------------------------- the child side


def child(system: str, mode: str, args: argparse.Namespace) -> dict:
    import numpy as np

    if system == "ray":
        import ray
        from ray import tune
        from ray.tune.schedulers import PopulationBasedTraining
    else:
        from sweepflow import tune
        from sweepflow.tune.schedulers import PopulationBasedTraining

    marks = tempfile.mkdtemp(prefix="bench-trainable-")

    class Work(tune.Trainable):
        def setup(self, config):
            self.iterations = config["iterations"]
            self.state = np.random.default_rng(0).bytes(int(config["size_mb"] * 2**20))
            self.log = open(
                os.path.join(config["marks"], f"{self.trial_id}.jsonl"), "a"
            )  # a restarted trial appends

        def step(self):
            started = time.time()
            burn(self.iterations)
            self.log.write(json.dumps({"step": [started, time.time()]}) + "\n")
            self.log.flush()
            return {"score": float(self.iteration + self.config.get("x", 0))}

        def save_checkpoint(self, checkpoint_dir):
            np.save(os.path.join(checkpoint_dir, "state.npy"), np.frombuffer(self.state, dtype=np.uint8))
            return checkpoint_dir

        def load_checkpoint(self, checkpoint_dir):
            started = time.time()
            self.state = np.load(os.path.join(checkpoint_dir, "state.npy")).tobytes()
            self.log.write(json.dumps({"load": [started, time.time()]}) + "\n")
            self.log.flush()

        def reset_config(self, new_config):
            self.config = new_config
            return True

    config = {"iterations": args.iterations, "size_mb": args.size_mb, "marks": marks}
    if mode == "plain":
        work = Work(config)
        for _ in range(args.steps):
            work.train()
    else:
        if system == "ray":
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        # PBT: every step checkpointed, so a donor always has one when the other trial reaches its perturbation.
        checkpoint = tune.CheckpointConfig(checkpoint_frequency=0 if mode == "tune" else 1)
        scheduler = None
        if mode == "pbt":
            config["x"] = tune.grid_search([0.0, 100.0])  # the second trial leads: the first exploits it
            scheduler = PopulationBasedTraining(
                time_attr="training_iteration",
                perturbation_interval=2,
                quantile_fraction=0.5,
                resample_probability=0.0,
                hyperparam_mutations={"x": [0.0, 100.0]},
            )
        tune.Tuner(
            Work,
            param_space=config,
            tune_config=tune.TuneConfig(
                metric="score", mode="max", scheduler=scheduler, max_concurrent_trials=2
            ),
            run_config=tune.RunConfig(
                name=f"bench-{mode}-{os.getpid()}",
                stop={"training_iteration": args.steps},
                checkpoint_config=checkpoint,
                verbose=0,
            ),
        ).fit()
    steps, loads = [], []
    for name in os.listdir(marks):
        with open(os.path.join(marks, name)) as f:
            events = [json.loads(line) for line in f]
        steps.append([e["step"] for e in events if "step" in e])
        loads.extend(e["load"] for e in events if "load" in e)
    return {"steps": steps, "loads": loads}


# ------------------------------------------------------------------------------------------ the orchestrator side


def run_child(
    python: str, system: str, mode: str, args: argparse.Namespace, size_mb: float, env: dict
) -> dict:
    command = [
        python,
        os.path.abspath(__file__),
        "--child",
        system,
        mode,
        "--steps",
        str(args.steps),
        "--iterations",
        str(args.iterations),
        "--size-mb",
        str(size_mb),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{system} {mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def gaps(steps: list[list[float]]) -> list[float]:
    return [b[0] - a[1] for a, b in zip(steps, steps[1:], strict=False)]


def span(steps: list[list[float]]) -> float:
    return steps[-1][1] - steps[0][0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ray-venv", help="a venv with Ray 2.60 (see ray_examples.py: built there if missing)"
    )
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--step-s", type=float, default=1.0)
    parser.add_argument("--sizes", default="1,10,100", help="checkpoint sizes, MB")
    parser.add_argument("--child", nargs=2, metavar=("SYSTEM", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--iterations", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--size-mb", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # Killed (timeout, Ctrl-C from a supervisor): the finally blocks still stop the services started here.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.child:
        print(json.dumps(child(*args.child, args)))
        return 0
    if not args.no_ray and not args.ray_venv:
        parser.error("give --ray-venv DIR, or --no-ray")
    sys.path.insert(0, BENCH_DIR)
    from ray_examples import ray_python

    systems = {"sweepflow": sys.executable}
    if not args.no_ray:
        systems["ray"] = ray_python(args.ray_venv)
    args.iterations = calibrate(args.step_s)
    sizes = [float(s) for s in args.sizes.split(",")]
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-trainable-home-") as home:
        env = {**os.environ, "SWEEPFLOW_HOME": home, "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
        sweepflow = os.path.join(os.path.dirname(sys.executable), "sweepflow")
        subprocess.run([sweepflow, "server", "start"], env=env, check=True, capture_output=True)
        try:
            # Each measurement on both systems back to back, so their figures come from the same minutes.
            rows: list[tuple[str, dict[str, str]]] = []
            # Plain before and after the trial, averaged: the machine's speed drifts (up to 3x between hours).
            base_gap, checkpoint_gap, row = {}, {}, {}
            for s, p in systems.items():
                before = span(run_child(p, s, "plain", args, 0, env)["steps"][0])
                t = run_child(p, s, "tune", args, 0, env)["steps"][0]
                after = span(run_child(p, s, "plain", args, 0, env)["steps"][0])
                plain = (before + after) / 2
                base_gap[s] = statistics.mean(gaps(t))
                row[s] = (
                    f"{span(t):.2f} s vs plain {plain:.2f} s ({before:.2f}/{after:.2f}): "
                    f"**{span(t) / plain:.3f}x**; gap {1000 * base_gap[s]:.0f} ms a report"
                )
            rows.append((f"{args.steps} steps of {args.step_s:.1f} s, no checkpoint", row))
            for size in sizes:
                row = {}
                for s, p in systems.items():
                    got = run_child(p, s, "checkpoint", args, size, env)["steps"][0]
                    checkpoint_gap[s, size] = statistics.mean(gaps(got))
                    extra = checkpoint_gap[s, size] - base_gap[s]
                    row[s] = (
                        f"{1000 * extra:.0f} ms a checkpoint (gap {1000 * statistics.mean(gaps(got)):.0f} ms)"
                    )
                rows.append((f"checkpoint every step, {size:g} MB", row))
            size = max(sizes)
            row = {}
            for s, p in systems.items():
                got = run_child(p, s, "pbt", args, size, env)
                loads = got["loads"]
                exploit_gaps = []
                for trial in got["steps"]:
                    for a, b in zip(trial, trial[1:], strict=False):
                        if any(a[1] <= load[0] <= b[0] for load in loads):
                            exploit_gaps.append(b[0] - a[1])
                if loads:
                    exploit_gap = statistics.mean(exploit_gaps or [0])
                    row[s] = (
                        f"{len(loads)} exploit(s): gap {1000 * exploit_gap:.0f} ms, "
                        f"{1000 * (exploit_gap - checkpoint_gap[s, size]):.0f} ms more than a checkpointed step's; "
                        f"of it load_checkpoint {1000 * statistics.mean(end - start for start, end in loads):.0f} ms"
                    )
                else:
                    row[s] = "no exploit happened"
            rows.append((f"PBT exploit, {size:g} MB checkpoint", row))
        finally:
            subprocess.run([sweepflow, "server", "stop"], env=env, check=False, capture_output=True)
    print(
        f"\nload average at the start {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; step = "
        f"{args.iterations} iterations of burn() (~{args.step_s} s here)\n"
    )
    print("| measurement | " + " | ".join(systems) + " |\n|---|" + "---|" * len(systems))
    for what, row in rows:
        print(f"| {what} | " + " | ".join(row[s] for s in systems) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
