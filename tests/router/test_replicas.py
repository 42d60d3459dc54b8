"""Finding the replicas of each model: addresses parsed, names resolved (IPv4 first), every resolved address one
replica, replicas that disagree refused, and names resolved again as pods come and go. Workers and the
resolver are fakes: nothing here opens a socket."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specrouter.router.replicas import PoolMismatch, ReplicaSet, WorkerAddress, parse_address, resolve

INFO = dict(vocab_size=512, tokenizer_sha256="ab" * 32, context_length=256, parameters=1_000, dtype="float32")


class FakeWorker:
    """A worker as the router sees it after its Info: a model, an address, a channel that can be closed."""

    def __init__(self, address: str, model: str, **info):
        self.address, self.name, self.remote = address, model, True
        self.info = SimpleNamespace(model_name=model, **{**INFO, **info})
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Fleet:
    """What the fake network holds: the addresses each name resolves to, and the worker behind each address."""

    def __init__(self, names: dict[str, list[str]], workers: dict[str, dict]):
        self.names, self.workers = names, workers
        self.dialled: list[str] = []
        self.connected: dict[str, FakeWorker] = {}

    def resolve(self, address: WorkerAddress) -> list[str]:
        if address.literal:
            return [f"{address.host}:{address.port}"]
        if address.host not in self.names:
            raise OSError(f"{address.host}: name does not resolve")
        return [f"{ip}:{address.port}" for ip in self.names[address.host]]

    def connect(self, address: str, entry: WorkerAddress, wait_s: float) -> FakeWorker:
        self.dialled.append(address)
        if address not in self.workers:
            raise ConnectionError(f"nothing answers at {address}")
        worker = FakeWorker(address, **self.workers[address])
        self.connected[address] = worker
        return worker

    def open(self, entries: list[str]) -> ReplicaSet:
        return ReplicaSet.open(entries, self.connect, timeout_s=0.2, refresh_s=60, resolver=self.resolve)


def test_addresses_parse_in_every_spelling() -> None:
    assert parse_address("dns:///stdlib-29m.specrouter.svc:50061") == WorkerAddress(
        "dns:///stdlib-29m.specrouter.svc:50061", "stdlib-29m.specrouter.svc", 50061)
    assert parse_address("dns:worker-a:50052").host == "worker-a"
    assert parse_address("[::1]:7000") == WorkerAddress("[::1]:7000", "::1", 7000)
    assert parse_address("10.0.0.7:50052").literal and not parse_address("worker-a:50052").literal
    for bad in ("worker-a", "worker-a:", ":50052", "worker-a:http", "worker-a:70000"):
        with pytest.raises(PoolMismatch, match="is not HOST:PORT or dns:///HOST:PORT"):
            parse_address(bad)
    with pytest.raises(PoolMismatch, match=r"names a DNS server \(8.8.8.8\)"):
        parse_address("dns://8.8.8.8/worker-a:50052")


def test_a_name_resolves_to_its_ipv4_addresses_once_each() -> None:
    assert resolve(parse_address("127.0.0.1:9")) == ["127.0.0.1:9"]
    assert resolve(parse_address("[::1]:9")) == ["[::1]:9"]
    assert resolve(parse_address("localhost:9")) == ["127.0.0.1:9"]   # not ::1 as well: one replica, not two


def test_every_address_a_name_resolves_to_is_a_replica_of_the_model_its_info_names() -> None:
    fleet = Fleet({"worker-t": ["10.0.0.1", "10.0.0.2"], "worker-d": ["10.0.1.1"]},
                  {"10.0.0.1:50052": {"model": "t"}, "10.0.0.2:50052": {"model": "t"},
                   "10.0.1.1:50052": {"model": "d"}})
    replicas = fleet.open(["dns:///worker-t:50052", "worker-d:50052"])
    assert replicas.models == ["t", "d"]
    assert [w.address for w in replicas.of("t")] == ["10.0.0.1:50052", "10.0.0.2:50052"]
    assert replicas.addresses("d") == ["10.0.1.1:50052"]
    assert replicas.reference("t") is replicas.of("t")[0]
    replicas.close()
    assert all(w.closed for w in fleet.connected.values())


def test_replicas_that_disagree_stop_the_router_with_the_model_addresses_and_fields() -> None:
    fleet = Fleet({}, {"127.0.0.1:1": {"model": "t"}, "127.0.0.1:2": {"model": "t", "vocab_size": 600}})
    with pytest.raises(PoolMismatch) as err:
        fleet.open(["127.0.0.1:1", "127.0.0.1:2"])
    assert str(err.value) == ("the replicas of 't' disagree: 127.0.0.1:2 has vocab_size 600 != 512 of 127.0.0.1:1; "
                              "every replica of a model must serve the same checkpoint")
    assert all(w.closed for w in fleet.connected.values())   # nothing left open behind the error

    fleet = Fleet({}, {"127.0.0.1:1": {"model": "t"}, "127.0.0.1:2": {"model": "t", "tokenizer_sha256": "cd" * 32}})
    with pytest.raises(PoolMismatch, match=f"127.0.0.1:2 has tokenizer_sha256 '{'cd' * 32}' != '{'ab' * 32}'"):
        fleet.open(["127.0.0.1:1", "127.0.0.1:2"])


def test_an_entry_with_no_replica_that_answers_stops_the_router_by_name() -> None:
    fleet = Fleet({"worker-t": ["10.0.0.1"]}, {"10.0.1.1:50052": {"model": "d"}})
    with pytest.raises(PoolMismatch, match=r"no worker answered at worker-t:50052 within 0.2 s "
                                           r"\(10.0.0.1:50052: nothing answers at 10.0.0.1:50052\)"):
        fleet.open(["10.0.1.1:50052", "worker-t:50052"])
    with pytest.raises(PoolMismatch, match=r"the worker address nowhere:1 does not resolve"):
        fleet.open(["nowhere:1"])
    with pytest.raises(PoolMismatch, match="no workers given"):
        fleet.open([])


def test_a_replica_that_does_not_answer_yet_joins_at_a_later_round() -> None:
    fleet = Fleet({"worker-t": ["10.0.0.1", "10.0.0.2"]}, {"10.0.0.1:50052": {"model": "t"}})
    replicas = fleet.open(["worker-t:50052"])
    assert replicas.addresses("t") == ["10.0.0.1:50052"]
    fleet.workers["10.0.0.2:50052"] = {"model": "t"}   # its pod is ready now
    replicas.refresh()
    assert replicas.addresses("t") == ["10.0.0.1:50052", "10.0.0.2:50052"]


def test_resolving_again_adds_new_replicas_and_retires_gone_ones_once_no_batch_holds_them() -> None:
    fleet = Fleet({"worker-t": ["10.0.0.1"]}, {f"10.0.0.{i}:50052": {"model": "t"} for i in (1, 2, 3)})
    replicas = fleet.open(["dns:///worker-t:50052"])
    joined = []
    replicas.on_join(joined.append)
    first = replicas.of("t")[0]
    assert joined == [first]

    fleet.names["worker-t"] = ["10.0.0.1", "10.0.0.2"]   # a pod joins
    replicas.refresh()
    assert replicas.addresses("t") == ["10.0.0.1:50052", "10.0.0.2:50052"]
    second = replicas.of("t")[1]
    assert joined == [first, second]

    fleet.names["worker-t"] = ["10.0.0.2", "10.0.0.3"]   # one leaves, another joins
    replicas.refresh()
    assert replicas.addresses("t") == ["10.0.0.2:50052", "10.0.0.3:50052"]
    assert replicas.reference("t") is first   # still describes the model
    replicas.close_retired(in_use=[first])    # a batch still runs on it: its channel stays open
    assert not first.closed
    replicas.close_retired(in_use=[second])
    assert first.closed and not second.closed

    del fleet.names["worker-t"]                # the resolver fails: the replicas stay as they were
    replicas.refresh()
    assert replicas.addresses("t") == ["10.0.0.2:50052", "10.0.0.3:50052"]
    assert fleet.dialled == ["10.0.0.1:50052", "10.0.0.2:50052", "10.0.0.3:50052"]


def test_a_joining_replica_that_disagrees_or_serves_another_model_is_left_out_and_not_asked_again(caplog) -> None:
    fleet = Fleet({"worker-t": ["10.0.0.1"]},
                  {"10.0.0.1:50052": {"model": "t"}, "10.0.0.2:50052": {"model": "t", "dtype": "float16"},
                   "10.0.0.3:50052": {"model": "x"}})
    replicas = fleet.open(["worker-t:50052"])
    fleet.names["worker-t"] = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    replicas.refresh()
    replicas.refresh()
    assert replicas.addresses("t") == ["10.0.0.1:50052"] and replicas.models == ["t"]
    assert fleet.dialled == ["10.0.0.1:50052", "10.0.0.2:50052", "10.0.0.3:50052"]
    assert fleet.connected["10.0.0.2:50052"].closed and fleet.connected["10.0.0.3:50052"].closed
    said = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert said == [
        "the worker at 10.0.0.2:50052 (from worker-t:50052) is left out: its dtype 'float16' != 'float32' of the "
        "other replicas of 't': every replica of a model must serve the same checkpoint",
        "the worker at 10.0.0.3:50052 (from worker-t:50052) is left out: it serves 'x', which is not a model of "
        "this router's pool (t); restart the routers to change the pool"]
