"""The node process: one worker machine that generates frames.

It polls five Temporal task queues: the shared queue (RenderWorkflow itself, `prepare`, `publish`,
`record_status`, `stored_audio`, `notify_session_ended`, and `validate_inputs` for the API's uploads), the lease
queue (`hold_node`, with one slot per session the node can hold: this is how a node takes a session), its own queue
`node-<id>` (the pinned per-session work), the sink queue (`run_sink`: the pumps feeding S3 and Kinesis Video
Streams from storage) and the webhook queue (WebhookDeliveryWorkflow and its attempts). Heavy work runs in sync
activities on a thread pool so the event loop keeps heartbeating.
SIGTERM/SIGINT hand the sessions back (their leases end with NodeDraining), stop polling, and let running
chunks finish."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import structlog
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError
from temporalio.client import Client
from temporalio.worker import Worker

from activities.fault_injection import Faults
from activities.lease import NodeLease
from activities.node import NodeActivities
from activities.session import SessionActivities
from activities.sinks import SinkActivities
from activities.validate import ValidateActivities
from activities.webhooks import WebhookActivities
from gpu_worker import node_http
from gpu_worker.models import check_configured_weights
from gpu_worker.models.dit.checkpoint import CheckpointError
from gpu_worker.registry import NodeReporter
from monologue import contracts as c
from monologue import metrics, temporal_client, tracing
from monologue.db import NodeStatus, make_engine, make_sessionmaker
from monologue.settings import Settings
from monologue.storage import open_store
from workflows.render import RenderWorkflow
from workflows.validate import ValidateInputsWorkflow
from workflows.webhook import WebhookDeliveryWorkflow

SINK_SLOTS = 32  # sink pumps one node runs at once (each mostly waits on the network)
WEBHOOK_SLOTS = 16  # webhook attempts one node makes at once (async: each waits on a receiver)
SHUTDOWN_MARGIN_S = 10.0  # past the graceful shutdown, what the workers may take to stop before the node exits anyway
HEALTH_EVERY_S = 5.0  # how often the node checks that Temporal and its database answer (for /readyz)

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
    every rank (gpu_worker/distributed/launch.py). `handle_signals` False: a node inside another program
    (a test) leaves its signals alone."""
    try:
        check_configured_weights()
    except CheckpointError as exc:  # a user's checkpoint that cannot load: say which file and key, start nothing
        log.error("model weights do not load", error=str(exc))
        raise SystemExit(f"node not started: {exc}") from exc
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if handle_signals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
    tracing.configure(settings.tracing, "monologue-node")
    metrics.initialise()

    store = open_store(settings.storage)
    engine = make_engine(settings.db_url, settings.database_pool)
    sessions = make_sessionmaker(engine)
    node_id = settings.node.id
    node = settings.node
    metrics_port = node.temporal_metrics_port
    client = await temporal_client.connect(
        settings.temporal, metrics_address=None if metrics_port is None else f"{node.http_host}:{metrics_port}"
    )
    shared = SessionActivities(store=store, sessions=sessions)
    validate = ValidateActivities(store=store)
    sinks = SinkActivities(store=store, sessions=sessions, allowed=settings.sinks)
    hooks = WebhookActivities(sessions=sessions, settings=settings)
    faults = Faults(
        chunk_delay_s=settings.node.chunk_delay_s,
        hang_chunk=settings.node.hang_chunk,
        finalize_delay_s=settings.node.finalize_delay_s,
    )
    pinned = node_activities(store=store, sessions=sessions, node_id=node_id, faults=faults)
    lease = NodeLease(client=client, node_id=node_id)
    capacity = settings.node.capacity
    reporter = NodeReporter(
        sessions=sessions,
        node_id=node_id,
        capacity=capacity,
        held_sessions=lease.held_sessions,
        chunks_done=lambda: pinned.chunks_done,
    )
    grace = timedelta(seconds=settings.node.graceful_shutdown_s)
    health = node_http.NodeHealth(
        capacity=capacity, require_gpu=node.require_gpu, slots_used=lambda: len(lease.held_sessions())
    )
    server = None if node.http_port is None else node_http.serve(health, node.http_host, node.http_port)

    window = c.CHUNK_WINDOW
    with (
        ThreadPoolExecutor(max_workers=capacity * window + 4, thread_name_prefix="activity") as executor,
        ThreadPoolExecutor(max_workers=SINK_SLOTS, thread_name_prefix="sink") as sink_executor,
    ):
        shared_worker = Worker(
            client,
            task_queue=settings.temporal.task_queue,
            workflows=[RenderWorkflow, ValidateInputsWorkflow],
            activities=[
                shared.prepare,
                shared.publish,
                shared.record_status,
                shared.stored_audio,
                validate.validate_inputs,
                hooks.notify_session_ended,
            ],
            activity_executor=executor,
            max_concurrent_activities=4,
            graceful_shutdown_timeout=grace,
        )
        node_worker = Worker(
            client,
            task_queue=c.node_task_queue(node_id),
            activities=[pinned.init_session, pinned.generate_chunk, pinned.finalize],
            # Per session slot: the chunk running and the next one, waiting its turn in-process.
            activity_executor=executor,
            max_concurrent_activities=capacity * window,
            graceful_shutdown_timeout=grace,
            # Cancellations reach activities through heartbeat responses, and a chunk's progress must reach
            # Temporal well within the pinned activities' heartbeat timeout: let them through within a second.
            max_heartbeat_throttle_interval=timedelta(seconds=1),
            default_heartbeat_throttle_interval=timedelta(seconds=1),
        )
        lease_worker = Worker(
            client,
            task_queue=c.lease_task_queue(settings.temporal.task_queue),
            activities=[lease.hold_node],
            # The node's capacity: sessions beyond it wait in the queue, in order, for a free slot.
            max_concurrent_activities=capacity,
            # A released lease learns of its cancellation from a heartbeat response: send them often, so a
            # finished session frees its slot within about a second.
            max_heartbeat_throttle_interval=timedelta(seconds=1),
            default_heartbeat_throttle_interval=timedelta(seconds=1),
            graceful_shutdown_timeout=grace,
        )
        # Sink pumps stream for as long as their sessions: their own queue and threads, never the shared slots.
        sink_worker = Worker(
            client,
            task_queue=c.sink_task_queue(settings.temporal.task_queue),
            activities=[sinks.run_sink],
            activity_executor=sink_executor,
            max_concurrent_activities=SINK_SLOTS,
            max_heartbeat_throttle_interval=timedelta(seconds=1),
            default_heartbeat_throttle_interval=timedelta(seconds=1),
            graceful_shutdown_timeout=grace,
        )
        # Webhook deliveries: their workflows and attempts on a queue of their own, so a slow receiver waits there.
        webhook_worker = Worker(
            client,
            task_queue=c.webhook_task_queue(settings.temporal.task_queue),
            workflows=[WebhookDeliveryWorkflow],
            activities=[hooks.deliver_webhook, hooks.webhook_given_up],
            max_concurrent_activities=WEBHOOK_SLOTS,
            graceful_shutdown_timeout=grace,
        )
        queues = [
            settings.temporal.task_queue,
            c.lease_task_queue(settings.temporal.task_queue),
            c.node_task_queue(node_id),
        ]
        async with shared_worker, node_worker, lease_worker, sink_worker, webhook_worker:
            reporting = asyncio.create_task(reporter.run())
            watching = asyncio.create_task(_watch_health(health, client, engine))
            health.polling = True
            log.info("node ready", node_id=node_id, capacity=capacity, queues=queues)
            await stop.wait()
            health.draining = True
            # Hand the sessions back first (their workflows move them at once instead of waiting for a
            # heartbeat timeout); the chunk in progress still finishes while the workers shut down.
            log.info("node draining", node_id=node_id)
            overrun = _exit_after(settings.node.graceful_shutdown_s + SHUTDOWN_MARGIN_S)
            lease.draining.set()
            reporter.set_status(NodeStatus.DRAINING)
            await asyncio.sleep(0.5)
        health.polling = False
        watching.cancel()
        reporter.set_status(NodeStatus.STOPPED)
        await reporting
    overrun.cancel()  # the workers and their threads stopped in time (a node inside a test must not end its host)
    if server is not None:
        server.shutdown()
    engine.dispose()
    tracing.shutdown()
    log.info("node stopped", node_id=node_id)


async def _watch_health(health: node_http.NodeHealth, client: Client, engine: Engine) -> None:
    """Every few seconds: does Temporal answer, does the database? (for /readyz; never fatal to the node)."""

    def database() -> None:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    while True:
        try:
            health.temporal_ok = await client.service_client.check_health(timeout=timedelta(seconds=3))
            health.problems.pop("temporal", None)
        except Exception as err:  # any failure of the RPC means the same to a probe: not reachable
            health.temporal_ok = False
            health.problems["temporal"] = str(err)[:200]
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
