"""``hps_admin`` of the ps.json: settings of the control plane (``hps admin``)."""

from __future__ import annotations

from pydantic import Field, field_validator

from hps.config.common import Frozen


class AdminConfig(Frozen):
    path_roots: list[str] | None = Field(
        default=None,
        description="folders under which the control plane's routes may read server-side "
        "paths (import `path`, warm-up `keyset_path` / `frequency_path`); absolute. Default "
        "(null): the ps.json's folder and the control plane's state folder; []: none, "
        "uploads only (docs/security.md: confined paths)",
    )

    @field_validator("path_roots")
    @classmethod
    def _absolute(cls, v: list[str] | None) -> list[str] | None:
        for root in v or ():
            if not root.startswith("/") or "\x00" in root:
                raise ValueError(f"{root!r} is not an absolute path")
        return v
