"""Ports for servers: free, and outside the range outgoing connections take theirs from."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from hps import net
from hps.net import claim, free_port, listening_ports, port_free


def test_a_free_port_lies_below_the_ephemeral_range_and_binds() -> None:
    low = int(net.EPHEMERAL_RANGE.read_text().split()[0])
    for _ in range(50):
        port = free_port()
        assert net.LOWEST_PORT <= port < low
        with socket.socket() as s:
            s.bind((net.LOOPBACK, port))  # free indeed


def test_the_offset_port_stays_below_the_range_too() -> None:
    low = int(net.EPHEMERAL_RANGE.read_text().split()[0])
    for _ in range(50):
        port = free_port(also_free_at=10_000)
        assert port + 10_000 < low and port_free(port + 10_000)


def test_a_port_in_use_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        busy = free_port()
        taken.bind((net.LOOPBACK, busy))
        taken.listen()
        other = free_port()
        monkeypatch.setattr(net, "_taken", set())  # both handed out before: forgotten
        monkeypatch.setattr(net, "listening_ports", lambda span=0: [busy, other])
        assert free_port() == other


def test_a_port_handed_out_or_claimed_is_never_chosen_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chosen but not bound yet, it is free to any check: a second choice could be it."""
    a, b, c = free_port(), free_port(), free_port()
    assert len({a, b, c}) == 3
    monkeypatch.setattr(net, "_taken", set())
    monkeypatch.setattr(net, "listening_ports", lambda span=0: [a, b, c])
    claim(a)  # e.g. a public port given on the command line
    assert {free_port(), free_port()} == {b, c}
    with pytest.raises(RuntimeError, match="no free port"):
        free_port()


def test_an_unknown_range_falls_back_to_the_kernels_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(net, "EPHEMERAL_RANGE", tmp_path / "absent")
    assert listening_ports() is None
    assert port_free(free_port())
    (tmp_path / "narrow").write_text("10500\t60999\n")  # under 1,000 ports below it
    monkeypatch.setattr(net, "EPHEMERAL_RANGE", tmp_path / "narrow")
    assert listening_ports() is None
