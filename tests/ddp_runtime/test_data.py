"""``ddp_runtime.data`` (Ray Data's subset on Dask): the operations against pandas on files written here, the
refusals, and ``TorchTrainer(datasets=...)`` + ``get_dataset_shard`` on real 2-rank groups: every row once per
epoch with equal batch counts, a dataset several times a worker's memory limit, and Ray Train's regression
example's calls on an S3 (moto) CSV."""

from __future__ import annotations

import json
import math
import os
import traceback

import numpy as np
import pandas as pd
import pytest
import torch

import ddp_runtime as train
import ddp_runtime.data as rd
from ddp_runtime.torch import TorchTrainer, prepare_model

# ------------------------------------------------------------------------------------------- pure operations


def _truth(n: int = 1003) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "id": np.arange(n, dtype=np.int64),
            "x": rng.normal(size=n),
            "k": rng.integers(0, 5, size=n).astype(np.int64),
        }
    )


def _same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(
        got.reset_index(drop=True), want.reset_index(drop=True), check_dtype=False, check_exact=False
    )


@pytest.fixture
def files(tmp_path):
    """The same table as CSV (two files), Parquet (a directory of three) and JSON lines."""
    df = _truth()
    (tmp_path / "csv").mkdir()
    df.iloc[:400].to_csv(tmp_path / "csv" / "a.csv", index=False)
    df.iloc[400:].to_csv(tmp_path / "csv" / "b.csv", index=False)
    (tmp_path / "pq").mkdir()
    for i, (lo, hi) in enumerate([(0, 100), (100, 700), (700, len(df))]):
        df.iloc[lo:hi].to_parquet(tmp_path / "pq" / f"part-{i}.parquet", index=False)
    df.to_json(tmp_path / "rows.jsonl", orient="records", lines=True)
    return df, tmp_path


def test_readers_give_the_rows_written(files):
    df, d = files
    for ds in (
        rd.read_csv(str(d / "csv" / "*.csv")),
        rd.read_csv([str(d / "csv" / "a.csv"), str(d / "csv" / "b.csv")]),
        rd.read_parquet(str(d / "pq")),
        rd.read_json(str(d / "rows.jsonl")),
    ):
        _same(ds.to_pandas(), df)
        assert ds.count() == len(df)
        assert ds.columns() == ["id", "x", "k"]
        assert dict(zip(ds.schema().names, ds.schema().types, strict=True))["x"] == np.float64
        _same(pd.DataFrame(ds.take(3)), df.iloc[:3])  # JSON keeps 10 significant digits
    assert rd.read_parquet(str(d / "pq")).num_blocks() == 3
    assert rd.read_parquet(str(d / "pq"), columns=["x"]).columns() == ["x"]


