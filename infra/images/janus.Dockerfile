# Janus, the SFU that live sessions' viewers may watch through (docs/architecture.md, "WebRTC out"): Debian 12's
# package, its Streaming plug-in and HTTP transport only (the folders below link just those two libraries, as
# cli/janus.py does on loopback). The configuration comes from infra/k8s/extras/janus.yaml's ConfigMap.
#   docker build -f infra/images/janus.Dockerfile -t monologue-janus .
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends janus \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /opt/janus/plugins /opt/janus/transports /opt/janus/events /opt/janus/loggers \
 && ln -s /usr/lib/x86_64-linux-gnu/janus/plugins/libjanus_streaming.so /opt/janus/plugins/ \
 && ln -s /usr/lib/x86_64-linux-gnu/janus/transports/libjanus_http.so /opt/janus/transports/ \
 && useradd --system --uid 10002 --no-create-home monologue-janus
USER 10002:10002
ENTRYPOINT ["janus"]
