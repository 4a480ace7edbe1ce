# A CUDA GPU node: one pod per GPU host, `torchrun` with one process per GPU (rank 0 runs the Temporal workers;
# the models are sharded with FSDP2 and each forward split with sequence parallelism, gpu_worker/distributed/).
#   docker build -f infra/images/gpu.Dockerfile -t monologue-gpu .
# torch and its CUDA libraries (nvidia-* wheels) come from the image lock with everything else
# (infra/images/requirements-gpu.txt, hashes checked; infra/images/lock.sh): the host supplies only the driver,
# so the base is the same slim Python image as the other two.
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/monologue
COPY infra/images/requirements-gpu.txt /tmp/requirements.txt
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
# numactl: the NUMA topology the ranks pin themselves by (gpu_worker/distributed/numa.py reads sysfs; numactl is
# there for operators checking it: `numactl --hardware`). gcc and libc6-dev: Triton compiles its CUDA launcher
# helpers with the system C compiler the first time it runs a kernel (torch.compile, flex attention); the slim
# image has none. libespeak-ng1: espeak-ng, the engine that speaks a render's `text` (gpu_worker/tts/espeak.py).
# fonts-dejavu-core: the font of burned-in captions (gpu_worker/pipeline/burn_in.py).
RUN apt-get update && apt-get install -y --no-install-recommends numactl gcc libc6-dev libespeak-ng1 fonts-dejavu-core \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /home/monologue --create-home monologue
COPY --from=build /opt/monologue /opt/monologue
# The compilers' caches go under MONOLOGUE_HOME, which the pod mounts writable (the root filesystem is read-only):
# Triton's kernels, Inductor's generated code, and anything else that caches under XDG_CACHE_HOME.
ENV PATH=/opt/monologue/bin:$PATH PYTHONUNBUFFERED=1 MONOLOGUE_HOME=/home/monologue/var MONOLOGUE_LOG_FORMAT=json \
    MONOLOGUE_NODE__HTTP_HOST=0.0.0.0 MONOLOGUE_NODE__HTTP_PORT=9100 MONOLOGUE_NODE__REQUIRE_GPU=true \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    TRITON_CACHE_DIR=/home/monologue/var/cache/triton TORCHINDUCTOR_CACHE_DIR=/home/monologue/var/cache/inductor \
    XDG_CACHE_HOME=/home/monologue/var/cache
WORKDIR /home/monologue
USER 10001:10001
EXPOSE 9100
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9100/healthz', timeout=2)"]
STOPSIGNAL SIGTERM
# torchrun forwards SIGTERM to its ranks; rank 0 drains the node, the others leave when it shuts the group down;
# --shutdown-timeout: torchrun kills the ranks only after the drain (its default, 30 s, would cut it short).
# --nproc-per-node gpu: one process per visible GPU. --max-restarts: a broken rank group restarts the node afresh.
CMD ["torchrun", "--nproc-per-node", "gpu", "--max-restarts", "3", "--shutdown-timeout", "260", "-m", "node.launch"]
