"""The anchor rule (which anchors a chunk reads, leaves and releases) is `contracts.Chunk`'s, written once: the
pipeline, its store, the multi-GPU steps and the checkpoints call it and spell no anchor by hand."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from monologue.contracts import Chunk, ChunkKind
from monologue.contracts.session import AnchorEnd, AnchorRef
from monologue.plan import plan_chunks

ROOT = Path(__file__).resolve().parents[2]
HEAD, TAIL = AnchorEnd.HEAD, AnchorEnd.TAIL

# Where anchors used to be spelled with bare strings ("N", "head", "tail"); they now ask `Chunk`.
CALLERS = (
    "gpu_worker/pipeline/stages.py",
    "gpu_worker/pipeline/pipeline.py",
    "gpu_worker/distributed/pipeline.py",
    "activities/checkpoints.py",
)
ANCHOR_STRINGS = {"N", "I", "head", "tail"}


def test_an_n_chunk_reads_the_previous_tail_and_leaves_its_head_and_tail() -> None:
    assert Chunk(ChunkKind.N, 0, 0, 40).anchors_read() == ()
    assert Chunk(ChunkKind.N, 3, 130, 40).anchors_read() == (AnchorRef(2, TAIL),)
    assert Chunk(ChunkKind.N, 3, 130, 40).anchors_left() == (AnchorRef(3, HEAD), AnchorRef(3, TAIL))


def test_an_i_chunk_reads_its_left_tail_then_its_right_head_and_leaves_nothing() -> None:
    chunk = Chunk(ChunkKind.I, 2, 120, 4)
    assert chunk.anchors_read() == (AnchorRef(2, TAIL), AnchorRef(3, HEAD))
    assert chunk.anchors_left() == ()


def test_what_a_chunk_releases() -> None:
    held = [AnchorRef(index, end) for index in range(6) for end in AnchorEnd]
    # After N4: N3's head and everything older than N3 (N3's tail still anchors I3).
    released = Chunk(ChunkKind.N, 4, 0, 8).anchors_released(held)
    assert set(released) == {AnchorRef(i, end) for i in (0, 1, 2) for end in AnchorEnd} | {AnchorRef(3, HEAD)}
    # After I2: its seam (N2's tail, N3's head) and N2's head.
    assert set(Chunk(ChunkKind.I, 2, 0, 4).anchors_released(held)) == {
        AnchorRef(2, HEAD),
        AnchorRef(2, TAIL),
        AnchorRef(3, HEAD),
    }
    assert Chunk(ChunkKind.I, 2, 0, 4).anchors_released([]) == ()


def test_dependencies_are_the_chunks_that_leave_what_a_chunk_reads() -> None:
    assert Chunk(ChunkKind.N, 0, 0, 8).depends_on == ()
    assert Chunk(ChunkKind.N, 2, 0, 8).depends_on == ((ChunkKind.N, 1),)
    assert Chunk(ChunkKind.I, 2, 0, 4).depends_on == ((ChunkKind.N, 2), (ChunkKind.N, 3))


@given(frames=st.integers(1, 400), n_frames=st.integers(2, 60), i_frames=st.integers(0, 8))
def test_in_generation_order_every_anchor_read_is_held_and_at_most_four_are(
    frames: int, n_frames: int, i_frames: int
) -> None:
    """Released is never read again: walking any plan, a chunk finds what it reads, and the store stays bounded."""
    held: set[AnchorRef] = set()
    for chunk in plan_chunks(frames, n_frames=n_frames, i_frames=i_frames):
        assert set(chunk.anchors_read()) <= held, f"{chunk.name} reads {chunk.anchors_read()}, held {held}"
        held |= set(chunk.anchors_left())
        held -= set(chunk.anchors_released(held))
        assert len(held) <= 4, f"after {chunk.name}: {sorted(ref.name for ref in held)}"


def test_anchor_names_are_the_stored_ones() -> None:
    """Flat arrays keep "N3.tail.<field>", as sessions' stored anchors always have."""
    assert AnchorRef(3, TAIL).name == "N3.tail"
    assert AnchorRef.parse("N12.head") == AnchorRef(12, HEAD)
    for bad in ("I3.tail", "N3.middle", "N.tail", "tail"):
        with pytest.raises(ValueError):
            AnchorRef.parse(bad)


def _bare_strings(path: Path) -> set[str]:
    """String constants of a module, leaving out the parts of f-strings (what it shows, e.g. "checkpoint N3")."""
    tree = ast.parse(path.read_text())
    in_fstrings = {id(node) for joined in ast.walk(tree) if isinstance(joined, ast.JoinedStr) for node in joined.values}
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_fstrings
    }


@pytest.mark.parametrize("module", CALLERS)
def test_no_caller_spells_an_anchor_with_bare_strings(module: str) -> None:
    spelled = _bare_strings(ROOT / module) & ANCHOR_STRINGS
    assert not spelled, f"{module} spells anchors as {spelled}: ask Chunk.anchors_read/left/released instead"


def test_the_rule_has_one_definition() -> None:
    """Only contracts/session.py says which chunk's anchors are which: no caller builds an AnchorRef itself."""
    for module in CALLERS:
        calls = [
            node
            for node in ast.walk(ast.parse((ROOT / module).read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "AnchorRef"
        ]
        assert not calls, f"{module} builds AnchorRefs at lines {[call.lineno for call in calls]}"
