# The API image: FastAPI under uvicorn, no torch, OpenCV, PyAV or Pillow (uploads are checked on a node).
#   docker build -f infra/images/api.Dockerfile -t monologue-api .
# Dependencies come from the image lock (infra/images/requirements-api.txt, hashes checked; infra/images/lock.sh).
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/monologue
COPY infra/images/requirements-api.txt /tmp/requirements.txt
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
RUN useradd --system --uid 10001 --home-dir /home/monologue --create-home monologue
COPY --from=build /opt/monologue /opt/monologue
ENV PATH=/opt/monologue/bin:$PATH PYTHONUNBUFFERED=1 MONOLOGUE_HOME=/home/monologue/var \
    MONOLOGUE_API__HOST=0.0.0.0 MONOLOGUE_API__PORT=8000 MONOLOGUE_LOG_FORMAT=json
WORKDIR /home/monologue
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
CMD ["monologue", "api"]
