"""The base of every scenario model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """A scenario section: immutable (safe to share between runs and replications) and strict
    about field names (a misspelt key is an error naming it, never silently ignored)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
