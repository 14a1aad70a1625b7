"""tools.snapshot: the README's chart images come from the charts' HTML, rendered in real Chromium."""
import os

import pytest

from tools.snapshot import find_chromium

if find_chromium() is None:
    if os.environ.get("CI"):
        raise RuntimeError("Chromium is missing: .ci/run must install Debian's chromium")
    pytest.skip("Chromium is not installed (Debian package chromium)", allow_module_level=True)

pytestmark = pytest.mark.slow


def test_frontier_chart_renders_to_png(tmp_path):
    from csd.bench.report import frontier_figure
    from tools.snapshot import snapshot

    points = [dict(method="sd", tokens_per_s=9.0, accuracy=0.5, accuracy_ci95=[0.3, 0.7], n=8),
              dict(method="csd", tokens_per_s=10.0, accuracy=0.45, accuracy_ci95=[0.25, 0.65], n=8)]
    html = tmp_path / "frontier.html"
    frontier_figure(points, {"machine": {"cpu": "test CPU"}, "dtype": "float32"}).write_html(
        html, include_plotlyjs="directory", full_html=True)
    assert (tmp_path / "plotly.min.js").is_file()           # one shared bundle beside the page
    png = snapshot(html, tmp_path / "frontier.png", width=800, height=500)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert 600 <= w <= 800 and 300 <= h <= 1000              # the chart itself, not a blank page
    assert len(data) > 10_000


def test_snapshot_names_a_missing_file(tmp_path):
    from tools.snapshot import snapshot
    with pytest.raises(SystemExit, match="no such file"):
        snapshot(tmp_path / "absent.html", tmp_path / "x.png")
