"""Starting the services as child processes, each on a free port: `specrouter up` and the tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

LISTENING = re.compile(r"listening on (\S+):(\d+)")
START_TIMEOUT_S = 300.0


class ServiceProcess:
    """`python -m MODULE ARGS...`, which prints `... listening on HOST:PORT` once it serves."""

    def __init__(self, module: str, *args: str, log_dir: Path, env: dict[str, str] | None = None,
                 name: str | None = None):
        self.name = name or module.rsplit(".", 1)[-1]
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{self.name}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, env={**os.environ, **(env or {})})
        self.address = self._wait_listening()

    def _wait_listening(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = LISTENING.search(line)
            if m:
                # keep draining stdout into the log, or a chatty child would block on a full pipe
                threading.Thread(target=self._drain, daemon=True).start()
                host = "127.0.0.1" if m.group(1) in ("[::]", "0.0.0.0") else m.group(1)
                return f"{host}:{m.group(2)}"
        self.stop()
        raise RuntimeError(f"{self.name} did not start; the end of {self.log_path}:\n{self.log_path.read_text()[-3000:]}")

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._log.closed:
            self._log.flush()
        return self.proc.returncode


DRAFTER_CPU_THREADS = 1  # PyTorch threads of a worker other than the target's when the pool runs on the CPU
# How long an idle OpenMP thread of a CPU worker spins before it sleeps (GNU OpenMP's GOMP_SPINCOUNT, in
# spin iterations). Its default, 300,000, keeps a core busy for milliseconds after each forward pass,
# taking it from the next model of the chain and from the router. Far fewer, and the target's threads
# fall asleep between the operations of one forward pass and pay a wake-up for each of them, which costs
# more than the whole forward's matrix products on a small model. This count covers the gaps between
# operations and ends well before the next call arrives.
CPU_SPINCOUNT = "20000"


class LocalCluster:
    """The embedded default: a profiler, one worker per pool model and a router, on localhost.

    On the CPU every worker shares the machine's cores. The target keeps PyTorch's default (a thread
    per core): it does most of the compute, and its verification of a window at batch 4 and beyond
    runs much faster on every core. The drafters and intermediate verifiers get DRAFTER_CPU_THREADS:
    small models gain little from more threads, and extra OpenMP teams that wait by spinning on cores
    the target needs slow every forward pass of the target down. For the same reason their idle
    OpenMP threads stop spinning soon after a forward pass (CPU_SPINCOUNT), unless the caller's
    environment sets GOMP_SPINCOUNT itself.
    """

    def __init__(self, pool_dir: Path, log_dir: Path, port: int = 0, redis_url: str | None = None,
                 dtype: str = "float32", device: str = "cpu", env: dict[str, str] | None = None,
                 on_start=None, router_args: list[str] | None = None):
        from specrouter.pool.load import PoolDir

        pool = PoolDir.open(pool_dir)
        self.services: list[ServiceProcess] = []
        say = on_start or (lambda _s: None)
        try:
            profiler_args = ["--host", "127.0.0.1", "--port", "0"] + (["--redis-url", redis_url] if redis_url else [])
            self.profiler = self._start("specrouter.profiler", profiler_args, log_dir, env, "profiler", say)
            spin = device == "cpu" and "GOMP_SPINCOUNT" not in os.environ
            worker_env = {"GOMP_SPINCOUNT": CPU_SPINCOUNT, **(env or {})} if spin else env
            workers = [self._start("specrouter.worker", ["--model-dir", str(pool.model_dir(n)), "--name", n,
                                                         "--dtype", dtype, "--device", device,
                                                         *self._thread_args(n, pool.target, device)],
                                   log_dir, worker_env, f"worker-{n}", say) for n in pool.names]
            self.router = self._start("specrouter.router", [
                "--workers", ",".join(w.address for w in workers), "--tokenizer-dir", str(pool.model_dir(pool.target)),
                "--target", pool.target, "--profiler", self.profiler.address, "--port", str(port),
                "--pool-dir", str(pool_dir), *(router_args or [])],
                log_dir, env, "router", say)
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _thread_args(model: str, target: str, device: str) -> list[str]:
        if device != "cpu" or model == target:
            return []
        return ["--torch-threads", str(DRAFTER_CPU_THREADS)]

    def _start(self, module, args, log_dir, env, name, say) -> ServiceProcess:
        service_env = {"OTEL_SERVICE_NAME": f"specrouter-{name}", **(env or {})}
        service = ServiceProcess(module, *args, log_dir=log_dir, env=service_env, name=name)
        self.services.append(service)
        say(service)
        return service

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()
