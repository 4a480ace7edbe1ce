"""Compiled DiT denoising steps (issue 29 item 2): each DiT's per-step forward (the dit family's A2V and SR DiTs,
infinitetalk's Wan DiT) as one `torch.compile` graph per warm bucket, so the per-layer CPU launch time leaves the
critical path.

A bucket is the step's input signature (every tensor's shape, dtype and device): the graphs are static
(`dynamic=False`), one per bucket. On CUDA they compile with `mode="reduce-overhead"` (Inductor kernels replayed as
CUDA graphs: one launch per step instead of a few per layer); on CPU, where the tests count compiles, with a
cheap backend (`eager`, or `aot_eager`) that runs the same traced graph with the eager kernels, so its outputs
equal the eager model's bit for bit.

Compiles happen in `CompiledStep.warm_up` only, which the dit family's A2V and SR modules call when they load (the
warm buckets: the steady-state chunks of a default session at `MONOLOGUE_DIT_WARM_RESOLUTIONS`,
gpu_worker/models/dit/warm.py), never in a session's chunk: a compile there (tens of seconds for a full-size DiT)
would stall the chunk's progress-driven heartbeats past their timeout and move the session. A step at a bucket
that was not warmed runs eagerly (counted in `eager_steps`), and so does a warmed one whose other guards (grad or
autocast mode) do not hold (`set_stance("eager_on_recompile")`): a chunk never compiles. Infinitetalk's Wan DiT
runs through the same wrapper but has no warm buckets at load yet (its step shapes follow the aspect bucket, the
sampling preset's passes and the motion frames): until it has, its steps run eagerly.

On CUDA, Inductor's CUDA-graph trees are per thread: a chunk on another thread than the load records its graphs
again on its first steps (a replay's worth of work, no compile), and each thread's graphs hold their own memory pool.

Eager too, on purpose:
- under sequence parallelism (`current_sp()`): the forwards' all-to-alls and all-gathers are not captured, and a
  CUDA graph of one rank's collectives would need every rank to replay in lockstep. The per-rank work of an SP
  step stays eager; compiling it is left for when the SP step itself is measured on several GPUs. A family loaded
  under SP (a multi-GPU node's ranks) warms nothing.
- a model whose inner modules carry forward hooks (switch residency's `ModelSwitcher` streams blocks in from them;
  FSDP unshards from them): a CUDA graph would replay the parameters' old addresses after a switch frees and
  refills them. Switch residency hooks the models after they load, so such a load still compiles its warm
  buckets, which its chunks then never use (load time and CUDA-graph memory spent for nothing: set the setting
  off on switch nodes until the load can tell).

The forwards ask `current_sp()` (a ContextVar, which Dynamo cannot trace) which path to take; a compiled step only
ever runs outside SP, so the wrapper marks it `assume_constant_result`: traced as its value then, None.

The one setting: `MONOLOGUE_COMPILE_STEPS` (`StepCompile`: off, the default until a GPU run has measured the gain and
gated the frames; auto, on with CUDA and off on CPU; on), read here
and nowhere else, as `MONOLOGUE_SP_DEGREE` is (every rank, and the bare GPU machine's bench, read it without the
service's Settings). Must never: compile outside `warm_up`, or change what a step computes.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import fields, is_dataclass
from enum import StrEnum
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from torch._dynamo.utils import counters

from gpu_worker.distributed.sequence import current_sp

COMPILE_ENV = "MONOLOGUE_COMPILE_STEPS"
# The dit decoder's per-frame stage (a compiled step of its own, `SpatialStage`): auto by default, since the first
# H200 runs measured it 3.1x faster compiled (docs/benchmarks.md) with the same frames run after run.
DECODER_COMPILE_ENV = "MONOLOGUE_COMPILE_DECODER"
# The CPU backend: the traced graph run by the eager kernels (bit-identical to eager; compiles in a second).
CPU_BACKEND = "eager"

# A step's input signature: (shape, dtype, device) of every tensor argument, in order.
Bucket = tuple[tuple[tuple[int, ...], str, str], ...]


class StepCompile(StrEnum):
    """Whether the DiTs' steps are compiled (`MONOLOGUE_COMPILE_STEPS`)."""

    AUTO = "auto"  # on with CUDA (CUDA graphs), off on CPU (compiling there only costs time)
    ON = "on"  # also on CPU, with the cheap backend: what the tests use
    OFF = "off"

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str] = os.environ, variable: str = COMPILE_ENV, default: str = "off"
    ) -> StepCompile:
        """The setting `variable` holds (`default` where unset), or a ValueError naming the variable and its values.
        The steps' default is off until a GPU run measures them; the decoder's is auto (`decoder_setting`)."""
        text = environ.get(variable, "").strip().lower() or default
        try:
            return cls(text)
        except ValueError:
            known = ", ".join(mode.value for mode in cls)
            raise ValueError(f"{variable} must be one of {known}, got {text!r}") from None

    def enabled(self, device: str) -> bool:
        """Compile the steps of models on `device` ("cuda", "cuda:1", "cpu")?"""
        if self is StepCompile.AUTO:
            return device.startswith("cuda")
        return self is StepCompile.ON


