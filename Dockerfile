# syntax=docker/dockerfile:1
# One image for every SpecRouter service; the command picks what runs:
#   specrouter serve router|worker|profiler [options]     specrouter healthcheck HOST:PORT
# Two variants from this file, by the torch wheels it installs:
#   CPU (default; router, profiler, CPU workers):  docker build -t specrouter:0.1.0 .
#   CUDA (GPU workers):  docker build --build-arg TORCH_VARIANT=cu128 -t specrouter:0.1.0-cuda .
# TORCH_VARIANT names a wheel index of the PyTorch project (cpu, cu126, cu128, ...): pick one that the
# torch release in TORCH_SPEC is published for. The CUDA wheels bring their CUDA libraries; the node
# brings the driver (the NVIDIA container toolkit / device plugin).
# The demo pool is baked in at /models/demo-pool; other pools are mounted (e.g. over /models).

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_VARIANT=cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/specrouter
ENV PATH=/opt/specrouter/bin:$PATH
# torch first, from the variant's index, so that installing the package finds it satisfied
RUN pip install --index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}" "${TORCH_SPEC}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY services ./services
RUN pip install . \
 && python -c "import specrouter.cli, specrouter.router.server, specrouter.worker.server, specrouter.gateway.server"

FROM ${PYTHON_IMAGE} AS runtime
ARG UID=10001
# Nothing writes under / at run time: caches and temporary files go to /tmp (an emptyDir in Kubernetes,
# a tmpfs in compose), the models are read only, and no hub is reached.
ENV PATH=/opt/specrouter/bin:$PATH \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp XDG_CACHE_HOME=/tmp/cache HF_HOME=/tmp/cache/huggingface MPLCONFIGDIR=/tmp/matplotlib \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
RUN groupadd --system --gid "${UID}" specrouter \
 && useradd --system --uid "${UID}" --gid "${UID}" --no-create-home --home-dir /tmp --shell /usr/sbin/nologin specrouter
COPY --from=build /opt/specrouter /opt/specrouter
COPY models/demo-pool /models/demo-pool
USER ${UID}:${UID}
WORKDIR /tmp
# gRPC: router 50051, worker 50052, profiler 50053; the gateway's HTTP 8000; Prometheus metrics (compose,
# k8s: --metrics-port 9464)
EXPOSE 50051 50052 50053 8000 9464
ENTRYPOINT ["specrouter"]
CMD ["--help"]
