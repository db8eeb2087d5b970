"""The built report, as a reader meets it: in a real browser (every image loads, every link resolves, no console
error, no horizontal scrolling at 1,280 pixels) and as a PDF (title, contents, sections on new pages, no page
mostly empty, headers never broken inside a word). One report is built for the whole module, beside the other tests
(conftest.py, ReportBuild)."""

import json
import re
import urllib.parse
import urllib.request

import pytest
from bs4 import BeautifulSoup

from conftest import ROOT, needs_tool
from kvlab.report import render

ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture(scope="module")
def report(built_report):
    """The report at its defaults, built while the other tests ran (conftest.py, ReportBuild)."""
    return built_report


def pages(report):
    return ["index.html", "ledger.html", "validation.html"] + sorted(p.name for p in report.glob("[0-9][0-9]_*.html"))


# ---------------------------------------------------------------- in a browser
@needs_tool("chromium")
def test_the_report_in_headless_chromium(report):
    from browser import Browser, Served

    ARTIFACTS.mkdir(exist_ok=True)
    with Served(report) as served:
        browser = Browser(width=1280, height=900)
        try:
            for name in pages(report):
                browser.open(served.url + name)
                images = browser.evaluate(
                    "[...document.images].map(i => [i.src.slice(0, 80), i.complete && i.naturalWidth > 0, i.alt])"
                )
                assert all(ok for _, ok, _ in images), f"{name}: an image did not load: {images}"
                assert all(alt and "No description" not in alt for _, _, alt in images), (
                    f"{name}: an image has no alt text"
                )
                width = browser.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
                assert width[0] <= width[1], f"{name} scrolls sideways at 1,280 px: {width}"
                assert browser.console_errors() == [], f"{name}: {browser.console_errors()}"
                for href in browser.evaluate(
                    "[...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'))"
                ):
                    target = urllib.parse.urljoin(served.url + name, href)
                    path, _, anchor = target.partition("#")
                    assert path.startswith(served.url), f"{name} links outside the report: {href}"
                    with urllib.request.urlopen(path, timeout=10) as response:
                        assert response.status == 200, f"{name}: {href} does not resolve"
                        if anchor:
                            assert f'id="{anchor}"' in response.read().decode(), f"{name}: {href} has no anchor"
                if name == "index.html":
                    browser.screenshot(ARTIFACTS / "front-page.png")
        finally:
            browser.close()
    assert (ARTIFACTS / "front-page.png").stat().st_size > 10_000


# ---------------------------------------------------------------- as a PDF (pypdfium2: PDFium, pinned; no system tool)
def page_images(pdf, dpi=30):
    """Every page of the PDF as a grey image."""
    import pypdfium2

    document = pypdfium2.PdfDocument(str(pdf))
    try:
        return [page.render(scale=dpi / 72, grayscale=True).to_pil() for page in document]
    finally:
        document.close()


def page_texts(pdf) -> list[str]:
    """The text of every page of the PDF, line by line as laid out."""
    import pypdfium2

    document = pypdfium2.PdfDocument(str(pdf))
    try:
        return [page.get_textpage().get_text_bounded() for page in document]
    finally:
        document.close()


def fullness(image) -> float:
    """How far down the text area a page's content reaches (0 to 1), its page number left out."""
    width, height = image.size
    top, bottom = int(height * 1.3 / 29.7), int(height * (29.7 - 1.5) / 29.7)  # the @page margins, cm of A4
    pixels = image.load()
    last = max((y for y in range(top, bottom) for x in range(0, width, 2) if pixels[x, y] < 200), default=top)
    return (last - top) / (bottom - top)


def test_the_pdf_has_no_page_mostly_empty_but_a_chapters_last(report):
    layout = json.loads((report / "report-pages.json").read_text())
    starts = sorted(layout["chapters"].values())
    last_of_chapter = {s - 1 for s in starts} | {layout["num_pages"]} | {1}  # the title and contents page too
    images = page_images(report / "report.pdf")
    assert len(images) == layout["num_pages"]
    thin = [n for n, image in enumerate(images, 1) if n not in last_of_chapter and fullness(image) < 1 / 3]
    assert thin == [], f"pages less than a third full: {thin}"
    assert layout["chapters"]["overview"] == 2 and all(s > 1 for s in starts)  # title and contents, then chapters


def test_the_pdf_reads_in_at_most_45_pages(report):
    """The whole report, validation chapter included, prints in at most 45 A4 pages (#51's budget for a reader)."""
    assert json.loads((report / "report-pages.json").read_text())["num_pages"] <= 45


def test_the_pdf_has_a_title_page_contents_with_page_numbers_and_each_section(report):
    title_page = contents = page_texts(report / "report.pdf")[0]
    assert render.TITLE in " ".join(title_page.split())
    layout = json.loads((report / "report-pages.json").read_text())
    for stem in (p.stem for p in report.glob("[0-9][0-9]_*.html")):
        title = BeautifulSoup((report / f"{stem}.html").read_text(), "html.parser").title.string
        entry = next(line for line in contents.splitlines() if title[:40] in line)
        assert entry.rstrip().endswith(str(layout["chapters"][f"sec-{stem}"])), entry


def test_table_headers_are_never_broken_inside_a_word(report):
    text = "\n".join(page_texts(report / "report.pdf"))
    words_in_text = set(re.findall(r"[A-Za-z]{6,}", text))
    for name in pages(report):
        soup = BeautifulSoup((report / name).read_text(), "html.parser")
        for th in soup.select("table.kvlab thead th"):
            for word in re.findall(r"[A-Za-z]{6,}", th.get_text()):
                assert word in words_in_text, f"{name}: header word {word!r} is broken in the PDF"


def test_long_tables_print_in_parts_of_at_least_three_rows():
    rows = "".join(f"<tr><td>{i}</td></tr>" for i in range(50))
    document = render.pdf_document(
        f'<table class="kvlab"><thead><tr><th>n</th></tr></thead><tbody>{rows}</tbody></table>', [], "", "today"
    )
    soup = BeautifulSoup(document, "html.parser")
    sizes = [len(t.find("tbody").find_all("tr")) for t in soup.find_all("table")]
    assert sum(sizes) == 50 and all(3 <= s <= render.ROWS_PER_PRINTED_TABLE for s in sizes)
    assert all(t.find("thead") is not None for t in soup.find_all("table"))


def test_links_to_the_validation_chapter_stay_inside_the_pdf():
    index = '<a href="validation.html">the chapter</a> <a href="validation.html#validation-01_a">its part</a>'
    soup = BeautifulSoup(render.pdf_document(index, [], "<h1>V</h1>", "today"), "html.parser")
    hrefs = [a["href"] for a in soup.find_all("a") if a.get_text() in ("the chapter", "its part")]
    assert hrefs == ["#validation-chapter", "#validation-01_a"]
    assert soup.find(id="validation-chapter") is not None


def test_no_python_identifier_in_the_built_pages(report):
    """What the report's pages show names no Python identifier of kvlab's: the notebooks' reader text is checked in
    test_reader_text; this checks what the report adds to it. The footer's record of the parameters papermill was
    given is left out: those names are what a user sets to rebuild the report, as a command's flags are."""
    from test_reader_text import identifiers

    found = {}
    for name in pages(report):
        soup = BeautifulSoup((report / name).read_text(encoding="utf-8"), "html.parser")
        for tag in [*soup(["script", "style"]), *soup.select(".params")]:
            tag.decompose()
        hits = identifiers(soup.get_text(" "))
        if hits:
            found[name] = hits[:5]
    assert not found, found
