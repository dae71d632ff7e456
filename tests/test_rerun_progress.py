"""Re-run with its effect shown (issue 40): right after "re-run N failed cells" the store
still says failed; the page shows those cells in progress and offers no second button."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from accelmatrix.ui import oncall
from accelmatrix.ui.model import CellView

T = datetime(2026, 11, 20, 2, 0)  # naive, as SQLite gives the store's times back


def _cell(cid: str, state: str, kind: str, index: int) -> CellView:
    return CellView(
        cell_id=cid,
        axes={"x": cid[2:]},
        state=state,
        kind=kind,
        quarantined=False,
        message="",
        machine="cpu",
        map_index=index,
        data_docs=None,
        attempt_at=T,
    )


def _cells() -> list[CellView]:
    return [
        _cell("x=a", "passed", "passed", 0),
        _cell("x=b", "failed", "failed", 1),
        _cell("x=c", "failed", "failed", 2),
    ]


def _form(cells: list[CellView]) -> str:
    return oncall.render_panel(
        cells=cells,
        shown=cells,
        axes=["x"],
        filters=oncall.Filters(),
        dag_id="d",
        run_id="r",
        page_base="",
        app_base="/accelmatrix",
        embedded=False,
        can_rerun=True,
        cost=(None, 0, 0),
        owners=None,
        reruns=[],
    )


def test_the_button_names_the_cells_before_clearing() -> None:
    html = _form(_cells())
    assert ">re-run 2 failed cells</button>" in html
    assert '<span class="targets" id="rerun-targets">x=b, x=c</span>' in html


def test_cleared_cells_show_in_progress_until_they_write_again() -> None:
    cells = _cells()
    after = datetime(2026, 11, 20, 2, 5, tzinfo=UTC)
    note = oncall.RerunNote("admin", after, ["x=b"])
    marked = oncall.mark_rerunning(cells, [note])
    assert [c.cell_id for c in marked] == ["x=b"]
    b = cells[1]
    assert b.kind == "pending" and b.cause[0].startswith("re-running: cleared by admin at ")
    # No second button for it; the other failed cell is still offered.
    html = _form(cells)
    assert ">re-run 1 failed cell</button>" in html and ">x=c</span>" in html
    # A re-run older than the cell's last write (it ran again and failed again): red again.
    again = _cells()
    again[1].attempt_at = T + timedelta(minutes=10)
    assert oncall.mark_rerunning(again, [note]) == [] and again[1].kind == "failed"
    # A re-run naming other cells changes nothing.
    other = _cells()
    assert oncall.mark_rerunning(other, [oncall.RerunNote("bo", after, ["x=z"])]) == []
