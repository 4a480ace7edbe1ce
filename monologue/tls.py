"""The one TLS context of the process's outgoing httpx clients. Building one (the CA bundle read and parsed) costs
about 30 ms of CPU, which every client made for a single request paid (a call to Janus, a signalling request to a
node: several per viewer that connects). A context holds no connection state, so every client and event loop may
share it."""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's own default context (certifi's CA bundle, certificates and host names checked), built once."""
    return httpx.create_ssl_context()
