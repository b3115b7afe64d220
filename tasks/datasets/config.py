"""What to prepare: ``DataConfig``, the one data config (the registry of known datasets: ``catalog.py``).

``DataConfig`` is a frozen pydantic model that is at once the library's input (``prepare_dataset``, the
``download_dataset`` task), the pipeline config's ``data`` section (``flows/config.py``) and the source of
the Prefect cache key (``cache_identity()``). It reads no environment: machine-dependent locations
(``cache_dir``, ``staging_dir``) are filled in by the entry point. An invalid field raises
``DatasetConfigError`` naming the field and the fix; inside a larger model (``PipelineConfig``) the same
message arrives in pydantic's ``ValidationError``.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import fsspec
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from .catalog import DATASETS, DatasetName, DatasetSpec
from .errors import DatasetConfigError
from .uris import endpoint_url, protocol, redact, split_userinfo

__all__ = [
    "DATASETS",
    "PREPARED_FORMAT_VERSION",
    "DataConfig",
    "DataCredentials",
    "DatasetName",
    "DatasetSpec",
]

#: Bump when the prepared files' layout or the preparation logic changes: it is part of the fingerprint,
#: so old prepared directories are simply no longer found (and can be deleted) instead of being misread.
PREPARED_FORMAT_VERSION = 1


# --------------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------------

#: fsspec protocols that can be read but not written (or not shared between hosts): not usable as cache_dir.
_READ_ONLY_PROTOCOLS = frozenset({"http", "https", "github", "git", "zip", "tar", "libarchive", "reference"})


@dataclass(frozen=True, repr=False)
class DataCredentials:
    """What ``DataConfig.without_credentials`` took out of a config (``repr`` shows none of it)."""

    public_source: str | None = None  # the source as the public config has it
    source: str | None = None  # ... and with its user:password@
    storage_options: dict[str, Any] | None = None
    cache_dir: str | None = None
    cache_storage_options: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return "DataCredentials(<hidden>)"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _checked_options(field_name: str, options: Any) -> dict[str, Any]:
    """``options`` as a deep-copied JSON-able dict, or a DatasetConfigError naming ``field_name``."""
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise DatasetConfigError(
            f"DataConfig.{field_name} must be a dict with string keys or None (got {type(options).__name__})"
        )
    try:
        return json.loads(json.dumps(options, sort_keys=True))
    except (TypeError, ValueError) as exc:
        raise DatasetConfigError(
            f"DataConfig.{field_name} must be JSON-serialisable (they travel as task parameters and "
            f"cache keys): {exc}. Pass plain strings/numbers/dicts, e.g. client_kwargs.endpoint_url"
        ) from exc


#: Where a dataset's source may be: what the download reads, checks before work (preflight) and tests serve.
SOURCE_SCHEMES = frozenset({"http", "https", "s3", "file"})


def _remote_cache_dir(cache_dir: str, scheme: str) -> str:
    """A remote ``cache_dir`` checked (writable, shared, no credentials) and without a trailing slash."""
    if scheme not in fsspec.available_protocols():
        raise DatasetConfigError(
            f"DataConfig.cache_dir: unsupported scheme {scheme!r} in {redact(cache_dir)!r}; use a local "
            "directory or a writable fsspec URI such as s3://bucket/prefix"
        )
    if scheme in _READ_ONLY_PROTOCOLS:
        raise DatasetConfigError(
            f"DataConfig.cache_dir: {scheme}:// is read-only, but the cache is written to "
            f"(got {redact(cache_dir)!r}); use a local directory or a writable store such as s3://bucket/prefix, "
            "and put a read-only mirror in `source` instead"
        )
    if redact(cache_dir) != cache_dir:
        raise DatasetConfigError(
            f"DataConfig.cache_dir must not contain credentials (got {redact(cache_dir)!r}): it is part of "
            "every prepared path, result and log line. Pass them in cache_storage_options or, for S3, "
            "through the AWS environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE)"
        )
    prefix, location = cache_dir.split("://", 1)
    if not location.strip("/"):
        raise DatasetConfigError(
            f"DataConfig.cache_dir {cache_dir!r} names no location; give a bucket and optional prefix, "
            "e.g. s3://my-bucket/sweepflow-data"
        )
    # No trailing slash, so s3://b/p and s3://b/p/ give the same cache key and the same paths.
    return f"{prefix}://{location.rstrip('/')}"


def _location(value: Any, field_name: str, expected: str) -> str:
    """``value`` (a string or ``os.PathLike``) as a non-blank string, or a DatasetConfigError naming the field."""
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(text, str) or not text.strip():
        raise DatasetConfigError(f"DataConfig.{field_name} must be {expected} (got {value!r})")
    return text


def _local_path(path: str) -> str:
    """Absolute and user-expanded, so the same directory always gives the same cache key."""
    return os.path.abspath(os.path.expanduser(path.removeprefix("file://")))


def _describe(exc: ValidationError) -> str:
    """One message for a failed DataConfig validation: our own messages as they are, pydantic's with the field."""
    errors = exc.errors()
    messages = [_error_message(e) for e in errors if e["type"] != "extra_forbidden"]
    unknown = [str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden"]
    if unknown:
        messages.insert(
            0,
            f"DataConfig: unknown field(s) {', '.join(map(repr, unknown))}; valid fields are: "
            f"{', '.join(sorted(DataConfig.model_fields))}",
        )
    return "; ".join(messages)


def _error_message(error: ErrorDetails) -> str:
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, DatasetConfigError):
        return str(cause)
    return f"DataConfig.{'.'.join(map(str, error['loc']))}: {error['msg']}"


