"""Local server processes: a free port, and waiting until one answers its readiness URL."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(process: subprocess.Popen[bytes], url: str, timeout: float, log: Path, name: str,
               interval: float = 0.05) -> None:
    """Return once ``url`` answers 200; raise (with the log's tail) if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}; log:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    raise TimeoutError(f"{name} was not ready in {timeout:.0f} s; log:\n{log.read_text()[-4000:]}")
