"""The node's peer connections' ICE configuration (monologue/ice.py's servers as aiortc takes them). Never aiortc's
default (Google's public STUN server): a node asks only the servers its settings name, none on loopback or a LAN.
aiortc uses the first STUN and the first TURN URL it can (TURN over UDP or TCP)."""

from __future__ import annotations

import time

from aiortc import RTCConfiguration, RTCIceServer, RTCIceTransportPolicy

from monologue.ice import ice_servers
from monologue.settings import IceSettings


def rtc_configuration(settings: IceSettings, who: str) -> RTCConfiguration:
    """A fresh configuration (TURN credentials minted now) for a connection of `who` (e.g. `node-<id>`)."""
    servers = [
        RTCIceServer(urls=list(server.urls), username=server.username, credential=server.credential)
        for server in ice_servers(settings, who, now=time.time())
    ]
    return RTCConfiguration(iceServers=servers, iceTransportPolicy=RTCIceTransportPolicy(settings.transport_policy))
