"""bench/curves.py --quick: a smoke run of every cost curve against real `tiered serve` processes.

Checks that each curve's JSON exists, parses, has one point per requested x
value with sane numbers and a fitted growth, and (when matplotlib, the
``bench`` extra, is installed) that each PNG is a PNG. The Python load driver
is forced so the run is the same with or without wrk installed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
CURVES = {
    "memory": 2,
    "snapshot": 2,
    "stop-streams": 2,
    "restart-streams": 2,
    "append-streams": 2,
    "create-streams": 2,
    "restart-journal": 2,
    "append-readers": 4,  # (sse, long-poll) x (0, 50 readers)
    "cold-read": 2,
}


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("curves")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "curves.py"),
            "--quick",
            "--driver",
            "python",
            "--out-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return out, proc.stdout


@pytest.mark.parametrize("name", sorted(CURVES))
def test_curve_json_has_every_point_and_a_fit(quick_run: tuple[Path, str], name: str) -> None:
    out, _ = quick_run
    doc = json.loads((out / f"curve-{name}.json").read_text())
    assert doc["name"] == name
    assert doc["meta"]["quick"] is True and doc["meta"]["driver"] == "python"
    assert len(doc["points"]) == CURVES[name]
    assert doc["series"]
    for series in doc["series"]:
        assert len(series["x"]) == len(series["y"]) >= 1
        assert all(x > 0 for x in series["x"])
        assert all(isinstance(y, float) and math.isfinite(y) and y >= 0 for y in series["y"])
        fit = doc["fits"][series["label"]]
        assert "class" in fit
        if len(series["x"]) >= 2:
            assert 0.0 <= fit["power_fit"]["k"] <= 3.0


def test_points_measured_what_they_say(quick_run: tuple[Path, str]) -> None:
    out, stdout = quick_run
    memory = json.loads((out / "curve-memory.json").read_text())
    for pt in memory["points"]:
        assert pt["create"]["ok"] == pt["streams"]
        assert pt["rss_after_create_bytes"] > 10 * 1024 * 1024
        assert pt["snapshot"]["newest"] > 0
        assert pt["append"]["ok"] > 0 and pt["append"]["non2xx"] == 0
    journal = json.loads((out / "curve-restart-journal.json").read_text())
    for pt in journal["points"]:
        # Every acknowledged append (plus the 100 creates) was replayed after the SIGKILL.
        assert pt["records_replayed"] >= pt["appends"] + 100
    readers = json.loads((out / "curve-append-readers.json").read_text())
    for pt in readers["points"]:
        assert pt["live_readers_after"] >= pt["readers"]
    cold = json.loads((out / "curve-cold-read.json").read_text())
    for pt in cold["points"]:
        assert pt["cold_objects"] >= pt["stream_bytes"] // (64 * 1024)
        assert all(r["bytes"] == pt["stream_bytes"] for r in pt["reads"])
    assert "fitted growth:" in stdout


@pytest.mark.skipif(not _has_matplotlib(), reason="matplotlib (the bench extra) is not installed")
def test_every_curve_has_a_png(quick_run: tuple[Path, str]) -> None:
    out, _ = quick_run
    for name in CURVES:
        assert (out / f"curve-{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(not _has_matplotlib(), reason="matplotlib (the bench extra) is not installed")
def test_replot_redraws_every_png_from_the_json(quick_run: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = quick_run
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "curves.py"),
            "--replot",
            "--out-dir",
            str(out),
            "--img-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(f"curve-{n}.png" for n in CURVES)
    for name in CURVES:
        assert (tmp_path / f"curve-{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
