"""Every replica of every model of the pool, as a router finds them.

`--workers` lists addresses, and each names one replica or several: `HOST:PORT` stands for every address
HOST resolves to (a Kubernetes headless Service's name resolves to one address per ready pod),
`dns:///HOST:PORT` is the same in gRPC's spelling, and an IP address stands for itself. Every address is one
replica; its Info says which model it serves. At start every entry must name at least one replica that
answers, and the replicas of a model must agree (`AGREE`: the same checkpoint, served the same way), or the
router does not start.

While the router runs, `refresh` resolves every entry again (every `refresh_s`, on a thread of its own): a
replica at a new address joins once it answers and agrees with the others of its model; one whose address
is gone is no longer placed on, and its channel is closed once no batch holds it (`close_retired`).
Which replicas answer is health.py's; which replica a batch runs on, placement.py's.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc

from specrouter.router.workers import Worker

log = logging.getLogger(__name__)
DNS_SCHEME = "dns:"
# Info fields on which the replicas of a model must agree: the same checkpoint served the same way, so that
# the rows of a batch moved to another replica of the target go on to the output they would have had
AGREE = ("vocab_size", "tokenizer_sha256", "context_length", "parameters", "dtype")
JOIN_WAIT_S = 5.0         # how long a refresh waits for a new replica's Info (one not ready is asked again)
RESOLVE_RETRY_S = 0.5     # between attempts to resolve an entry at start


class PoolMismatch(RuntimeError):
    """The workers do not form a usable pool (tokenizers differ, a model is missing, replicas disagree, ...)."""


@dataclass(frozen=True)
class WorkerAddress:
    """One entry of `--workers`: `text` as given, and the host and port it names."""

    text: str
    host: str
    port: int

    @property
    def literal(self) -> bool:
        """Whether the host is an IP address, which names itself and nothing else."""
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True


def parse_address(text: str) -> WorkerAddress:
    """`HOST:PORT`, `[IPV6]:PORT`, `dns:///HOST:PORT` or `dns:HOST:PORT`."""
    rest = text.strip()
    if rest.startswith(DNS_SCHEME):
        rest = rest[len(DNS_SCHEME):]
        if rest.startswith("//"):
            authority, _, rest = rest[2:].partition("/")
            if authority:
                raise PoolMismatch(f"worker address {text!r} names a DNS server ({authority}); the router resolves "
                                   "with the system's resolver: write dns:///HOST:PORT")
    host, sep, port = rest.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PoolMismatch(f"worker address {text!r} is not HOST:PORT or dns:///HOST:PORT")
    return WorkerAddress(text, host, int(port))


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def resolve(address: WorkerAddress) -> list[str]:
    """Every HOST:PORT that `address` stands for, sorted: the IPv4 addresses its host resolves to, or the IPv6
    ones where it has none (a name with both would otherwise count each replica twice). Raises OSError when
    the name does not resolve."""
    if address.literal:
        return [host_port(address.host, address.port)]
    found = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
    v4 = {a[4][0] for a in found if a[0] == socket.AF_INET}
    v6 = {a[4][0] for a in found if a[0] == socket.AF_INET6}
    return sorted(host_port(h, address.port) for h in (v4 or v6))


# (address to dial, the entry that named it, how long to wait for its Info) -> the replica, connected
Connect = Callable[[str, WorkerAddress, float], Worker]
Resolve = Callable[[WorkerAddress], list[str]]


def disagreement(reference: Worker, other: Worker) -> list[str]:
    """The AGREE fields in which `other`'s Info differs from `reference`'s, as `field a != b`."""
    a, b = reference.info, other.info
    return [f"{f} {getattr(b, f)!r} != {getattr(a, f)!r}" for f in AGREE if getattr(a, f) != getattr(b, f)]


class ReplicaSet:
    """The replicas of each model, by the address each was dialled at. Thread-safe: the refresh thread
    changes the set while the batcher reads it."""

    def __init__(self, addresses: Sequence[WorkerAddress] = (), connect: Connect | None = None,
                 resolver: Resolve = resolve, refresh_s: float = 5.0):
        self.entries = list(addresses)   # the --workers entries
        self.refresh_s = refresh_s
        self._connect = connect
        self._resolve = resolver
        self._members: dict[str, Worker] = {}        # dialled address -> replica
        self._model: dict[str, str] = {}             # dialled address -> the model its replica serves
        self._reference: dict[str, Worker] = {}      # model -> its first replica found: what the model is
        self._resolved: dict[str, list[str]] = {}    # entry -> the addresses it resolved to last
        self._refused: dict[str, str] = {}           # address -> why its replica was left out (while it resolves)
        self._retired: list[Worker] = []             # gone from the names, still held by a batch perhaps
        self._on_join: list[Callable[[Worker], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def fixed(cls, workers: Mapping[str, Worker | Sequence[Worker]]) -> ReplicaSet:
        """Replicas given as objects (workers in this process, tests): one or a list per model, never resolved."""
        replicas = cls()
        for model, given in workers.items():
            for i, worker in enumerate(given if isinstance(given, Sequence) else [given]):
                # the replicas of a model in this process share its address: each is told apart by its index
                replicas._add(worker.address if worker.remote else f"{worker.address}#{i}", worker, model)
        return replicas

    @classmethod
    def open(cls, entries: Sequence[str], connect: Connect, timeout_s: float, refresh_s: float = 5.0,
             resolver: Resolve = resolve) -> ReplicaSet:
        """Resolves every entry and connects to every address found, in parallel, within `timeout_s`; an entry
        with no replica that answers, or replicas of a model that disagree, stop the router (PoolMismatch)."""
        addresses = [parse_address(e) for e in entries if e.strip()]
        if not addresses:
            raise PoolMismatch("no workers given: pass --workers HOST:PORT,...")
        replicas = cls(addresses, connect, resolver, refresh_s)
        deadline = time.monotonic() + timeout_s
        found = {a: replicas._resolve_by(a, deadline) for a in addresses}
        replicas._resolved = {a.text: found[a] for a in addresses}
        origin = {d: a for a in addresses for d in found[a]}
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(origin)))) as pool:
            calls = {d: pool.submit(connect, d, a, max(0.1, deadline - time.monotonic())) for d, a in origin.items()}
            answered, errors = {}, {}
            for d, call in calls.items():
                try:
                    answered[d] = call.result()
                except Exception as exc:  # noqa: BLE001 - said below, with the entry it came from
                    errors[d] = exc
        try:
            for a in addresses:
                if not any(d in answered for d in found[a]):
                    why = "; ".join(f"{d}: {error_line(errors[d])}" for d in found[a])
                    raise PoolMismatch(f"no worker answered at {a.text} within {timeout_s:g} s ({why})")
            for d in sorted(errors):
                log.warning("the worker at %s (from %s) does not answer yet; it joins when it does: %s",
                            d, origin[d].text, error_line(errors[d]))
            for d, worker in answered.items():
                reference = replicas._reference.get(worker.name)
                differ = disagreement(reference, worker) if reference is not None else []
                if differ:
                    raise PoolMismatch(
                        f"the replicas of {worker.name!r} disagree: {d} has {', '.join(differ)} of "
                        f"{replicas.address_of(reference)}; every replica of a model must serve the same checkpoint")
                replicas._add(d, worker)
        except BaseException:
            for worker in answered.values():
                worker.close()
            raise
        return replicas

    def _resolve_by(self, address: WorkerAddress, deadline: float) -> list[str]:
        """`address` resolved, trying again until `deadline` while the name resolves to nothing."""
        while True:
            try:
                found = self._resolve(address)
                if found:
                    return found
                error: object = "no addresses"
            except OSError as exc:
                error = exc
            if time.monotonic() >= deadline:
                raise PoolMismatch(f"the worker address {address.text} does not resolve ({error})")
            time.sleep(RESOLVE_RETRY_S)

    # -- reading --------------------------------------------------------------------------------

    @property
    def models(self) -> list[str]:
        """The pool's models, in the order their first replica was found."""
        with self._lock:
            return list(self._reference)

    def reference(self, model: str) -> Worker:
        """The first replica of `model` found: its Info describes the model (every replica agrees with it)."""
        with self._lock:
            return self._reference[model]

    def of(self, model: str) -> list[Worker]:
        """The replicas of `model` now (none while its name resolves to no replica that answers)."""
        with self._lock:
            return [w for a, w in self._members.items() if self._model[a] == model]

    def addresses(self, model: str) -> list[str]:
        """The addresses of the replicas of `model` now."""
        with self._lock:
            return [a for a in self._members if self._model[a] == model]

    def members(self) -> list[tuple[str, Worker]]:
        """(address, replica) for every replica now."""
        with self._lock:
            return list(self._members.items())

    def address_of(self, worker: Worker) -> str:
        with self._lock:
            return next((a for a, w in self._members.items() if w is worker), worker.address)

    def on_join(self, hook: Callable[[Worker], None]) -> None:
        """Calls `hook` with every replica now and every replica that joins later."""
        with self._lock:
            self._on_join.append(hook)
            now = list(self._members.values())
        for worker in now:
            hook(worker)

    # -- changing -------------------------------------------------------------------------------

    def _add(self, address: str, worker: Worker, model: str | None = None) -> None:
        model = model or worker.name
        with self._lock:
            self._members[address] = worker
            self._model[address] = model
            self._reference.setdefault(model, worker)
            hooks = list(self._on_join)
        for hook in hooks:
            hook(worker)

    def refresh(self) -> None:
        """One round: every entry resolved again; replicas at new addresses join (when they answer and agree
        with their model's), those at addresses gone leave. An entry that fails to resolve keeps its replicas
        (a resolver's outage is not the pods' departure)."""
        wanted: dict[str, WorkerAddress] = {}
        with self._lock:
            members = dict(self._members)
        for address in self.entries:
            try:
                found = self._resolve(address)
            except OSError as exc:
                log.debug("%s does not resolve now (%s); its replicas stay", address.text, exc)
                found = self._resolved.get(address.text, [])
            self._resolved[address.text] = found
            for d in found:
                wanted.setdefault(d, address)
        for d, address in wanted.items():
            if d not in members and d not in self._refused:
                self._join(d, address)
        for d in members.keys() - wanted.keys():
            self._leave(d)
        for d in self._refused.keys() - wanted.keys():
            del self._refused[d]

    def _join(self, address: str, origin: WorkerAddress) -> None:
        try:
            worker = self._connect(address, origin, JOIN_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - not ready yet: asked again at the next round
            log.debug("the worker at %s does not answer yet: %s", address, exc)
            return
        reference = self._reference.get(worker.name)
        if reference is None:
            why = (f"it serves {worker.name!r}, which is not a model of this router's pool ({', '.join(self.models)}); "
                   "restart the routers to change the pool")
        else:
            differ = disagreement(reference, worker)
            why = (f"its {', '.join(differ)} of the other replicas of {worker.name!r}: every replica of a model must "
                   "serve the same checkpoint") if differ else ""
        if why:
            self._refused[address] = why
            worker.close()
            log.error("the worker at %s (from %s) is left out: %s", address, origin.text, why)
            return
        self._add(address, worker)
        log.warning("a replica of %s joined at %s (%d now)", worker.name, address, len(self.of(worker.name)))

    def _leave(self, address: str) -> None:
        with self._lock:
            worker = self._members.pop(address)
            del self._model[address]
            self._retired.append(worker)
        log.warning("the replica of %s at %s left (its address no longer resolves; %d left)", worker.name, address,
                    len(self.of(worker.name)))

    def close_retired(self, in_use: Iterable[Worker]) -> None:
        """Closes the replicas that left and that no batch in `in_use` holds any more."""
        if not self._retired:
            return
        held = {id(w) for w in in_use}
        with self._lock:
            done = [w for w in self._retired if id(w) not in held]
            self._retired = [w for w in self._retired if id(w) in held]
        for worker in done:
            worker.close()

    # -- running --------------------------------------------------------------------------------

    def start(self) -> None:
        """Resolves the entries again every `refresh_s` until `close` (nothing to do for fixed replicas)."""
        if self._connect is not None and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="worker-replicas", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - finding replicas must go on
                log.exception("refreshing the worker replicas failed")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        with self._lock:
            workers = list(self._members.values()) + self._retired
            self._members, self._model, self._retired = {}, {}, []
        for worker in workers:
            worker.close()


def error_line(exc: object) -> str:
    """An error in one line for logs and messages: a gRPC error's code and details, else its text."""
    text = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.Call) else str(exc)
    return (text or type(exc).__name__).splitlines()[0][:300]
