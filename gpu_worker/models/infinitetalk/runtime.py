"""What the infinitetalk modules share with the dit family's: device placement, precision, offload and switch
residency (`gpu_worker.models.dit.runtime.TorchModule`), over the user's folders instead of a dit checkpoint."""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch
from torch import nn

from gpu_worker.models.dit.runtime import Precision, TorchModule, default_device
from gpu_worker.models.infinitetalk.checkpoint import InfiniteTalkWeights
from gpu_worker.models.infinitetalk.config import EncoderPrecision, InfiniteTalkConfig
from gpu_worker.models.infinitetalk.dit import no_autocast


class WanModule(TorchModule):
    """A pipeline module over some of the family's models; each loads straight into the precision's dtype (a 14B
    DiT is never held in fp32 on the host)."""

    def __init__(self, weights: InfiniteTalkWeights, precision: Precision = Precision.AUTO) -> None:
        super().__init__(weights, precision)  # type: ignore[arg-type]  # duck-types dit's Weights.build/config
        self.family_weights = weights

    @property
    def settings(self) -> InfiniteTalkConfig:
        return self.family_weights.config

    def load(self) -> None:
        device = default_device()
        self.dtype = self.precision.dtype(device)
        self.quantize.check(device)  # before any weight is read: fp8 on a CPU node fails at once
        for name in self.model_names:
            model = self.family_weights.build(name, self.model_dtype(name))  # a LoRA is merged here, in float
            self.models[name] = self.quantized(name, model, device)
        self.loaded = True
        self.to(device)

    def model_dtype(self, name: str) -> torch.dtype:
        """The named model's dtype: the precision's, except the VAE's and CLIP's below fp32 (the config's, the
        original's fp32 and fp16 by default). Each runs in its own under the module's autocast (`own_precision`)."""
        own = {"vae": self.settings.vae_precision, "clip": self.settings.clip_precision}.get(name)
        if own is None or self.dtype == torch.float32:
            return self.dtype
        return ENCODER_DTYPES[own]


ENCODER_DTYPES = {
    EncoderPrecision.FP32: torch.float32,
    EncoderPrecision.FP16: torch.float16,
    EncoderPrecision.BF16: torch.bfloat16,
}


def own_precision(model: nn.Module, device: torch.device) -> AbstractContextManager[object]:
    """Autocast to `model`'s own dtype, off for fp32: inside a bf16 module's `running()`, an fp32 VAE or an fp16
    CLIP computes in its own precision, as the original runs them (a bf16 one as before)."""
    dtype = next(model.parameters()).dtype
    if dtype == torch.float32 or not torch.amp.is_autocast_available(device.type):
        return no_autocast(device)
    return torch.autocast(device.type, dtype=dtype)
