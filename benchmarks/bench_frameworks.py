"""A Lightning trial and a Transformers trial inside a Dask worker vs the same in a plain process (issue 64 item 5).

    .venv/bin/python benchmarks/bench_frameworks.py [--repeats 3] [--lightning-epochs 20] [--transformers-epochs 10]

Each framework's loop runs the same model, data, epochs and per-epoch checkpoint in both places, with one torch
thread in both (a pipeline worker has one):

- **plain**: the framework's own loop in this process (Lightning's ``Trainer`` with a ``ModelCheckpoint`` every
  epoch; Transformers' ``Trainer`` saving every epoch), as a team runs it without sweepflow;
- **worker**: the same function through ``TorchTrainer`` on a warm one-rank group of a local cluster, with
  ``ddp_runtime.lightning`` / ``ddp_runtime.huggingface.transformers`` (strategy, environment, report callback:
  each epoch's metrics and checkpoint reported and committed).

Printed per framework: the medians of ``--repeats`` runs, plain and worker, alternated, and the ratio worker /
plain of the loop's own time (``trainer.fit``/``train()``, measured inside the function) and of the whole call
(the driver's ``fit()``, group start-up and the report of the last checkpoint included). Asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import ddp_runtime as train
from ddp_runtime.cluster import local_cluster
from ddp_runtime.torch import TorchTrainer


def _digits() -> tuple[TensorDataset, TensorDataset]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    return TensorDataset(x[:1400], y[:1400]), TensorDataset(x[1400:], y[1400:])


def lightning_trial(config: dict) -> float:
    """A digits MLP for ``config["epochs"]`` epochs; returns the seconds ``trainer.fit`` took."""
    import lightning.pytorch as pl

    torch.set_num_threads(1)

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            width = config["width"]
            self.net = torch.nn.Sequential(
                torch.nn.Linear(64, width),
                torch.nn.ReLU(),
                torch.nn.Linear(width, width),
                torch.nn.ReLU(),
                torch.nn.Linear(width, 10),
            )

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.log("train_loss", loss, on_epoch=True, on_step=False)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    train_set, val_set = _digits()
    common = {
        "max_epochs": config["epochs"],
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "logger": False,
    }
    scratch = tempfile.mkdtemp(prefix="bench-lightning-")
    if config["in_worker"]:
        from ddp_runtime.lightning import (
            RayDDPStrategy,
            RayLightningEnvironment,
            RayTrainReportCallback,
            prepare_trainer,
        )

        trainer = prepare_trainer(
            pl.Trainer(
                devices="auto",
                accelerator="auto",
                strategy=RayDDPStrategy(),
                plugins=[RayLightningEnvironment()],
                callbacks=[RayTrainReportCallback()],
                enable_checkpointing=False,
                **common,
            )
        )
    else:
        every_epoch = pl.callbacks.ModelCheckpoint(dirpath=scratch, save_top_k=-1, every_n_epochs=1)
        trainer = pl.Trainer(accelerator="cpu", devices=1, callbacks=[every_epoch], **common)
    loaders = DataLoader(train_set, batch_size=32, shuffle=True), DataLoader(val_set, batch_size=256)
    started = time.perf_counter()
    trainer.fit(Net(), *loaders)
    took = time.perf_counter() - started
    shutil.rmtree(scratch, ignore_errors=True)
    return took


def _corpus(n: int, seed: int) -> list[dict]:
    """Token-id sequences of 12; label 1 when token 7 appears."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(8, 40, (n, 12), generator=g)
    positive = torch.rand(n, generator=g) < 0.5
    ids[positive, 3] = 7
    mask = torch.ones(12, dtype=torch.long)
    return [{"input_ids": ids[i], "attention_mask": mask, "labels": positive[i].long()} for i in range(n)]


