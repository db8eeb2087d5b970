"""The report's pages: the front page, one page per section, the ledger, and the one document the PDF is made of.

HTML for a browser (a column of readable width, tables that scroll inside their own box when wide) and
for print (A4 portrait: a title page, contents with page numbers, each section on a new page, figures and
tables kept whole and small enough that a page is never left mostly empty before them).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from pathlib import Path

from bs4 import BeautifulSoup

from kvlab.report.findings import findings
from kvlab.report.glossary import glossary_html
from kvlab.sections.shared import ledger as ledger_mod
from kvlab.sections.shared import present

TITLE = "kvlab: KV-cache memory in LLM serving"
ROWS_PER_PRINTED_TABLE = 24  # a longer table is printed as parts of at most this many rows, each kept whole
CHARS_PER_PRINTED_LINE = 70  # a cell of long text wraps at about this many characters in print (counted as more rows)

CSS = """
:root { --ink: #1d2327; --muted: #5b6670; --line: #d6dbe0; --pass: #176b2c; --fail: #b00020; --accent: #1f5fa8; }
body { font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; max-width: 60rem; margin: 2rem auto;
       padding: 0 1rem; color: var(--ink); line-height: 1.5; font-size: 11pt; }
h1 { font-size: 1.7rem; line-height: 1.25; } h2 { font-size: 1.3rem; margin-top: 2rem; } h3 { font-size: 1.1rem; }
a { color: var(--accent); }
.anchor-link { display: none; }
table { border-collapse: collapse; margin: 0.6rem 0; font-size: 8.5pt; }
th, td { border-bottom: 1px solid var(--line); padding: 0.2rem 0.55rem; text-align: left; vertical-align: top;
         overflow-wrap: normal; word-break: normal; hyphens: manual; }
thead th { border-bottom: 2px solid var(--ink); font-weight: 600; }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; }
tbody th { font-weight: normal; color: var(--ink); }
caption { caption-side: top; text-align: left; color: var(--muted); font-size: 8.5pt; padding-bottom: 0.2rem; }
.table-wrap, .jp-OutputArea-output:has(> table) { overflow-x: auto; max-width: 100%; }
.jp-RenderedHTMLCommon, .output_html { overflow-x: auto; max-width: 100%; }
pre { background: #f5f7f9; padding: 0.6rem 0.8rem; overflow-x: auto; font-size: 9pt; white-space: pre-wrap; }
img { max-width: 100%; height: auto; }
figure { margin: 1rem 0; }
figcaption { color: var(--muted); font-size: 9pt; margin-top: 0.3rem; }
nav { font-size: 0.9rem; margin: 0 0 1rem; }
.headline { font-size: 1.15rem; margin: 0.5rem 0 1rem; }
.headline strong { font-size: 1.6rem; }
.fail, td.fail { color: var(--fail); } .pass { color: var(--pass); }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(17rem, 1fr)); gap: 1rem; }
.answer { border-left: 4px solid var(--pass); padding: 0.4rem 0.8rem; background: #f6f8f6; }
.glossary dt { font-weight: 600; margin-top: 0.3rem; } .glossary dd { margin: 0 0 0.2rem 1.2rem; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 0.8rem; }
.card h3 { margin: 0 0 0.5rem; font-size: 1rem; }
.card img { display: block; border: 1px solid var(--line); }
.card pre { font-size: 7.5pt; padding: 0.4rem; }
.skipped { color: var(--muted); font-style: italic; }
.params { font-family: "DejaVu Sans Mono", monospace; font-size: 7.5pt; margin: 0.2rem 0; overflow-wrap: anywhere; }
footer { margin-top: 2.5rem; font-size: 8.5pt; color: var(--muted); border-top: 1px solid var(--line); }
@page { size: A4 portrait; margin: 1.3cm 1.3cm 1.5cm;
        @bottom-center { content: counter(page); font-size: 8pt; color: #777; } }
@page title { @bottom-center { content: none; } }
@media print {
  body { max-width: none; margin: 0; padding: 0; font-size: 7.6pt; line-height: 1.2; }
  p { margin: 0.35rem 0; }
  nav, .cards img { display: none; }
  h1 { font-size: 15pt; margin: 0 0 0.4rem; } h2 { font-size: 12pt; margin: 0.8rem 0 0.3rem; }
  h3 { font-size: 10.5pt; margin: 0.6rem 0 0.25rem; }
  h1, h2, h3 { break-after: avoid; }
  table { font-size: 6.2pt; break-inside: avoid; margin: 0.35rem 0; }
  pre { font-size: 7.5pt; padding: 0.4rem; }
  th, td { padding: 0.12rem 0.35rem; }
  figure, pre { break-inside: avoid; }
  /* Figures float right at a little over half the width, the prose beside them: a page is not left half
     empty when a figure does not fit below a paragraph. Tables and headings start below any figure. */
  figure { float: right; width: 47%; margin: 0.1rem 0 0.3rem 0.45cm; }
  figure img { width: 100%; height: auto; max-height: none; }
  figcaption { font-size: 7pt; }
  table, pre, h1, h2, h3, .table-wrap { clear: both; }
  .title-page { page: title; padding-top: 3cm; }
  .title-page h1 { font-size: 24pt; }
  .contents { page: title; break-after: page; margin-top: 2cm; }
  footer .params { font-size: 6pt; }
  section#ledger table { font-size: 6.2pt; }
  .contents a { text-decoration: none; color: var(--ink); }
  .contents a::after { content: leader('.') target-counter(attr(href), page); }
  .contents li { list-style: none; margin: 0.25rem 0; }
  section.chapter { break-before: page; }
  /* The validation chapter is reference material: printed denser than the sections it checks. */
  section.validation { font-size: 7pt; line-height: 1.15; }
  section.validation table { font-size: 5.4pt; }
  section.validation figure { width: 40%; }
  section.validation h2 { font-size: 10.5pt; } section.validation h3 { font-size: 9pt; }
  /* The contents page lists the sections, and each section ends with its headline: no cards in print. */
  .cards, .sections-heading { display: none; }
}
"""


@dataclass
class Section:
    """One notebook in the report: what it is called, what it concluded, how long it took, why it was skipped."""

    stem: str
    title: str = ""
    headline: str = ""
    seconds: float = 0.0
    params: dict = field(default_factory=dict)
    skipped: str = ""  # why the notebook was not run (empty when it ran)
    key_figure: str = ""  # path of the section's key figure, relative to the report (empty: none)
    key_caption: str = ""
    finding: str = ""  # the section's one sentence for the front page (its cell tagged finding)
    body: str = ""  # the rendered notebook without its validation cells, for its page and the PDF
    validation: str = ""  # its cells tagged validation, rendered for the closing validation chapter

    @property
    def number(self) -> int:
        """The section's number (01_allocation -> 1)."""
        return int(self.stem[:2])


def page(title: str, body: str) -> str:
    """A whole HTML page with the report's style."""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,">'  # no icon: the browser asks for no /favicon.ico that 404s
        f"<title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


NAV = '<nav><a href="index.html">&larr; the report</a></nav>'


VALIDATION_TAG = "validation"  # a cell of validation detail: shown in the closing validation chapter, not its section


def _render_cells(cells, number: int, first_figure: int = 1) -> BeautifulSoup:
    """Notebook cells as HTML without code, their figures numbered (number.first_figure, ...) with captions."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        template_name="basic", exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True
    )
    notebook = nbformat.v4.new_notebook()
    notebook.cells = cells
    body, _ = exporter.from_notebook_node(notebook)
    soup = BeautifulSoup(body, "html.parser")
    for figure_number, img in enumerate(soup.find_all("img"), first_figure):
        alt = img.get("alt", "")
        figure = soup.new_tag("figure")
        img.wrap(figure)
        caption = soup.new_tag("figcaption")
        caption.string = f"Figure {number}.{figure_number}. {alt}"
        figure.append(caption)
    for output in soup.select(".jp-OutputArea-output, .output_html"):
        if output.find("table") is not None:
            output["class"] = output.get("class", []) + ["table-wrap"]
    return soup


def _split_cells(executed: Path) -> tuple[list, list]:
    """A notebook's cells: (its findings and their evidence, its cells tagged validation)."""
    import nbformat

    cells = nbformat.read(executed, as_version=4).cells
    tagged = [VALIDATION_TAG in c.metadata.get("tags", []) for c in cells]
    return [c for c, t in zip(cells, tagged) if not t], [c for c, t in zip(cells, tagged) if t]


def section_body(executed: Path, section: Section) -> str:
    """The notebook's prose and outputs without code, its figures numbered with their captions; its cells tagged
    validation are left to the validation chapter (validation_body), a link at the end pointing there."""
    findings_cells, validation_cells = _split_cells(executed)
    soup = _render_cells(findings_cells, section.number)
    title = soup.find("h1")
    if section.finding and title is not None:  # the section opens with its question (the title) and its answer
        answer = soup.new_tag("p", attrs={"class": "answer"})
        lead = soup.new_tag("strong")
        lead.string = "The answer, in short: "
        answer.append(lead)
        answer.append(section.finding)
        title.insert_after(answer)
    if validation_cells:
        soup.append(
            BeautifulSoup(
                f'<p class="validation-link">How this section\'s numbers were checked (its ledger rows, its checks '
                f'against vLLM and measurements, its sensitivities): <a href="validation.html#{validation_anchor(section)}">'
                "the validation chapter</a>.</p>",
                "html.parser",
            )
        )
    return str(soup)


def validation_anchor(section: Section) -> str:
    return f"validation-{section.stem}"


def validation_body(executed: Path, section: Section) -> str:
    """The notebook's cells tagged validation, its headings one level down under the section's own, their figures
    numbered after the section's (empty when it has none)."""
    findings_cells, validation_cells = _split_cells(executed)
    if not validation_cells:
        return ""
    first = 1 + sum("image/png" in o.get("data", {}) for c in findings_cells for o in c.get("outputs", []))
    soup = _render_cells(validation_cells, section.number, first)
    for level in (5, 4, 3, 2):
        for heading in soup.find_all(f"h{level}"):
            heading.name = f"h{level + 1}"
    return (
        f'<section class="validation" id="{validation_anchor(section)}"><h2>{html.escape(section.title)}</h2>'
        f'{soup}<p><a href="{section.stem}.html">Back to the section</a>.</p></section>'
    )


VALIDATION_TITLE = "Validation: how each section's numbers were checked"


def validation_page_body(sections: list[Section]) -> str:
    """The closing chapter: every section's validation detail, in order."""
    parts = [
        f'<h1 id="validation">{VALIDATION_TITLE}</h1>',
        "<p>The section pages state what kvlab found and the evidence for it. What follows is how those numbers were "
        "checked, section by section: each section's rows of the reproduction ledger (the published figures against "
        "kvlab's, with the tolerance each is held to), kvlab's decisions and sizes against vLLM's own code on the same "
        "inputs, the time models' term-by-term checks and where their coefficients come from, and how much the "
        "figures move with the seed and with the choices the sources leave open.</p>",
    ]
    parts += [s.validation for s in sections if s.validation]
    return "\n".join(parts)


def section_page(section: Section) -> str:
    """A section's page: its body between links back to the front page."""
    return page(section.title, NAV + section.body + NAV)


def skipped_body(section: Section) -> str:
    """The body of a section that was not built: its title and why."""
    return (
        f'<h1>{html.escape(section.title)}</h1><p class="skipped">This section was {html.escape(section.skipped)}.</p>'
    )


def ledger_table(rows, *, with_section: bool = True) -> str:
    """Ledger rows as one table: the figure, the published value (a range as 'low to high') and kvlab's at the
    source's precision, the mark, and the note that says why where there is one."""
    published_figures = ledger_mod.figures().set_index(ledger_mod.KEY)
    head = (["section"] if with_section else []) + ["figure", "published", "kvlab", "tolerance", "status", "why"]
    body = []
    for _, r in rows.iterrows():
        key = tuple(r[k] for k in ledger_mod.KEY)
        figure = published_figures.loc[key] if key in published_figures.index else None
        d = int(figure["decimals"]) if figure is not None else 2
        figure_text = f"{ledger_mod.table_name(r['table'])}: {r['row']}, {present.label(r['column'])}"
        tolerance = (
            f"band {present.cell(r['band_low'], d)} to {present.cell(r['band_high'], d)}"
            if str(r["tolerance"]).startswith("band") and r["band_low"] == r["band_low"]
            else str(r["tolerance"])
        )
        value = present.published(figure, d) if figure is not None else present.cell(r["article"], d)
        cells = ([str(r["section"])] if with_section else []) + [
            figure_text,
            value,
            present.cell(r["reproduced"], d),
            tolerance,
            present.MARKS.get(r["status"], r["status"]),
            "" if str(r["why"]) == "nan" else str(r["why"]),
        ]
        kinds = ([""] if with_section else []) + ["", "num", "num", "", r["status"].replace(" ", "-"), ""]
        body.append("<tr>" + "".join(f'<td class="{k}">{html.escape(c)}</td>' for k, c in zip(kinds, cells)) + "</tr>")
    header = "".join(f'<th class="{"num" if h in ("published", "kvlab") else ""}">{h}</th>' for h in head)
    return f'<table class="kvlab"><thead><tr>{header}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def ledger_body(ledger) -> str:
    """Every published figure: first those not reproduced, each with why, then every figure by section."""
    parts = [
        "<h1>The reproduction ledger</h1>",
        "<p>Every figure the article publishes (sections 1-3) and the vLLM paper's figures that section 6 "
        "reproduces (Kwon et al., SOSP 2023, arXiv 2309.06180), against kvlab's value. Machine-readable: "
        '<a href="ledger.csv">ledger.csv</a> (its column <em>source</em> says whose figure a row is; '
        "<em>article</em> holds the published value).</p>",
        TOLERANCES,
    ]
    open_rows = ledger[ledger["status"].isin(["fail", "missing"])]
    if len(open_rows):
        parts.append("<h2>Figures not reproduced, and why</h2>" + ledger_table(open_rows))
    for number, rows in ledger.groupby("section", sort=True):
        source = ledger_mod.SOURCE_NAMES[ledger_mod.source_of(int(number))]
        parts.append(f"<h2>Section {number}: {source}'s figures</h2>" + ledger_table(rows, with_section=False))
    return "\n".join(parts)


TOLERANCES = (
    "<p>How a figure passes: <em>abs N</em>, kvlab's value rounded to the digits the source prints is "
    "within N of the published one (abs 0: the same printed digits); <em>rel x</em>, it differs by at most "
    "x times the published value; <em>band</em>, the article's value lies inside kvlab's 5-95% band over "
    "seeds (section 2, where kvlab's value is the median over seeds); <em>range a..b</em>, kvlab's value "
    "lies inside a range the vLLM paper publishes; <em>above x</em>, kvlab's value is above x. The "
    "tolerances of the vLLM paper's figures were chosen before kvlab's values were seen. A figure is "
    "<em>not compared</em> when its section ran with other settings than its source's.</p>"
)


def _counts(summary: dict) -> str:
    return (
        f" ({summary['fail']} not within tolerance, {summary['missing']} missing)"
        if summary["fail"] or summary["missing"]
        else ""
    )


def _headline(ledger, set_aside: dict[int, str]) -> str:
    """The ledger's summary, each source counted apart: 'N of M figures the article publishes reproduced; K of L
    of the vLLM paper's'."""
    article = ledger_mod.summary(ledger[ledger["source"] == "article"] if "source" in ledger else ledger)
    text = (
        f'<p class="headline"><strong>{article["pass"]} of {article["compared"]}</strong> figures the article '
        f"publishes reproduced" + _counts(article)
    )
    if "source" in ledger and (ledger["source"] == "vllm-paper").any():
        paper = ledger_mod.summary(ledger, "vllm-paper")
        text += f"; <strong>{paper['pass']} of {paper['compared']}</strong> of the vLLM paper's" + _counts(paper)
    text += ".</p>"
    if set_aside:
        not_compared = ledger_mod.summary(ledger)["not_compared"]
        whose = "the article's" if all(ledger_mod.source_of(n) == "article" for n in set_aside) else "their sources'"
        text += (
            "<p>With the parameters of this build, "
            + "; ".join(f"section {n} ran with {why}" for n, why in sorted(set_aside.items()))
            + f": its {not_compared} figures are not compared with {whose}.</p>"
        )
    return text


def index_body(
    sections: list[Section], ledger, info: dict, params: dict, traces_note: str, set_aside: dict[int, str]
) -> str:
    """The front page: what the report is, what it found (from the ledger and the sections' findings), one sentence
    and one figure per section, the ledger's summary (its page lists every figure not reproduced and why), the
    reproducibility footer."""
    parts = [
        f"<h1>{TITLE}</h1>",
        "<p>This report reproduces a short article on how vLLM manages KV-cache memory: reserving it in small "
        "blocks instead of the maximum length (section 1), continuous instead of static batching (section 2) and how "
        "many requests fit in GPU memory (section 3). It then goes further: real request traces (section 4); the "
        "article's two assumed numbers and kvlab's step costs set against arithmetic, public operator-level GPU "
        "measurements and real vLLM runs (section 5); serving under one memory budget (section 6), the vLLM "
        "paper's experiment (Kwon et al., SOSP 2023) run on kvlab's engine with the paper's figures held to "
        "tolerances chosen in advance (kvlab's scheduler is vLLM 0.33's, held to vLLM's own scheduler decision by "
        "decision on the same requests; the mid-2023 scheduler section 6 runs for the paper's system is kvlab's "
        "reading of vLLM 0.1.4's source, as the paper names no version, checked against no running copy of it); and "
        "planning a deployment with all of it (section 7). kvlab is the small Python library and command line that "
        "computes every number here.</p>",
    ]
    found = findings(ledger, sections)
    if found:
        parts.append(
            '<h2>What the report found</h2><ul class="findings">'
            + "".join(f"<li>{html.escape(line)}</li>" for line in found)
            + "</ul>"
        )
    parts.append(glossary_html())
    parts.append('<h2 class="sections-heading">Sections</h2>')
    cards = []
    for sec in sections:
        figure = (
            f'<a href="{sec.stem}.html"><img src="{sec.key_figure}" alt="{html.escape(sec.key_caption)}" '
            f'width="700" height="420"></a>'
            if sec.key_figure
            else ""
        )
        body = (
            f'<p class="skipped">{html.escape(sec.skipped[0].upper() + sec.skipped[1:])}.</p>'
            if sec.skipped
            else f"<p>{html.escape(sec.finding)}</p>"
            if sec.finding
            else f"<pre>{html.escape(sec.headline)}</pre>"
        )
        cards.append(
            f'<div class="card"><h3><a href="{sec.stem}.html">{html.escape(sec.title)}</a></h3>{body}{figure}</div>'
        )
    parts.append('<div class="cards">' + "".join(cards) + "</div>")
    parts += [
        "<h2>Reproduction ledger</h2>",
        _headline(ledger, set_aside),
        '<p>Every figure, and each one not reproduced with why: <a href="ledger.html">the ledger</a> '
        '(<a href="ledger.csv">ledger.csv</a>). How each section\'s numbers were checked (its ledger rows, kvlab '
        "against vLLM's own code, the time models' checks, seeds and sensitivities): "
        '<a href="validation.html">the validation chapter</a>.</p>',
    ]
    if traces_note:
        parts.append(f"<p><strong>Real request traces.</strong> {html.escape(traces_note)}</p>")
    parts.append(footer(info, params))
    return "\n".join(parts)


def footer(info: dict, params: dict) -> str:
    """Versions, commit, build date, and the parameters and seeds the notebooks ran with."""
    pkgs = ", ".join(f"{k} {v}" for k, v in info["packages"].items())
    return (
        "<footer><h2>Reproducibility</h2>"
        f"<p>kvlab {info['packages'].get('kvlab', '?')}; commit {info['commit']}"
        f"{' (working tree has uncommitted changes)' if info['dirty'] else ''}; Python {info['python']}; "
        f"built {info['built']}.</p><p>Packages: {html.escape(pkgs)}.</p>"
        + ("<p>Sweeps: " + html.escape("; ".join(info["sweeps"])) + ".</p>" if info.get("sweeps") else "")
        + "<p>Parameters and seeds given to papermill (the rest are each notebook's defaults):</p>"
        + "".join(
            f'<p class="params"><strong>{html.escape(stem)}</strong>: '
            + html.escape(", ".join(f"{k}={v!r}" for k, v in sorted(values.items())) or "its defaults")
            + "</p>"
            for stem, values in sorted(params.items())
        )
        + "</footer>"
    )


def _printed_lines(row) -> int:
    """About how many printed lines a table row takes: its longest cell wrapped at CHARS_PER_PRINTED_LINE."""
    return max([1] + [-(-len(cell.get_text()) // CHARS_PER_PRINTED_LINE) for cell in row.find_all(["td", "th"])])


def _printable_tables(soup: BeautifulSoup) -> None:
    """Split every table longer than ROWS_PER_PRINTED_TABLE lines (a row of long text counts as the lines it wraps
    to) into parts of about equal length, each repeating the header and kept whole on a page: no page is left with a
    table's last one or two rows, and no table too tall for a page pushes its heading's page out empty."""
    for table in soup.find_all("table"):
        rows = table.find("tbody").find_all("tr", recursive=False) if table.find("tbody") else []
        lines = [_printed_lines(row) for row in rows]
        if sum(lines) <= ROWS_PER_PRINTED_TABLE:
            continue
        parts = -(-sum(lines) // ROWS_PER_PRINTED_TABLE)
        cuts, done, part = [], 0, 1
        for i, n in enumerate(lines[:-1]):
            done += n
            if done * parts >= part * sum(lines):  # this part has its share of the lines: the next row starts one
                cuts.append(i + 1)
                part += 1
        head = table.find("thead")
        anchor = table
        for start, end in zip(cuts, cuts[1:] + [len(rows)]):
            piece = soup.new_tag("table", attrs={"class": table.get("class", [])})
            if head is not None:
                piece.append(BeautifulSoup(str(head), "html.parser"))
            body = soup.new_tag("tbody")
            for row in rows[start:end]:
                body.append(row.extract())
            piece.append(body)
            anchor.insert_after(piece)
            anchor = piece


def pdf_document(index: str, sections: list[Section], validation: str, built: str) -> str:
    """The whole report as one printable HTML document: a title page with the contents, the front page's summary,
    each section on its own pages, then the validation chapter (the full ledger stays in ledger.html and
    ledger.csv: in print the validation chapter holds each section's own rows)."""
    chapters = [("overview", "Overview: the findings, the terms, the ledger", index)]
    chapters += [(f"sec-{s.stem}", s.title, s.body if not s.skipped else skipped_body(s)) for s in sections]
    chapters.append(("validation-chapter", VALIDATION_TITLE, validation))
    contents = "".join(f'<li><a href="#{anchor}">{html.escape(title)}</a></li>' for anchor, title, _ in chapters)
    body = (
        f'<div class="title-page"><h1>{TITLE}</h1><p>A reproducible report on KV-cache memory in LLM '
        f"serving: the article's figures reproduced, and what real models, traces and vLLM's own accounting "
        f"add.</p><p>Built {html.escape(built)}.</p></div>"
        f'<div class="contents"><h2>Contents</h2><ul>{contents}</ul></div>'
        + "".join(f'<section class="chapter" id="{anchor}">{content}</section>' for anchor, _, content in chapters)
    )
    soup = BeautifulSoup(body, "html.parser")
    _printable_tables(soup)
    for link in soup.find_all("a", href=re.compile(r"^[0-9][0-9]_\w+\.html$")):
        link["href"] = f"#sec-{link['href'][:-5]}"  # links between pages become links inside the PDF
    for link in soup.find_all("a", href=re.compile(r"^validation\.html")):  # the chapter, or a section's part of it
        link["href"] = link["href"][len("validation.html") :] or "#validation-chapter"
    for link in soup.find_all("a", href="ledger.html"):
        link.replace_with(link.get_text() + " (ledger.html beside this PDF)")
    return page(TITLE, str(soup))


def write_pdf(document: str, pdf: Path, base_url: Path) -> dict:
    """Render the printable document to pdf (WeasyPrint: no LaTeX, no browser); where each chapter starts (pages)."""
    import weasyprint

    rendered = weasyprint.HTML(string=document, base_url=str(base_url)).render()
    first_pages = {}
    for number, pdf_page in enumerate(rendered.pages, 1):
        for anchor in pdf_page.anchors:
            if anchor in ("overview", "ledger", "validation-chapter") or anchor.startswith("sec-"):
                first_pages.setdefault(anchor, number)
    rendered.write_pdf(str(pdf))
    return {"num_pages": len(rendered.pages), "chapters": first_pages}
