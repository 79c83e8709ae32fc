"""Where a job's records come from inside a dataset (FLEET_INPUT__*): a Hub dataset's config,
split and revision, and the columns that carry fleet's fields (docs/architecture.md, Records).
Not part of the job's configuration: what they select is, through the input's digest."""

from __future__ import annotations

from pydantic import BaseModel, Field


class InputSettings(BaseModel):
    config: str | None = Field(
        None, description="dataset config (a Hub dataset's or a dataset folder's); none: the default one")
    split: str = Field("train", description="dataset split to read")
    revision: str | None = Field(
        None, description="Hub dataset revision (branch, tag or commit); none: main, or the commit a "
        "resumed job was pinned to")
    columns: dict[str, str] = Field(
        default_factory=dict, description="fleet's field -> the input's column, for inputs whose columns have "
        "other names (`--columns id=uuid`)")
