"""Every rank's checkpoint, as Ray merges them (issue 63, item 1): the files of every rank that passes
``report(checkpoint=...)`` go into one checkpoint, written by each rank, committed only once all are stored;
conflicts refused before anything is written; a rank dying mid-upload commits nothing. On local storage and on
S3 (moto). Run with ``-s`` for the figures (ranks, files, bytes, time to commit)."""

from __future__ import annotations

import json
import os

import pytest
from conftest import whole
from merge_fns import MB, conflicting_files, every_rank_writes, rank_one_dies_mid_upload

import ddp_runtime as train
from ddp_runtime.checkpoint import MARKER, RunStorage
from ddp_runtime.cluster import local_cluster
from ddp_runtime.torch import TorchTrainer

EPOCHS = 3
SIZE_MB = 4


@pytest.fixture(scope="module")
def _own_cluster():
    """This module's own 2 workers: its crash tests kill them (their nannies restart them)."""
    with local_cluster(n_workers=2) as client:
        yield client


@pytest.fixture
def cluster(_own_cluster):
    return whole(_own_cluster, 2)


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    """A run's storage: a local directory, or a bucket of a moto S3 server."""
    if request.param == "local":
        return {"kind": "local", "storage_path": str(tmp_path / "results"), "options": None}
    endpoint = request.getfixturevalue("s3_endpoint")
    import s3fs

    bucket = f"merge-{os.urandom(3).hex()}"
    s3fs.S3FileSystem(**endpoint["storage_options"]).mkdir(bucket)
    return {"kind": "s3", "storage_path": f"s3://{bucket}/runs", "options": endpoint["storage_options"]}


def _trainer(fn, config, where, name, cluster, **run) -> TorchTrainer:
    return TorchTrainer(
        fn,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name=name, storage_path=where["storage_path"], storage_options=where["options"], **run
        ),
        client=cluster,
    )


