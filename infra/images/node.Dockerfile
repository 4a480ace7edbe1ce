# A CPU node: the warp family (and the dit family's tiny smoke model) on the CPU.
#   docker build -f infra/images/node.Dockerfile -t monologue-node .
# torch is the CPU build (PyTorch's CPU index, pinned as in infra/setup.sh); everything else comes from the image
# lock (infra/images/requirements-node.txt, hashes checked; infra/images/lock.sh).
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/monologue
RUN /opt/monologue/bin/pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"
COPY infra/images/requirements-node.txt /tmp/requirements.txt
RUN /opt/monologue/bin/pip install --require-hashes --no-deps -r /tmp/requirements.txt
COPY pyproject.toml README.md /src/
COPY monologue /src/monologue
COPY workflows /src/workflows
COPY activities /src/activities
COPY gpu_worker /src/gpu_worker
COPY node /src/node
COPY cli /src/cli
COPY api /src/api
COPY migrations /src/migrations
RUN /opt/monologue/bin/pip install --no-deps /src

FROM python:3.11-slim-bookworm
# libespeak-ng1: espeak-ng, the engine that speaks a render's `text` (gpu_worker/tts/espeak.py loads it with ctypes).
# fonts-dejavu-core: the font of burned-in captions (gpu_worker/pipeline/burn_in.py).
RUN apt-get update && apt-get install -y --no-install-recommends libespeak-ng1 fonts-dejavu-core \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /home/monologue --create-home monologue
COPY --from=build /opt/monologue /opt/monologue
ENV PATH=/opt/monologue/bin:$PATH PYTHONUNBUFFERED=1 MONOLOGUE_HOME=/home/monologue/var MONOLOGUE_LOG_FORMAT=json \
    MONOLOGUE_NODE__HTTP_HOST=0.0.0.0 MONOLOGUE_NODE__HTTP_PORT=9100
WORKDIR /home/monologue
USER 10001:10001
EXPOSE 9100
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9100/healthz', timeout=2)"]
# SIGTERM drains: the node hands its sessions over and finishes its running chunk (MONOLOGUE_NODE__GRACEFUL_SHUTDOWN_S).
STOPSIGNAL SIGTERM
CMD ["monologue", "node"]
