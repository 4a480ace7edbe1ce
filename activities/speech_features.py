"""A render's speech features in storage: the rows its family's context encoded over the whole speech when the
session started (`Pipeline.encode_speech`), one safetensors file beside the reference conditioning
(`keys.speech_features`), read back by frame range.

Reading by range keeps a node's memory flat whatever the speech's length (20 minutes of wav2vec2 features are about
1 GB), and a node that resumes the session reads the very bytes the first node computed instead of encoding again.
The file is a plain safetensors file with one float32 tensor, so any safetensors reader opens it whole.
"""

from __future__ import annotations

import json
import math

import numpy as np
from safetensors.numpy import save as save_tensors

from gpu_worker.pipeline.types import ArrayFeatures
from monologue.storage import ObjectStore

TENSOR = "features"


def features_file(rows: np.ndarray) -> bytes:
    """rows (frames, ...) → the stored file's bytes (float32)."""
    return save_tensors({TENSOR: np.ascontiguousarray(rows, dtype=np.float32)})


class StoredFeatures:
    """SpeechFeatures over a stored file: each `read` fetches only the rows it returns (its header is read once)."""

    def __init__(self, store: ObjectStore, key: str) -> None:
        self._store = store
        self._key = key
        header_size = int.from_bytes(store.get_range(key, 0, 8), "little")
        entry = json.loads(store.get_range(key, 8, 8 + header_size))[TENSOR]
        if entry["dtype"] != "F32":
            raise ValueError(f"{key}: speech features are float32, found {entry['dtype']}")
        self.frames: int = entry["shape"][0]
        self._row_shape = tuple(entry["shape"][1:])
        self._row_bytes = 4 * math.prod(self._row_shape)
        self._data = 8 + header_size + entry["data_offsets"][0]

    def read(self, start: int, end: int) -> np.ndarray:
        first = min(max(start, 0), self.frames - 1)
        last = min(max(end - 1, 0), self.frames - 1)
        raw = self._store.get_range(
            self._key, self._data + first * self._row_bytes, self._data + (last + 1) * self._row_bytes
        )
        rows = np.frombuffer(raw, dtype="<f4").reshape(last + 1 - first, *self._row_shape)
        return ArrayFeatures(rows, first, self.frames).read(start, end)
