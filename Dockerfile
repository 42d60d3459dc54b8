# One image for every SpecRouter service; the command picks the service:
#   specrouter serve router|worker|profiler [options]
# GPU nodes: build with --build-arg TORCH_SPEC="torch==2.13.0" and a CUDA wheel index in PIP_EXTRA_INDEX_URL.
FROM python:3.11-slim

ARG TORCH_SPEC="torch==2.13.0"
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
COPY services ./services
COPY proto ./proto
RUN pip install "${TORCH_SPEC}" && pip install .
# The demo pool; mount real checkpoints over /models for other pools.
COPY models /models

EXPOSE 50051 50052 50053
ENTRYPOINT ["specrouter", "serve"]
