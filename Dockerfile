# pipetune images, one Dockerfile with two targets (docker-compose.yml builds both):
#   service  the REST service and `pipetune db upgrade` (python slim; no GPU needed)
#   worker   the GPU worker: CUDA runtime base image + CuPy (`pipetune worker --runner cupy`);
#            the driver comes from the host through the NVIDIA container toolkit.
# The package is installed editable from /app: `pipetune db upgrade` reads the Alembic
# scripts from /app/migrations, next to the sources.
ARG PYTHON_IMAGE=python:3.12-slim
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-runtime-ubuntu24.04

FROM ${PYTHON_IMAGE} AS service
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY docs/LICENSE docs/LICENSE
COPY model model
COPY tuner tuner
COPY workers workers
COPY service service
COPY clients clients
COPY migrations migrations
RUN pip install -e . \
    && useradd --create-home --uid 1000 pipetune
USER pipetune
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --retries=6 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
CMD ["pipetune", "serve", "--host", "0.0.0.0", "--port", "8000"]

FROM ${CUDA_IMAGE} AS worker
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DEBIAN_FRONTEND=noninteractive PATH=/opt/venv/bin:$PATH
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
WORKDIR /app
COPY pyproject.toml README.md ./
COPY docs/LICENSE docs/LICENSE
COPY model model
COPY tuner tuner
COPY workers workers
COPY service service
COPY clients clients
COPY migrations migrations
# [gpu]: CuPy for CUDA 13 (the runner measures with it; NVRTC comes from the PyPI wheels).
RUN pip install -e '.[gpu]' \
    && useradd --create-home --uid 1001 pipetune
USER pipetune
# Compiled cubins are cached under the user's cache dir (a compose volume keeps them); made
# here so that the volume starts owned by this user.
RUN mkdir -p /home/pipetune/.cache
CMD ["pipetune", "worker", "--runner", "cupy"]
