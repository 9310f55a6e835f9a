"""Start and stop local processes (simulated workers, the gateway) and read their CPU time.

Shared by the benchmarks and the tests, so both drive the same real processes over loopback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from workers.process import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[2]
_TICK = os.sysconf("SC_CLK_TCK")
# a small simulated worker (4 sequences, 12 ms decode steps: two take ~10 req/s of 64-token streams), the one the
# overload, fairness, batch and replica benchmarks put behind a gateway
SMALL_SIM = ("--max-num-seqs", "4", "--decode-base-ms", "12")


@dataclass
class Proc:
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process so far (from /proc)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start(cmd: list[str], port: int, log: Path, ready_path: str, timeout: float = 20.0,
          cpu: int | None = None) -> Proc:
    """Start ``cmd`` in its own session (optionally pinned to one CPU) and wait until ready_path answers 200."""
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu), *cmd]
    with open(log, "wb") as sink:
        process = subprocess.Popen(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    proc = Proc(process, port, log)
    try:
        wait_ready(process, proc.url + ready_path, timeout, log, " ".join(cmd[:4]))
    except (RuntimeError, TimeoutError):
        proc.kill()
        raise
    return proc


def start_sim(log_dir: Path, *flags: str, model: str = "sim-llama-8b", port: int | None = None,
              ready: str = "/health", cpu: int | None = None) -> Proc:
    """A simulated worker whose answers run to max_tokens (the benches and tests count on exact lengths) unless
    ``flags`` give it a ``--mean-output-tokens`` of its own (the last one given wins)."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "workers.sim", "--port", str(port), "--model", model, "--mean-output-tokens", "0",
           *flags]
    return start(cmd, port, log_dir / f"sim-{port}.log", ready, cpu=cpu)


def start_gateway(log_dir: Path, policy: dict[str, Any], ready: str = "/readyz", cpu: int | None = None,
                  timeout: float = 60.0, data_dir: Path | None = None, port: int | None = None) -> Proc:
    """A gateway process on ``policy``; its data directory is ``data_dir`` (default: a new one in log_dir)."""
    port = port or free_port()
    path = log_dir / f"policy-{port}.yaml"
    path.write_text(yaml.safe_dump(policy))
    data_dir = data_dir or log_dir / f"data-{port}"
    cmd = [sys.executable, "-m", "gateway", "serve", "--policy", str(path), "--port", str(port),
           "--data-dir", str(data_dir)]
    proc = start(cmd, port, log_dir / f"gateway-{port}.log", ready, timeout=timeout, cpu=cpu)
    proc.extra["policy_path"] = path
    return proc


def start_nginx(log_dir: Path, ports: list[int]) -> Proc:
    """nginx on deploy/nginx/tollgate.conf (the sources' front: HTTP/1.1 keep-alive upstream, no buffering) in
    front of gateway replicas on ``ports``; the conf's two example upstream servers become these."""
    import shutil

    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    listen = free_port()
    conf = (ROOT / "deploy" / "nginx" / "tollgate.conf").read_text()
    servers = "".join(f"    server 127.0.0.1:{port} max_fails=3 fail_timeout=5s;\n" for port in ports)
    head, _, rest = conf.partition("    server 127.0.0.1:8081")
    rest = rest.partition("    server 127.0.0.1:8082")[2].partition("\n")[2]
    conf = (head + servers + rest).replace("listen 8080 reuseport;", f"listen 127.0.0.1:{listen};")
    here = log_dir / f"nginx-{listen}"
    here.mkdir(parents=True, exist_ok=True)
    (here / "tollgate.conf").write_text(conf)
    (here / "nginx.conf").write_text(
        f"pid {here}/nginx.pid;\nerror_log {here}/error.log;\nworker_processes 1;\n"
        # streams and queued requests hold two connections each (client and upstream) for their whole life:
        # nginx's default 512 per worker ran out under the 2x overload (500s and resets, measured)
        f"worker_rlimit_nofile 65536;\nevents {{ worker_connections 16384; }}\nhttp {{\n"
        f"  access_log off;\n  client_body_temp_path {here}/body;\n  proxy_temp_path {here}/proxy;\n"
        f"  include {here}/tollgate.conf;\n}}\n")
    return start([binary, "-c", str(here / "nginx.conf"), "-p", str(here), "-g", "daemon off;"], listen,
                 here / "stdout.log", "/healthz", timeout=15)
