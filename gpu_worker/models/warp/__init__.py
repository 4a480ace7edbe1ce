"""The warp family: the default CPU model. It animates the portrait itself, with no learned weights.

Speech loudness and spectral shape drive the jaw and lips; a slow random sway moves the head and blinks
close the eyelids; rendering warps only the head region of the portrait and paints the inner mouth from
a texture fixed per session, so everything away from the head is the portrait's own pixels.
"""

from __future__ import annotations

from gpu_worker.models.warp.features import SpeechContext
from gpu_worker.models.warp.motion import WarpMotion
from gpu_worker.models.warp.reference import WarpReference
from gpu_worker.models.warp.render import PassThroughDecoder, WarpRenderer
from gpu_worker.pipeline.module import ModelSet
from monologue.contracts import Family


def build_family() -> ModelSet:
    """The warp family's five modules (none has weights to load)."""
    return ModelSet(
        name=Family.WARP,
        reference=WarpReference(),
        context=SpeechContext(),
        audio_to_video=WarpMotion(),
        super_resolution=WarpRenderer(),
        decoder=PassThroughDecoder(),
    )
