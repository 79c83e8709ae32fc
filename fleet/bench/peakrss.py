"""Run one `fleet` command in this process and write its peak resident memory to a file.

`python -m fleet.bench.peakrss OUT.json enqueue INPUT --job J`. The kernel's rusage
cannot give this from the parent: a child's ru_maxrss keeps the peak of the process it
was forked from (the benchmark itself) across exec. VmHWM belongs to this process's own
address space, so it is the command's peak alone.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: best effort


def main() -> None:
    out, args = Path(sys.argv[1]), sys.argv[2:]
    code: int | str | None = 0
    try:
        # by module name, so the bench part never imports the CLI that drives it
        sys.argv = ["fleet", *args]
        runpy.run_module("fleet", run_name="__main__")
    except SystemExit as e:
        code = e.code
    finally:
        out.write_text(json.dumps({"peak_rss_mb": peak_rss_mb(), "code": code}))
    sys.exit(code)


if __name__ == "__main__":
    main()
