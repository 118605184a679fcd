"""The S3 workload of ``bench_real_data.py``: objects of 16 KiB on moto's S3 server (``python
-m moto.server`` on 127.0.0.1, started for the benchmark and stopped at its end), each read
with s3fs (``cat_file``) after a 50 ms sleep in the reading thread, where a slow network
would keep it waiting; and the check of every object's bytes."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conveyor.tools.bench.harness.tally import Tally

OBJECT_BYTES = 16 * 1024
#: Every read waits this long first: the latency of a slow network.
LATENCY_S = 0.05
THREADS = 16
BUCKET = "bench"
#: Seconds moto's server has to answer at its start.
SERVER_START_S = 60.0


def object_bytes(index: int) -> bytes:
    """Object ``index``'s content: its number, eight digits, repeated."""
    return f"{index:08d}".encode() * (OBJECT_BYTES // 8)


@functools.cache
def s3_filesystem(endpoint: str) -> Any:
    """One s3fs filesystem per process for moto's server (its credentials are moto's
    defaults; 32 pooled connections, so that 16 threads never wait for one)."""
    import fsspec

    return fsspec.filesystem(
        "s3",
        key="testing",
        secret="testing",
        client_kwargs={"endpoint_url": endpoint, "region_name": "us-west-2"},
        config_kwargs={"max_pool_connections": 32},
    )


def read_object(endpoint: str, url: str) -> bytes:
    """One object, after the injected latency."""
    time.sleep(LATENCY_S)
    return s3_filesystem(endpoint).cat_file(url)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def s3_server() -> Iterator[tuple[str, int]]:
    """moto's S3 server on a free local port, for as long as the block runs: its URL, its pid."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"moto's server exited with code {process.returncode} before it answered")
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not answer at {url} within {SERVER_START_S:.0f} s") from None
                time.sleep(0.1)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux's ``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def put_objects(endpoint: str, count: int) -> list[str]:
    """``count`` objects on the server: their URLs."""
    fs = s3_filesystem(endpoint)
    fs.mkdir(BUCKET)
    urls = [f"s3://{BUCKET}/objects/{index:06d}" for index in range(count)]
    fs.pipe({url: object_bytes(index) for index, url in enumerate(urls)})
    return urls


class ObjectTally(Tally):
    """Each item an object's bytes, its index in its first eight."""

    def see(self, blob: Any) -> None:
        self.count += 1
        if not isinstance(blob, bytes) or len(blob) != OBJECT_BYTES or not blob[:8].isdigit():
            self.wrong(blob[:8] if isinstance(blob, bytes) else blob, f"an object of {OBJECT_BYTES} bytes")
            return
        index = int(blob[:8])
        if blob != object_bytes(index):
            self.wrong(f"object {index}", "its bytes")
        self.id(index)
