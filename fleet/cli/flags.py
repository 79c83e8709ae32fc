"""The rules of flags that are not settings (a setting's flag is validated by the settings:
`fleet.cli.app.settings_from`), as typer callbacks: each runs while the command line is parsed,
before anything is written or started, and a bad value is one line naming the flag
(`fleet.cli.app.OneLineErrors`). Each rule itself lives beside what it guards."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from pydantic import PositiveFloat, TypeAdapter, ValidationError

from fleet.errors import FleetError


def checked(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A flag's typer callback for one of fleet's own rules, `check(value)` raising a FleetError
    (the rule stays beside what it guards): each value given, while the flags are parsed."""

    def callback(value: Any) -> Any:
        for one in value if isinstance(value, list | tuple) else [] if value is None else [value]:
            try:
                check(one)
            except FleetError as e:
                raise typer.BadParameter(str(e)) from e
        return value

    return callback


def constrained(annotation: Any) -> Callable[[Any], Any]:
    """A flag's typer callback for a bound typer's min=/max= cannot say (an open one: > 0),
    validated by pydantic like a setting."""
    adapter: TypeAdapter[Any] = TypeAdapter(annotation)

    def callback(value: Any) -> Any:
        try:
            return None if value is None else adapter.validate_python(value)
        except ValidationError as e:
            raise typer.BadParameter(e.errors()[0]["msg"]) from e

    return callback


def _job_name(job: str) -> None:
    from fleet.store.layout import check_job_name

    check_job_name(job)


def _model(model: str) -> None:
    from fleet.model.modeldir import check_model

    check_model(model)


def _input(url: str) -> None:
    from fleet.producer.source import check_input

    check_input(url)


def _gpu_kind(kind: str) -> None:
    from fleet.model.gpus import gpu_spec

    gpu_spec(kind)


def _gpus(spec: str) -> None:
    from fleet.model.gpus import gpu_spec_indexes

    gpu_spec_indexes(spec)


#: a job's name: a folder of the store and a part of the broker's keys (fleet.store.layout.JOB_NAME)
job_name = checked(_job_name)
#: a --model that names a directory must be one; an ORG/NAME hub id is looked up where it is used
model_dir = checked(_model)
#: a local input must exist; a URL's scheme must be one fleet reads (fleet.store.schemes)
input_url = checked(_input)
#: 'all' or GPU indexes, as written (fleet.model.gpus.gpu_spec_indexes); which are present is asked when
#: the command runs, before it starts anything (a compose file's command is checked on a host without GPUs)
gpu_indexes = checked(_gpus)
#: a GPU kind of fleet's table (fleet.model.gpus.gpu_spec: case, '_' and an 'nvidia-' prefix do not matter)
gpu_kind = checked(_gpu_kind)
#: a number that must be above 0: a time, a rate, a size
positive = constrained(PositiveFloat)
