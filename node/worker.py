"""The node process: one worker machine that generates frames.

It polls five Temporal task queues: the shared queue (RenderWorkflow itself, `prepare`, `publish`,
`record_status`, `stored_audio`, `notify_session_ended`, and `validate_inputs` for the API's uploads), the lease
queue (`hold_node`, with one slot per session the node can hold: this is how a node takes a session), its own queue
`node-<id>` (the pinned per-session work), the sink queue (`run_sink`: the pumps feeding S3 and Kinesis Video
Streams from storage) and the webhook queue (WebhookDeliveryWorkflow and its attempts). Heavy work runs in sync
activities on a thread pool so the event loop keeps heartbeating. The node warms (node/warm.py) before any of them
polls. SIGTERM/SIGINT hand the sessions back (their leases end with NodeDraining), stop polling, and let running
chunks finish."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker
from temporalio.client import Client

from activities.node import NodeActivities
from gpu_worker.models import check_configured_weights
from gpu_worker.models.dit.checkpoint import CheckpointError
from monologue import metrics, temporal_client, tracing
from monologue.db import NodeStatus, make_engine, make_sessionmaker
from monologue.settings import Settings
from monologue.storage import open_store
from node import http_port as node_http
from node.pollers import Pollers, watch_temporal
from node.registry import NodeReporter
from node.warm import warm
from node.wiring import NodeParts, build_parts, executors, queues, renewable_workers, steady_workers

if TYPE_CHECKING:
    from node.webrtc.server import MediaServer

SHUTDOWN_MARGIN_S = 10.0  # past the graceful shutdown, what the workers may take to stop before the node exits anyway
HEALTH_EVERY_S = 5.0  # how often the node checks that its database answers (for /readyz; Temporal: node/pollers.py)

log = structlog.get_logger("node")


async def run_node(
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    node_activities: Callable[..., NodeActivities] = NodeActivities,
    handle_signals: bool = True,
) -> None:
    """Run the node's workers until `stop` is set or the process gets SIGTERM/SIGINT.

    `node_activities` builds the pinned activities: a multi-GPU node passes one whose pipelines run on
    every rank (node/launch.py). `handle_signals` False: a node inside another program
    (a test) leaves its signals alone."""
    _check_weights()
    stop = stop or asyncio.Event()
    if handle_signals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    tracing.configure(settings.tracing, "monologue-node")
    metrics.initialise()
    engine = make_engine(settings.db_url, settings.database_pool)
    sessions = make_sessionmaker(engine)
    client = await _connect(settings)
    parts = build_parts(
        settings, store=open_store(settings.storage), sessions=sessions, client=client, node_activities=node_activities
    )
    node = settings.node
    reporter = NodeReporter(
        sessions=sessions,
        node_id=node.id,
        capacity=node.capacity,
        held_sessions=parts.lease.held_sessions,
        chunks_done=lambda: parts.pinned.chunks_done,
    )
    health = node_http.NodeHealth(
        capacity=node.capacity,
        require_gpu=node.require_gpu,
        slots_used=lambda: len(parts.lease.held_sessions()),
        shortage=parts.disks.shortage,
    )
    server = None if node.http_port is None else node_http.serve(health, node.http_host, node.http_port)
    media = _start_media(settings, parts, reporter, sessions=sessions, client=client)
    await warm(node, parts.pinned.pipelines, health)  # before any worker polls: no lease until warm
    executor, sink_executor = executors(settings)
    with executor, sink_executor:
        pollers = Pollers(
            client,
            steady_workers(client, settings, parts, sink_executor),
            lambda fresh, generation: renewable_workers(fresh, settings, parts, executor, generation),
            lambda: _connect(settings),
        )
        overrun = await _serve(settings, pollers, parts, reporter, health, (client, engine), stop)
    overrun.cancel()  # the workers and their threads stopped in time (a node inside a test must not end its host)
    if server is not None:
        server.shutdown()
    if media is not None:
        await media.peers.close_all()
        if media.whip is not None:
            await media.whip.close_all()
        media.shutdown()
    engine.dispose()
    tracing.shutdown()
    log.info("node stopped", node_id=node.id)


def _start_media(
    settings: Settings, parts: NodeParts, reporter: NodeReporter, *, sessions: sessionmaker[Any], client: Client
) -> MediaServer | None:
    """The node's WebRTC port and media hub (node/webrtc/), its address in the node's row, and its WHIP audio
    ingress; None without aiortc (a node installed without the `node` extra's WebRTC stack serves HLS only)."""
    try:
        from node.webrtc import server as webrtc
        from node.webrtc.whip import WhipIngress
    except ImportError as err:
        log.warning("WebRTC off: aiortc is not installed", error=str(err))
        return None
    whip = WhipIngress(store=open_store(settings.storage), sessions=sessions, temporal=client, ice=settings.ice)
    media, hub = webrtc.start(settings.node, asyncio.get_running_loop(), whip, settings.ice, settings.sfu)
    parts.pinned.frame_tap = hub
    reporter.media_url = settings.node.media_url or media.url(settings.node.http_host)
    return media


def _check_weights() -> None:
    """A user's checkpoint that cannot load: say which file and key, and start nothing."""
    try:
        check_configured_weights()
    except CheckpointError as exc:
        log.error("model weights do not load", error=str(exc))
        raise SystemExit(f"node not started: {exc}") from exc


async def _connect(settings: Settings) -> Client:
    node = settings.node
    port = node.temporal_metrics_port
    return await temporal_client.connect(
        settings.temporal, metrics_address=None if port is None else f"{node.http_host}:{port}"
    )


async def _serve(
    settings: Settings,
    pollers: Pollers,
    parts: NodeParts,
    reporter: NodeReporter,
    health: node_http.NodeHealth,
    probes: tuple[Client, Engine],
    stop: asyncio.Event,
) -> threading.Timer:
    """Poll until `stop`, then drain: hand the sessions back first (their workflows move them at once instead of
    waiting for a heartbeat timeout) while the chunk in progress finishes as the workers shut down. Returns the
    timer that ends the process if the shutdown overruns. A worker's fatal error ends the node (raised here)."""
    node_id = settings.node.id
    client, engine = probes
    pollers.start()
    reporting = asyncio.create_task(reporter.run())
    watching = [
        asyncio.create_task(watch_temporal(client, health, pollers)),
        asyncio.create_task(_watch_database(health, engine)),
    ]
    health.polling = True
    log.info("node ready", node_id=node_id, capacity=settings.node.capacity, queues=queues(settings))
    stopping = asyncio.create_task(stop.wait())
    ends: list[asyncio.Future[Any]] = [stopping, pollers.failed]
    await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
    health.draining = True
    log.info("node draining", node_id=node_id)
    overrun = _exit_after(settings.node.graceful_shutdown_s + SHUTDOWN_MARGIN_S)
    parts.lease.draining.set()
    reporter.set_status(NodeStatus.DRAINING)
    for task in [stopping, *watching]:
        task.cancel()
    await asyncio.sleep(0.5)
    await pollers.stop()
    health.polling = False
    reporter.set_status(NodeStatus.STOPPED)
    await reporting
    if pollers.failed.done():
        raise pollers.failed.result()
    return overrun


async def _watch_database(health: node_http.NodeHealth, engine: Engine) -> None:
    """Every few seconds: does the database answer? (for /readyz; never fatal to the node)."""

    def database() -> None:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    while True:
        try:
            await asyncio.to_thread(database)
            health.database_ok = True
            health.problems.pop("database", None)
        except SQLAlchemyError as err:
            health.database_ok = False
            health.problems["database"] = str(err).splitlines()[0][:200]
        await asyncio.sleep(HEALTH_EVERY_S)


def _exit_after(seconds: float) -> threading.Timer:
    """A stopping node exits within `seconds` even if a worker's shutdown never returns (Temporal's workers
    retry RPCs to a server that is gone when the whole stack stops at once, e.g. after its parent's SIGKILL)."""

    def exit_now() -> None:
        log.warning("node shutdown overran; exiting", after_s=seconds)
        os._exit(1)

    timer = threading.Timer(seconds, exit_now)
    timer.daemon = True
    timer.start()
    return timer