def test_transformations_match_pandas(files):
    df, d = files
    ds = rd.read_parquet(str(d / "pq"))

    def scale(batch: pd.DataFrame) -> pd.DataFrame:
        return batch.assign(y=batch["x"] * 2 + batch["k"])

    want = df.assign(y=df["x"] * 2 + df["k"])
    _same(ds.map_batches(scale).to_pandas(), want)
    _same(ds.map_batches(scale, batch_size=7).to_pandas(), want)

    def numpy_fn(batch: dict) -> dict:
        assert isinstance(batch["x"], np.ndarray)
        rows = len(batch["x"])
        return {"id": batch["id"], "x2": batch["x"] ** 2, "batch_rows": np.full(rows, rows)}

    local = rd.from_pandas(df, override_num_blocks=3)
    out = local.map_batches(numpy_fn, batch_format="numpy", batch_size=100).to_pandas()
    # Read from the output, not from a list the function appends to: under a distributed client (one an
    # earlier test made the default) the function runs in another process.
    assert out["batch_rows"].max() == 100  # batches within a partition, as Ray's
    _same(out.drop(columns="batch_rows"), df[["id"]].assign(x2=df.x**2))
    _same(
        ds.map(lambda r: {"id": r["id"], "s": r["x"] + r["k"]}).to_pandas(), df[["id"]].assign(s=df.x + df.k)
    )
    _same(ds.filter(lambda r: r["k"] == 2).to_pandas(), df[df.k == 2])
    assert ds.map_batches(scale).columns() == ["id", "x", "k", "y"]

    shuffled = ds.random_shuffle(seed=7).to_pandas()
    assert sorted(shuffled["id"]) == list(df["id"]) and list(shuffled["id"]) != list(df["id"])
    assert list(ds.random_shuffle(seed=7).to_pandas()["id"]) == list(shuffled["id"])  # seeded: reproducible

    train_ds, test_ds = ds.train_test_split(test_size=0.25)
    n_test = math.ceil(len(df) * 0.25)
    _same(train_ds.to_pandas(), df.iloc[: len(df) - n_test])
    _same(test_ds.to_pandas(), df.iloc[len(df) - n_test :])
    a, b = ds.train_test_split(test_size=100, shuffle=True, seed=1)
    ids_a, ids_b = set(a.to_pandas()["id"]), set(b.to_pandas()["id"])
    assert len(ids_b) == 100 and not ids_a & ids_b and ids_a | ids_b == set(df["id"])

    parts = ds.split(4)
    assert [p.count() for p in parts] == [250, 251, 251, 251]
    _same(pd.concat([p.to_pandas() for p in parts]), df)
    assert [p.count() for p in ds.split(4, equal=True)] == [250] * 4

    assert ds.take(5) == df.iloc[:5].to_dict("records")
    batch = ds.take_batch(6)
    assert set(batch) == {"id", "x", "k"} and np.array_equal(batch["id"], np.arange(6))
    _same(ds.take_batch(6, batch_format="pandas"), df.iloc[:6])
    sizes = [len(b["id"]) for b in ds.iter_batches(batch_size=128)]
    assert sizes == [128] * 7 + [len(df) - 7 * 128]  # across partition boundaries, only the last short
    assert sum(len(b) for b in ds.iter_batches(batch_size=None, batch_format="pandas")) == len(df)
    tb = list(ds.iter_torch_batches(batch_size=500, dtypes=torch.float32))
    assert [t["x"].dtype for t in tb] == [torch.float32] * 3 and torch.allclose(
        torch.cat([t["x"] for t in tb]), torch.tensor(df["x"].to_numpy(), dtype=torch.float32)
    )
    mixed = next(iter(ds.iter_torch_batches(batch_size=4, dtypes={"x": torch.float16})))
    assert mixed["x"].dtype == torch.float16 and mixed["id"].dtype == torch.int64
    collated = next(iter(ds.iter_torch_batches(batch_size=4, collate_fn=lambda b: torch.tensor(b["k"]))))
    assert torch.equal(collated, torch.tensor(df["k"].to_numpy()[:4]))
    assert ds.sum("k") == df["k"].sum() and ds.max("x") == df["x"].max()
    assert ds.limit(10).count() == 10 and ds.union(ds).count() == 2 * len(df)


def test_in_memory_sources():
    assert rd.range(10, override_num_blocks=3).take_all() == [{"id": i} for i in range(10)]
    assert rd.from_items([{"a": 1}, {"a": 2}]).take() == [{"a": 1}, {"a": 2}]
    assert rd.from_items(["u", "v"]).take() == [{"item": "u"}, {"item": "v"}]
    images = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    batch = rd.from_numpy(images).take_batch(4)
    assert np.array_equal(batch["data"], images)  # one array per row, stacked again in the batch
    assert np.array_equal(rd.from_numpy(np.arange(5)).take_batch(5)["data"], np.arange(5))
    two = rd.from_pandas([_truth(10), _truth(5)])
    assert two.num_blocks() == 2 and two.count() == 15


