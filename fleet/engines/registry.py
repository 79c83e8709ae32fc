"""The engines fleet knows: one line each, from its name to its settings section (in the
settings part, fleet.settings.ENGINE_SECTIONS) and its package. What fleet asks of an engine
(build, identity, capacity, doctor, engine-args) is its `spec` module, imported by name when
used (fleet.engines.specs).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from fleet.settings import ENGINE_SECTIONS


@dataclass(frozen=True)
class Registered:
    #: the settings section, FLEET_<NAME>__*
    settings: type[BaseModel]
    #: module whose SPEC (an EngineSpec) says everything else about the engine
    spec: str


ENGINES: dict[str, Registered] = {
    name: Registered(section, f"fleet.engines.{name}.spec") for name, section in ENGINE_SECTIONS.items()
}
