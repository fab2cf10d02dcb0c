"""Where the lakehouse lives: one storage setting for Spark's ``s3a`` file system and for delta-rs.

A lakehouse on local disk needs nothing. One on S3 (AWS, or an S3-compatible server) is an ``s3a://``
URI plus an `S3Storage`: endpoint, region, path-style access, and where the credentials come from.
The same setting becomes

* the runtime settings of every Spark session of the lakehouse (`session_conf`, applied by
  `sessions.spark_session`): the ``fs.s3a.*`` settings (`hadoop_conf`) and the credentials named by
  ``*_env``, read when the session is made. Spark copies a session's settings into the Hadoop
  configuration of its reads and writes (on the executors too), so a Spark Connect server that was
  started without them serves them. Spark redacts the credentials' keys (``spark.redaction.regex``)
  wherever it shows settings. Hadoop's file system cache stays on: a server keeps the ``s3a`` file
  system of a bucket (its endpoint, its keys) that it first opened until it restarts, unless the
  storage asks for `fresh_file_systems` (keys rotated, or another endpoint, on a running server);
* delta-rs's ``storage_options`` (`storage_options`), with which the run process reads the Delta log.

Credentials: by default the AWS default chain, which both Hadoop's ``s3a`` and delta-rs follow
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, web
identity, the instance's role). ``access_key_id_env`` and friends name other environment variables
(a ``dg.EnvVar`` is one), read where they are used, never stored.

**Log store.** Delta commits a version by writing ``_delta_log/<version>.json`` if it does not exist.
S3 had no put-if-absent when Delta's ``s3a`` log store (``S3SingleDriverLogStore``, Delta's default
for ``s3a``) was written: it keeps two commits of one version apart only *inside one JVM*. So every
commit to an S3 lakehouse must go through one Spark driver: the embedded Spark Connect server (one for
all runs) or a cluster's Spark Connect server. `check_single_driver` refuses ``local`` Spark (a driver
per run process) unless the configuration names a log store itself (``spark.delta.logStore.s3a.impl``,
for example Delta's ``S3DynamoDBLogStore`` for many drivers).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from feedapi_dagster.errors import StorageError
from feedapi_dagster.spark.failures import StorageFailure, first_line, storage_failure

S3A = "s3a"
LOG_STORE_KEYS = ("spark.delta.logStore.s3a.impl", "spark.delta.logStore.class")
# Each credential setting: the delta-rs option and the s3a setting that get the value it names.
_CREDENTIALS = {
    "access_key_id_env": ("AWS_ACCESS_KEY_ID", "fs.s3a.access.key"),
    "secret_access_key_env": ("AWS_SECRET_ACCESS_KEY", "fs.s3a.secret.key"),
    "session_token_env": ("AWS_SESSION_TOKEN", "fs.s3a.session.token"),
}
CREDENTIALS_PROVIDER = "fs.s3a.aws.credentials.provider"
SIMPLE_CREDENTIALS = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
TEMPORARY_CREDENTIALS = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
# Hadoop caches a file system per (scheme, bucket, user) in its JVM and builds it from the configuration
# of the first call: later sessions get the S3AFileSystem made with the first one's endpoint and keys.
# With `S3Storage.fresh_file_systems` the sessions turn the cache off for s3a (each file system Spark asks
# for is made from the session's settings), at a cost: Hadoop never closes the file systems it made
# uncached (their threads and connection pools stay in the server's JVM).
NO_FILE_SYSTEM_CACHE = "fs.s3a.impl.disable.cache"
# Every setting `session_conf` may give: a session of the shared server-side session that does not give
# one unsets it, so that no setting of an earlier session (another lakehouse's endpoint, keys) is left.
SESSION_KEYS = (
    "fs.s3a.path.style.access",
    "fs.s3a.endpoint",
    "fs.s3a.connection.ssl.enabled",
    "fs.s3a.endpoint.region",
    NO_FILE_SYSTEM_CACHE,
    CREDENTIALS_PROVIDER,
    *(key for _, key in _CREDENTIALS.values()),
)


class S3Storage(BaseModel):
    """An S3 lakehouse (``lakehouse: s3a://bucket/prefix``): AWS or an S3-compatible endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str | None = Field(default=None, description="an S3-compatible server's URL; AWS when unset")
    region: str | None = Field(default=None, description="the bucket's region (AWS default chain when unset)")
    path_style: bool = Field(
        default=False, description="bucket in the path, not the host name (most S3-compatible servers)"
    )
    access_key_id_env: str | None = Field(default=None, description="environment variable with the access key id")
    secret_access_key_env: str | None = Field(default=None, description="environment variable with the secret key")
    session_token_env: str | None = Field(default=None, description="environment variable with a session token")
    fresh_file_systems: bool = Field(
        default=False,
        description="make every s3a file system of a Spark read or write from the session's settings "
        "(fs.s3a.impl.disable.cache=true), so that keys rotated in the *_env variables, or another "
        "endpoint, are used without restarting the Spark server; costs the server's JVM the file "
        "systems (and their threads) Hadoop never closes, with every load. Off: a Spark server "
        "keeps the file system of a bucket it first opened (its endpoint and keys) until it restarts",
    )

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
                raise ValueError(f"endpoint must be an http:// or https:// URL of the server, got {value!r}")
            value = value.rstrip("/")
        return value

    @field_validator("access_key_id_env", "secret_access_key_env", "session_token_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and (not value or "=" in value or not value.replace("_", "").isalnum()):
            raise ValueError(f"expected the name of an environment variable (letters, digits, _), got {value!r}")
        return value

    @model_validator(mode="after")
    def _key_pair(self) -> S3Storage:
        if (self.access_key_id_env is None) != (self.secret_access_key_env is None):
            raise ValueError(
                "set access_key_id_env and secret_access_key_env together (or neither: the AWS default chain)"
            )
        return self

    # ------------------------------------------------------------------ credentials
    def _credential_values(self) -> dict[str, str]:
        """Setting -> the value of the variable it names, read now; {} for the default chain. Raises
        `StorageError` naming the setting of a variable that is not set."""
        values = {}
        for setting in _CREDENTIALS:
            name = getattr(self, setting)
            if name is None:
                continue
            value = os.environ.get(name)
            if not value:
                raise StorageError(
                    f"lakehouse storage: environment variable {name} (storage.s3.{setting}) is not set in this process"
                )
            values[setting] = value
        return values

    def credentials(self) -> dict[str, str]:
        """AWS variable (``AWS_ACCESS_KEY_ID``...) -> value, read now; {} for the default chain."""
        return {_CREDENTIALS[setting][0]: value for setting, value in self._credential_values().items()}

    # ------------------------------------------------------------------ Spark
    def session_conf(self) -> dict[str, str]:
        """Runtime settings of a Spark session: the ``fs.s3a.*`` settings (`hadoop_conf`), with
        `fresh_file_systems` Hadoop's file system cache off for ``s3a`` (`NO_FILE_SYSTEM_CACHE`; never
        set otherwise) and, with ``*_env``, the credentials read now, with the provider that takes them
        from the configuration (a session token: the temporary one). Without ``*_env`` s3a follows its
        default chain. Holds secrets: hand it to Spark only (whose ``spark.redaction.regex`` hides the
        credentials' keys wherever it shows settings)."""
        conf = self.hadoop_conf()
        if self.fresh_file_systems:
            conf[NO_FILE_SYSTEM_CACHE] = "true"
        values = self._credential_values()
        if values:
            conf.update({_CREDENTIALS[setting][1]: value for setting, value in values.items()})
            conf[CREDENTIALS_PROVIDER] = TEMPORARY_CREDENTIALS if "session_token_env" in values else SIMPLE_CREDENTIALS
        return conf

    def hadoop_conf(self) -> dict[str, str]:
        """``fs.s3a.*`` settings (no secrets)."""
        conf = {"fs.s3a.path.style.access": str(self.path_style).lower()}
        if self.endpoint:
            conf["fs.s3a.endpoint"] = self.endpoint
            conf["fs.s3a.connection.ssl.enabled"] = str(self.endpoint.startswith("https://")).lower()
        if self.region:
            conf["fs.s3a.endpoint.region"] = self.region
        elif self.endpoint:
            # the AWS SDK wants a region even for a server that ignores it (else it probes EC2's metadata)
            conf["fs.s3a.endpoint.region"] = "us-east-1"
        return conf

    # ------------------------------------------------------------------ delta-rs
    def storage_options(self) -> dict[str, str]:
        """delta-rs (object_store) options; without credentials it follows the AWS default chain."""
        options: dict[str, str] = {}
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint
            options["AWS_ALLOW_HTTP"] = str(self.endpoint.startswith("http://")).lower()
        region = self.hadoop_conf().get("fs.s3a.endpoint.region")
        if region:
            options["AWS_REGION"] = region
        if self.path_style:
            options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
        options.update(self.credentials())
        return options


def is_s3(uri: str) -> bool:
    return urlsplit(uri).scheme.lower() in ("s3", "s3a", "s3n")


def check_storage(uri: str, storage: S3Storage | None, spark_mode: str, spark_conf: Mapping[str, str]) -> None:
    """What the feeds configuration (`ProjectConfig`, a defs.yaml) checks of the lakehouse: its URI,
    its storage setting and, on S3, one Spark driver (`check_single_driver`)."""
    check_lakehouse_uri(uri, storage)
    check_single_driver(uri, spark_mode, spark_conf)


def check_lakehouse_uri(uri: str, storage: S3Storage | None) -> None:
    """A lakehouse URI Spark and delta-rs both open, matching its storage setting."""
    scheme = urlsplit(uri).scheme.lower()
    if scheme in ("s3", "s3n"):
        raise ValueError(
            f"lakehouse {uri!r}: write s3a://{uri.split('://', 1)[1]} (Hadoop's S3 file system, "
            "which Spark uses; delta-rs reads it too)"
        )
    if scheme == S3A and not urlsplit(uri).netloc:
        raise ValueError(f"lakehouse {uri!r}: s3a:// needs a bucket (s3a://bucket/prefix)")
    if storage is not None and scheme != S3A:
        raise ValueError(f"storage.s3 is set but the lakehouse {uri!r} is not an s3a:// URI")


def check_single_driver(uri: str, spark_mode: str, spark_conf: Mapping[str, str]) -> None:
    """Refuse Spark in every run process (``local``) for an S3 lakehouse with Delta's single-driver
    log store (see the module docstring)."""
    if not is_s3(uri) or spark_mode != "local" or any(key in spark_conf for key in LOG_STORE_KEYS):
        return
    raise ValueError(
        f"lakehouse {uri!r} with spark mode 'local': every run would be its own Spark driver, and Delta's S3 "
        "log store (S3SingleDriverLogStore) keeps two commits of one table version apart only within one "
        "driver. Use spark mode 'embedded' (one local server for all runs) or 'remote' (a cluster's Spark "
        "Connect server), or name a log store made for many drivers in spark.conf "
        "(spark.delta.logStore.s3a.impl, e.g. io.delta.storage.S3DynamoDBLogStore)"
    )


# What each storage failure means, said with the setting to change.
_MEANINGS: dict[StorageFailure, str] = {
    StorageFailure.NO_S3A_FILE_SYSTEM: "the Spark that runs the load has no s3a file system (hadoop-aws and the AWS SDK): run "
    "`feedapi-dagster setup-jars` for the embedded or local Spark; a cluster needs "
    "org.apache.hadoop:hadoop-aws (its Hadoop's version) and the AWS SDK on its classpath",
    StorageFailure.NO_CREDENTIALS: "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile or role) where Spark "
    "runs, or name the variables in storage.s3.access_key_id_env / secret_access_key_env",
    StorageFailure.ACCESS_DENIED: "S3 refused the credentials (access denied): check the key in storage.s3 (or the AWS default chain) "
    "and its rights on the bucket",
    StorageFailure.NO_BUCKET: "the bucket does not exist (or the endpoint in storage.s3 is not the server that has it)",
    StorageFailure.UNREACHABLE: "cannot reach the S3 endpoint: check storage.s3.endpoint and that the server is up",
}


def explain_storage_error(uri: str, error: BaseException) -> StorageError | None:
    """A `StorageError` saying what a Spark error about an S3 lakehouse means, or None when it is
    not one of those (the error then stands as it is). Only the first line of Spark's message is
    kept: no stack trace from deep in Hadoop."""
    if not is_s3(uri):
        return None
    failure = storage_failure(error)
    if failure is None:
        return None
    return StorageError(f"lakehouse table {uri}: {_MEANINGS[failure]} (Spark said: {first_line(error)})")
