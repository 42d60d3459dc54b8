"""`specrouter soak`: concurrent clients load a router for a bounded time; then the figures that say whether
it held: requests, errors by status, latency, throughput, the workers' live states and each process's RSS.

Every client loops until the deadline, each request on a prompt of the held-out workloads asking for
MIN_NEW_TOKENS to `max_new_tokens` tokens: unary or streaming, greedy or sampled (SAMPLED_TEMPERATURE,
SAMPLED_TOP_P, a seed per request), chosen at random. A fraction of the clients (`cancel_fraction`) make
every other request a stream that they end after a few tokens, in turn by cancelling the call and by
closing their channel (a client that goes away); those endings are counted apart from errors. Greedy
outputs of one prompt must agree (the shorter a prefix of the longer) whatever ran beside them.

The load runs `warmup_s` before the measurement (not counted; the RSS at start is read at its end) and
`duration_s` measured. At the deadline the clients start nothing new; requests in flight get `grace_s`
to finish, then they are cancelled ("cut": not an error, but it fails the soak, as a healthy router
finishes them in time). A chunk of a stream may carry several tokens (all that a
cycle emitted): time to first token runs from the call to the first chunk with tokens, and time
between tokens shares each later chunk's gap among its tokens.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from specrouter.report.soak_results import (CANCELLED, CUT, CUT_JOIN_S, DISCONNECTED, MIXED_KINDS, OWN_ENDINGS,
                                            STREAM_CANCELLED, STREAM_DROPPED, STREAM_SAMPLED, UNARY_GREEDY,
                                            UNARY_SAMPLED, GreedyOutputs, Outcome, Tally, parse_duration,
                                            spoken_duration)
from specrouter.report.workloads import Prompt
from specrouter.v1 import router_pb2 as pb
from specrouter.v1 import router_pb2_grpc, worker_pb2, worker_pb2_grpc

MIN_NEW_TOKENS = 8
SAMPLED_TEMPERATURE, SAMPLED_TOP_P = 0.8, 0.95
END_AFTER_TOKENS = (1, 6)     # a cancelling client ends its stream once it holds this many tokens (range)
PROMPTS_PER_KIND = 16         # held-out prompts of each workload kind the clients draw from
CALL_TIMEOUT_S = 300.0        # a call's deadline: a router that hangs shows as DEADLINE_EXCEEDED
RELEASE_WAIT_S = 15.0         # how long the workers get to drop their states after the load
PROGRESS_EVERY_S = 10.0


# -- settings -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoakSettings:
    clients: int = 16
    duration_s: float = 600.0
    warmup_s: float = 30.0
    grace_s: float = 30.0
    cancel_fraction: float = 0.25
    max_new_tokens: int = 48
    max_rss_growth: float = 10.0   # percent
    seed: int = 0

    @classmethod
    def parse(cls, duration: str, warmup: str, grace: str, **values) -> SoakSettings:
        """Settings from the command line's values (durations as text); ValueError says what is wrong."""
        settings = cls(duration_s=parse_duration(duration), warmup_s=parse_duration(warmup),
                       grace_s=parse_duration(grace), **values)
        settings.validate()
        return settings

    def validate(self) -> None:
        wrong = []
        if self.clients < 1:
            wrong.append(f"--clients must be at least 1, got {self.clients}")
        if self.duration_s <= 0:
            wrong.append(f"--duration must be more than 0, got {self.duration_s:g} s")
        if self.warmup_s < 0 or self.grace_s < 0:
            wrong.append("--warmup and --grace cannot be negative")
        if not 0 <= self.cancel_fraction <= 1:
            wrong.append(f"--cancel-fraction must be in [0, 1], got {self.cancel_fraction}")
        if self.max_new_tokens < MIN_NEW_TOKENS:
            wrong.append(f"--max-new-tokens must be at least {MIN_NEW_TOKENS}, got {self.max_new_tokens}")
        if self.max_rss_growth < 0:
            wrong.append(f"--max-rss-growth cannot be negative, got {self.max_rss_growth}")
        if wrong:
            raise ValueError("; ".join(wrong))

    def cancelling_clients(self) -> int:
        """How many clients end streams early: the fraction rounded, one at least unless it is 0."""
        if self.cancel_fraction == 0:
            return 0
        return min(self.clients, max(1, round(self.clients * self.cancel_fraction)))