def test_every_ranks_files_are_merged_into_one_committed_checkpoint(cluster, where, tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    config = {"epochs": EPOCHS, "mb": SIZE_MB, "log": str(log), "named": True}
    result = _trainer(
        every_rank_writes,
        config,
        where,
        "merged",
        cluster,
        checkpoint_config=train.CheckpointConfig(
            num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
        ),
    ).fit()
    storage = RunStorage(where["storage_path"], "merged", where["options"])
    committed = storage.list_committed()
    assert [c.checkpoint.path.rsplit("/", 1)[-1] for c in committed] == ["epoch_1", "epoch_2"]  # num_to_keep
    assert result.checkpoint == committed[-1].checkpoint and result.checkpoint.path.endswith("/epoch_2")
    with result.checkpoint.as_directory() as d:
        names = sorted(set(os.listdir(d)) - {MARKER})  # the commit marker is there on local storage
        contents = {n: open(os.path.join(d, n), "rb").read() for n in ("model-rank=0.pt", "model-rank=1.pt")}
    assert names == [".metadata.json", "config.json", "model-rank=0.pt", "model-rank=1.pt"], names
    assert contents["model-rank=0.pt"][-2:] == bytes([0, 2]) and contents["model-rank=1.pt"][-2:] == bytes(
        [1, 2]
    )
    # Checkpoint metadata, as Ray's: set by rank 0 before the report, read and updated on the stored checkpoint.
    assert result.checkpoint.get_metadata() == {"by": "rank 0", "epoch": 2}
    result.checkpoint.update_metadata({"evaluated": True})
    assert result.checkpoint.get_metadata() == {"by": "rank 0", "epoch": 2, "evaluated": True}
    marker = result.checkpoint._marker()
    assert marker["ranks"] == [0, 1] and marker["files"] == 4 and marker["metrics"]["epoch"] == 2
    # get_all_reported_checkpoints on every rank: what retention kept, after each report.
    for rank in (0, 1):
        seen = json.loads((log / f"rank{rank}.json").read_text())
        assert [[epoch for _, epoch, _ in entry["listed"]] for entry in seen] == [[0], [0, 1], [1, 2]]
        assert {status for entry in seen for _, _, status in entry["listed"]} == {"COMMITTED"}
    rank0 = json.loads((log / "rank0.json").read_text())
    print(
        f"\nmerged checkpoint on {where['kind']}: ranks {marker['ranks']}, {marker['files']} files, "
        f"{marker['bytes']} bytes ({marker['bytes'] / MB:.1f} MB); agree+upload+confirm "
        f"{marker['write_s'] * 1000:.0f} ms; report() on rank 0 (with the commit and the driver's verdict) "
        + ", ".join(f"{e['report_s'] * 1000:.0f}" for e in rank0)
        + " ms"
    )


@pytest.mark.parametrize(
    "case",
    [
        {"extra": True},
        {"extra": True, "same_size": True},
        {"fsdp": True, "same_size": True},  # copies of one name, but shards of a sharded model
    ],
    ids=["sizes-differ", "bytes-differ", "fsdp-shards"],
)
def test_two_ranks_writing_one_file_with_different_bytes_fail_the_report_and_commit_nothing(
    cluster, tmp_path, case
):
    where = {"storage_path": str(tmp_path / "results"), "options": None}
    with pytest.raises(train.TrainingFailedError) as failure:
        _trainer(conflicting_files, case, where, "clash", cluster).fit()
    message = str(failure.value.result.error).splitlines()[0]
    assert (
        "ranks 0 and 1 both wrote 'model.pt' into this report's checkpoint, with different contents"
        in message
    )
    assert ("the same size, 1000 bytes, but other bytes" in message) == bool(case.get("same_size")), message
    assert not os.listdir(tmp_path / "results" / "clash")  # no checkpoint, no staging directory left
    print(f"\n{message}")


def test_copies_of_one_unsharded_checkpoint_keep_rank_zeros(cluster, tmp_path):
    """Ray's getting-started example: every rank saves the whole DDP model under one name, and BatchNorm's
    statistics make the copies differ. Rank 0's copy is committed (as before the merge), with a warning."""
    where = {"storage_path": str(tmp_path / "results"), "options": None}
    result = _trainer(conflicting_files, {"same_size": True}, where, "copies", cluster).fit()
    with result.checkpoint.as_directory() as d:
        assert open(os.path.join(d, "model.pt"), "rb").read() == bytes([0]) * 1000
    assert result.checkpoint._marker()["kept_lowest_rank_copy_of"] == ["model.pt"]


def test_a_rank_dying_mid_upload_commits_nothing_and_the_retry_commits_it_whole(cluster, where, tmp_path):
    name = "dies"
    run = f"{where['storage_path']}/{name}"
    config = {"files": 30, "once": str(tmp_path / "killed-once"), "run": run, "options": where["options"]}
    storage = RunStorage(where["storage_path"], name, where["options"])
    with pytest.raises(train.TrainingFailedError):
        _trainer(rank_one_dies_mid_upload, config, where, name, cluster).fit()
    assert os.path.exists(config["once"])
    assert storage.list_committed() == []  # nothing a resume or the registry would pick
    storage.fs.invalidate_cache()
    partial = storage.fs.glob(f"{storage.root}/**/rank1-part*.bin")
    assert 0 < len(partial) < 30, f"rank 1 died mid-upload: {len(partial)} of its 30 files were written"
    whole(cluster, 2)
    result = _trainer(
        rank_one_dies_mid_upload,
        config,
        where,
        name,
        cluster,
        failure_config=train.FailureConfig(max_failures=1),
    ).fit()
    [stored] = storage.list_committed()
    assert result.checkpoint == stored.checkpoint
    with stored.checkpoint.as_directory() as d:
        files = sorted(set(os.listdir(d)) - {MARKER})
    assert files == ["rank0-part000.bin"] + [f"rank1-part{i:03d}.bin" for i in range(30)]
    print(
        f"\n{where['kind']}: rank 1 killed after {len(partial)} of 30 files: nothing committed; the next run "
        f"committed all 31"
    )


def test_named_checkpoints_are_listed_by_index_and_a_committed_name_is_not_reused(tmp_path):
    from ddp_runtime.checkpoint import checked_dir_name

    storage = RunStorage(str(tmp_path), "run")
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.txt").write_text("x")
    assert train.Checkpoint.from_directory(src).get_metadata() == {}
    for index, name in enumerate(["zeta", "alpha", None]):
        storage.persist(str(src), index, {"i": index}, name=name)
    assert [c.checkpoint.path.rsplit("/", 1)[-1] for c in storage.list_committed()] == [
        "zeta",
        "alpha",
        "checkpoint_000002",
    ]
    with pytest.raises(FileExistsError, match="already has a committed checkpoint of that name"):
        storage.persist(str(src), 3, {}, name="alpha")
    for bad in ("a/b", ".hidden", ""):
        with pytest.raises(ValueError, match="checkpoint_dir_name"):
            checked_dir_name(bad)
    assert sorted(os.listdir(tmp_path / "run")) == ["alpha", "checkpoint_000002", "zeta"]  # no staging left


def test_load_full_state_dict_says_when_a_checkpoint_holds_no_distributed_checkpoint(tmp_path):
    from ddp_runtime.sharded import load_full_state_dict

    (tmp_path / "model.pt").write_bytes(b"not dcp")
    with pytest.raises(FileNotFoundError, match=r"holds no distributed checkpoint \(no .metadata file"):
        load_full_state_dict(str(tmp_path))
