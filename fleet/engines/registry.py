"""The engines fleet knows: one line each, from its name to the module whose SPEC (an EngineSpec)
says everything fleet asks of it (build, identity, capacity, doctor, engine-args), imported by name
when used (fleet.engines.specs). The names are the settings' (fleet.settings.ENGINE_SECTIONS, each
engine's settings section): adding an engine is its package, its section and that one line.
"""

from __future__ import annotations

from fleet.settings import ENGINE_SECTIONS

#: engine name -> module whose SPEC is its EngineSpec
ENGINES: dict[str, str] = {name: f"fleet.engines.{name}.spec" for name in ENGINE_SECTIONS}
