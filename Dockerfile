# The byzps image: one image for every role of the cluster (ps-server, ps-worker,
# ps-worker --evaluate, ps-proxy), configured by PS_* environment variables.
#
#   docker build -t byzps .                                       # pip's configured sources
#   docker build -t byzps --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu .
#
# Layers go from the least to the most often changed: system packages, torch,
# the Python dependencies (from pyproject.toml only), then the source. A change
# to the source rebuilds only the last layers. See docs/docker.md.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# The default dataset (gz IDX files in /usr/share/datasets/fashion-mnist).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        dataset-fashion-mnist \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# torch before the project, so that the project's `torch>=2.1` is already met and
# pip never fetches the (multi-GB) CUDA build from PyPI. TORCH_INDEX_URL empty:
# pip's configured sources; https://download.pytorch.org/whl/cpu: the CPU wheels
# (on the stock python:3.11-slim, use that); .../whl/cu126 etc.: a CUDA build.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}" \
    && python -c "import torch; print('torch', torch.__version__)"

# The project's other dependencies, read from pyproject.toml alone: this layer is
# rebuilt when the dependencies change, not when the code does.
WORKDIR /opt/byzps
COPY pyproject.toml ./
RUN python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; print('\n'.join(deps))" >/tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt "setuptools>=64" wheel \
    && python -c "import torch; assert torch.__version__.startswith('${TORCH_VERSION}'), torch.__version__" \
    && rm /tmp/requirements.txt

# Unprivileged user (compose may run another uid: PS_UID/PS_GID).
RUN groupadd --gid 1000 ps && useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash ps \
    && mkdir -p /runs && chown ps:ps /runs
COPY docker/entrypoint.sh /usr/local/bin/ps-entrypoint
RUN chmod 0755 /usr/local/bin/ps-entrypoint

# The source, last.
COPY . ./
RUN pip install --no-deps --no-build-isolation . \
    && rm -rf build ./*.egg-info

# Threads: one per process (many processes share few cores). Caches (numba's
# machine code, the generated sorting-network kernels) in /tmp, writable whatever
# uid the container runs as (compose: PS_UID); site-packages is read-only to it.
# The generated compose file and swarm stack run every container with a read-only
# root file system: /tmp is a tmpfs there, /runs the service's own directory and
# the keys a read-only mount (docs/docker.md).
ENV PS_TORCH_THREADS=1 \
    OMP_NUM_THREADS=1 \
    MKL_NUM_THREADS=1 \
    NUMBA_CACHE_DIR=/tmp/numba-cache \
    XDG_CACHE_HOME=/tmp/cache \
    PS_OUT_DIR=/runs

USER ps
WORKDIR /runs
ENTRYPOINT ["ps-entrypoint"]
CMD ["ps-server", "--help"]
