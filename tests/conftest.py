"""Shared fixtures. Server fixtures live in tests/fixtures/ and start real servers."""

from __future__ import annotations

pytest_plugins: list[str] = [
    "tests.fixtures.kafka",
    "tests.fixtures.redis_servers",
    "tests.fixtures.triton",
    "tests.fixtures.wheel",
]
