"""Starting the services as child processes, each on a free port, and keeping them up: `specrouter up`
and the tests."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
LISTENING = re.compile(r"listening on (\S+):(\d+)")
METRICS = re.compile(r"metrics at http://(\S+):(\d+)(/\S*)")   # printed before the listening line
START_TIMEOUT_S = 300.0
LOG_TAIL_CHARS = 2000   # the end of a service's log that a failure message quotes


class ServiceProcess:
    """`python -m MODULE ARGS...`, which prints `... listening on HOST:PORT` once it serves (and before it,
    `... metrics at URL` where it serves its Prometheus metrics: `metrics_url`).

    Its stdout and stderr go to `log_dir/NAME.log`; `respawn` starts it again on the port it had, the
    log kept (a restart appends to it)."""

    def __init__(self, module: str, *args: str, log_dir: Path, env: dict[str, str] | None = None,
                 name: str | None = None):
        self.name = name or module.rsplit(".", 1)[-1]
        self.module, self.args, self.env = module, list(args), {**os.environ, **(env or {})}
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{self.name}.log"
        self.log_path.write_text("")
        self.address: str | None = None
        self.metrics_url: str | None = None
        self.restarts = 0
        self._spawn(self.args)
        self.address = self._wait_listening()

    def _spawn(self, args: Sequence[str]) -> None:
        self._ready, self._ended = threading.Event(), threading.Event()
        self._metrics_at: str | None = None
        log_file = self.log_path.open("a")   # appends: a restart keeps what the last run wrote
        self.proc = subprocess.Popen([sys.executable, "-m", self.module, *args], stdout=subprocess.PIPE,
                                     stderr=log_file, text=True, env=self.env)
        # stdout is read to its end, into the log: a chatty child would block on a full pipe
        threading.Thread(target=self._drain, args=(self.proc, log_file, self._ready, self._ended),
                         name=f"{self.name}-stdout", daemon=True).start()

    def _drain(self, proc: subprocess.Popen, log_file, ready: threading.Event, ended: threading.Event) -> None:
        try:
            for line in proc.stdout:
                log_file.write(line)
                log_file.flush()
                metrics = METRICS.search(line)
                if metrics and not ready.is_set():
                    self._metrics_at = f"http://{_reachable(metrics.group(1))}:{metrics.group(2)}{metrics.group(3)}"
                m = LISTENING.search(line)
                if m and not ready.is_set():
                    self._listening_at = f"{_reachable(m.group(1))}:{m.group(2)}"
                    ready.set()
        finally:
            log_file.close()
            ended.set()

    def _wait_listening(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._ready.wait(0.05) and not self._ended.is_set() and time.monotonic() < deadline:
            pass
        if self._ready.is_set():
            self.metrics_url = self._metrics_at
            return self._listening_at
        self.stop()
        raise RuntimeError(f"{self.name} did not start; the end of {self.log_path}:\n{self.log_tail()}")

    def ready(self) -> bool:
        """Whether the run started last has printed its listening line."""
        return self._ready.is_set()

    def listening_address(self) -> str:
        """HOST:PORT from the listening line of the run started last (once `ready()`)."""
        return self._listening_at

    def listening_metrics(self) -> str | None:
        """The metrics URL the run started last printed (once `ready()`), None if it serves none."""
        return self._metrics_at

    def respawn(self) -> None:
        """Starts the service again, on the port it had (clients and the router hold its address) and the
        metrics port it had (so does a Prometheus); returns at once: `ready()` says when it listens, `alive()`
        whether it failed."""
        self.restarts += 1
        port = self.address.rsplit(":", 1)[1]
        with self.log_path.open("a") as f:
            f.write(f"--- restart {self.restarts}: the last run exited with code {self.proc.returncode} ---\n")
        args = with_port(self.args, port)
        if self.metrics_url is not None:
            args = with_port(args, self.metrics_url.rsplit(":", 1)[1].split("/", 1)[0], "--metrics-port")
        self._spawn(args)

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        with self.log_path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - chars))
            return f.read().decode("utf-8", "replace")

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
        self._ended.wait(5)   # the log has all the run wrote
        return self.proc.returncode


def with_port(args: Sequence[str], port: str, flag: str = "--port") -> list[str]:
    """`args` with `--port PORT` (or `flag PORT`) in place of the port they gave (or with it added)."""
    out = list(args)
    if flag in out[:-1]:
        out[out.index(flag) + 1] = port
        return out
    return [*out, flag, port]


def _reachable(host: str) -> str:
    """A host a client on this machine can reach for one a service printed (every interface: loopback)."""
    return "127.0.0.1" if host in ("[::]", "0.0.0.0") else host


def exit_description(code: int) -> str:
    """`code 1`, or `-9 (SIGKILL)` for a process ended by a signal."""
    if code < 0:
        try:
            return f"code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"code {code}"


@dataclass(frozen=True)
class Backoff:
    """How long a failed service waits before its next start: `first_s`, doubling with each failure in a
    row up to `most_s`; a run that stayed up `reset_after_s` clears the failures before it."""

    first_s: float = 0.5
    most_s: float = 30.0
    reset_after_s: float = 60.0

    def delay(self, failures: int) -> float:
        """The wait before the next start after `failures` failures in a row (1 or more)."""
        return min(self.most_s, self.first_s * 2 ** min(failures - 1, 64))


@dataclass
class _Watch:
    failures: int = 0              # failures in a row
    up_since: float = 0.0          # when the current run started serving
    due: float | None = None       # when the next start is due, while the service is down
    starting: float | None = None  # when the current start began, until it serves or fails


class Supervisor:
    """Keeps services up: one that exits is logged (its exit code and the end of its log) and started again
    on its port after a backoff; `run` does so until its stop event is set.

    `step` is one round of it, at time `now` (time.monotonic); the tests drive it directly."""

    POLL_S = 0.2

    def __init__(self, services: Sequence[ServiceProcess], backoff: Backoff = Backoff(),
                 on_back: Callable[[ServiceProcess], None] | None = None):
        self.services = list(services)
        self.backoff = backoff
        self.on_back = on_back or (lambda _s: None)
        now = time.monotonic()
        self._watch = {s.name: _Watch(up_since=now) for s in self.services}

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.POLL_S):
            self.step(time.monotonic())

    def due(self, service: ServiceProcess) -> float | None:
        """When `service` starts again, while it waits to."""
        return self._watch[service.name].due

    def step(self, now: float) -> None:
        for service in self.services:
            watch = self._watch[service.name]
            if watch.due is not None:
                if now >= watch.due:
                    watch.due, watch.starting = None, now
                    service.respawn()
            elif watch.starting is not None:
                if service.ready():
                    watch.starting, watch.up_since = None, now
                    service.address = service.listening_address()
                    service.metrics_url = service.listening_metrics()
                    log.warning("%s is back at %s (restart %d)", service.name, service.address, service.restarts)
                    self.on_back(service)
                elif not service.alive():
                    self._failed(service, watch, now, "did not start again")
                elif now - watch.starting > START_TIMEOUT_S:
                    self._failed(service, watch, now, f"did not listen within {START_TIMEOUT_S:.0f} s")
            elif not service.alive():
                if now - watch.up_since >= self.backoff.reset_after_s:
                    watch.failures = 0
                self._failed(service, watch, now, "exited")

    def _failed(self, service: ServiceProcess, watch: _Watch, now: float, what: str) -> None:
        service.stop()   # reaps it and waits for the end of its log
        watch.starting = None
        watch.failures += 1
        delay = self.backoff.delay(watch.failures)
        watch.due = now + delay
        log.warning("%s %s with %s; starting it again on %s in %.1f s (failure %d in a row). The end of %s:\n%s",
                    service.name, what, exit_description(service.proc.returncode), service.address, delay,
                    watch.failures, service.log_path, service.log_tail().rstrip())


DRAFTER_CPU_THREADS = 1  # PyTorch threads of a worker other than the target's when the pool runs on the CPU
# How long an idle OpenMP thread of a CPU worker spins before it sleeps (GNU OpenMP's GOMP_SPINCOUNT, in
# spin iterations). Its default, 300,000, keeps a core busy for milliseconds after each forward pass,
# taking it from the next model of the chain and from the router. Far fewer, and the target's threads
# fall asleep between the operations of one forward pass and pay a wake-up for each of them, which costs
# more than the whole forward's matrix products on a small model. This count covers the gaps between
# operations and ends well before the next call arrives.
CPU_SPINCOUNT = "20000"


@dataclass(frozen=True)
class ClusterTLS:
    """TLS for a local cluster from one CA and one certificate: every service serves with the certificate
    (it must name the host the services listen on, 127.0.0.1), the workers and the profiler take only
    clients signed by `ca` (mutual TLS), and the router presents the same certificate to them (so it must
    allow client use as well as server use). The router's public side asks clients for no certificate."""

    ca: Path
    cert: Path
    key: Path

    def server_args(self, mutual: bool) -> list[str]:
        args = ["--tls-cert", str(self.cert), "--tls-key", str(self.key)]
        return args + (["--tls-client-ca", str(self.ca)] if mutual else [])

    def upstream_args(self) -> list[str]:
        return ["--upstream-ca", str(self.ca), "--upstream-cert", str(self.cert), "--upstream-key", str(self.key)]


