"""The benchmark tools' figures (bpl-bench-compare, bpl-bench-torch), drawn by gnuplot: a grid of panels,
each with both axes titled and its legend outside the data, under lines that say how the run went (its
ranks, its load, how noisy it was), so that a reader does not take a loaded run's picture for a quiet one's."""

import math
import shutil
import subprocess
import sys
from dataclasses import dataclass

SIZE_AXIS = "message size (bytes)"
PANEL_WIDTH, PANEL_HEIGHT = 620, 340


@dataclass
class Series:
    title: str
    rows: list  # (x, y, y_low, y_high): a point and the range of its repetitions
    color: int = 1
    dashed: bool = False


@dataclass
class Panel:
    title: str
    ylabel: str
    series: list
    log_y: bool = False
    xlabel: str = SIZE_AXIS
    reference: tuple = None  # (y, title): a dotted line across the panel, such as "equal time" at 1


def significant(value, digits=3):
    """`value` with `digits` significant digits and at least one decimal (0.000412, 1.23, 123.4)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:.1f}"
    decimals = max(1, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def draw(path, panels, columns, notes, tool):
    """Writes `panels` (a list, row by row) to the PNG `path`, `columns` a row, under the lines `notes`.
    Returns whether it was drawn; says why not on stderr (`tool` names the caller)."""
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        print(f"{tool}: gnuplot not found (apt-get install gnuplot-nox): no plot {path}", file=sys.stderr)
        return False
    rows = math.ceil(len(panels) / columns)
    heading = "\\n".join(note.replace('"', "'") for note in notes)
    script = [f'set terminal pngcairo size {PANEL_WIDTH * columns},{PANEL_HEIGHT * rows + 24 * len(notes)} '
              'font ",10" noenhanced',
              f'set output "{path}"',
              f'set multiplot layout {rows},{columns} title "{heading}" font ",11"',
              "set logscale x 2", "set format x '%.0b%B'", "set grid", "set key outside right top vertical Left reverse"]
    blocks = []
    for index, panel in enumerate(panels):
        plots = []
        for number, series in enumerate(panel.series):
            name = f"$p{index}s{number}"
            blocks.append(f"{name} << EOD\n" + "".join(f"{x} {y} {low} {high}\n" for x, y, low, high in series.rows)
                          + "EOD")
            plots.append(f"{name} using 1:2:3:4 with yerrorlines lc {series.color} dt {2 if series.dashed else 1} "
                         f'pt {6 if series.dashed else 7} title "{series.title}"')
        if panel.reference is not None:
            plots.append(f'{panel.reference[0]} with lines lc rgb "black" dt 3 title "{panel.reference[1]}"')
        if not plots:
            continue
        script += [f'set title "{panel.title}"', f'set xlabel "{panel.xlabel}"', f'set ylabel "{panel.ylabel}"',
                   "set logscale y 10" if panel.log_y else "unset logscale y",
                   "plot " + ", ".join(plots)]
    script.append("unset multiplot")
    done = subprocess.run([gnuplot], input="\n".join(blocks + script), text=True, capture_output=True)
    if done.returncode != 0:
        print(f"{tool}: gnuplot failed on {path}: {done.stderr}", file=sys.stderr)
    return done.returncode == 0