class DataConfig(BaseModel):
    """Which dataset to prepare, from where, into which cache, and how to split it.

    All fields are plain JSON-able data so that the config can be a Prefect/deployment parameter and a
    stable cache key. ``source`` overrides the official base location (see the package docstring);
    ``storage_options`` are passed to fsspec for that source (e.g. ``{"key": ..., "secret": ...,
    "client_kwargs": {"endpoint_url": ...}}`` for S3; prefer AWS_* environment variables for credentials,
    since configs get logged and stored). ``checksums`` maps filenames to MD5s for mirrors whose files
    differ from the official ones. ``follow_source`` is for a source whose files change in place (new data
    under the same names): instead of MD5s, each file's current version (HTTP ETag, else Last-Modified and
    size; S3 ETag; a directory's mtime and size) decides whether it is downloaded again (see ``prepare``).

    ``cache_dir`` is a local directory (a shared mount works for multi-node) or a writable fsspec URI such
    as ``s3://bucket/prefix``; ``prepare_dataset`` requires it (the library picks no default location:
    the pipeline's entry point, ``flows/settings.py:resolve_settings``, fills it). ``cache_storage_options``
    are fsspec options for a remote ``cache_dir`` (same shape as ``storage_options``). They are separate
    from ``storage_options`` because the source and the cache are often different stores (an HTTPS mirror
    and an S3 bucket). When both are omitted, s3fs uses the standard AWS chain (``AWS_ACCESS_KEY_ID``/
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL_S3``, ``AWS_PROFILE``, instance roles), which is also what
    trainers calling ``load_split(path, ...)`` without options rely on. Neither set of options is part of
    ``repr``, ``cache_identity()`` or any result (only an ``endpoint_url`` is kept in the identity: it
    names a store). ``staging_dir`` is the host-local directory that keeps verified copies of a remote
    cache's files (required with a remote ``cache_dir``, unused otherwise); it is host-specific, so it is
    not part of the identity either.

    For datasets with an official test set (mnist, fashion_mnist, cifar10) the test split *is* that set:
    ``val_fraction`` is taken from the official training set and ``test_fraction`` is unused. For bundled
    datasets (digits, mnist_5k) both fractions are shares of the whole dataset.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    name: DatasetName | None = Field(
        "digits",
        description="A bundled dataset; none (null) when `source` is your own data (with prepare_fn or format)",
    )
    source: str | None = Field(
        None,
        description="A bundled dataset's mirror (https://..., s3://bucket/prefix, a directory); or, with "
        "prepare_fn or format, your own data: any fsspec URL or local path, a file or a directory, any format",
    )
    prepare_fn: str | None = Field(
        None,
        description="Your own data: 'package.module:function' called as prepare_fn(raw_dir, out_dir) once per "
        "version of `source` (in the flow's process); trials get config['data_path'] = the prepared out_dir",
    )
    format: Literal["csv", "parquet", "image_folder"] | None = Field(
        None,
        description="Your own data, prepared without code: csv or parquet (with `target`: a seeded "
        "train/val/test split into train.<fmt>, val.<fmt>, test.<fmt>), or image_folder (torchvision "
        "ImageFolder layout, split per class into train/, val/, test/)",
    )
    target: str | None = Field(None, description="format csv/parquet: the label column")
    cache_dir: str | None = Field(
        None,
        description="Local directory or s3://bucket/prefix. Default: <storage>/datasets, else <state_dir>/data",
    )
    val_fraction: float = Field(
        0.15, gt=0, lt=1, description="Share held out for validation (of the official training set, where there is one)"
    )
    test_fraction: float = Field(
        0.15, gt=0, lt=1, description="Share held out for the test set (unused where the dataset has an official one)"
    )
    seed: int = Field(0, ge=0, lt=2**32, description="Seed of the train/val/test split")
    storage_options: dict[str, Any] | None = Field(
        None, repr=False, description="fsspec options for `source` (may hold credentials)"
    )
    checksums: dict[str, str] | None = Field(None, description="{filename: md5} for a mirror's own files")
    cache_storage_options: dict[str, Any] | None = Field(
        None, repr=False, description="fsspec options for a remote cache_dir (may hold credentials)"
    )
    staging_dir: str | None = Field(
        None,
        description="Host-local staging for a remote cache_dir. Default: <state_dir>/data/remote-staging",
    )
    follow_source: bool = Field(
        False,
        description=(
            "The source publishes new data under the same file names (e.g. a nightly export): every run asks "
            "it for each file's version (HTTP ETag/Last-Modified, S3 ETag) and downloads again when it changed. "
            "Files are not MD5-pinned then; each run records the sha256 of what it trained on."
        ),
    )

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise DatasetConfigError(_describe(exc)) from None

    # Field validators run in field order and before pydantic's own checks (mode="before"), so every
    # invalid value gets our message; cross-field rules run last, in ``_consistent``.

    @model_validator(mode="before")
    @classmethod
    def _own_data_has_no_name(cls, data: Any) -> Any:
        """Your own data (``prepare_fn`` or ``format``) is not a bundled set: ``name`` is left out (None)."""
        if not isinstance(data, Mapping) or not (data.get("prepare_fn") or data.get("format")):
            return data
        if data.get("name") is not None:
            raise DatasetConfigError(
                f"DataConfig.name={data['name']!r} names a bundled dataset, but prepare_fn/format say `source` is "
                "your own data: drop data.name (or drop prepare_fn/format to train on the bundled set)"
            )
        return {**data, "name": None}

    @field_validator("prepare_fn", mode="before")
    @classmethod
    def _import_path(cls, value: Any) -> Any:
        if value is None:
            return None
        module, _, function = str(value).partition(":") if isinstance(value, str) else ("", "", "")
        if not module or not function:
            raise DatasetConfigError(
                f"DataConfig.prepare_fn must be 'package.module:function' (got {value!r}), a function called as "
                "prepare_fn(raw_dir, out_dir)"
            )
        return value

    @field_validator("name", mode="before")
    @classmethod
    def _known_name(cls, value: Any) -> Any:
        if value is None:
            return None  # your own data: checked with the other fields in _consistent
        if not isinstance(value, str) or value not in DATASETS:
            raise DatasetConfigError(
                f"DataConfig.name: unknown dataset {value!r}; use one of: {', '.join(sorted(DATASETS))}"
            )
        return value

    @field_validator("source", mode="before")
    @classmethod
    def _valid_source(cls, value: Any) -> Any:
        if value is None:
            return None
        source = _location(value, "source", "a URI or directory string, or None for the official location")
        scheme = protocol(source)
        if scheme is None:
            return os.path.abspath(os.path.expanduser(source))
        if scheme not in SOURCE_SCHEMES:  # e.g. ftp://: fsspec has it, but the download and its checks do not
            raise DatasetConfigError(
                f"DataConfig.source: unsupported scheme {scheme!r} in {redact(source)!r}; use https://..., "
                "http://..., s3://bucket/prefix, file:///dir or a local directory"
            )
        return source

    @field_validator("cache_dir", mode="before")
    @classmethod
    def _valid_cache_dir(cls, value: Any) -> Any:
        if value is None:
            return None  # prepare_dataset requires one; the entry point fills it
        cache_dir = _location(value, "cache_dir", "a local directory or a URI such as s3://bucket/prefix")
        scheme = protocol(cache_dir)
        if scheme not in (None, "file"):
            return _remote_cache_dir(cache_dir, scheme)
        return _local_path(cache_dir)

    @field_validator("val_fraction", "test_fraction", mode="before")
    @classmethod
    def _valid_fraction(cls, value: Any, info: ValidationInfo) -> Any:
        if not _is_number(value) or not 0 < value < 1:
            raise DatasetConfigError(
                f"DataConfig.{info.field_name} must be a number strictly between 0 and 1 (got {value!r}); "
                "e.g. 0.15"
            )
        return value

    @field_validator("seed", mode="before")
    @classmethod
    def _valid_seed(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
            raise DatasetConfigError(
                f"DataConfig.seed must be an int in [0, 2**32) (got {value!r}); e.g. seed=0"
            )
        return value

    @field_validator("storage_options", "cache_storage_options", mode="before")
    @classmethod
    def _valid_options(cls, value: Any, info: ValidationInfo) -> Any:
        return None if value is None else _checked_options(info.field_name, value)

    @field_validator("checksums", mode="before")
    @classmethod
    def _valid_checksums(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise DatasetConfigError(
                f"DataConfig.checksums must be a dict {{filename: md5}} or None (got {type(value).__name__})"
            )
        for filename, md5 in value.items():
            if (
                not isinstance(md5, str)
                or len(md5) != 32
                or any(c not in "0123456789abcdef" for c in md5.lower())
            ):
                raise DatasetConfigError(
                    f"DataConfig.checksums[{filename!r}] must be a 32-character hex MD5 (got {md5!r}); "
                    f"compute it with `md5sum {filename}`"
                )
        return {filename: md5.lower() for filename, md5 in value.items()}

    @field_validator("follow_source", mode="before")
    @classmethod
    def _valid_follow_source(cls, value: Any) -> Any:
        if not isinstance(value, bool):
            raise DatasetConfigError(f"DataConfig.follow_source must be true or false (got {value!r})")
        return value

    @field_validator("staging_dir", mode="before")
    @classmethod
    def _valid_staging_dir(cls, value: Any) -> Any:
        if value is None:
            return None
        expected = "a local directory on this host, e.g. ~/.sweepflow/data/remote-staging"
        staging = _location(value, "staging_dir", expected)
        if protocol(staging) not in (None, "file"):
            raise DatasetConfigError(f"DataConfig.staging_dir must be {expected} (got {value!r})")
        return _local_path(staging)

    @model_validator(mode="after")
    def _consistent(self) -> DataConfig:
        if self.is_own_data or self.name is None:
            return self._consistent_own_data()
        if self.target is not None:
            raise DatasetConfigError(
                "DataConfig.target is the label column of your own csv/parquet data (format: csv or parquet); "
                f"{self.name!r} has its labels: drop target"
            )
        spec = self.spec
        if not spec.official_test and self.val_fraction + self.test_fraction >= 1:
            raise DatasetConfigError(
                f"DataConfig.val_fraction + test_fraction must be < 1 for {self.name!r}, whose three splits are "
                f"all carved from one pool (got {self.val_fraction} + {self.test_fraction}); lower either, e.g. "
                "0.15 each"
            )
        if self.source is not None and not spec.remote:
            raise DatasetConfigError(
                f"DataConfig.source: {self.name!r} is bundled with an installed package and is never "
                f"downloaded; drop source={redact(self.source)!r} (sources apply to: "
                f"{', '.join(sorted(n for n, s in DATASETS.items() if s.remote))})"
            )
        if self.storage_options is not None and self.source is None:
            raise DatasetConfigError(
                "DataConfig.storage_options only apply to a `source` override; set source=... as well, or "
                "drop storage_options to use the official location (options for an s3:// cache_dir go in "
                "cache_storage_options)"
            )
        if self.cache_storage_options is not None and not self.cache_is_remote:
            raise DatasetConfigError(
                f"DataConfig.cache_storage_options only apply to a remote cache_dir such as s3://bucket/prefix "
                f"(cache_dir is {self.cache_dir!r}); drop cache_storage_options, or set cache_dir to the "
                "remote URI"
            )
        if self.follow_source and self.source is None:
            raise DatasetConfigError(
                "DataConfig.follow_source needs a `source` (the location that publishes new data, e.g. "
                "https://data.example.com/exports/mnist/ or s3://bucket/exports/mnist): the official mirrors "
                "never change. Set source=..., or drop follow_source"
            )
        if self.follow_source and self.checksums is not None:
            raise DatasetConfigError(
                "DataConfig.follow_source and checksums exclude each other: pinned MD5s mean the files never "
                "change, follow_source that they do. Drop checksums to retrain on whatever the source publishes "
                "(its sha256 is recorded per run), or drop follow_source to pin the files"
            )
        if self.checksums is not None:
            if not spec.remote:
                raise DatasetConfigError(
                    f"DataConfig.checksums: {self.name!r} is bundled and has no downloaded files; drop checksums"
                )
            for filename in self.checksums:
                if filename not in spec.filenames:
                    raise DatasetConfigError(
                        f"DataConfig.checksums: {filename!r} is not a file of {self.name!r}; its files are: "
                        f"{', '.join(spec.filenames)}"
                    )
        return self

    def _consistent_own_data(self) -> DataConfig:
        if not self.is_own_data:
            raise DatasetConfigError(
                "DataConfig.name is empty: name a bundled dataset (one of "
                f"{', '.join(sorted(DATASETS))}), or give your own data as source with prepare_fn or format"
            )
        if self.prepare_fn and self.format:
            raise DatasetConfigError(
                "DataConfig.prepare_fn and format both prepare the data: keep one (format for csv/parquet/"
                "image_folder without code, prepare_fn for anything else)"
            )
        if self.source is None:
            raise DatasetConfigError(
                "DataConfig.source is missing: prepare_fn/format prepare your own data, so say where it is "
                "(a local file or directory, s3://bucket/key, https://host/file.csv)"
            )
        if self.format in ("csv", "parquet") and not self.target:
            raise DatasetConfigError(
                f"DataConfig.target is missing: format {self.format} splits a table, name its label column "
                "(e.g. target: price)"
            )
        if self.target is not None and self.format not in ("csv", "parquet"):
            raise DatasetConfigError(
                "DataConfig.target only applies to format csv or parquet (a label column); drop it"
            )
        if self.checksums is not None:
            raise DatasetConfigError(
                "DataConfig.checksums pin a bundled dataset's files; your own source is versioned by what it "
                "reports for each file (S3/HTTP ETag, size and modification time): drop checksums"
            )
        if self.val_fraction + self.test_fraction >= 1:
            raise DatasetConfigError(
                f"DataConfig.val_fraction + test_fraction must be < 1 (got {self.val_fraction} + "
                f"{self.test_fraction}); lower either, e.g. 0.15 each"
            )
        if self.storage_options is not None and self.source is None:
            raise DatasetConfigError("DataConfig.storage_options only apply to a `source`")
        if self.cache_storage_options is not None and not self.cache_is_remote:
            raise DatasetConfigError(
                "DataConfig.cache_storage_options only apply to a remote cache_dir such as s3://bucket/prefix"
            )
        return self

    @property
    def is_own_data(self) -> bool:
        """A team's own data (``source`` with ``prepare_fn`` or ``format``), not a bundled set."""
        return bool(self.prepare_fn or self.format)

    @property
    def label(self) -> str:
        """What to call the data in titles and paths: the bundled set's name, or the source's last part."""
        if self.name is not None:
            return self.name
        last = redact(self.source or "data").rstrip("/").rsplit("/", 1)[-1]
        stem = last.split(".", 1)[0] or "data"
        return re.sub(r"[^A-Za-z0-9_-]+", "-", stem).strip("-")[:40] or "data"

    @property
    def spec(self) -> DatasetSpec:
        if self.name is None:
            raise DatasetConfigError(
                f"DataConfig: {self.label!r} is your own data (source with prepare_fn/format), not a bundled set"
            )
        return DATASETS[self.name]

    @property
    def cache_is_remote(self) -> bool:
        """True if ``cache_dir`` is a remote fsspec URI (s3://...) rather than a local directory."""
        return self.cache_dir is not None and protocol(self.cache_dir) is not None

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain JSON-able data (including both storage options: treat the result as secret)."""
        return self.model_dump()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DataConfig:
        """Build from a dict such as a deployment parameter; unknown keys are an error, not ignored."""
        if not isinstance(data, Mapping):
            raise DatasetConfigError(f"DataConfig.from_dict expects a dict, got {type(data).__name__}")
        return cls(**dict(data))

    @classmethod
    def coerce(cls, value: DataConfig | Mapping[str, Any]) -> DataConfig:
        """A validated DataConfig from a DataConfig or its dict form (what arrives through Prefect parameters).

        A DataConfig is validated again, since ``model_copy(update=...)`` (how entry points fill in
        ``cache_dir``) does not validate; a valid one comes back equal.
        """
        return cls.from_dict(value.to_dict() if isinstance(value, DataConfig) else value)

    def without_credentials(self) -> tuple[DataConfig, DataCredentials]:
        """This config with no credential left in it (``source`` without its ``user:password@``, neither storage
        option), for where it is stored or shown (a Prefect flow parameter); and what was taken out, which
        ``with_credentials`` puts back in the process that does the work."""
        public = self.model_copy(
            update={
                "source": split_userinfo(self.source)[0] if self.source else None,
                "storage_options": None,
                "cache_storage_options": None,
            }
        )
        secrets = DataCredentials(
            public_source=public.source,
            source=self.source,
            storage_options=self.storage_options,
            cache_dir=self.cache_dir,
            cache_storage_options=self.cache_storage_options,
        )
        return public, secrets

    def with_credentials(self, secrets: DataCredentials) -> DataConfig:
        """This config with what ``without_credentials`` took out put back, where it still applies: the source's
        credentials and options to the same source, the cache's options to the same cache directory."""
        update: dict[str, Any] = {}
        if secrets.source is not None and self.source == secrets.public_source:
            update.update(source=secrets.source, storage_options=secrets.storage_options)
        if secrets.cache_storage_options is not None and self.cache_dir == secrets.cache_dir:
            update["cache_storage_options"] = secrets.cache_storage_options
        return self.model_copy(update=update) if update else self

    def cache_identity(self) -> dict[str, Any]:
        """The fields that determine the prepared result, without credentials.

        Used for cache keys: two configs with the same identity prepare the same data into the same
        place. Credentials are left out (they do not change the data, and keys end up in logs/storage),
        but S3 endpoint URLs (of the source and of the cache) are kept because they name different stores.
        ``staging_dir`` is left out: it is this host's working copy, not where the result is.
        ``follow_source`` is only present when set, so configs without it keep the keys they always had;
        with it, the task's cache key adds the source's current file versions (``tasks/download.py``).
        """
        if self.is_own_data:
            return {
                "own_data": True,
                "source": redact(self.source) if self.source else None,
                "endpoint_url": endpoint_url(self.storage_options),
                "prepare": self.prepare_fn or f"{self.format}:{self.target or ''}",
                "cache_dir": self.cache_dir,
                "cache_endpoint_url": endpoint_url(self.cache_storage_options),
                "val_fraction": float(self.val_fraction),
                "test_fraction": float(self.test_fraction),
                "seed": self.seed,
                "format_version": PREPARED_FORMAT_VERSION,
            }
        identity: dict[str, Any] = {
            "name": self.name,
            "source": redact(self.source) if self.source else None,
            "endpoint_url": endpoint_url(self.storage_options),
            "cache_dir": self.cache_dir,
            "cache_endpoint_url": endpoint_url(self.cache_storage_options),
            "val_fraction": float(self.val_fraction),
            "test_fraction": None if self.spec.official_test else float(self.test_fraction),
            "seed": self.seed,
            "checksums": dict(sorted((self.checksums or {}).items())),
            "format_version": PREPARED_FORMAT_VERSION,
        }
        if self.follow_source:
            identity["follow_source"] = True
        return identity
