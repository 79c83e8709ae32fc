"""Load `fleet.cli.app.app` with the ops commands registered, for CliRunner tests.

`fleet/cli/__init__.py` imports every command module; while some are still being
written that import can fail, so fall back to loading only `app` and `ops`.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import typer


def cli_app() -> typer.Typer:
    try:
        import fleet.cli  # noqa: F401
    except ImportError:
        for name in [m for m in sys.modules if m.startswith("fleet.cli")]:
            del sys.modules[name]
        pkg = types.ModuleType("fleet.cli")
        pkg.__path__ = [str(Path(fleet.__file__).parent / "cli")]
        sys.modules["fleet.cli"] = pkg
    import fleet.cli.ops  # noqa: F401
    from fleet.cli.app import app

    return app


#: The same fallback as a `python -c` program, for tests that run the CLI as a subprocess.
SUBPROCESS_CODE = "import sys; sys.argv[0] = 'fleet'\nfrom tests.cliload import cli_app\ncli_app()()\n"
