"""``ddp_runtime.huggingface.transformers`` and Accelerate (issue 64 item 2): a Hugging Face Trainer and an
``Accelerator()`` loop inside a 2-rank TorchTrainer over gloo, with nothing but the group's environment."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("transformers", reason="the transformers extra: pip install 'sweepflow[transformers]'")

from hf_fns import corpus_frame, train_accelerate, train_transformers  # noqa: E402

import ddp_runtime as train  # noqa: E402
from ddp_runtime.torch import TorchTrainer  # noqa: E402


def _trainer(cluster, tmp_path, fn, name, **kwargs):
    return TorchTrainer(
        fn,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(name=name, storage_path=str(tmp_path / "results")),
        client=cluster,
        **kwargs,
    )


def test_a_transformers_trainer_reports_each_save_with_its_checkpoint_and_resumes_from_it(cluster, tmp_path):
    first = _trainer(cluster, tmp_path, train_transformers, "hf", train_loop_config={"epochs": 2}).fit()
    assert first.error is None, first.error
    history = first.metrics_history
    # 256 rows, 2 ranks, 16 per device: 8 steps an epoch; the Trainer saves after each epoch's evaluation.
    assert [m["step"] for m in history] == [8, 16] and all("eval_loss" in m and "loss" in m for m in history)
    with first.checkpoint.as_directory() as directory:
        saved = os.listdir(os.path.join(directory, "checkpoint"))
    assert "trainer_state.json" in saved and any(f.startswith("model") for f in saved), saved

    trainer = _trainer(cluster, tmp_path, train_transformers, "hf-resumed", train_loop_config={"epochs": 3})
    trainer.resume_from_checkpoint = first.checkpoint
    resumed = trainer.fit()
    assert resumed.error is None, resumed.error
    assert [m["step"] for m in resumed.metrics_history] == [24]  # epochs 1 and 2 came from the checkpoint
    assert resumed.metrics_history[-1]["eval_loss"] < history[0]["eval_loss"]


def test_a_transformers_trainer_reads_its_rank_s_dataset_shard(cluster, tmp_path):
    import ddp_runtime.data as data

    result = _trainer(
        cluster,
        tmp_path,
        train_transformers,
        "hf-shard",
        train_loop_config={"shard": True, "max_steps": 12, "steps_per_save": 4},
        datasets={"train": data.from_pandas(corpus_frame(256, 0))},
    ).fit()
    assert result.error is None, result.error
    # Each rank's shard is 128 rows, 8 batches of 16 a pass: 12 steps need a second pass, which the batches
    # (a ddp_runtime.data iterable, re-iterable as Ray's) start.
    assert [m["step"] for m in result.metrics_history] == [4, 8, 12]
    assert result.metrics_history[-1]["epoch"] > 1 and "loss" in result.metrics_history[-1]


def test_an_accelerator_built_in_the_function_trains_on_the_group(cluster, tmp_path):
    result = _trainer(cluster, tmp_path, train_accelerate, "accelerate", train_loop_config={"epochs": 2}).fit()
    assert result.error is None, result.error
    last = result.metrics_history[-1]
    assert last["num_processes"] == 2 and last["process_index"] == 0
    assert last["batches"] == 8  # 256 rows / 2 processes / 16: Accelerate sharded the loader by the group's ranks
    assert last["loss"] < result.metrics_history[0]["loss"]
