"""What the infinitetalk modules share with the dit family's: device placement, precision, offload and switch
residency (`gpu_worker.models.dit.runtime.TorchModule`), over the user's folders instead of a dit checkpoint."""

from __future__ import annotations

from gpu_worker.models.dit.runtime import Precision, TorchModule, default_device
from gpu_worker.models.infinitetalk.checkpoint import InfiniteTalkWeights
from gpu_worker.models.infinitetalk.config import InfiniteTalkConfig


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
        for name in self.model_names:
            self.models[name] = self.family_weights.build(name, self.dtype)
        self.loaded = True
        self.to(device)
