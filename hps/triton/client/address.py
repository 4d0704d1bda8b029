"""The Triton address every client of this package takes (``--url`` of ``hps query``,
``hps reload``, ``hps versions activate``; ``hps admin --triton-url``): ``host:port``, or
that with its protocol's scheme (``http://``, or ``grpc://`` for a gRPC client), which is
stripped. Any other
scheme, a path or a malformed port is a RequestError naming the address, refused before a
client library sees it (tritonclient's own refusals come as a traceback, followed by an
``Exception ignored in __del__`` of its half-made client)."""

from __future__ import annotations

import re

from hps.errors import RequestError

# A host name or IPv4 address, or a bracketed IPv6 one; then an optional port.
_ADDRESS = re.compile(r"(?P<host>\[[0-9A-Za-z:.%_-]+\]|[0-9A-Za-z._-]+)(?::(?P<port>\d{1,5}))?")
PORT_MAX = 65535


def triton_address(url: str, *, grpc: bool = False) -> str:
    """``host:port`` of ``url``, which may carry the client's scheme (``http://`` or, with
    ``grpc``, ``grpc://``) and a trailing ``/``; a RequestError for anything else."""
    scheme = "grpc" if grpc else "http"
    address = url.strip()
    head, sep, rest = address.partition("://")
    if sep:
        if head.lower() != scheme:
            raise RequestError(
                f"Triton address {url!r}: {'a gRPC' if grpc else 'an HTTP'} client takes "
                f"host:port or {scheme}://host:port, not {head}://"
            )
        address = rest
    address = address.removesuffix("/")
    found = _ADDRESS.fullmatch(address)
    if found is None or not 1 <= int(found["port"] or 1) <= PORT_MAX:
        raise RequestError(
            f"Triton address {url!r}: expected host:port or {scheme}://host:port, "
            "e.g. 127.0.0.1:8000"
        )
    return address