def test_what_is_not_built_is_refused_in_one_sentence():
    with pytest.raises(
        rd.NotBuiltError, match=r"ray\.data\.read_images is not built: read_parquet, read_csv"
    ):
        rd.read_images  # noqa: B018
    with pytest.raises(ImportError, match="from_pandas"):
        from ddp_runtime.data import from_arrow  # noqa: F401
    ds = rd.range(4)
    with pytest.raises(NotImplementedError, match=r"Dataset\.groupby \(Ray Data\) is not built here: use"):
        ds.groupby("id")
    with pytest.raises(NotImplementedError, match="get_dataset_shard"):
        ds.streaming_split(2)
    with pytest.raises(AttributeError):
        ds.no_such_method  # noqa: B018
    with pytest.raises(ValueError, match="batch_format must be 'pandas' or 'numpy'"):
        ds.map_batches(lambda b: b, batch_format="pyarrow")
    with pytest.raises(TypeError, match="callable classes"):
        ds.map_batches(dict)
    with pytest.raises(ValueError, match="actor pools and task resources are not built"):
        ds.map_batches(lambda b: b, compute="actors")
    with pytest.raises(ValueError, match=r"local shuffling is not built; call random_shuffle\(\)"):
        ds.iter_torch_batches(local_shuffle_buffer_size=100)
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'"):
        ds.iter_batches(batchsize=3)
    assert len(list(ds.iter_batches(batch_size=2, prefetch_batches=4))) == 2  # a hint: accepted
    assert rd.DataConfig is train.DataConfig


def test_trainer_checks_its_datasets_before_any_work():
    with pytest.raises(
        TypeError, match=r"not datasets: \{'train': 'DataFrame'\} among the names given: \['train', 'val'\]"
    ):
        TorchTrainer(_noop, datasets={"train": pd.DataFrame({"a": [1]}), "val": rd.range(3)})
    with pytest.raises(
        ValueError,
        match=r"names \['test'\], which are not in TorchTrainer\(datasets=...\); given: \['train'\]",
    ):
        TorchTrainer(
            _noop,
            datasets={"train": rd.range(3)},
            dataset_config=train.DataConfig(datasets_to_split=["test"]),
        )
    with pytest.raises(ValueError, match="datasets_to_split"):
        train.DataConfig(datasets_to_split="train")
    with pytest.raises(RuntimeError, match="only be called inside a training function"):
        train.get_dataset_shard("train")


def _noop() -> None:
    pass


# --------------------------------------------------------------------------------------- on 2-rank groups