def next_kind(rng: random.Random, cancelling: bool, count: int) -> str:
    """The kind of a client's request number `count`: a cancelling client ends every other request early,
    by cancelling and by closing its channel in turn; the rest are drawn from MIXED_KINDS."""
    if cancelling and count % 2 == 1:
        return STREAM_CANCELLED if count % 4 == 1 else STREAM_DROPPED
    return rng.choice(MIXED_KINDS)


# -- processes ------------------------------------------------------------------------------------


def rss_kib(pid: int) -> int | None:
    """VmRSS of process `pid` in KiB (from /proc), or None when it is not there."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def rss_rows(start: dict[str, int | None], end: dict[str, int | None]) -> dict[str, dict]:
    """Per process: RSS at start and end in MiB and the growth in percent (None where not read)."""
    rows = {}
    for name in start:
        a, b = start[name], end.get(name)
        growth = (b - a) / a * 100 if a and b is not None else None
        rows[name] = {"start_mib": None if a is None else a / 1024, "end_mib": None if b is None else b / 1024,
                      "growth_pct": growth}
    return rows


def live_states(workers: dict[str, str]) -> dict[str, int | None]:
    """Each worker's live states (its Info RPC), None for one that does not answer."""
    out: dict[str, int | None] = {}
    for name, address in workers.items():
        with grpc.insecure_channel(address) as channel:
            try:
                out[name] = worker_pb2_grpc.WorkerServiceStub(channel).Info(worker_pb2.InfoRequest(),
                                                                            timeout=10).live_states
            except grpc.RpcError:
                out[name] = None
    return out


def wait_released(workers: dict[str, str], wait_s: float = RELEASE_WAIT_S) -> tuple[dict[str, int | None], float]:
    """Live states once every worker holds none, or as they are after `wait_s`; and the seconds waited."""
    started = time.monotonic()
    while True:
        states = live_states(workers)
        waited = time.monotonic() - started
        if all(s == 0 for s in states.values()) or waited >= wait_s:
            return states, waited
        time.sleep(0.2)


# -- the load -------------------------------------------------------------------------------------


def _channel(address: str) -> grpc.Channel:
    from specrouter.client import CHANNEL_OPTIONS

    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


