"""Test-side only: hangs the hf engine's generating thread once, mid-generation, as a stuck GPU
engine does, while the worker process, its loop and its heartbeat stay alive.

On PYTHONPATH with FLEET_TEST_HF_HANG=MARKER (a file path) and FLEET_TEST_HF_HANG_AFTER_STEPS=N: the
Nth decode step of the process blocks forever, once per MARKER (it is created as the hang begins,
so the worker's restarted successor generates normally). tests/test_watchdog.py."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

_marker = os.environ.get("FLEET_TEST_HF_HANG")
if _marker and not Path(_marker).exists():
    from fleet.engines.hf import engine as _hf

    _after = int(os.environ.get("FLEET_TEST_HF_HANG_AFTER_STEPS", "50"))
    _steps = [0]
    _call = _hf.RowStopper.__call__

    def _hanging(self: Any, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        _steps[0] += 1
        if _steps[0] == _after and not Path(_marker).exists():
            Path(_marker).touch()
            threading.Event().wait()
        return _call(self, input_ids, scores, **kwargs)

    _hf.RowStopper.__call__ = _hanging  # type: ignore[method-assign]
