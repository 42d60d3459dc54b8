"""What every SpecRouter gRPC server carries: the standard health service, reflection, a bound port
(in plaintext, or over TLS: `tls.py`)."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from specrouter.tls import ServerTLS


def add_health_and_reflection(server: grpc.Server, service_name: str, serving: bool) -> health.HealthServicer:
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    set_serving(health_servicer, service_name, serving)
    reflection.enable_server_reflection((service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    return health_servicer


def set_serving(health_servicer: health.HealthServicer, service_name: str, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in (service_name, ""):
        health_servicer.set(name, status)


def listen(server: grpc.Server, host: str, port: int, tls: ServerTLS | None = None) -> int:
    """Binds host:port (0: a free port), over TLS with `tls`, else in plaintext, and returns the port."""
    address = f"{host}:{port}"
    bound = server.add_insecure_port(address) if tls is None else server.add_secure_port(address, tls.credentials())
    if bound == 0:
        raise OSError(f"cannot listen on {address}")
    return bound
