"""Run one python block of the docs as a program (``docs_runner.run_program`` starts this script).

The job file gives the block's source, where it is in the markdown (so a
traceback names the doc's file and line) and a prelude from the block's
setups: stubs for the application's own functions the snippet names, which
may raise ``DocsTestStop`` once the program showed what it should (a consumer
loop never ends by itself), and an optional ``docs_after()`` check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


class DocsTestStop(Exception):
    """Raised by a setup's stub: the program did what the docs say; end the run here, successfully."""


def main(job_path: str) -> int:
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)  # run as a script: no test module may shadow what the snippet imports
    job = json.loads(Path(job_path).read_text())
    namespace: dict[str, object] = {"__name__": "__main__", "DocsTestStop": DocsTestStop}
    exec(compile(job["prelude"], "<docs-test setup>", "exec"), namespace)
    code = compile("\n" * (job["line"] - 1) + job["source"], job["filename"], "exec")
    try:
        exec(code, namespace)
    except DocsTestStop:
        pass
    after = namespace.get("docs_after")
    if callable(after):
        after()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