# Router flags of a cluster that measures speed over prompts it sees more than once (rounds, screening):
# the lookup level would otherwise copy whole answers from its own earlier requests, a speed no user with
# new prompts gets.
MEASURING_ROUTER_ARGS = ("--lookup-recent-tokens", "0")


class LocalCluster:
    """The embedded default: a profiler, one worker per pool model and a router, on localhost; with
    `gateway_port` (0: a free one), the OpenAI-compatible HTTP gateway in front of the router too, which
    formats chat messages with the target's chat template.

    On the CPU every worker shares the machine's cores. The target keeps PyTorch's default (a thread
    per core): it does most of the compute, and its verification of a window at batch 4 and beyond
    runs much faster on every core. The drafters and intermediate verifiers get DRAFTER_CPU_THREADS:
    small models gain little from more threads, and extra OpenMP teams that wait by spinning on cores
    the target needs slow every forward pass of the target down. For the same reason their idle
    OpenMP threads stop spinning soon after a forward pass (CPU_SPINCOUNT), unless the caller's
    environment sets GOMP_SPINCOUNT itself.

    With `models_in_router` there are no worker processes: the router serves the pool's models in its own
    process (specrouter/models_in_process.py), and a chain's levels cost no RPC.

    With `tls` every channel runs over TLS (ClusterTLS). A router token travels in the environment
    (SPECROUTER_ROUTER_AUTH_TOKEN, in `env` or inherited) or as a file (`--auth-token-file` in
    `router_args`), never as a command-line value.
    """

    def __init__(self, pool_dir: Path, log_dir: Path, port: int = 0, redis_url: str | None = None,
                 dtype: str = "float32", device: str = "cpu", env: dict[str, str] | None = None,
                 on_start=None, router_args: list[str] | None = None, tls: ClusterTLS | None = None,
                 gateway_port: int | None = None, models_in_router: bool = False):
        from specrouter.pool.load import PoolDir

        pool = PoolDir.open(pool_dir)
        self.pool_dir, self.env = pool_dir, env
        self.services: list[ServiceProcess] = []
        say = on_start or (lambda _s: None)
        try:
            server_tls = tls.server_args(mutual=True) if tls else []
            profiler_args = (["--host", "127.0.0.1", "--port", "0"] + (["--redis-url", redis_url] if redis_url else [])
                             + server_tls)
            self.profiler = self._start("specrouter.profiler", profiler_args, log_dir, env, "profiler", say)
            spin = device == "cpu" and "GOMP_SPINCOUNT" not in os.environ
            worker_env = {"GOMP_SPINCOUNT": CPU_SPINCOUNT, **(env or {})} if spin else env
            workers = [] if models_in_router else [
                self._start("specrouter.worker", ["--model-dir", str(pool.model_dir(n)), "--name", n,
                                                  "--dtype", dtype, "--device", device,
                                                  *self._thread_args(n, pool.target, device), *server_tls],
                            log_dir, worker_env, f"worker-{n}", say) for n in pool.names]
            models = (["--models-in-process", "true", "--models-dtype", dtype, "--models-device", device] if models_in_router
                      else ["--workers", ",".join(w.address for w in workers)])
            self.router = self._start("specrouter.router", [
                *models, "--tokenizer-dir", str(pool.model_dir(pool.target)),
                "--target", pool.target, "--profiler", self.profiler.address, "--port", str(port),
                "--pool-dir", str(pool_dir), *(tls.server_args(mutual=False) + tls.upstream_args() if tls else []),
                *(router_args or [])],
                log_dir, env, "router", say)
            self.gateway = None if gateway_port is None else self._start("specrouter.gateway", [
                "--router", self.router.address, "--tokenizer-dir", str(pool.model_dir(pool.target)),
                "--host", "127.0.0.1", "--port", str(gateway_port),
                *(["--router-ca", str(tls.ca), "--tls-cert", str(tls.cert), "--tls-key", str(tls.key)] if tls else [])],
                log_dir, env, "gateway", say)
        except BaseException:
            self.stop()
            raise

    def another_router(self, log_dir: Path, router_args: Sequence[str], name: str) -> ServiceProcess:
        """One more router over the cluster's workers and profiler, with flags of its own (to compare two
        routers' settings on the same worker processes); it stops with the cluster."""
        from specrouter.pool.load import PoolDir

        pool = PoolDir.open(self.pool_dir)
        workers = [s.address for s in self.services if s.name.startswith("worker-")]
        if not workers:
            raise ValueError("another router needs the cluster's workers; this cluster's router holds the models")
        return self._start("specrouter.router", [
            "--workers", ",".join(workers), "--tokenizer-dir", str(pool.model_dir(pool.target)), "--target",
            pool.target, "--profiler", self.profiler.address, "--port", "0", "--pool-dir", str(self.pool_dir),
            *router_args], log_dir, self.env, name, lambda _s: None)

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
