"""The `monologue` command and what it starts (the entry floor, above everything it uses): the commands
(`main.py` and its groups), the embedded stack (`stack.py`) and its launchers (`seaweed.py`, `prometheus_server.py`,
`cluster.py`), and the benches (`bench.py`, `benches/`)."""