def shard_coverage(config: dict) -> None:
    """Two epochs over the split "train" shard (one DDP step per batch: an unequal batch count would hang the
    group) and one over the unsplit "whole"; records the ids each rank saw."""
    ctx = train.get_context()
    model = prepare_model(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    shard = train.get_dataset_shard("train")
    epochs = []
    for _ in range(2):
        ids, batches = [], 0
        for batch in shard.iter_torch_batches(batch_size=config["batch_size"], dtypes={"x": torch.float32}):
            ids.extend(batch["id"].tolist())
            batches += 1
            loss = model(batch["x"].unsqueeze(1)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        epochs.append({"ids": ids, "batches": batches})
    whole = [int(i) for b in train.get_dataset_shard("whole").iter_batches(batch_size=None) for i in b["id"]]
    try:
        train.get_dataset_shard("nope")
        unknown = None
    except KeyError as exc:
        unknown = str(exc)
    out = {"epochs": epochs, "whole": whole, "unknown": unknown}
    with open(os.path.join(config["out"], f"rank{ctx.get_world_rank()}.json"), "w") as f:
        json.dump(out, f)
    train.report({"batches": epochs[0]["batches"]})


@pytest.mark.dask
def test_each_rank_streams_its_own_equal_shard(small_workers, tmp_path, files):
    df, d = files  # 1003 rows in three Parquet files of 100, 600 and 303 rows
    ds = rd.read_parquet(str(d / "pq")).map_batches(lambda b: b.assign(x=b["x"].astype("float32")))
    whole = rd.read_csv(str(d / "csv" / "*.csv"))
    result = TorchTrainer(
        shard_coverage,
        train_loop_config={"batch_size": 64, "out": str(tmp_path)},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(storage_path=str(tmp_path / "results")),
        torch_config=train.TorchConfig(hang_timeout_s=120),
        datasets={"train": ds, "whole": whole},
        dataset_config=train.DataConfig(datasets_to_split=["train"]),
        client=small_workers,
    ).fit()
    assert result.error is None
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    per_rank = len(df) // 2  # 501: the one remainder row (the last) is dropped
    for epoch in (0, 1):
        seen = [r["epochs"][epoch]["ids"] for r in ranks]
        assert [len(s) for s in seen] == [per_rank, per_rank]
        assert not set(seen[0]) & set(seen[1])
        assert sorted(seen[0] + seen[1]) == list(range(2 * per_rank))  # every row once, but the dropped last
        assert (
            ranks[0]["epochs"][epoch]["batches"]
            == ranks[1]["epochs"][epoch]["batches"]
            == math.ceil(per_rank / 64)
        )
    assert ranks[0]["whole"] == ranks[1]["whole"] == list(range(len(df)))  # unsplit: all of it on every rank
    assert "given: ['train', 'whole']" in ranks[0]["unknown"]


def memory_bound(config: dict) -> None:
    """One epoch over a shard of generated rows through iter_torch_batches; records the worker's peak memory."""
    model = prepare_model(torch.nn.Linear(config["width"], 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rows = 0
    for batch in train.get_dataset_shard("train").iter_torch_batches(
        batch_size=config["batch_size"], collate_fn=_stack
    ):
        loss = model(batch).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        rows += len(batch)
    with open("/proc/self/status") as f:
        peak_kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    train.report({"rows": rows, "peak_bytes": peak_kib * 1024})


def _stack(batch: dict) -> torch.Tensor:
    return torch.as_tensor(np.stack([batch[f"f{i}"] for i in range(len(batch) - 1)], axis=1))


def _features(batch: pd.DataFrame, width: int) -> pd.DataFrame:
    rng = np.random.default_rng(int(batch["id"].iloc[0]) if len(batch) else 0)
    values = rng.random((len(batch), width), dtype=np.float32)
    return pd.DataFrame({"id": batch["id"].to_numpy(), **{f"f{i}": values[:, i] for i in range(width)}})


# Per worker. A rank's worker holds ~760-800 MiB of it before any data (torch, gloo, autograd: measured), so Dask's
# pause at 80 % is turned off (a paused worker computes no partition and its rank would wait); the nanny still
# kills a worker past 95 %. At 1 GiB that left ~200 MiB for the partitions in flight and the nanny killed a rank
# now and then (two partitions of 13.6 MB, their pandas and torch copies, allocator slack): 1.25 GiB leaves ~400.
MEMORY_LIMIT = 5 * 2**28


@pytest.fixture(scope="module")
def small_workers():
    """Two 1-thread workers of MEMORY_LIMIT each (torch preloaded, as ddp_runtime's local clusters), not pausing:
    the module's 2-rank groups all run on them (one cluster start, one cold start of DDP)."""
    import dask
    from distributed import Client, LocalCluster

    from ddp_runtime.cluster import PRELOAD, worker_config

    with dask.config.set({**worker_config(), "distributed.worker.memory.pause": False}):
        cluster = LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            memory_limit=MEMORY_LIMIT,
            preload=[PRELOAD],
        )
    with cluster, Client(cluster) as client:
        yield client


@pytest.mark.dask
def test_a_dataset_larger_than_a_worker_trains_through_its_shards(small_workers, tmp_path):
    width, rows = 32, 10_000_000  # 1e7 x (32 float32 + an int64 id) = 1.36 GB in memory, over MEMORY_LIMIT
    dataset_bytes = rows * (width * 4 + 8)
    ds = rd.range(rows, override_num_blocks=80).map_batches(_features, fn_kwargs={"width": width})
    result = TorchTrainer(
        memory_bound,
        train_loop_config={"width": width, "batch_size": 32768},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(storage_path=str(tmp_path / "results")),
        datasets={"train": ds},
        client=small_workers,
    ).fit()
    assert result.error is None
    assert result.metrics["rows"] == rows // 2
    peak = result.metrics["peak_bytes"]
    print(
        f"startup {result.startup_s:.1f} s, training {result.train_time_s:.1f} s; dataset {dataset_bytes / 2**20:.0f} MiB, worker limit {MEMORY_LIMIT / 2**20:.0f} MiB, rank 0 peak {peak / 2**20:.0f} MiB"
    )
    assert dataset_bytes > MEMORY_LIMIT and peak < MEMORY_LIMIT


# ----------------------------------------------------------------------- Ray Train's regression example, ported


def regression_train_func(config: dict) -> None:
    """What Ray's example's train_func does: shards as float32 tensor batches, an MLP, MSE, a loss per epoch."""
    model = prepare_model(
        torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    opt = torch.optim.Adam(model.parameters(), lr=config["lr"])
    loss_fn = torch.nn.MSELoss()
    train_shard = train.get_dataset_shard("train")
    val_shard = train.get_dataset_shard("validation")
    for epoch in range(config["epochs"]):
        for batch in train_shard.iter_torch_batches(batch_size=config["batch_size"], dtypes=torch.float32):
            features = torch.stack([batch["a"], batch["b"], batch["c"]], dim=1)
            loss = loss_fn(model(features), batch["y"].unsqueeze(1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            total, n = 0.0, 0
            for batch in val_shard.iter_torch_batches(batch_size=config["batch_size"], dtypes=torch.float32):
                features = torch.stack([batch["a"], batch["b"], batch["c"]], dim=1)
                total += loss_fn(model(features), batch["y"].unsqueeze(1)).item() * len(features)
                n += len(features)
        train.report({"epoch": epoch, "loss": loss.item(), "val_loss": total / n})


def _standardize(batch: pd.DataFrame) -> pd.DataFrame:
    return batch.assign(**{c: (batch[c] - 0.5) / 0.29 for c in ("a", "b", "c")})


@pytest.mark.dask
def test_ray_trains_regression_example_runs_on_s3(small_workers, s3_endpoint, tmp_path):
    import s3fs

    options = s3_endpoint["storage_options"]
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir("regression")
    rng = np.random.default_rng(0)
    x = rng.random((2000, 3))
    frame = pd.DataFrame(x, columns=["a", "b", "c"]).assign(y=x @ np.array([2.0, -1.0, 0.5]) + 0.1)
    with fs.open("regression/data.csv", "w") as f:
        frame.to_csv(f, index=False)

    secret = {**options, "secret": "s3cr3t-never-shown"}  # moto takes any credentials
    with pytest.raises(FileNotFoundError) as missing:
        rd.read_csv("s3://no-such-bucket/data.csv", storage_options=secret)
    assert "s3cr3t" not in "".join(traceback.format_exception(missing.value))

    # Ray's spelling of a public bucket (pyarrow's s3://anonymous@bucket/...): read without credentials.
    fs.chmod("regression/data.csv", acl="public-read")
    public = rd.read_csv("s3://anonymous@regression/data.csv", storage_options={"client_kwargs": options["client_kwargs"]})
    assert public.count() == 2000

    dataset = rd.read_csv("s3://regression/data.csv", storage_options=options)
    dataset = dataset.map_batches(_standardize, batch_format="pandas")
    train_dataset, validation_dataset = dataset.train_test_split(test_size=0.3)
    trainer = TorchTrainer(
        regression_train_func,
        train_loop_config={"lr": 0.01, "epochs": 4, "batch_size": 32},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(storage_path=str(tmp_path / "results")),
        datasets={"train": train_dataset, "validation": validation_dataset},
        client=small_workers,
    )
    result = trainer.fit()
    losses = [m["val_loss"] for m in result.metrics_history]
    print(f"regression example: loss {result.metrics['loss']:.4f}, validation loss per epoch {losses}")
    assert result.error is None and len(losses) == 4
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
