"""Datasets for sweeps: fetch, verify, parse, split, normalise and store them once, load them anywhere.

Every DDP rank of every trial needs the same data, split the same way and normalised with the same
statistics, so ``prepare_dataset`` does that work once, up front, and writes a *prepared directory*
(``<cache_dir>/prepared/<dataset>-<fingerprint>/``: ``train.npz``, ``val.npz``, ``test.npz``, ``meta.json``)
that ranks only read (``load_split`` / ``load_meta``). The fingerprint covers the raw data's checksum, the
source and the split parameters: the same inputs map to the same directory, any change maps elsewhere.

Modules, in pipeline order:

* ``config``: ``DataConfig`` (the one pydantic data config, also the pipeline's ``data`` section) and the
  ``DATASETS`` registry; ``errors``: what can go wrong, and whether a retry can help.
* ``download``: fetching raw files from the official mirrors or a ``source`` override (``http(s)://``,
  ``s3://``, a directory), MD5-verified, atomically; or, for a source that publishes new data under the same
  names (``DataConfig.follow_source``), keyed by the version the source reports for each file.
* ``cache``: the local or remote (``s3://``) cache those files and the prepared sets live in.
* ``formats``: IDX, CIFAR-10 tarball (restricted unpickling) and bundled-dataset parsers.
* ``split``: seeded, stratified train/val/test split; standardisation with train statistics.
* ``prepared``: the prepared directory (``PreparedDataset``) and its readers; ``prepare``: ``prepare_dataset``.

The package imports neither Prefect nor MLflow (``tasks/download.py`` wraps it in a Prefect task), reads no
environment (``cache_dir`` and ``staging_dir`` come from the entry point), and imports torch only in
``load_split``.
"""

from .config import DATASETS, PREPARED_FORMAT_VERSION, DataConfig, DataCredentials, DatasetSpec
from .errors import (
    ChecksumMismatchError,
    DatasetConfigError,
    DatasetError,
    DatasetFetchError,
    DatasetFormatError,
    DatasetSourceError,
)
from .formats import read_cifar10_tarball, read_idx
from .prepare import prepare_dataset, source_versions
from .prepared import PreparedDataset, load_meta, load_split, prepared_dataset_exists
from .split import SPLITS

__all__ = [
    "DATASETS",
    "PREPARED_FORMAT_VERSION",
    "SPLITS",
    "ChecksumMismatchError",
    "DataConfig",
    "DataCredentials",
    "DatasetConfigError",
    "DatasetError",
    "DatasetFetchError",
    "DatasetFormatError",
    "DatasetSourceError",
    "DatasetSpec",
    "PreparedDataset",
    "load_meta",
    "load_split",
    "prepare_dataset",
    "prepared_dataset_exists",
    "read_cifar10_tarball",
    "read_idx",
    "source_versions",
]
