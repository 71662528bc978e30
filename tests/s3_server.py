"""A real S3-compatible server (moto's server mode) on loopback, for tests.

Guarantees: `S3Server.start()` returns only once the server answers on 127.0.0.1; `stop()` ends
the process and never leaves it running (`S3Server.serving(...)` does both around a block).
Traffic never leaves the machine.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.ports import free_port

#: Requests moto serves before it starts checking signatures: the IAM set-up in `start()`.
_SETUP_REQUESTS = 3


class S3Server:
    """moto_server on a free loopback port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen | None = None
        self.access_key = ""
        self.secret_key = ""
        self._names = itertools.count()

    @classmethod
    @contextmanager
    def serving(cls, *buckets: str) -> Iterator[S3Server]:
        """A started server with ``buckets`` created, stopped when the block ends."""
        server = cls()
        server.start()
        try:
            for bucket in buckets:
                server.create_bucket(bucket)
            yield server
        finally:
            server.stop()

    def start(self, timeout: float = 60.0) -> None:
        moto = Path(sys.executable).with_name("moto_server")
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_SETUP_REQUESTS)}
        self._process = subprocess.Popen(
            [str(moto), "-H", "127.0.0.1", "-p", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"moto_server exited with code {self._process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            except OSError:
                time.sleep(0.2)
                continue
            self._create_user()
            return
        self.stop()
        raise RuntimeError(f"moto_server did not answer on {self.endpoint} within {timeout} s")

    @property
    def pid(self) -> int:
        """The server's process id (a test can pause the server with SIGSTOP)."""
        assert self._process is not None, "the server is not running"
        return self._process.pid

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
            self._process = None

    def _create_user(self) -> None:
        """An IAM user allowed everything; from then on moto rejects requests it did not sign."""
        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
            region_name="us-east-1",
        )
        iam.create_user(UserName="trainer")
        iam.put_user_policy(
            UserName="trainer",
            PolicyName="all",
            PolicyDocument=json.dumps(
                {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
            ),
        )
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]

    def create_bucket(self, name: str) -> None:
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=name)

    def fresh_uri(self, bucket: str, stem: str) -> str:
        """A dataset URI never handed out before by this server: a module-scoped fixture runs again
        when pytest-xdist gives its worker another module's tests in between, and the server
        outlives both."""
        return f"s3://{bucket}/{stem}-{next(self._names)}.lance"

    def read_only_options(self) -> dict[str, str]:
        """Storage options of an IAM user that may only read (moto enforces the policy): writing a
        tag or a version fails with 403."""
        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
        )
        name = f"reader{len(iam.list_users()['Users'])}"
        iam.create_user(UserName=name)
        read = {"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": "*"}
        iam.put_user_policy(
            UserName=name, PolicyName="read", PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [read]})
        )
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return {
            **self.storage_options(),
            "aws_access_key_id": key["AccessKeyId"],
            "aws_secret_access_key": key["SecretAccessKey"],
        }

    def storage_options(self, secret: str | None = None) -> dict[str, str]:
        return {
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": secret or self.secret_key,
            "aws_region": "us-east-1",
            "aws_endpoint": self.endpoint,
            "allow_http": "true",
        }


def environment_credentials(server: S3Server) -> dict[str, str]:
    """The same settings as environment variables, which Lance's object store also reads."""
    return {
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": server.secret_key,
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT": server.endpoint,
        "AWS_ALLOW_HTTP": "true",
    }
