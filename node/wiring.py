"""What a node runs, wired once: its activities (`NodeParts`, built from settings) and the six Temporal workers
that poll its queues (`steady_workers`, `renewable_workers`), each with the slots and throttles its queue needs. The
process around them (start, drain, stop, fresh pollers after an outage) is `node/worker.py` and `node/pollers.py`."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import sessionmaker
from temporalio.client import Client
from temporalio.worker import Worker

from activities.avatars import AvatarActivities
from activities.disks import NodeDisks, watch
from activities.fault_injection import Faults
from activities.lease import NodeLease
from activities.node import NodeActivities
from activities.retention import RetentionActivities
from activities.sched import SchedActivities
from activities.session import SessionActivities
from activities.sinks import SinkActivities
from activities.validate import ValidateActivities
from activities.webhooks import WebhookActivities
from gpu_worker.tts import TtsConfig
from monologue import contracts as c
from monologue.orchestration import lease_timeout_s
from monologue.settings import Settings
from monologue.storage import ObjectStore
from node.lease_gate import LeaseSlots, lease_tuner
from workflows.avatar import PrepareAvatarWorkflow
from workflows.render import RenderWorkflow
from workflows.retention import RetentionWorkflow
from workflows.validate import ValidateInputsWorkflow
from workflows.webhook import WebhookDeliveryWorkflow

SINK_SLOTS = 32  # sink pumps one node runs at once (each mostly waits on the network)
WEBHOOK_SLOTS = 16  # webhook attempts one node makes at once (async: each waits on a receiver)
# Cancellations reach activities through heartbeat responses, and progress must reach Temporal well within the
# heartbeat timeouts: let heartbeats through within a second.
SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class NodeParts:
    """The node's activities, one object per queue's concern."""

    shared: SessionActivities
    sched: SchedActivities
    validate: ValidateActivities
    avatars: AvatarActivities
    sinks: SinkActivities
    hooks: WebhookActivities
    retention: RetentionActivities
    pinned: NodeActivities
    lease: NodeLease
    disks: NodeDisks  # where it writes; whether it has room to take a session
    slots: LeaseSlots  # the node's session slots: the shared lease queue's polls, and the leases handed to it


def build_parts(
    settings: Settings,
    *,
    store: ObjectStore,
    sessions: sessionmaker[Any],
    client: Client,
    node_activities: Callable[..., NodeActivities],
) -> NodeParts:
    """The activities of node `settings.node.id`; `node_activities` builds the pinned ones (a multi-GPU node passes
    one whose pipelines run on every rank). The scratch folder is created here, and its disks watched."""
    node = settings.node
    disks = NodeDisks.of(node, settings.storage)
    watch(disks)
    slots = LeaseSlots(node.capacity, disks.shortage)
    faults = Faults(
        chunk_delay_s=node.chunk_delay_s,
        hang_chunk=node.hang_chunk,
        finalize_delay_s=node.finalize_delay_s,
        session_load_delay_s=node.session_load_delay_s,
    )
    return NodeParts(
        shared=SessionActivities(store=store, sessions=sessions),
        sched=SchedActivities(
            client=client, sessions=sessions, settings=settings.sched, lost_after_s=node.lease_timeout_s
        ),
        validate=ValidateActivities(store=store, tts=TtsConfig(piper_voice=settings.tts.piper_voice)),
        avatars=AvatarActivities(store=store),
        sinks=SinkActivities(store=store, sessions=sessions, allowed=settings.sinks, scratch_dir=disks.scratch),
        hooks=WebhookActivities(sessions=sessions, settings=settings),
        retention=RetentionActivities(store=store, sessions=sessions),
        pinned=node_activities(
            store=store, sessions=sessions, node_id=node.id, faults=faults, scratch_dir=disks.scratch
        ),
        lease=NodeLease(client=client, node_id=node.id, shortage=disks.shortage, slots=slots),
        disks=disks,
        slots=slots,
    )


STICKY_TIMEOUT = timedelta(seconds=2)


def executors(settings: Settings) -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
    """The activity threads (per session slot: the chunk running and the next one, plus the shared queue's) and
    the sink pumps' own threads."""
    slots = settings.node.capacity * c.CHUNK_WINDOW + 4
    return (
        ThreadPoolExecutor(max_workers=slots, thread_name_prefix="activity"),
        ThreadPoolExecutor(max_workers=SINK_SLOTS, thread_name_prefix="sink"),
    )


def steady_workers(
    client: Client, settings: Settings, parts: NodeParts, sink_executor: ThreadPoolExecutor
) -> list[Worker]:
    """The workers that run from the node's start to its stop: the lease queues and the sink pumps (their activities
    last as long as sessions) and the webhook queue."""
    grace = timedelta(seconds=settings.node.graceful_shutdown_s)
    return [
        _lease_worker(client, settings, parts, grace),
        _handed_lease_worker(client, settings, parts, grace),
        _sink_worker(client, settings, parts, sink_executor, grace),
        _webhook_worker(client, settings, parts, grace),
    ]


def renewable_workers(
    client: Client, settings: Settings, parts: NodeParts, executor: ThreadPoolExecutor, generation: int
) -> list[Worker]:
    """The workers whose tasks are short, made afresh after Temporal was unreachable (node/pollers.py): the shared
    queue and the node's own. Each generation's pollers have an identity of their own (`<client>#<generation>`)."""
    grace = timedelta(seconds=settings.node.graceful_shutdown_s)
    identity = f"{client.identity}#{generation}"
    return [
        _shared_worker(client, settings, parts, executor, grace, identity),
        _node_worker(client, settings, parts, executor, grace, identity),
    ]


def queues(settings: Settings) -> list[str]:
    """The queues that say which node this is (for its start-up line)."""
    shared = settings.temporal.task_queue
    node_id = settings.node.id
    return [shared, c.lease_task_queue(shared), c.node_task_queue(node_id), c.handed_lease_task_queue(node_id)]


def _shared_worker(
    client: Client, settings: Settings, parts: NodeParts, executor: ThreadPoolExecutor, grace: timedelta, identity: str
) -> Worker:
    """RenderWorkflow, ValidateInputsWorkflow, PrepareAvatarWorkflow and RetentionWorkflow, and the activities any
    node may run for any session."""
    return Worker(
        client,
        task_queue=settings.temporal.task_queue,
        identity=identity,
        workflows=[RenderWorkflow, ValidateInputsWorkflow, PrepareAvatarWorkflow, RetentionWorkflow],
        activities=[
            parts.shared.prepare,
            parts.shared.publish,
            parts.shared.record_status,
            parts.shared.stored_audio,
            parts.sched.ask_to_yield,
            parts.sched.record_yield,
            parts.validate.validate_inputs,
            parts.avatars.prepare_avatar,
            parts.hooks.notify_session_ended,
            parts.retention.apply_retention,
            parts.retention.expire_assets,
        ],
        activity_executor=executor,
        max_concurrent_activities=4,
        graceful_shutdown_timeout=grace,
        # A session's workflow is cached on the node that ran its last task, and its next task waits on that node's
        # sticky queue this long before any node may take it: when the node died (its sessions' leases timing out),
        # that wait was the SDK's 10 s, on top of the lease timeout, before the sessions could move.
        sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT,
    )


def _node_worker(
    client: Client, settings: Settings, parts: NodeParts, executor: ThreadPoolExecutor, grace: timedelta, identity: str
) -> Worker:
    """The pinned work of the sessions this node holds."""
    pinned = parts.pinned
    return Worker(
        client,
        task_queue=c.node_task_queue(settings.node.id),
        identity=identity,
        activities=[pinned.init_session, pinned.generate_chunk, pinned.finalize],
        # Per session slot: the chunk running and the next one, waiting its turn in-process.
        activity_executor=executor,
        max_concurrent_activities=settings.node.capacity * c.CHUNK_WINDOW,
        graceful_shutdown_timeout=grace,
        max_heartbeat_throttle_interval=SECOND,
        default_heartbeat_throttle_interval=SECOND,
    )


def _lease_worker(client: Client, settings: Settings, parts: NodeParts, grace: timedelta) -> Worker:
    """The lease queue, one slot per session the node can hold: how a node takes a session."""
    return Worker(
        client,
        task_queue=c.lease_task_queue(settings.temporal.task_queue),
        activities=[parts.lease.hold_node],
        # The node's capacity: sessions beyond it wait in the queue, in order, for a free slot; and no slot at all
        # while the node has no room for a session's files (node/lease_gate.py).
        tuner=lease_tuner(parts.slots),
        # A released lease learns of its cancellation from a heartbeat response: send them often, so a finished
        # session frees its slot within about a second; and well within the shortest lease timeout (a live one's).
        max_heartbeat_throttle_interval=_lease_beat(settings),
        default_heartbeat_throttle_interval=_lease_beat(settings),
        graceful_shutdown_timeout=grace,
    )


def _handed_lease_worker(client: Client, settings: Settings, parts: NodeParts, grace: timedelta) -> Worker:
    """The leases handed to this node: each waits for the next slot freed here, ahead of the shared queue's polls
    (node/lease_gate.py), so a slot given up to a session goes to it. Room for a lease per slot, and one more per
    slot waiting."""
    return Worker(
        client,
        task_queue=c.handed_lease_task_queue(settings.node.id),
        activities=[parts.lease.hold_node],
        max_concurrent_activities=2 * settings.node.capacity,
        max_heartbeat_throttle_interval=_lease_beat(settings),
        default_heartbeat_throttle_interval=_lease_beat(settings),
        graceful_shutdown_timeout=grace,
    )


def _lease_beat(settings: Settings) -> timedelta:
    """How often a held lease's heartbeats reach Temporal: four per live lease timeout, at most a second apart."""
    return min(SECOND, timedelta(seconds=lease_timeout_s(settings, c.SessionKind.LIVE) / 4))


def _sink_worker(
    client: Client, settings: Settings, parts: NodeParts, sink_executor: ThreadPoolExecutor, grace: timedelta
) -> Worker:
    """Sink pumps stream for as long as their sessions: their own queue and threads, never the shared slots."""
    return Worker(
        client,
        task_queue=c.sink_task_queue(settings.temporal.task_queue),
        activities=[parts.sinks.run_sink],
        activity_executor=sink_executor,
        max_concurrent_activities=SINK_SLOTS,
        max_heartbeat_throttle_interval=SECOND,
        default_heartbeat_throttle_interval=SECOND,
        graceful_shutdown_timeout=grace,
    )


def _webhook_worker(client: Client, settings: Settings, parts: NodeParts, grace: timedelta) -> Worker:
    """Webhook deliveries: their workflows and attempts on a queue of their own, so a slow receiver waits there."""
    return Worker(
        client,
        task_queue=c.webhook_task_queue(settings.temporal.task_queue),
        workflows=[WebhookDeliveryWorkflow],
        activities=[parts.hooks.deliver_webhook, parts.hooks.webhook_given_up],
        max_concurrent_activities=WEBHOOK_SLOTS,
        graceful_shutdown_timeout=grace,
    )
