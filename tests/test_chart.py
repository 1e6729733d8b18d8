"""chart.py: the SVG chart the rules draw on, with matplotlib's Axes API (a subset)."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from traceanalyzer.chart import (
    Chart,
    Swatch,
    Unsupported,
    nice_step,
    text_width,
    tick_labels,
    tick_values,
    viridis,
)

NS = "{http://www.w3.org/2000/svg}"
T0 = 1_736_408_883_000_000_000  # an int64 ns timestamp


def svg_of(chart: Chart) -> ET.Element:
    """The chart's SVG, parsed: it must be well-formed XML."""
    return ET.fromstring(chart.to_svg())


def texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{NS}text")]


def data(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{NS}g") if g.get("class") == "data"]


def line_paths(root: ET.Element) -> list[ET.Element]:
    return [p for g in data(root) for p in g.iter(f"{NS}path") if p.get("fill") == "none"]


def test_every_supported_method_gives_well_formed_svg() -> None:
    chart = Chart(9.0, 3.0, cols=2)
    left, right = chart.axes
    left.plot([0, 1, 2], [1, 3, 2], color="C1", lw=1.6, ls="--", marker="o", ms=3, label="a")
    left.step([0, 1, 2], [2, 2, 1], where="post", c="#16a34a", label="b")
    left.bar(["x", "y", "z"], [1, 2, 3], color=["#dc2626", "#9ca3af", "#dc2626"], width=0.7)
    left.vlines([0.5, 1.5], 0, [1, 2], colors="#111111", linewidth=1.0, label="c")
    left.axhline(1.5, color="grey", linestyle=":")
    left.axvspan(0.2, 0.4, color="#fde68a", alpha=0.35, zorder=0)
    left.fill_between([0, 1, 2], [1, 2, 1], step="post", color="#9bbb59", alpha=0.4)
    left.text(0.5, 0.5, "two\nlines", ha="center", va="center", transform=left.transAxes)
    left.legend(fontsize=7, frameon=False)
    left.set_title("title", fontsize=10)
    left.set_xlabel("x label", fontsize=9)
    left.set_ylabel("y label", fontsize=9)
    left.set_ylim(bottom=0)
    left.grid(axis="y", visible=False)
    right.barh(["long", "short"], [3, 1], color="#c0504d")
    right.broken_barh([(0, 1), (2, 0.5)], (-0.35, 0.7), facecolors="#f59e0b")
    right.set_yticks([0, 1], ["first", "second"], fontsize=8)
    right.set_xticks([0, 1, 2, 3])
    right.set_xticklabels(["0", "1", "2", "3"], rotation=30, ha="right")
    right.set_xlim(-0.5, 3.5)
    right.legend(handles=[Swatch("#f59e0b", "wait")], loc="upper left", bbox_to_anchor=(1.01, 1))
    twin = right.twinx()
    twin.plot([0, 3], [0, 1])
    chart.subplots_adjust(left=0.1)
    root = svg_of(chart)
    assert root.tag == f"{NS}svg"
    assert root.get("viewBox") == "0 0 864 288"  # 96 units an inch
    assert root.get("width") == "100%"
    assert {"title", "x label", "y label", "first", "second", "wait", "a", "b", "c"} <= set(
        texts(root)
    )
    assert chart._repr_svg_() == chart.to_svg()
    assert len(chart.axes) == 3  # the twin too


def test_nice_ticks() -> None:
    assert nice_step(1.0, 5) == 0.2
    assert nice_step(12345, 5) == 2500
    assert nice_step(37, 5) == 10
    assert tick_values(-3, 7, 2) == [-2, 0, 2, 4, 6]
    assert tick_labels([0, 0.25, 0.5], 0.25)[0] == ["0.00", "0.25", "0.50"]
    assert tick_labels([0, 2500, 5000, 7500, 10000], 2500)[0] == [
        "0",
        "2500",
        "5000",
        "7500",
        "10000",
    ]
    assert tick_labels([0, 1e6, 2e6], 1e6)[0] == ["0", "1M", "2M"]
    assert tick_labels([0, 250_000, 500_000], 250_000)[0] == ["0", "250k", "500k"]
    assert tick_labels([-0.0, 1.0], 1.0)[0] == ["0", "1"]
    assert tick_labels([-2e6, 0.0], 1e6)[0] == ["−2M", "0"]
    assert text_width("算子", 10) == pytest.approx(20) and text_width("ab", 10) == 12  # em: 1, 0.6


def test_int64_ns_values_are_labelled_relative_to_an_offset() -> None:
    ticks = tick_values(T0, T0 + 5e9, 1e9)
    labels, offset = tick_labels(ticks, 1e9)
    assert labels == ["3G", "4G", "5G", "6G", "7G", "8G"]
    assert offset == "+1.73640888e18"
    chart = Chart(6, 2)
    (ax,) = chart.axes
    ax.plot([T0, T0 + 2_000_000, T0 + 5_000_000], [1, 2, 3])
    shown = texts(svg_of(chart))
    assert any(t.startswith("+1.7364088") for t in shown)
    assert not [t for t in shown if len(t) > 15]  # no 19-digit tick label


def test_text_from_traces_is_escaped_and_long_names_cut() -> None:
    chart = Chart(6, 2)
    (ax,) = chart.axes
    nasty = "<script>alert('x')</script> & \"q\"\x01"
    long_name = "aclnn" + "VeryLongOperatorName" * 10
    ax.barh([nasty, long_name], [1, 2])
    ax.set_title(nasty)
    text = chart.to_svg()
    assert "<script>" not in text and "\x01" not in text
    root = ET.fromstring(text)
    shown = texts(root)
    assert "<script>alert('x')</script> & \"q\"" in shown
    hover = {t.find(f"{NS}title").text: t for t in root.iter(f"{NS}text") if len(t)}
    cut = hover[long_name]  # the whole name on hover
    shown = cut.find(f"{NS}title").tail
    assert shown.endswith("…") and long_name.startswith(shown[:-1]) and len(shown) < 60


@pytest.mark.parametrize(
    "xs, ys",
    [
        ([], []),  # empty
        ([5], [3]),  # one point
        ([1, 2, 3], [-5, -5, -5]),  # all equal, negative
        ([0, 0, 0], [1, 2, 3]),  # a zero-width x range
        ([1, 2, 3, 4], [float("nan"), None, float("inf"), float("-inf")]),  # nothing finite
    ],
)
def test_degenerate_data_draws(xs: list, ys: list) -> None:
    chart = Chart(4, 2)
    (ax,) = chart.axes
    ax.plot(xs, ys, marker="o")
    ax.bar(xs, ys)
    ax.axhline(float("nan"))
    ax.text(float("inf"), 0, "nowhere")
    ax.set_xlim(float("nan"), None)
    root = svg_of(chart)
    assert texts(root)  # tick labels, at least
    assert "nan" not in chart.to_svg().lower() and "inf" not in chart.to_svg().lower()


def test_non_finite_points_break_the_line() -> None:
    chart = Chart(4, 2)
    (ax,) = chart.axes
    ax.plot([0, 1, 2, 3, 4, 5, 6], [1, 2, float("nan"), 3, 4, None, 5])
    # two runs drawn as lines, and the lone point after None as a dot
    assert len(line_paths(svg_of(chart))) == 2
    assert len([c for g in data(svg_of(chart)) for c in g.iter(f"{NS}circle")]) == 1


def test_many_touching_bars_merge() -> None:
    chart = Chart(6, 2)
    (ax,) = chart.axes
    ax.broken_barh([(i, 1) for i in range(10_000)], (0, 1), facecolors="#dc2626")
    rects = [r for g in data(svg_of(chart)) for r in g.iter(f"{NS}rect")]
    assert len(rects) == 1


def test_twin_axis_is_on_the_right() -> None:
    chart = Chart(6, 2)
    (ax,) = chart.axes
    ax.plot([0, 10], [100, 200])
    ax.set_ylabel("MHz")
    busy = ax.twinx()
    busy.fill_between([0, 10], [0.2, 0.8], step="post", color="#9bbb59", alpha=0.4)
    busy.set_ylim(0, 1)
    busy.set_ylabel("busy")
    root = svg_of(chart)
    labels = {"".join(t.itertext()): t for t in root.iter(f"{NS}text")}
    assert float(labels["1.0"].get("x")) > float(labels["200"].get("x")) + 300
    assert labels["1.0"].get("text-anchor") == "start"
    assert float(labels["busy"].get("x")) > float(labels["1.0"].get("x"))


def test_inverted_y_axis_puts_the_first_row_on_top() -> None:
    chart = Chart(6, 2)
    (ax,) = chart.axes
    ax.set_yticks([0, 1], ["top row", "bottom row"])
    ax.set_ylim(1.6, -0.6)
    root = svg_of(chart)
    y = {"".join(t.itertext()): float(t.get("y")) for t in root.iter(f"{NS}text")}
    assert y["top row"] < y["bottom row"]


def test_unsupported_features_point_at_matplotlib() -> None:
    chart = Chart(4, 2)
    (ax,) = chart.axes
    with pytest.raises(Unsupported, match=r"fig\.matplotlib"):
        ax.set_yscale("log")
    with pytest.raises(Unsupported, match=r"does not take hatch="):
        ax.bar([1], [2], hatch="//")
    with pytest.raises(Unsupported, match=r"set_xlabel\(\) does not take labelpad="):
        ax.set_xlabel("x", labelpad=4)
    with pytest.raises(Unsupported, match="format string"):
        ax.plot([1, 2], [1, 2], "r-")
    with pytest.raises(Unsupported, match="Swatch"):
        ax.legend(handles=[object()])
    with pytest.raises(Unsupported, match="savefig"):
        chart.savefig("x.png")
    assert not hasattr(chart, "_repr_png_")  # IPython probes: a plain AttributeError
    assert isinstance(Unsupported("x"), AttributeError)


def test_viridis_ramp() -> None:
    assert viridis(0.0) == "#440154" and viridis(1.0) == "#fde725"
    assert viridis(-1) == viridis(0) and viridis(math.nan) == viridis(0)
    assert viridis(0.5) not in ("#440154", "#fde725")


def test_heat_map_cells_and_colour_scale() -> None:
    chart = Chart(6, 3)
    (ax,) = chart.axes
    cells = ax.imshow([[0.0, 0.5], [1.0, 0.25]], vmin=0, vmax=1)
    ax.set_xticks([0, 1], ["a", "b"], rotation=30)
    chart.colorbar(cells, label="share")
    root = svg_of(chart)
    fills = [r.get("fill") for g in data(root) for r in g.iter(f"{NS}rect")]
    assert fills == ["#440154", viridis(0.5), "#fde725", viridis(0.25)]
    assert "share" in texts(root) and root.find(f".//{NS}linearGradient") is not None


def test_ids_differ_between_charts() -> None:
    def chart(y: float) -> str:
        c = Chart(4, 2)
        c.axes[0].plot([0, 1], [0, y])
        return c.to_svg()

    def ids(svg: str) -> set[str]:
        return {e.get("id") for e in ET.fromstring(svg).iter() if e.get("id")}

    assert ids(chart(1)).isdisjoint(ids(chart(2)))  # two charts inline on one page
    assert chart(1) == chart(1)  # deterministic