def transformers_trial(config: dict) -> float:
    """A tiny BERT on a generated corpus for ``config["epochs"]`` epochs; returns the seconds ``train()`` took."""
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=40,
            hidden_size=config["width"],
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=2 * config["width"],
            max_position_embeddings=12,
            num_labels=2,
        )
    )
    scratch = tempfile.mkdtemp(prefix="bench-transformers-")
    args = TrainingArguments(
        output_dir=scratch,
        eval_strategy="epoch",
        save_strategy="epoch",
        logging_strategy="epoch",
        num_train_epochs=config["epochs"],
        per_device_train_batch_size=16,
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
        save_total_limit=1,
    )
    callbacks = []
    if config["in_worker"]:
        from ddp_runtime.huggingface.transformers import RayTrainReportCallback

        callbacks = [RayTrainReportCallback()]
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=_corpus(1024, 0),
        eval_dataset=_corpus(128, 1),
        callbacks=callbacks,
    )
    if config["in_worker"]:
        from ddp_runtime.huggingface.transformers import prepare_trainer

        trainer = prepare_trainer(trainer)
    started = time.perf_counter()
    trainer.train()
    took = time.perf_counter() - started
    shutil.rmtree(scratch, ignore_errors=True)
    return took


def _in_worker(fn, config: dict, client, storage: str) -> tuple[float, float]:
    """(seconds inside the function, seconds of the driver's fit()) of one one-rank TorchTrainer run."""
    timing: dict[str, float] = {}

    def timed(cfg: dict) -> None:
        timing_s = fn(cfg)
        train.report({"loop_s": timing_s})

    started = time.perf_counter()
    result = TorchTrainer(
        timed,
        train_loop_config={**config, "in_worker": True},
        scaling_config=train.ScalingConfig(num_workers=1),
        run_config=train.RunConfig(storage_path=storage),
        client=client,
    ).fit()
    timing["fit_s"] = time.perf_counter() - started
    return float(result.metrics["loop_s"]), timing["fit_s"]


def _plain(fn, config: dict) -> tuple[float, float]:
    started = time.perf_counter()
    loop_s = fn({**config, "in_worker": False})
    return loop_s, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    # About 1-s epochs on the 2-core machine, 20-s trials: a report's fixed cost (the checkpoint's durable copy,
    # the round trip to the driver) against an epoch of that length.
    parser.add_argument("--lightning-epochs", type=int, default=20)
    parser.add_argument("--lightning-width", type=int, default=768)
    parser.add_argument("--transformers-epochs", type=int, default=10)
    parser.add_argument("--transformers-width", type=int, default=192)
    args = parser.parse_args()
    storage = tempfile.mkdtemp(prefix="sweepflow-bench-frameworks-")
    cases = [
        ("lightning", lightning_trial, args.lightning_epochs, args.lightning_width),
        ("transformers", transformers_trial, args.transformers_epochs, args.transformers_width),
    ]
    with local_cluster(n_workers=1) as client:
        for name, fn, epochs, width in cases:
            # Warm-up, both places: the first call pays the framework's imports (seconds) in either.
            _plain(fn, {"epochs": 1, "width": width})
            _in_worker(fn, {"epochs": 1, "width": width}, client, storage)
            plain, worker = [], []
            for _ in range(args.repeats):  # alternated: the machine's speed drifts between minutes
                plain.append(_plain(fn, {"epochs": epochs, "width": width}))
                worker.append(_in_worker(fn, {"epochs": epochs, "width": width}, client, storage))
            p_loop, p_all = (statistics.median(x[i] for x in plain) for i in (0, 1))
            w_loop, w_all = (statistics.median(x[i] for x in worker) for i in (0, 1))
            print(
                f"{name:12} {epochs} epochs (width {width}), median of {args.repeats}: plain loop {p_loop:.2f} s (call {p_all:.2f} s), "
                f"worker loop {w_loop:.2f} s (fit {w_all:.2f} s); ratio loop {w_loop / p_loop:.3f}, "
                f"whole call {w_all / p_all:.3f}"
            )
    shutil.rmtree(storage, ignore_errors=True)


if __name__ == "__main__":
    main()
