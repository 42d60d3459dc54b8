"""Which workers compute on the router's own cores: there the scheduler plans between the passes, not beside them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from specrouter.contract.calls import WorkerInfo
from specrouter.router.workers import computes_on_this_hosts_cpu


@dataclass
class FakeWorker:
    address: str
    remote: bool
    info: WorkerInfo


def worker(address: str, device: str, remote: bool = True) -> FakeWorker:
    return FakeWorker(address, remote, WorkerInfo("m", 1, 8, 64, device=device))


@pytest.mark.parametrize("address, device, remote, local", [
    ("127.0.0.1:50051", "cpu", True, True),
    ("localhost:50051", "cpu", True, True),
    ("[::1]:50051", "cpu", True, True),
    ("unix:/run/specrouter/w.sock", "cpu", True, True),
    ("in-process", "cpu", False, True),            # an engine the router holds
    ("127.0.0.1:50051", "cuda:0", True, False),    # its passes run on a device, not on the cores
    ("in-process", "cuda", False, False),
    ("10.0.3.7:50051", "cpu", True, False),        # another machine's cores
    ("worker-29m.specrouter.svc:50051", "cpu", True, False),
])
def test_a_worker_on_this_hosts_cpu_is_told_from_one_elsewhere(address, device, remote, local) -> None:
    assert computes_on_this_hosts_cpu(worker(address, device, remote)) is local
