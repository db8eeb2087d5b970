#!/usr/bin/env python3
"""Print Fig. 18a of the vLLM paper (arXiv 2309.06180v1) as data/vllm_2023/fig18a_kernel_latency.csv holds it.

    python scripts/vllm_2023/read_fig18a.py PAPER.pdf      (needs pdfplumber: pip install pdfplumber, in a venv
                                                             of its own; kvlab does not depend on it)

The figure is vector graphics: each of its four lines is a polyline whose vertices are the plotted points.
This reads the vertices from page 12 and maps their y to microseconds with the axis's own ticks (0 at
y=142.867 pt, 250 us at y=91.729 pt; the PDF gives coordinates to 0.001 pt, so +-0.005 pt, about +-0.02 us).
Colours tell the systems apart (blue vLLM, orange FasterTransformer); the legend gives both batch sizes the
same marker, so the lower line of each colour is taken as batch 8, the upper as batch 32.
"""

from __future__ import annotations

import sys

import pdfplumber

ZERO_PT, TOP_PT, TOP_US = 142.867, 91.729, 250.0
CONTEXTS = {345.5: 64, 370.35: 128, 420.05: 256}  # x of the axis's ticks (pt) -> context length
SYSTEMS = {(0.1215686275, 0.4666666667, 0.7058823529): "vLLM", (1.0, 0.4980392157, 0.0549019608): "FasterTransformer"}


def main(path: str) -> None:
    page = pdfplumber.open(path).pages[11]
    lines = [c for c in page.curves if 344 < c["x0"] < 346 and c["x1"] > 400 and c["top"] < ZERO_PT]
    rows = []
    for system in SYSTEMS.values():
        mine = [c for c in lines if SYSTEMS.get(tuple(round(v, 10) for v in c["stroking_color"])) == system]
        mine.sort(key=lambda c: -c["top"])  # lower line (larger y) first: batch 8
        for batch, curve in zip((8, 32), mine):
            for x, y in curve["pts"]:
                us = (ZERO_PT - y) * TOP_US / (ZERO_PT - TOP_PT)
                rows.append((system, batch, CONTEXTS[round(x, 2)], round(us, 2)))
    print("system,batch_size,context_tokens,latency_us,read_precision_us")
    for system, batch, context, us in sorted(rows, key=lambda r: (r[0] != "vLLM", r[1], r[2])):
        print(f"{system},{batch},{context},{us:.2f},0.02")


if __name__ == "__main__":
    main(sys.argv[1])
