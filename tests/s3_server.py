"""A real S3-compatible server for the tests and the benchmark: moto's standalone server (its S3 API
over HTTP, the `moto[server]` test dependency) in a process of its own on 127.0.0.1.

    python -m tests.s3_server --port 9000

Routes added for the tests (every other request is moto's):

* ``POST /_feedapi_test/age?bucket=B&prefix=P&seconds=S`` moves the LastModified of the objects under
  P back by S seconds. Delta's log cleanup decides by the log files' modification times, which S3
  sets at upload: on local disk the tests age files with `os.utime`, on this server with this route.
* ``POST /_feedapi_test/hold?part=X`` holds every upload whose path contains X until
  ``POST /_feedapi_test/release``; ``GET /_feedapi_test/held`` says how many wait: a test kills a
  load in the middle of its Delta write (its executors uploading data files).

`S3Server` starts the program and is the tests' handle on it (bucket, listing, reading, ageing).
By default the server takes any key; ``S3Server(enforce_keys=True)`` checks every request's key and
signature against its IAM users' access keys (moto's ``INITIAL_NO_AUTH_ACTION_COUNT``): the tests make
keys (`create_access_key`) and revoke them (`delete_access_key`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import parse_qs

import requests

AGE_ROUTE = "/_feedapi_test/age"
HOLD_ROUTE, RELEASE_ROUTE, HELD_ROUTE = "/_feedapi_test/hold", "/_feedapi_test/release", "/_feedapi_test/held"
REGION = "us-east-1"
# moto accepts any key; the tests hand these to Spark and delta-rs through the storage setting
TEST_CREDENTIALS = {"FEEDAPI_TEST_S3_KEY": "feedapi-test-key", "FEEDAPI_TEST_S3_SECRET": "feedapi-test-secret"}
# enforce_keys: the requests moto serves without a key, the IAM set-up of the tests' user (`_setup_iam`)
_UNCHECKED_SETUP_REQUESTS = 3
_ADMIN, _IAM_USER = "feedapi-test-admin", "feedapi-test"  # the tests' own client's user; the keys' user
_EVERYTHING = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})


class _Hold:
    def __init__(self) -> None:
        self.part: str | None = None
        self.released = threading.Event()
        self.waiting = 0
        self.lock = threading.Lock()

    def wait_if_held(self, path: str) -> None:
        part = self.part
        if part is None or part not in path:
            return
        with self.lock:
            self.waiting += 1
        try:
            self.released.wait(600)
        finally:
            with self.lock:
                self.waiting -= 1


def _with_test_routes(app: Callable) -> Callable:
    hold = _Hold()

    def answer(start_response: Callable, text: str) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [text.encode()]

    def serve(environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        query = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        if path == HOLD_ROUTE:
            hold.released.clear()
            hold.part = query["part"]
            return answer(start_response, "held")
        if path == RELEASE_ROUTE:
            hold.part = None
            hold.released.set()
            return answer(start_response, "released")
        if path == HELD_ROUTE:
            return answer(start_response, str(hold.waiting))
        if path != AGE_ROUTE:
            if environ.get("REQUEST_METHOD") in ("PUT", "POST"):
                hold.wait_if_held(path)
            return app(environ, start_response)
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        bucket = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets[query["bucket"]]
        shift = dt.timedelta(seconds=float(query["seconds"]))
        aged = 0
        for name in list(bucket.keys.keys()):
            if name.startswith(query.get("prefix", "")):
                for key in bucket.keys.getlist(name):
                    key.last_modified = key.last_modified - shift
                aged += 1
        return answer(start_response, str(aged))

    return serve


def serve(port: int) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    app = _with_test_routes(DomainDispatcherApplication(create_backend_app))
    print(f"S3 server (moto) on http://127.0.0.1:{port}", flush=True)
    make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler).serve_forever()


class S3Server:
    """The server program in a child process (stopped by `stop`), and what the tests do on it."""

    def __init__(self, port: int | None = None, log_path: Path | None = None, *, enforce_keys: bool = False):
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "wb") if log_path else subprocess.DEVNULL
        root = Path(__file__).resolve().parents[1]
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_UNCHECKED_SETUP_REQUESTS)} if enforce_keys else None
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.s3_server", "--port", str(self.port)],
            cwd=root,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + 60
        while not _port_open(self.port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the S3 server did not start (exit code {self._process.poll()})")
            time.sleep(0.1)
        self._client = None
        self._keys = (TEST_CREDENTIALS["FEEDAPI_TEST_S3_KEY"], TEST_CREDENTIALS["FEEDAPI_TEST_S3_SECRET"])
        if enforce_keys:
            self._keys = self._setup_iam()

    def _boto(self, service: str, keys: tuple[str, str] | None = None):
        import boto3

        key, secret = keys or self._keys
        return boto3.client(
            service, endpoint_url=self.url, region_name=REGION, aws_access_key_id=key, aws_secret_access_key=secret
        )

    def _setup_iam(self) -> tuple[str, str]:
        """The key of the tests' own client, of an IAM user allowed everything: the requests moto serves
        without checking a key. Then the user of the keys the tests make (AWS allows 2 per user)."""
        iam = self._boto("iam")
        iam.create_user(UserName=_ADMIN)
        iam.put_user_policy(UserName=_ADMIN, PolicyName="everything", PolicyDocument=_EVERYTHING)
        key = iam.create_access_key(UserName=_ADMIN)["AccessKey"]
        keys = key["AccessKeyId"], key["SecretAccessKey"]
        iam = self._boto("iam", keys)
        iam.create_user(UserName=_IAM_USER)
        iam.put_user_policy(UserName=_IAM_USER, PolicyName="everything", PolicyDocument=_EVERYTHING)
        return keys

    def create_access_key(self) -> tuple[str, str]:
        """A new access key (enforce_keys; two at most at a time): (key id, secret)."""
        key = self._boto("iam").create_access_key(UserName=_IAM_USER)["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def delete_access_key(self, key_id: str) -> None:
        """Revoke a key made by `create_access_key`: the server refuses it from now on."""
        self._boto("iam").delete_access_key(UserName=_IAM_USER, AccessKeyId=key_id)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def client(self):
        """A boto3 S3 client of the server (boto3 comes with moto)."""
        if self._client is None:
            self._client = self._boto("s3")
        return self._client

    def create_bucket(self, bucket: str) -> None:
        self.client.create_bucket(Bucket=bucket)

    def keys(self, bucket: str, prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def read(self, bucket: str, key: str) -> bytes:
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()

    def age(self, bucket: str, prefix: str, seconds: float) -> int:
        """Moves the LastModified of the objects under `prefix` back by `seconds`; how many."""
        answer = requests.post(
            f"{self.url}{AGE_ROUTE}", params={"bucket": bucket, "prefix": prefix, "seconds": seconds}, timeout=30
        )
        answer.raise_for_status()
        return int(answer.text)

    def hold_uploads(self, part: str) -> None:
        """Hold every upload whose path contains `part` until `release_uploads`."""
        requests.post(f"{self.url}{HOLD_ROUTE}", params={"part": part}, timeout=30).raise_for_status()

    def held_uploads(self) -> int:
        answer = requests.get(f"{self.url}{HELD_ROUTE}", timeout=30)
        answer.raise_for_status()
        return int(answer.text)

    def release_uploads(self) -> None:
        requests.post(f"{self.url}{RELEASE_ROUTE}", timeout=30).raise_for_status()

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._log is not subprocess.DEVNULL:
            self._log.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("FEEDAPI_TEST_S3_PORT", "9000")))
    serve(parser.parse_args().port)
