"""A real S3-compatible server for the object-store tests: moto's standalone server on a free loopback port,
reached with s3fs over HTTP (nothing is mocked in-process). One server per test process, started on first use and
stopped at exit; each test gets its own bucket.

``s3`` (a fixture) skips, naming the reason, where ``moto[server]`` or ``s3fs`` is not installed (they are in the
``test`` extra; the lighter matrix stacks lack them).
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import socket
import subprocess
import sys
import time
import uuid
import pytest

from tests.distributed import free_port

MISSING = [name for name in ("moto", "s3fs", "flask") if importlib.util.find_spec(name) is None]
REASON = f"needs {', '.join(MISSING)} (pip install 'moto[server]' s3fs: the test extra)" if MISSING else ""


class S3Server:
    """moto's server as a process; ``env`` points boto3/s3fs at it (also for worker processes)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
        self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if self.process.poll() is not None:
                raise RuntimeError(f"moto's server exited with {self.process.returncode}")
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("moto's server did not start within 60 s")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


class Bucket:
    """One test's bucket on the server: its URL, and a way to make the server refuse writes."""

    def __init__(self, server: S3Server) -> None:
        import s3fs

        self.server = server
        self.name = f"test-{uuid.uuid4().hex[:12]}"
        self.url = f"s3://{self.name}"
        self.fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": server.endpoint}, key="testing", secret="testing",
                                    skip_instance_cache=True)
        self.fs.call_s3("create_bucket", Bucket=self.name)

    @property
    def env(self) -> dict[str, str]:
        return self.server.env

    def deny_writes(self, prefix: str = "") -> None:
        """A bucket policy refusing every PutObject under ``prefix`` (as a permissions or quota error would)."""
        policy = {"Version": "2012-10-17", "Statement": [{
            "Effect": "Deny", "Principal": "*", "Action": "s3:PutObject",
            "Resource": f"arn:aws:s3:::{self.name}/{prefix}*"}]}
        self.fs.call_s3("put_bucket_policy", Bucket=self.name, Policy=json.dumps(policy))

    def keys(self, prefix: str = "") -> list[str]:
        """Every object under ``prefix``, relative to the bucket."""
        self.fs.invalidate_cache()
        try:
            return sorted(key[len(self.name) + 1:] for key in self.fs.find(f"{self.name}/{prefix}"))
        except FileNotFoundError:
            return []




_SERVER: list[S3Server] = []


@pytest.fixture
def s3_server() -> S3Server:
    """The one server of this test process (started on first use, stopped at exit): one per process, because
    fsspec keeps one S3 filesystem per set of options, and it would keep talking to the first server's port."""
    if MISSING:
        pytest.skip(REASON)
    if not _SERVER:
        _SERVER.append(S3Server())
        atexit.register(_SERVER[0].stop)
    return _SERVER[0]


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    """A fresh bucket on the session's moto server; this process's environment points s3fs at it."""
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    return Bucket(s3_server)


__all__ = ["MISSING", "REASON", "Bucket", "S3Server", "s3", "s3_server"]
