"""What fleet asks of the server engine: its identity is the model's files (as rendered by fleet) and
what the server says it serves; no engine args; `fleet doctor` asks the server."""

from __future__ import annotations

from typing import Any

from fleet.engines.base import Engine
from fleet.engines.modelspec import ModelEngineSpec
from fleet.settings import Settings


class ServerSpec(ModelEngineSpec):
    name = "server"

    def build(self, settings: Settings) -> Engine:
        from fleet.engines.server.engine import ServerEngine

        return ServerEngine(settings)

    def shaping(self, settings: Settings) -> dict[str, Any]:
        """The served model and its revision as the server reports them (asked now)."""
        from fleet.engines.server.served import server_facts

        return server_facts(settings.server).identity()

    def validate_args(self, settings: Settings) -> str:
        from fleet.engines.server.served import server_facts

        facts = server_facts(settings.server)
        return f"{settings.server.base_url} serves {facts.model!r} ({facts.api} API, from {facts.root})"


SPEC = ServerSpec()
