"""The base of every typed settings section: frozen, unknown keys refused, rejected input never echoed."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # hide_input_in_errors: a rejected section is not echoed back (it may hold URIs with credentials)
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)
