"""Where ``hps serve`` listens: its ``--host`` as Triton, nginx and clients get it.

:func:`resolve_host` is the one place a host is turned into an address; everything else
(Triton's address flags, the gate's ``listen``, the URLs in the banner, the readiness
probes, the port check) takes the numeric address it returns:

- a name is resolved once, to its first IPv4 address, else its first IPv6 one
  (``localhost``: 127.0.0.1). Triton's HTTP and metrics servers (libevhtp) take a numeric
  address only: given a name, they listen on 255.255.255.255 and say nothing;
- Triton 2.51 takes IPv6 on every endpoint, each in its own spelling
  (:func:`triton_addresses`): ``ipv6:ADDR`` for HTTP and metrics, ``[ADDR]`` for gRPC;
  nginx and URLs take ``[ADDR]`` (:func:`host_port`);
- clients on this machine reach a wildcard at the loopback address of its family
  (:func:`client_host`): 127.0.0.1 for 0.0.0.0, ::1 for ``::``. Triton's HTTP and metrics
  servers and nginx bind ``::`` IPv6-only (both set ``IPV6_V6ONLY``, whatever Linux's
  ``bindv6only``), so ``--host ::`` serves IPv6 only (gRPC without the gate: both);
- an IPv6 address with a zone (``fe80::1%eth0``) is refused: Triton's gRPC server cannot
  bind one (it exits at start-up) and libevhtp cannot parse one.
"""

from __future__ import annotations

import ipaddress
import socket

from hps.errors import ConfigError

WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1"}


def resolve_host(host: str) -> str:
    """The numeric address ``host`` stands for (``""``: 0.0.0.0); a ConfigError (a usage
    error: status 2) naming ``--host`` if it does not resolve or Triton cannot bind it."""
    if not host:
        return "0.0.0.0"
    if "%" in host:
        raise ConfigError(
            f"--host {host}: an IPv6 address with a zone cannot be served (tritonserver "
            "cannot bind one); give an address without %zone"
        )
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            found = socket.getaddrinfo(host, None, family, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            if family == socket.AF_INET6:
                raise ConfigError(f"--host {host} cannot be resolved: {exc.strerror}") from None
            continue
        for *_, sockaddr in found:
            if "%" not in str(sockaddr[0]):  # a zone: see above
                return str(sockaddr[0])
    raise ConfigError(f"--host {host} resolves to no address tritonserver can bind")


def is_ipv6(address: str) -> bool:
    return ":" in address


def client_host(address: str) -> str:
    """Where clients on this machine reach a server listening on ``address`` (a wildcard
    address is not one: the loopback address of its family)."""
    return WILDCARDS.get(address, address)


def host_port(address: str, port: int) -> str:
    """``address:port``, an IPv6 address in brackets (``[::1]:8000``), as URLs, gRPC
    targets and nginx's ``listen`` take it."""
    return f"[{address}]:{port}" if is_ipv6(address) else f"{address}:{port}"


def triton_addresses(address: str) -> tuple[str, str]:
    """Triton's spelling of ``address``: for ``--http-address`` and ``--metrics-address``
    (libevhtp: ``ipv6:`` before an IPv6 address), and for ``--grpc-address`` (gRPC:
    brackets)."""
    if is_ipv6(address):
        return f"ipv6:{address}", f"[{address}]"
    return address, address
