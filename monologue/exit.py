"""How a command that has talked to Temporal ends: at once, with its status, skipping the interpreter's teardown.

Temporal's client runs native threads (the Rust core) that can still be retrying a call when Python finalises;
the teardown then waits forever on them, or aborts the process with `PyGILState_Release ... finalizing`
(seen from `monologue temporal setup` under load). Everything the command printed is flushed first.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable


def exit_when_done(run: Callable[[], None]) -> None:
    """Run `run`, then `os._exit` with its status: 0, a SystemExit's code (its message on stderr and 1 when the
    code is text, as Python itself does), or 1 with the traceback for anything else."""
    code = 0
    try:
        run()
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # reported, then the process exits non-zero
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
