"""The GPU check's summary (infra/gpu_check.sh): one JSON file with every step's outcome and figures, so that the
three files the check returns say everything without unpacking the tarball. The standard library only: it runs on
the bare GPU image.

    python infra/gpu_summary.py RAW_DIR OUT_FILE

RAW_DIR holds steps.tsv (step, exit status or "skipped", seconds, limit, why), env.json, each step's NAME.json and
NAME.err, pytest_gpu.xml and records/*.json."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

ERR_TAIL = 1200  # characters of a failed step's stderr kept in the summary


def steps(raw: Path) -> list[dict[str, Any]]:
    """Each step's line of steps.tsv, with its outcome: ok, failed (and its stderr's end), timeout or skipped."""
    rows = []
    for line in (raw / "steps.tsv").read_text().splitlines()[1:]:
        fields = line.split("\t")
        if len(fields) < 4:
            continue  # the "total seconds" line
        name, rc, seconds, limit = fields[:4]
        row: dict[str, Any] = {"step": name, "rc": rc, "seconds": int(seconds), "limit": int(limit)}
        row["why"] = fields[4] if len(fields) > 4 and fields[4] else None
        if rc == "skipped":
            row["outcome"] = "skipped"
        elif rc == "0":
            row["outcome"] = "ok"
        else:
            row["outcome"] = "timeout" if rc in ("124", "134", "137") else "failed"
            err = raw / f"{name}.err"
            row["stderr_tail"] = err.read_text(errors="replace")[-ERR_TAIL:] if err.exists() else None
        rows.append(row)
    return rows


def pytest_outcome(raw: Path) -> dict[str, Any] | None:
    """The GPU tests: counts, and each skipped or failed test with its message."""
    report = raw / "pytest_gpu.xml"
    if not report.exists():
        return None
    suite = ElementTree.parse(report).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    if suite is None:
        return None
    cases = []
    for case in suite.iter("testcase"):
        for kind in ("skipped", "failure", "error"):
            found = case.find(kind)
            if found is not None:
                name = f"{case.get('classname')}::{case.get('name')}"
                message = found.get("message") or ""
                if message == "collection skipped":  # a module that skipped itself: its reason is in the text
                    message = found.text or message
                cases.append({"test": name, "outcome": kind, "message": message[:300]})
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    return counts | {"not_passed": cases}


def figures(raw: Path) -> dict[str, Any]:
    """Every step's JSON (bench_resident.json, sp_check.json, …) and the records, as written."""
    found: dict[str, Any] = {}
    for path in sorted([*raw.glob("*.json"), *raw.glob("records/*.json")]):
        key = str(path.relative_to(raw).with_suffix(""))
        try:
            found[key] = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            found[key] = {"unreadable": str(err)}
    for path in sorted(raw.glob("gate_*.out")):
        found[path.stem] = path.read_text(errors="replace")[-ERR_TAIL:]
    return found


def main(argv: list[str]) -> int:
    raw, out = Path(argv[0]), Path(argv[1])
    summary = {"steps": steps(raw), "pytest_gpu": pytest_outcome(raw), "figures": figures(raw)}
    out.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
