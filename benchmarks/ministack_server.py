"""MiniStack's S3 service on a free loopback port, for the object-store benchmark.

Guarantees: `MiniStackServer.serving(bucket)` starts ``ministack`` (pinned `VERSION`, run by
``uvx`` in its own environment, so the project's lock is untouched; the first start downloads it
from PyPI), waits until it answers, creates ``bucket``, and stops the server when the block
ends. It holds objects in memory and answers a ranged GET by slicing, so its cost per request does
not grow with the object (moto, the tests' server, reads the whole object for each one:
`probes/probe_store_rate.py`). `storage_options()` are Lance's options for it (any credentials pass).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import boto3

from tests.ports import free_port

VERSION = "1.5.33"
_CREDENTIALS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}


class MiniStackServer:
    """``ministack`` serving S3 on ``endpoint``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen | None = None

    @classmethod
    @contextmanager
    def serving(cls, *buckets: str) -> Iterator[MiniStackServer]:
        server = cls()
        server.start()
        try:
            for bucket in buckets:
                server.client().create_bucket(Bucket=bucket)
            yield server
        finally:
            server.stop()

    def start(self, timeout: float = 300.0) -> None:
        uvx = shutil.which("uvx") or os.path.expanduser("~/.local/bin/uvx")
        env = {
            **os.environ,
            "GATEWAY_PORT": str(self.port),
            "BIND_HOST": "127.0.0.1",
            "SERVICES": "s3",
            "LOG_LEVEL": "ERROR",
        }
        self._process = subprocess.Popen(
            [uvx, "--from", f"ministack=={VERSION}", "ministack"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"ministack exited with status {self._process.returncode} (is uvx installed?)")
            try:
                self.client().list_buckets()
                return
            except Exception:  # noqa: BLE001 - not listening yet
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"ministack did not answer on {self.endpoint} within {timeout:.0f} s")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, 15)
            self._process.wait(timeout=30)

    def client(self) -> object:
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", **_CREDENTIALS)

    def storage_options(self) -> dict[str, str]:
        return {"aws_endpoint": self.endpoint, "aws_region": "us-east-1", "allow_http": "true", **_CREDENTIALS}