_override: StepCompile | None = None


def configured() -> StepCompile:
    """The process's setting: `use`'s if a process entry point (the bench's --compile) chose one, else the
    environment's."""
    return _override if _override is not None else StepCompile.from_environ()


def use(mode: StepCompile | None) -> None:
    """Set the process's setting (None: back to the environment's); read when a family's modules load."""
    global _override
    _override = mode


def decoder_setting(environ: Mapping[str, str] = os.environ) -> StepCompile:
    """`MONOLOGUE_COMPILE_DECODER`: whether the dit decoder's per-frame stage compiles (default auto: with CUDA)."""
    return StepCompile.from_environ(environ, DECODER_COMPILE_ENV, StepCompile.AUTO.value)


def graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process (the counter torch's own tests read)."""
    return int(counters["stats"]["unique_graphs"])


def bucket_of(args: tuple[Any, ...]) -> Bucket:
    """The signature of a step's arguments: tensors directly, in tuples or lists, or in dataclass fields."""
    signature: list[tuple[tuple[int, ...], str, str]] = []
    for tensor in _tensors(args):
        signature.append((tuple(tensor.shape), str(tensor.dtype), str(tensor.device)))
    return tuple(signature)


def _tensors(value: Any) -> Iterator[Tensor]:
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _tensors(item)
    elif is_dataclass(value) and not isinstance(value, type):
        for item in fields(value):
            yield from _tensors(getattr(value, item.name))


def _hooked(model: nn.Module) -> bool:
    """Does anything run hooks around the model's inner modules (a ModelSwitcher's blocks, FSDP's)? Hooks on the
    model itself run eagerly around the compiled forward (`CompiledStep._run`), so they do not count."""
    return any(module._forward_pre_hooks or module._forward_hooks for module in model.modules() if module is not model)


class CompiledStep:
    """A DiT's step forward, callable as the model is: compiled per warm bucket, eager everywhere else.

    `compiles` counts, per bucket, the graphs Dynamo compiled while this step ran (0 for a bucket another model
    of the same architecture had compiled already: Dynamo's cache belongs to the forward's code, and the
    parameters are the graph's inputs, so they share it)."""

    def __init__(self, model: nn.Module, device: str, enabled: bool, collective_free: bool = False) -> None:
        self.model = model
        self.enabled = enabled
        # A forward with no collectives inside (the decoder's per-frame stage) compiles under SP too: each rank
        # replays its own graph, and a rank's frames stay the one-process frames.
        self.collective_free = collective_free
        self.cuda_graphs = device.startswith("cuda")
        options: dict[str, Any] = {"mode": "reduce-overhead"} if self.cuda_graphs else {"backend": CPU_BACKEND}
        # Not fullgraph: a graph break (one the CPU tests cannot see, e.g. on the SR's CUDA-only flex path) splits
        # the step into more graphs, each still compiled and captured, instead of failing the node's load.
        self._forward: Callable[..., Tensor] = torch.compile(type(model).forward, dynamic=False, **options)
        self.warmed: set[Bucket] = set()
        self.compiles: Counter[Bucket] = Counter()
        self.eager_steps: Counter[Bucket] = Counter()  # steps at a bucket never warmed: the shapes a load missed
        self.compiled_steps: Counter[Bucket] = Counter()  # steps that ran a warmed bucket's graph

    @property
    def active(self) -> bool:
        """Would a step now run compiled at a warm bucket (on, outside SP, no hooks inside the model)?"""
        return self.enabled and (self.collective_free or current_sp() is None) and not _hooked(self.model)

    def warm_up(self, *args: Any) -> Tensor:
        """The step's output for `args`, its bucket compiled first (under the caller's grad and autocast modes,
        which the graph is guarded on: the roles' `running()`); the graphs that took land in `compiles` (none
        where steps are not compiled, or the bucket was compiled before). Callable as the step is, so a role
        warms through its own sampling code. Dynamo's recompile limit is raised to hold every warmed bucket."""
        if not self.active:
            return self.model(*args)  # type: ignore[no-any-return]
        bucket = bucket_of(args)
        _hold(len(self.warmed) + 1)
        before = graphs_compiled()
        out = self._run(args)
        self.compiles[bucket] += graphs_compiled() - before
        self.warmed.add(bucket)
        return out

    def __call__(self, *args: Any) -> Tensor:
        if not self.active:
            return self.model(*args)  # type: ignore[no-any-return]
        bucket = bucket_of(args)
        if bucket not in self.warmed:
            self.eager_steps[bucket] += 1
            return self.model(*args)  # type: ignore[no-any-return]
        before = graphs_compiled()
        with torch.compiler.set_stance("eager_on_recompile"):
            out = self._run(args)
        self.compiles[bucket] += graphs_compiled() - before  # stays 0: the stance never compiles
        self.compiled_steps[bucket] += 1
        return out

    def _run(self, args: tuple[Any, ...]) -> Tensor:
        """The model's own call with the compiled forward in place of its forward for this call: hooks on the model
        itself (the bench's argument capture) run eagerly around the graph, as around the eager forward."""
        if self.cuda_graphs:
            # Each step is a new CUDA-graph generation: the previous step's output may be overwritten now.
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
        self.model.forward = partial(self._forward, self.model)
        try:
            out: Tensor = self.model(*args)
        finally:
            del self.model.forward
        # A CUDA graph's output lives in its pool until the next replay: the caller gets a copy (latent-sized,
        # against a whole DiT forward).
        return out.clone() if self.cuda_graphs else out


def _hold(buckets: int) -> None:
    """Raise Dynamo's per-code recompile limit (8 by default; past it, a shape runs eagerly) to `buckets`."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # torch < 2.6
    setattr(config, name, max(int(getattr(config, name)), buckets))


_STEP_ATTRIBUTE = "_monologue_compiled_step"  # kept on the model: the two live and die together


def compiled_step(
    model: nn.Module, device: str, mode: StepCompile | None = None, collective_free: bool = False
) -> CompiledStep:
    """The one `CompiledStep` of `model` (made on first use, with `mode` or the process's setting): the roles ask
    for it at load (to warm it) and at every chunk (to run it)."""
    step: CompiledStep | None = getattr(model, _STEP_ATTRIBUTE, None)
    if step is None:
        step = CompiledStep(model, device, (mode or configured()).enabled(device), collective_free)
        setattr(model, _STEP_ATTRIBUTE, step)
    return step


# The forwards decide their path with current_sp(); a compiled step runs outside SP only (see the docstring).
torch.compiler.assume_constant_result(current_sp)  # type: ignore[no-untyped-call]
