"""The chunked streaming inference framework: Module → Stage → Pipeline.

- **Module** (`module.py`): one model and its weights; load, move to a device, offload, restore.
  A model family (`gpu_worker/models/<family>/`) is a set of five modules, one per role.
- **Stage** (`stages.py`): a typed unit of work over modules, one verb each: context generation,
  audio-to-video, super-resolution, decode-and-publish.
- **Pipeline** (`pipeline.py`): runs the stages for one chunk and owns the session state (the static
  reference conditioning and the anchors); everything else is released when the chunk returns.
- **Progress** (`progress.py`): what a running chunk reports (each stage, each step of a long one); the
  node turns it into heartbeats.

Nothing here knows a family's internals: adding a family means adding modules, not editing this package.
"""

from gpu_worker.pipeline.module import (
    Anchor,
    AudioToVideo,
    ContextGenerator,
    Decoder,
    ModelSet,
    Module,
    ReferenceEncoder,
    SuperResolution,
)
from gpu_worker.pipeline.pipeline import ChunkResult, Pipeline
from gpu_worker.pipeline.progress import Progress, StepProgress, no_progress
from gpu_worker.pipeline.types import (
    ArrayAudio,
    AudioSource,
    AudioWindow,
    ChunkRequest,
    FrameSink,
    OutputSpec,
    chunk_rng,
    frame_size,
)

__all__ = [
    "Anchor",
    "ArrayAudio",
    "AudioSource",
    "AudioToVideo",
    "AudioWindow",
    "ChunkRequest",
    "ChunkResult",
    "ContextGenerator",
    "Decoder",
    "FrameSink",
    "ModelSet",
    "Module",
    "OutputSpec",
    "Pipeline",
    "Progress",
    "ReferenceEncoder",
    "StepProgress",
    "SuperResolution",
    "chunk_rng",
    "frame_size",
    "no_progress",
]
