# syntax=docker/dockerfile:1
# The specgate operator image: `specgate run` as a non-root user, no build tools in the final stage.
ARG PYTHON_IMAGE=python:3.11.10-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY requirements.lock pyproject.toml README.md ./
COPY operator ./operator
# requirements.lock pins every runtime dependency (regenerate with `make lock`).
RUN python -m venv /opt/specgate \
 && /opt/specgate/bin/pip install --no-cache-dir --only-binary=:all: -r requirements.lock \
 && /opt/specgate/bin/pip install --no-cache-dir --no-deps .

FROM ${PYTHON_IMAGE}
# Keep VERSION equal to pyproject.toml's version (a unit test checks); `docker build --build-arg VERSION=...`.
ARG VERSION=0.2.0
LABEL org.opencontainers.image.title="specgate" \
      org.opencontainers.image.description="Kubernetes operator that rolls out speculative decoding on vLLM safely" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://specgate.dev"
COPY --from=build /opt/specgate /opt/specgate
# MALLOC_ARENA_MAX: glibc gives each reconcile thread an arena of its own; at 500 objects the
# operator held 397 MB that way and 280 MB with two; with the operator's malloc_trim every minute,
# 204 MB with two and 197 MB with one (make bench-scale, 2026-11-25, before the operator dropped the
# kubernetes client's typed methods; since then 147 MB: docs/benchmarks.md has the current figure).
# The GIL lets one thread allocate at a time.
ENV PATH=/opt/specgate/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MALLOC_ARENA_MAX=1
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["specgate"]
CMD ["run"]