class Load:
    """The clients and what they share: the timeline, the tallies, the calls in flight (to cut at the end)."""

    def __init__(self, address: str, settings: SoakSettings, prompts: Sequence[Prompt], start: float):
        self.address, self.settings, self.prompts = address, settings, list(prompts)
        self.measure_at = start + settings.warmup_s
        self.stop_at = self.measure_at + settings.duration_s
        self.lock = threading.Lock()
        self.warmup, self.measured = Tally(), Tally()
        self.greedy = GreedyOutputs()
        self.in_flight: dict[int, object] = {}
        self.crashed: list[str] = []   # clients that stopped on an exception of their own
        self.cutting = False
        cancelling = settings.cancelling_clients()
        # the cancelling clients spread among the others
        self.cancelling = {round(k * settings.clients / cancelling) for k in range(cancelling)} if cancelling else set()
        self.threads = [threading.Thread(target=self._client, args=(i,), name=f"soak-client-{i}", daemon=True)
                        for i in range(settings.clients)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def running(self) -> int:
        return sum(t.is_alive() for t in self.threads)

    def join(self, until: float) -> None:
        for t in self.threads:
            t.join(max(0.0, until - time.monotonic()))

    def cut(self) -> int:
        """Cancels every call still in flight; how many."""
        with self.lock:
            self.cutting = True
            calls = list(self.in_flight.values())
        for call in calls:
            call.cancel()
        return len(calls)

    def _client(self, index: int) -> None:
        rng = random.Random(self.settings.seed * 1_000_003 + index)
        cancelling = index in self.cancelling
        channel = _channel(self.address)
        count = 0
        try:
            while time.monotonic() < self.stop_at:
                kind = next_kind(rng, cancelling, count)
                count += 1
                prompt = rng.choice(self.prompts).prompt
                request = self._request(rng, kind, prompt)
                stub = router_pb2_grpc.RouterServiceStub(channel)
                if kind in (UNARY_GREEDY, UNARY_SAMPLED):
                    outcome, tokens = self._unary(index, stub, kind, request)
                else:
                    end_after = rng.randint(*END_AFTER_TOKENS) if kind in (STREAM_CANCELLED, STREAM_DROPPED) else 0
                    outcome, tokens = self._stream(index, stub, channel, kind, request, end_after)
                self._record(outcome, prompt if request.temperature == 0 else None, tokens)
                if outcome.ending == DISCONNECTED:
                    channel = _channel(self.address)
        except Exception as exc:   # a fault of the client itself: reported, never a silent stop
            with self.lock:
                self.crashed.append(f"client {index}: {type(exc).__name__}: {exc}")
        finally:
            channel.close()

    def _request(self, rng: random.Random, kind: str, prompt: str) -> pb.GenerateRequest:
        request = pb.GenerateRequest(prompt=prompt, max_new_tokens=rng.randint(MIN_NEW_TOKENS, self.settings.max_new_tokens))
        sampled = kind in (UNARY_SAMPLED, STREAM_SAMPLED) or (kind in (STREAM_CANCELLED, STREAM_DROPPED)
                                                               and rng.random() < 0.5)
        if sampled:
            request.temperature, request.top_p, request.seed = SAMPLED_TEMPERATURE, SAMPLED_TOP_P, rng.getrandbits(63)
        return request

    def _enter(self, index: int, call) -> None:
        with self.lock:
            self.in_flight[index] = call
            cutting = self.cutting
        if cutting:
            call.cancel()

    def _leave(self, index: int) -> None:
        with self.lock:
            self.in_flight.pop(index, None)

    def _failed(self, outcome: Outcome, exc: grpc.RpcError) -> Outcome:
        if self.cutting and exc.code() == grpc.StatusCode.CANCELLED:
            outcome.ending = CUT
        else:
            outcome.ending, outcome.error, outcome.message = "", exc.code().name, exc.details() or ""
        outcome.ended = time.monotonic()
        return outcome

    def _unary(self, index: int, stub, kind: str, request) -> tuple[Outcome, list[int]]:
        outcome = Outcome(kind, time.monotonic(), 0.0)
        future = stub.Generate.future(request, timeout=CALL_TIMEOUT_S)
        self._enter(index, future)
        try:
            reply = future.result()
        except grpc.FutureCancelledError:
            outcome.ending, outcome.ended = CUT, time.monotonic()
            return outcome, []
        except grpc.RpcError as exc:
            return self._failed(outcome, exc), []
        finally:
            self._leave(index)
        outcome.ended, outcome.tokens = time.monotonic(), len(reply.token_ids)
        return outcome, list(reply.token_ids)

    def _stream(self, index: int, stub, channel, kind: str, request, end_after: int) -> tuple[Outcome, list[int]]:
        outcome = Outcome(kind, time.monotonic(), 0.0)
        tokens: list[int] = []
        last = outcome.started
        call = stub.GenerateStream(request, timeout=CALL_TIMEOUT_S)
        self._enter(index, call)
        try:
            for chunk in call:
                if chunk.token_ids:
                    now = time.monotonic()
                    if outcome.first_token_s is None:
                        outcome.first_token_s = now - outcome.started
                    else:
                        outcome.gaps.append((now - last, len(chunk.token_ids)))
                    last = now
                    tokens += chunk.token_ids
                if end_after and len(tokens) >= end_after:
                    if kind == STREAM_CANCELLED:
                        call.cancel()
                        outcome.ending = CANCELLED
                    else:
                        channel.close()
                        outcome.ending = DISCONNECTED
                    break
        except grpc.RpcError as exc:
            self._failed(outcome, exc)
        finally:
            self._leave(index)
        if not outcome.ended:
            outcome.ended = time.monotonic()
        outcome.tokens = len(tokens)
        return outcome, tokens

    def _record(self, outcome: Outcome, greedy_prompt: str | None, tokens: list[int]) -> None:
        with self.lock:
            (self.measured if outcome.started >= self.measure_at else self.warmup).observe(outcome)
            if greedy_prompt is not None and not outcome.error:
                self.greedy.check(greedy_prompt, tokens)


# -- the soak -------------------------------------------------------------------------------------


def run_soak(settings: SoakSettings, router: str | None = None, pool_dir: Path | None = None,
             redis_url: str | None = None, say: Callable[[str], None] = lambda _line: None,
             prompts: Sequence[Prompt] | None = None, release_wait_s: float = RELEASE_WAIT_S) -> dict:
    """Starts a local cluster of `pool_dir` unless `router` is given, runs the load on `prompts` (default:
    the held-out workloads), and returns the figures (JSON-ready); stops the cluster."""
    import tempfile

    from specrouter.client import Client
    from specrouter.launcher import LocalCluster
    from specrouter.report.workloads import builtin_prompts

    settings.validate()
    prompts = list(prompts or builtin_prompts(PROMPTS_PER_KIND))
    cluster = None
    try:
        if router is None:
            say("starting a local cluster of the pool ...")
            cluster = LocalCluster(pool_dir, Path(tempfile.mkdtemp(prefix="specrouter-soak-")), port=0,
                                   redis_url=redis_url, on_start=lambda s: say(f"{s.name} up at {s.address}"))
            router = cluster.router.address
        with Client(router, timeout_s=30) as client:
            workers = {m.name: m.address for m in client.models()}
        pids = {s.name: s.proc.pid for s in cluster.services} if cluster else {}
        return _soak(settings, router, prompts, workers, pids, cluster, say, release_wait_s)
    finally:
        if cluster is not None:
            cluster.stop()


def _soak(settings: SoakSettings, router: str, prompts: Sequence[Prompt], workers: dict[str, str],
          pids: dict[str, int], cluster, say: Callable[[str], None], release_wait_s: float) -> dict:
    load = Load(router, settings, prompts, time.monotonic())
    say(f"soak: {settings.clients} clients ({len(load.cancelling)} ending streams early) against {router}: "
        f"{spoken_duration(settings.warmup_s)} of warm-up, then {spoken_duration(settings.duration_s)} measured")
    load.start()
    _progress_until(load, load.measure_at, say)
    rss_start = {name: rss_kib(pid) for name, pid in pids.items()}
    _progress_until(load, load.stop_at, say)
    say(f"soak: deadline; {load.running()} clients finish what they have in flight "
        f"(up to {spoken_duration(settings.grace_s)})")
    load.join(load.stop_at + settings.grace_s)
    cut = load.cut() if load.running() else 0
    if cut:
        say(f"soak: cut {cut} requests still in flight after the grace")
    load.join(time.monotonic() + CUT_JOIN_S)
    stuck = load.running()
    states, waited = wait_released(workers, release_wait_s)
    rss_end = {name: rss_kib(pid) for name, pid in pids.items()}
    exited = {s.name: s.proc.returncode for s in cluster.services if not s.alive()} if cluster else {}
    with load.lock:
        tally = load.measured
        seconds = max(load.stop_at, tally.last_end or 0.0) - load.measure_at
        report = {
            "router": router, "local_cluster": cluster is not None,
            "settings": asdict(settings), "cancelling_clients": len(load.cancelling),
            "seconds": seconds, "warmup": _warmup_figures(load.warmup),
            **tally.summary(seconds),
            "greedy_checked": load.greedy.checked, "greedy_differ": list(load.greedy.differ),
            "live_states": states, "release_wait_s": waited,
            "rss": rss_rows(rss_start, rss_end) if pids else None,
            "exited": exited, "clients_stuck": stuck, "clients_crashed": list(load.crashed),
        }
    return report


def _warmup_figures(tally: Tally) -> dict:
    """What the verdict needs of the warm-up, whose requests the figures leave out: its errors and cuts."""
    s = tally.summary(1.0)
    return {"requests": s["requests"], "errors": s["errors"], "errors_by_status": s["errors_by_status"],
            "first_error": s["first_error"], "cut": s["endings"][CUT]}


def _progress_until(load: Load, until: float, say: Callable[[str], None]) -> None:
    while (left := until - time.monotonic()) > 0:
        time.sleep(min(PROGRESS_EVERY_S, left))
        say(progress_line(load, time.monotonic()))


def progress_line(load: Load, now: float) -> str:
    s = load.settings
    if now < load.measure_at:
        return f"soak: warm-up {spoken_duration(round(now - load.measure_at + s.warmup_s))}/{spoken_duration(s.warmup_s)}"
    with load.lock:
        t = load.measured
        requests, errors, tokens = sum(t.requests.values()), sum(t.errors.values()), t.tokens
        own = sum(t.endings[e] for e in OWN_ENDINGS)
    elapsed = min(now, load.stop_at) - load.measure_at
    return (f"soak {spoken_duration(round(elapsed))}/{spoken_duration(s.duration_s)}: {requests} requests, "
            f"{errors} errors, {own} ended by the clients, {tokens / max(elapsed, 1e-9):.0f} tokens/s")
