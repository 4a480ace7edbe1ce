"""The node process, above everything it starts: its Temporal workers (`worker.py`, wired in `wiring.py`), its
HTTP port (`http_port.py`), its row in `nodes` (`registry.py`) and the torchrun launcher of a multi-GPU node
(`launch.py`, with `distributed_activities.py`)."""
