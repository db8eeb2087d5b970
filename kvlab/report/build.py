"""Build report/: execute the notebooks with papermill, render HTML and one PDF, write the ledger.

    kvlab report --params params.yaml [--set NOTEBOOK.NAME=VALUE | --set NAME=VALUE ...]

Parameters are checked before any notebook runs. The build happens in a temporary folder that
replaces report/ only when every notebook succeeded, so a failed build leaves the last report intact.
"""
from __future__ import annotations

import datetime as dt
import html
import importlib.metadata
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.core import resources
from kvlab.report.params import ReportError, load_params, notebook_parameters
from kvlab.sections import ledger as ledger_mod
from kvlab.sections import parameters
from kvlab.workloads import traces

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
REPORT_DIR = ROOT / "report"
PACKAGES = ["kvlab", "numpy", "pandas", "matplotlib", "papermill", "nbconvert", "nbclient", "ipykernel", "weasyprint"]
TITLE = "kvlab: KV-cache memory in LLM serving"


# ---------------------------------------------------------------- execution
@dataclass
class Section:
    stem: str
    title: str = ""
    headline: str = ""
    seconds: float = 0.0
    params: dict = field(default_factory=dict)
    skipped: str = ""           # why the notebook was not run (empty when it ran)


def needs(notebook: Path) -> list[str]:
    """What a notebook needs beyond kvlab, from its metadata (kvlab.requires): e.g. ["traces"]."""
    import nbformat

    return list(nbformat.read(notebook, as_version=4).metadata.get("kvlab", {}).get("requires", []))


