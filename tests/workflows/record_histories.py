"""Record the closed RenderWorkflow histories of a running Temporal server as replay fixtures.

    python -m tests.workflows.record_histories --address 127.0.0.1:7233 [--namespace default] [--out DIR]

Run sessions on a stack first (`monologue up`, or a test run whose Temporal server you keep): renders, live
sessions, node kills, cancels, resumes, continue-as-new (MONOLOGUE_RENDER__CONTINUE_AS_NEW_EVERY=2). Each
run lands in `<workflow id>-<run id>.json` (`WorkflowHistory.to_json()`), the form `test_replay.py` reads.
Record from the code *before* a workflow change, so the replay test proves the change keeps them running."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from temporalio.client import Client

HISTORIES = Path(__file__).parent / "histories"
CLOSED_RENDERS = 'WorkflowType = "RenderWorkflow" AND ExecutionStatus != "Running"'


async def record(*, address: str, namespace: str, out: Path) -> int:
    """Write every closed RenderWorkflow run's history to `out`; returns how many were written."""
    client = await Client.connect(address, namespace=namespace)
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    async for execution in client.list_workflows(CLOSED_RENDERS):
        history = await client.get_workflow_handle(execution.id, run_id=execution.run_id).fetch_history()
        (out / f"{execution.id}-{execution.run_id}.json").write_text(history.to_json())
        written += 1
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:7233")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--out", type=Path, default=HISTORIES)
    args = parser.parse_args()
    written = asyncio.run(record(address=args.address, namespace=args.namespace, out=args.out))
    print(f"{written} histories written to {args.out}")


if __name__ == "__main__":
    main()
