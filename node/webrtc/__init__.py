"""WebRTC on the node that holds a live session: its frames and speech go to viewers over WHEP as each chunk is made
(`hub.py` the per-session buffer, `tracks.py` the viewer's tracks, `peers.py` the peer connections, `server.py` the
signalling port the API forwards to). Peer connections live here, beside the frames: no extra hop, no re-encode of
the HLS segments. Fan-out past one machine is an SFU's job (docs/architecture.md, "WebRTC")."""
