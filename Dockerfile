# syntax=docker/dockerfile:1
# The tpumon agent image:  docker build -t tpumon:0.1.0 .
# Deployed by deploy/kubernetes/ (a GKE DaemonSet), which runs it as root with all but two
# capabilities dropped (deploy/kubernetes/README.md says why); by itself it runs as an
# unprivileged user. Only pyproject.toml, README.md and tpumon/ enter the build
# (.dockerignore); the image has tpumon and its runtime dependencies, no test tools.

ARG PYTHON_IMAGE=python:3.11-slim

# Build the wheel and install it into a virtual environment.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tpumon/ tpumon/
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/tpumon \
 && /opt/tpumon/bin/pip install /wheels/tpumon-*.whl

# The same base, so the virtual environment's python links resolve.
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="tpumon" \
      org.opencontainers.image.description="Per-VM agent that watches Cloud TPU HBM, detects slow leaks and exports Prometheus metrics" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/tpumon /opt/tpumon
RUN groupadd --system --gid 65532 tpumon \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin tpumon \
 && install -d -o 65532 -g 65532 /var/lib/tpumon /run/tpumon
ENV PATH=/opt/tpumon/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 9847
ENTRYPOINT ["tpumon", "agent"]
