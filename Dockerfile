# syntax=docker/dockerfile:1
# The image of the GitHub Action (action.yml: runs.using docker). Build: docker build -t export-action .
#
# Base: pinned by tag. To pin by digest as well, resolve it where a registry is reachable and append it:
#   docker buildx imagetools inspect python:3.11-slim-bookworm --format '{{json .Manifest.Digest}}'
#   → FROM python:3.11-slim-bookworm@sha256:<digest>
# GPU image (CUDA wheels bundle the CUDA runtime; the driver comes from the host with `--gpus all`):
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 -t export-action:cuda .
# Another base (e.g. an internal mirror, or a CUDA image that provides Python 3.11 at /usr/local/bin/python):
#   docker build --build-arg BASE_IMAGE=registry.example/python:3.11-slim-bookworm .
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    HF_HUB_DISABLE_PROGRESS_BARS=1

# The whole stack at the exact versions CI tested (constraints.txt); torch's CPU (or CUDA) wheel from its index.
COPY constraints.txt pyproject.toml /opt/export-action/
COPY exporters /opt/export-action/exporters
COPY action /opt/export-action/action
RUN python -m pip install --extra-index-url "${TORCH_INDEX_URL}" -c /opt/export-action/constraints.txt \
        /opt/export-action \
    && python -c "import action.main, exporters.pipeline, exporters.publish, transformers.exporters" \
    && rm -rf /root/.cache

# No USER: the runner mounts the workspace owned by root and the Action must write to it.
# No WORKDIR reliance: the runner starts the container in /github/workspace; the entrypoint is an absolute path.
ENTRYPOINT ["/usr/local/bin/python", "-m", "action"]
