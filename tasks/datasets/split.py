"""Splitting into train/val/test with a fixed seed (stratified when every class can be), and standardisation
with the train split's statistics."""

from __future__ import annotations

import math

import numpy as np

from .errors import DatasetConfigError

#: The prepared splits, in the order they are written and reported.
SPLITS: tuple[str, ...] = ("train", "val", "test")


def _can_stratify(y: np.ndarray, n_held_out: int) -> bool:
    counts = np.bincount(y)
    counts = counts[counts > 0]
    return bool(counts.min() >= 2 and n_held_out >= len(counts) and len(y) - n_held_out >= len(counts))


def _holdout(
    indices: np.ndarray, y: np.ndarray, fraction: float, seed: int, what: str, name: str
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Split ``indices`` into sorted (kept, held_out), stratified by ``y[indices]`` when every class allows it.

    Implemented with numpy's seeded Generator rather than scikit-learn so the split for a given seed does
    not change with a library upgrade (and training-side imports stay light). Per-class quotas use the
    largest-remainder rule, so class proportions are kept as closely as integers allow.
    """
    n_held = math.ceil(fraction * len(indices))
    if n_held < 1 or n_held >= len(indices):
        raise DatasetConfigError(
            f"DataConfig: {what}={fraction} of {len(indices)} {name} images leaves an empty split; "
            f"choose a fraction giving between 1 and {len(indices) - 1} images"
        )
    rng = np.random.default_rng(seed)
    labels = y[indices]
    stratified = _can_stratify(labels, n_held)
    if stratified:
        classes, counts = np.unique(labels, return_counts=True)
        quota = counts * n_held / len(labels)
        take = np.floor(quota).astype(np.int64)
        extra = np.argsort(-(quota - take), kind="stable")[: n_held - int(take.sum())]
        take[extra] += 1
        held = np.concatenate(
            [rng.permutation(indices[labels == c])[:k] for c, k in zip(classes, take, strict=True)]
        )
    else:
        held = rng.permutation(indices)[:n_held]
    return np.setdiff1d(indices, held), np.sort(held), stratified


def split(
    x: np.ndarray,
    y: np.ndarray,
    test_x: np.ndarray | None,
    test_y: np.ndarray | None,
    *,
    val_fraction: float,
    test_fraction: float,
    seed: int,
    name: str,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], bool]:
    """(images, labels, stratified): the three splits of a parsed dataset, by name.

    With an official test set (``test_x``/``test_y``) that set is the test split and val is carved from
    ``x``; otherwise test, then val, are carved from ``x``, both fractions being shares of the whole pool.
    """
    pool = np.arange(len(y))
    if test_x is None or test_y is None:
        rest, test_idx, strat_test = _holdout(pool, y, test_fraction, seed, "test_fraction", name)
        val_share = val_fraction / (1 - test_fraction)  # val_fraction is a share of the whole pool
        train_idx, val_idx, strat_val = _holdout(rest, y, val_share, seed, "val_fraction", name)
        images = {"train": x[train_idx], "val": x[val_idx], "test": x[test_idx]}
        labels = {"train": y[train_idx], "val": y[val_idx], "test": y[test_idx]}
        return images, labels, strat_test and strat_val
    train_idx, val_idx, stratified = _holdout(pool, y, val_fraction, seed, "val_fraction", name)
    images = {"train": x[train_idx], "val": x[val_idx], "test": test_x}
    labels = {"train": y[train_idx], "val": y[val_idx], "test": test_y}
    return images, labels, stratified


def standardise(
    splits: dict[str, np.ndarray], pixel_max: float
) -> tuple[dict[str, np.ndarray], list[float], list[float]]:
    """Scale to [0, 1], then standardise each channel with the train split's mean/std (never val/test's)."""
    train = splits["train"].astype(np.float32) / np.float32(pixel_max)
    mean = train.mean(axis=(0, 2, 3), dtype=np.float64)
    std = train.std(axis=(0, 2, 3), dtype=np.float64)
    std = np.where(std < 1e-8, 1.0, std)  # a constant channel: centre it, do not blow it up
    mean32 = mean.astype(np.float32)[None, :, None, None]
    std32 = std.astype(np.float32)[None, :, None, None]
    out = {"train": (train - mean32) / std32}
    for name in ("val", "test"):
        out[name] = (splits[name].astype(np.float32) / np.float32(pixel_max) - mean32) / std32
    return out, [float(v) for v in mean], [float(v) for v in std]
