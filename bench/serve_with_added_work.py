#!/usr/bin/env python3
"""``tiered serve`` with a chosen amount of interpreter work added in front of every append (an experiment).

How does tiered's served throughput answer loop work? ``SPIN_US`` µs of busy loop (holding the GIL, as
tiered's own Python does) run on the event loop before each append the fused path serves
(``tiered.api.append_path.AppendPath._serve``); everything else is ``tiered serve`` as shipped. Used with
``bench/cpu_per_append.py`` one ``--build`` per amount, beside ``bench/null_server.py --journal``'s model
(docs/benchmarks.md, "what bounds a served append"):

    python bench/cpu_per_append.py --build "s0=env SPIN_US=0 python bench/serve_with_added_work.py" \\
        --build "s10=env SPIN_US=10 python bench/serve_with_added_work.py"

Arguments after the script's name are ``tiered serve``'s.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Awaitable, Mapping
from typing import Any

from tiered.api import append_path

_serve = append_path.AppendPath._serve
_work_s = float(os.environ.get("SPIN_US", "0")) / 1e6
_clock = time.perf_counter


def _serve_after_work(self: Any, request: Any, spec: Any, params: Mapping[str, str]) -> Awaitable[Any]:
    if _work_s:
        deadline = _clock() + _work_s
        while _clock() < deadline:
            pass
    return _serve(self, request, spec, params)  # the coroutine itself: no frame of ours per await


append_path.AppendPath._serve = _serve_after_work  # type: ignore[method-assign]

if __name__ == "__main__":
    from tiered.cli.main import main

    sys.exit(main(["serve", *sys.argv[1:]]))
