"""The engines fleet knows: one line each, from its name to its package.

A schema module: it imports only the engines' leaf settings models, so fleet.settings
composes one section per engine from this table without a circle. What fleet asks of an
engine (build, identity, capacity, doctor, engine-args) is its `spec` module, imported by
name when used (fleet.engines.specs), because that module reads fleet.settings itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from fleet.engines.hf.settings import HfSettings
from fleet.engines.sglang.settings import SglangSettings
from fleet.engines.sim.settings import SimSettings
from fleet.engines.vllm.settings import VllmSettings


@dataclass(frozen=True)
class Registered:
    #: the settings section, FLEET_<NAME>__*
    settings: type[BaseModel]
    #: module whose SPEC (an EngineSpec) says everything else about the engine
    spec: str


ENGINES: dict[str, Registered] = {
    "sim": Registered(SimSettings, "fleet.engines.sim.spec"),
    "hf": Registered(HfSettings, "fleet.engines.hf.spec"),
    "sglang": Registered(SglangSettings, "fleet.engines.sglang.spec"),
    "vllm": Registered(VllmSettings, "fleet.engines.vllm.spec"),
}