def title_of(notebook: Path) -> str:
    """The notebook's title: the first line of its first markdown cell, without the '#'."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    return next((c.source.splitlines()[0].lstrip("# ") for c in nb.cells if c.cell_type == "markdown"), notebook.stem)


def execute(notebook: Path, out_dir: Path, params: dict) -> Section:
    """Run one notebook with papermill into out_dir/notebooks; return its title and headline numbers."""
    import nbformat
    import papermill
    from papermill.exceptions import PapermillExecutionError

    executed = out_dir / "notebooks" / notebook.name
    ledger_csv = out_dir / "ledger" / f"{notebook.stem}.csv"
    declared = notebook_parameters(notebook)
    run_params = dict(params)
    if "LEDGER_CSV" in declared:
        run_params["LEDGER_CSV"] = str(ledger_csv)
    start = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(notebook), str(executed), parameters=run_params, kernel_name="python3",
            cwd=str(notebook.parent), progress_bar=False,
        )
    except PapermillExecutionError as error:
        raise ReportError(
            f"notebook {notebook.name} failed in cell {error.exec_count}: {error.ename}: {error.evalue}"
        ) from None
    except Exception as error:  # noqa: BLE001 - a kernel that died (nbclient's DeadKernelError) or would not start
        if type(error).__name__ != "DeadKernelError":
            raise
        available = resources.available_memory_bytes() / 2**30
        raise ReportError(f"notebook {notebook.name}: its kernel died, most likely out of memory ({available:.1f} GiB "
                          "available now); lower its NUM_REQUESTS or NUM_SEEDS") from None
    seconds = time.perf_counter() - start
    nb = nbformat.read(executed, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    headline = "".join(o.get("text", "") for o in code[-1].get("outputs", []) if o.get("name") == "stdout")
    return Section(notebook.stem, title_of(notebook), headline.rstrip(), seconds, params)


def skip(notebook: Path, params: dict, why: str) -> Section:
    """A section that was not run, with the sentence that says why."""
    return Section(notebook.stem, title_of(notebook), "", 0.0, params, skipped=why)


# ---------------------------------------------------------------- rendering
CSS = """
body { font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; max-width: 62rem; margin: 2rem auto;
       padding: 0 1rem; color: #222; line-height: 1.45; font-size: 11pt; }
h1 { font-size: 1.7rem; } h2 { font-size: 1.25rem; margin-top: 1.8rem; }
table { border-collapse: collapse; margin: 0.8rem 0; font-size: 8pt; }
.anchor-link { display: none; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.5rem; text-align: right; }
th { background: #f2f2f2; }
pre { background: #f7f7f7; padding: 0.6rem; overflow-x: auto; font-size: 9pt; white-space: pre-wrap; }
img { max-width: 100%; }
nav { font-size: 0.9rem; margin-bottom: 1rem; }
.pass { color: #176b2c; } .fail { color: #b00020; font-weight: bold; } .missing { color: #8a6d00; }
.params { font-family: "DejaVu Sans Mono", monospace; font-size: 7.5pt; margin: 0.3rem 0; }
footer { margin-top: 2.5rem; font-size: 8.5pt; color: #555; border-top: 1px solid #ccc; }
@page { size: A4 landscape; margin: 1.2cm; }
@media print {
  /* Wide tables (many columns with long names) must fit the page: headers may break anywhere. */
  table { font-size: 7pt; max-width: 100%; }
  thead th { overflow-wrap: anywhere; }
  th, td { padding: 0.15rem 0.35rem; }
  tr, img, pre { page-break-inside: avoid; }
  h1, h2, h3 { page-break-after: avoid; }
  /* The links between pages lead nowhere inside the PDF, and the last one took a page of its own. */
  nav { display: none; }
}
"""


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>\n{body}\n</body></html>\n")


def render_section(executed: Path, section: Section) -> str:
    """A section page: the notebook's outputs and prose without code, with a link back to the index."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="basic", exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True)
    nb = nbformat.read(executed, as_version=4)
    body, _ = exporter.from_notebook_node(nb)
    nav = '<nav><a href="index.html">&larr; back to the report index</a></nav>'
    return _page(section.title, nav + body + nav)


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def provenance() -> dict:
    """Versions, commit and date for the reproducibility footer."""
    commit = _git("rev-parse", "HEAD") or "unknown (not a git checkout)"
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!report"))
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {"commit": commit, "dirty": dirty, "python": platform.python_version(), "packages": versions,
            "built": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def _ledger_table(rows) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows.columns)
    body = []
    for _, r in rows.iterrows():
        cells = "".join(
            f"<td class=\"{r['status']}\">{html.escape(_fmt(v))}</td>" if c == "status" else f"<td>{html.escape(_fmt(v))}</td>"
            for c, v in r.items()
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _fmt(v) -> str:
    if isinstance(v, float):
        return "" if v != v else f"{v:.10g}"
    return str(v)


def render_index(sections: list[Section], ledger, info: dict, params: dict, traces_note: str = "") -> str:
    """The index page: what the report reproduces, the ledger summary, headlines, the footer."""
    s = ledger_mod.summary(ledger)
    open_rows = ledger[ledger["status"] != "pass"]
    parts = [
        f"<h1>{TITLE}</h1>",
        "<p>This report reproduces a short article on how vLLM manages KV-cache memory: reserving KV memory in "
        "small blocks instead of the maximum length (section 1), continuous instead of static batching (section 2) "
        "and how many requests fit in GPU memory (section 3). Every figure the article publishes is in the "
        "reproduction ledger below, next to kvlab's value and whether it matches within the stated tolerance.</p>",
        f"<h2>Reproduction ledger</h2><p><strong>{s['pass']} of {s['total']} published figures reproduced</strong> "
        f"({s['fail']} failing, {s['missing']} missing). Machine-readable: <a href=\"ledger.csv\">ledger.csv</a>.</p>",
        "<p>Tolerances: <em>abs N</em> passes when kvlab's value, rounded to the digits the article prints, "
        "is within N of the article's (abs 0: the same printed digits); <em>rel x</em> when it differs from "
        "the article's by at most x times the article's value; <em>band low..high</em> when the article's "
        "value lies inside kvlab's 5-95% band over seeds (section 2, where the reproduced value is the "
        "median over seeds).</p>",
    ]
    if len(open_rows):
        parts.append("<h3>Figures not reproduced</h3>" + _ledger_table(open_rows))
    parts.append("<h2>Sections</h2>")
    if traces_note:
        parts.append(f"<p><strong>Real request traces.</strong> {html.escape(traces_note)}</p>")
    for sec in sections:
        body = (f"<p class=\"skipped\">{html.escape(sec.skipped.capitalize())}.</p>" if sec.skipped
                else f"<pre>{html.escape(sec.headline)}</pre>")
        parts.append(f"<h3><a href=\"{sec.stem}.html\">{html.escape(sec.title)}</a></h3>{body}")
    parts.append("<h2>All ledger rows</h2>" + _ledger_table(ledger))
    pkgs = ", ".join(f"{k} {v}" for k, v in info["packages"].items())
    parts.append(
        "<footer><h2>Reproducibility</h2>"
        f"<p>kvlab {info['packages'].get('kvlab', '?')}; commit {info['commit']}"
        f"{' (working tree has uncommitted changes)' if info['dirty'] else ''}; Python {info['python']}; "
        f"built {info['built']}.</p><p>Packages: {html.escape(pkgs)}.</p>"
        "<p>Parameters and seeds given to papermill (the rest are each notebook's defaults):</p>"
        + "".join(f"<p class=\"params\"><strong>{html.escape(stem)}</strong>: "
                  + html.escape(", ".join(f"{k}={v!r}" for k, v in sorted(values.items()))) + "</p>"
                  for stem, values in sorted(params.items()))
        + "</footer>"
    )
    return _page(TITLE, "\n".join(parts))


def _traces_note(merged: dict[str, dict]) -> str:
    """Whether the real traces were there for this build: one sentence, or one per trace folder when the
    notebooks were given different folders (merged: each notebook's parameters, defaults included)."""
    from kvlab.sections.traces import availability_note

    folders: dict[str, list[str]] = {}
    for stem, values in merged.items():
        if "TRACE_DIR" in values:
            folders.setdefault(str(traces.trace_dir(values["TRACE_DIR"] or None)), []).append(stem)
    if len(folders) <= 1:
        return " ".join(availability_note(folder) for folder in folders)
    return " ".join(f"For {', '.join(stems)}: {availability_note(folder)}" for folder, stems in folders.items())


def render_skipped(section: Section) -> str:
    """The page of a section that was not built: its title and why."""
    nav = '<nav><a href="index.html">&larr; back to the report index</a></nav>'
    return _page(section.title, f"{nav}<h1>{html.escape(section.title)}</h1>"
                                f"<p class=\"skipped\">This section was {html.escape(section.skipped)}.</p>{nav}")


def write_pdf(pages: list[Path], pdf: Path) -> None:
    """One PDF from the HTML pages, in order (weasyprint: no LaTeX, no browser)."""
    import weasyprint

    documents = [weasyprint.HTML(filename=str(p)).render() for p in pages]
    all_pages = [page for doc in documents for page in doc.pages]
    documents[0].copy(all_pages).write_pdf(str(pdf))


# ---------------------------------------------------------------- build
MAX_MINUTES = 120  # a default report takes about one minute; refuse what would take hours unless asked


def plan(notebooks: list[Path], params: dict[str, dict], max_minutes: float, log) -> tuple[dict[str, str], dict]:
    """Before anything runs: the estimated time (refused past max_minutes), which notebooks to skip and why, and
    every notebook's parameters with its defaults merged in."""
    merged = {nb.stem: {**notebook_parameters(nb), **params[nb.stem]} for nb in notebooks}
    seconds = sum(parameters.estimate(stem, values).seconds for stem, values in merged.items())
    if seconds > 60 * max_minutes:
        heavy = max(merged, key=lambda stem: parameters.estimate(stem, merged[stem]).seconds)
        raise ReportError(f"the report would take about {seconds / 60:,.0f} min on this machine, over the limit of "
                          f"{max_minutes:g} min (--max-minutes); {heavy} takes most: lower its NUM_SEEDS or NUM_REQUESTS")
    if seconds > 120:
        log(f"report: about {seconds / 60:,.0f} min on this machine")
    skipped = {}
    for nb in notebooks:
        if "traces" in needs(nb):
            missing = traces.missing_traces(merged[nb.stem].get("TRACE_DIR") or None)
            if missing:
                skipped[nb.stem] = (f"not built: it needs the real request traces, and {', '.join(missing)} "
                                    f"{'is' if len(missing) == 1 else 'are'} not in the trace folder "
                                    "(run make traces or set TRACE_DIR)")
    return skipped, merged


def build(params_path: Path, overrides: list[str], out: Path = REPORT_DIR, *, notebook_dir: Path = NOTEBOOK_DIR,
          pdf: bool = True, max_minutes: float = MAX_MINUTES, log=print) -> Path:
    """Build the whole report into out atomically; raise ReportError on bad parameters or a failed notebook."""
    notebooks = sorted(Path(notebook_dir).glob("[0-9][0-9]_*.ipynb"))
    if not notebooks:
        raise ReportError(f"no notebooks found in {notebook_dir}")
    params = load_params(params_path, overrides, notebooks)
    skipped, merged = plan(notebooks, params, max_minutes, log)
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-build-", dir=out.parent))
    (tmp / "notebooks").mkdir()
    total_start = time.perf_counter()
    try:
        sections = []
        for i, nb in enumerate(notebooks, 1):
            log(f"report: [{i}/{len(notebooks)}] {nb.name} ...", end=" ", flush=True)
            if nb.stem in skipped:
                sec = skip(nb, params[nb.stem], skipped[nb.stem])
                log(sec.skipped, flush=True)
                (tmp / f"{nb.stem}.html").write_text(render_skipped(sec))
            else:
                sec = execute(nb, tmp, params[nb.stem])
                log(f"ok ({sec.seconds:.1f} s)", flush=True)
                (tmp / f"{nb.stem}.html").write_text(render_section(tmp / "notebooks" / nb.name, sec))
            sections.append(sec)
        ledger = ledger_mod.collect(sorted((tmp / "ledger").glob("*.csv")))
        ledger.to_csv(tmp / "ledger.csv", index=False, float_format="%.10g", lineterminator="\n")
        shutil.rmtree(tmp / "ledger", ignore_errors=True)
        (tmp / "index.html").write_text(render_index(sections, ledger, provenance(), params, _traces_note(merged)))
        if pdf:
            log("report: rendering report.pdf ...", end=" ", flush=True)
            pdf_start = time.perf_counter()
            write_pdf([tmp / "index.html"] + [tmp / f"{s.stem}.html" for s in sections], tmp / "report.pdf")
            log(f"ok ({time.perf_counter() - pdf_start:.1f} s)", flush=True)
        readme = out / "README.md"
        if readme.exists():
            shutil.copy2(readme, tmp / "README.md")
        tmp.chmod(0o755)
        _replace(out, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    s = ledger_mod.summary(ledger)
    log(f"report: done in {time.perf_counter() - total_start:.1f} s: {out}/index.html, report.pdf, ledger.csv "
        f"({s['pass']} of {s['total']} figures reproduced, {s['fail']} failing, {s['missing']} missing)")
    return out


def _replace(out: Path, new: Path) -> None:
    """Swap new in for out; the old report is removed only once the new one is in place."""
    old = out.with_name(f".{out.name}-old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    try:
        new.rename(out)
    except BaseException:
        if old.exists():
            old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
