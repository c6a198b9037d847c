"""`plan --picture`: the drawn grid's size and the colours of known ranks (stage fill, draft mark), SVG output, the
one-tile-per-node summary, and the CLI's errors (wrong suffix; matplotlib missing)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest

from specdraft.assemble import compile
from specdraft.render.picture import DETAIL_LIMIT, DRAFT_MARK, draw, picture_bytes, stage_color
from specdraft.spec.load import load_layout

mpl_image = pytest.importorskip("matplotlib.image")
from matplotlib.colors import to_rgb  # noqa: E402

from tests.support.cli import run_cli  # noqa: E402
from tests.support.paths import REPO  # noqa: E402

ROOT = REPO


def pixels(plan):
    picture = draw(plan)
    image = mpl_image.imread(io.BytesIO(picture_bytes(plan, "png")), format="png")
    return picture, image


def rgb(image, point):
    x, y = point
    return tuple(float(c) for c in image[y, x, :3])


def test_64_gpu_layout_colours_each_rank_by_stage_and_marks_the_draft():
    plan = compile(load_layout(ROOT / "layouts" / "llama3-70b.yaml"))  # 8 x 8 H100, pp4, draft on stage 3
    assert plan.world_size == DETAIL_LIMIT
    picture, image = pixels(plan)
    assert not picture.summary
    assert image.shape[:2] == (picture.height_px, picture.width_px)
    for rank in (7, 23, 39, 55, 63):
        stage = plan.ranks[rank].pp
        assert rgb(image, picture.fill_point(rank)) == pytest.approx(to_rgb(stage_color(stage)), abs=0.02), rank
    draft = set(plan.draft.ranks)
    assert 63 in draft and 7 not in draft
    assert rgb(image, picture.mark_point(63)) == pytest.approx(to_rgb(DRAFT_MARK), abs=0.02)
    assert rgb(image, picture.mark_point(7)) == pytest.approx(to_rgb(stage_color(0)), abs=0.02)
    # Cells of one node share a row, nodes stack top to bottom.
    assert picture.cells[0][1] == picture.cells[7][1] < picture.cells[8][1]


def test_more_than_64_ranks_draw_one_tile_per_node_and_svg_works():
    plan = compile(load_layout(ROOT / "layouts" / "mixtral-8x22b.yaml"))  # 16 x 8, pp4
    picture, image = pixels(plan)
    assert picture.summary and sorted(picture.cells) == list(range(16))
    for node in (0, 5, 10, 15):
        stage = plan.ranks[node * 8].pp
        assert rgb(image, picture.fill_point(node)) == pytest.approx(to_rgb(stage_color(stage)), abs=0.02)
    svg = picture_bytes(plan, "svg").decode()
    assert "<svg" in svg and "TapChannel" in svg


def run(*args, code):
    """``code`` in a fresh interpreter with ARGS: the one case here that needs a process of its own."""
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("SPECDRAFT_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )


def test_cli_writes_the_picture_and_refuses_other_suffixes(tmp_path):
    target = tmp_path / "plan.png"
    out = run_cli("plan", "--picture", target, cwd=ROOT, env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]
    out = run_cli("plan", "--picture", tmp_path / "plan.jpg", cwd=ROOT, env={"COLUMNS": "200"})
    assert out.returncode == 2 and ".png or .svg" in out.stderr


def test_cli_names_the_plot_extra_when_matplotlib_is_missing(tmp_path):
    code = textwrap.dedent("""
        import sys
        sys.modules["matplotlib"] = None  # as if the plot extra were not installed
        sys.argv = ["specdraft", *sys.argv[1:]]
        from specdraft.cli.main import main
        main()
    """)
    out = run("plan", "--picture", str(tmp_path / "plan.png"), code=code)
    assert out.returncode == 2, out.stderr
    assert "pip install 'specdraft[plot]'" in out.stderr and "Traceback" not in out.stderr
