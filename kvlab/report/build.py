"""Build report/: execute the notebooks with papermill, render HTML and one PDF, write the ledger.

    kvlab report --params params.yaml [--set NOTEBOOK.NAME=VALUE | --set NAME=VALUE ...]

Parameters are checked before any notebook runs. The build happens in a temporary folder that
replaces report/ only when every notebook succeeded, so a failed build leaves the last report intact.
"""

from __future__ import annotations

import base64
import datetime as dt
import importlib.metadata
import json
import os
import platform
import queue
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from kvlab.core import resources
from kvlab.report import render
from kvlab.report.params import MAX_MINUTES, CheckedParams, ReportError, check_params, notebook_parameters
from kvlab.report.paths import NOTEBOOK_DIR, REPORT_DIR, ROOT
from kvlab.report.render import Section
from kvlab.sections.shared import ledger as ledger_mod
from kvlab.sections.shared import parameters
from kvlab.studies import sweep
from kvlab.workloads import traces

PACKAGES = [
    "kvlab",
    "numpy",
    "pandas",
    "scipy",
    "matplotlib",
    "papermill",
    "nbconvert",
    "nbclient",
    "ipykernel",
    "weasyprint",
]
KEY_FIGURE_TAG = "key-figure"  # the cell whose figure stands for its section on the front page
FINDING_TAG = "finding"  # the cell whose one sentence stands for its section on the front page


# ---------------------------------------------------------------- execution
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
    os.environ[sweep.LOG_ENV] = str(out_dir / f"sweeps-{notebook.stem}.jsonl")  # its kernel logs every sweep there
    ledger_csv = out_dir / "ledger" / f"{notebook.stem}.csv"
    declared = notebook_parameters(notebook)
    run_params = dict(params)
    if "LEDGER_CSV" in declared:
        run_params["LEDGER_CSV"] = str(ledger_csv)
    start = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(notebook),
            str(executed),
            parameters=run_params,
            kernel_name="python3",
            cwd=str(notebook.parent),
            progress_bar=False,
        )
    except PapermillExecutionError as error:
        raise ReportError(
            f"notebook {notebook.name} failed in cell {error.exec_count}: {error.ename}: {error.evalue}"
        ) from None
    except Exception as error:  # noqa: BLE001 - a kernel that died (nbclient's DeadKernelError) or would not start
        if type(error).__name__ != "DeadKernelError":
            raise
        available = resources.available_memory_bytes() / 2**30
        raise ReportError(
            f"notebook {notebook.name}: its kernel died, most likely out of memory ({available:.1f} GiB "
            "available now); lower its NUM_REQUESTS or NUM_SEEDS"
        ) from None
    seconds = time.perf_counter() - start
    nb = nbformat.read(executed, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    headline = "".join(o.get("text", "") for o in code[-1].get("outputs", []) if o.get("name") == "stdout")
    return Section(notebook.stem, title_of(notebook), headline.rstrip(), seconds, params, finding=finding_of(nb))


def num_at_once(checked: CheckedParams, notebooks: list[Path]) -> int:
    """How many notebooks run at once: one a core, at most two (each section's sweeps use every core too), and one
    when the two heaviest would not fit in memory together (each notebook's parameters are checked against the
    whole memory)."""
    peaks = sorted((parameters.estimate(nb.stem, checked.merged[nb.stem]).peak_bytes for nb in notebooks), reverse=True)
    fits = sum(peaks[:2]) <= resources.USABLE_SHARE * resources.available_memory_bytes()
    return max(1, min(2, os.cpu_count() or 1, len(notebooks))) if fits else 1


def longest_first(checked: CheckedParams, notebooks: list[Path]) -> list[Path]:
    """The notebooks, the longest by its estimate (kvlab.sections.shared.parameters.estimate) first."""
    return sorted(notebooks, key=lambda nb: -parameters.estimate(nb.stem, checked.merged[nb.stem]).seconds)


def execute_all(
    checked: CheckedParams, notebooks: list[Path], out_dir: Path, log=print, then=lambda sec: sec
) -> dict[str, Section]:
    """execute() every notebook, num_at_once of them at a time in local processes, the longest (by its estimate)
    first; each section as it finishes is logged and given to then (here, while the others run). A failed notebook
    stops the others (ReportError)."""
    import multiprocessing

    order = longest_first(checked, notebooks)
    workers = num_at_once(checked, notebooks)
    if notebooks:
        log(f"report: {len(notebooks)} notebooks, {workers} at a time", flush=True)
    sections: dict[str, Section] = {}
    finished: queue.Queue = queue.Queue()  # each notebook's Section, or the exception it raised
    # Each notebook in a fresh worker from a fork server, never forked from this process: a fork of a process with
    # threads (the pool's own, a test runner's) can copy a held lock into the child and leave it waiting forever.
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["kvlab.report.build", "papermill", "nbformat"])  # imported once, in the server
    else:
        context = multiprocessing.get_context("spawn")
    with context.Pool(workers, maxtasksperchild=1) as pool:
        for nb in order:
            args = (nb, out_dir, checked.given[nb.stem])
            pool.apply_async(execute, args, callback=finished.put, error_callback=finished.put)
        try:
            for done in range(1, len(order) + 1):
                sec = finished.get()
                if isinstance(sec, BaseException):
                    raise sec
                log(f"report: [{done}/{len(order)}] {sec.stem}.ipynb ok ({sec.seconds:.1f} s)", flush=True)
                sections[sec.stem] = then(sec)
        except BaseException:
            pool.terminate()  # the kernels of the notebooks still running exit with their process
            raise
    return sections


def finding_of(nb) -> str:
    """The text of the cell tagged finding (its Markdown or printed output), '' when the notebook has none."""
    for cell in nb.cells:
        if cell.cell_type == "code" and FINDING_TAG in cell.metadata.get("tags", []):
            for output in cell.get("outputs", []):
                data = output.get("data", {})
                text = data.get("text/markdown") or data.get("text/plain") or output.get("text", "")
                if text:
                    return " ".join(text.split())
    return ""


def skip(notebook: Path, params: dict, why: str) -> Section:
    """A section that was not run, with the sentence that says why."""
    return Section(notebook.stem, title_of(notebook), "", 0.0, params, skipped=why)


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
    return {
        "commit": commit,
        "dirty": dirty,
        "python": platform.python_version(),
        "packages": versions,
        "built": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _traces_note(merged: dict[str, dict]) -> str:
    """Whether the real traces were there for this build: one sentence, or one per trace folder when the
    notebooks were given different folders (merged: each notebook's parameters, defaults included)."""
    from kvlab.sections.s04_traces import availability_note

    folders: dict[str, list[str]] = {}
    for stem, values in merged.items():
        if "TRACE_DIR" in values:
            folders.setdefault(str(traces.trace_dir(values["TRACE_DIR"] or None)), []).append(stem)
    if len(folders) <= 1:
        return " ".join(availability_note(folder) for folder in folders)
    return " ".join(f"For {', '.join(stems)}: {availability_note(folder)}" for folder, stems in folders.items())


def skipped_sections(checked: CheckedParams) -> dict[str, str]:
    """The notebooks that cannot run here (the real traces they need are missing), each with why."""
    skipped = {}
    for nb in checked.notebooks:
        if "traces" in needs(nb):
            missing = traces.missing_traces(checked.merged[nb.stem].get("TRACE_DIR") or None)
            if missing:
                skipped[nb.stem] = (
                    f"not built: it needs the real request traces, and {', '.join(missing)} "
                    f"{'is' if len(missing) == 1 else 'are'} not in the trace folder "
                    "(run make traces or set TRACE_DIR)"
                )
    return skipped


def build(
    params_path: Path,
    overrides: list[str],
    out: Path = REPORT_DIR,
    *,
    notebook_dir: Path = NOTEBOOK_DIR,
    pdf: bool = True,
    max_minutes: float = MAX_MINUTES,
    log=print,
) -> Path:
    """Build the whole report into out atomically; raise ReportError on bad parameters or a failed notebook."""
    return build_checked(check_params(params_path, overrides, notebook_dir, max_minutes, log), out, pdf=pdf, log=log)


def build_checked(checked: CheckedParams, out: Path = REPORT_DIR, *, pdf: bool = True, log=print) -> Path:
    """Build the report of parameters check_params passed into out atomically; raise ReportError on a failed
    notebook."""
    notebooks, params, merged = checked.notebooks, checked.given, checked.merged
    skipped = skipped_sections(checked)
    quiet_kernels()
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-build-", dir=out.parent))
    (tmp / "notebooks").mkdir()
    total_start = time.perf_counter()

    def rendered(sec: Section) -> Section:  # a section's page, written while the other notebooks run
        executed = tmp / "notebooks" / f"{sec.stem}.ipynb"
        sec.body = render.section_body(executed, sec)
        sec.validation = render.validation_body(executed, sec)
        key_figure(executed, tmp, sec)
        (tmp / f"{sec.stem}.html").write_text(render.section_page(sec))
        return sec

    try:
        executed = execute_all(checked, [nb for nb in notebooks if nb.stem not in skipped], tmp, log, rendered)
        sections = []
        for nb in notebooks:
            if nb.stem in skipped:
                sec = skip(nb, params[nb.stem], skipped[nb.stem])
                log(f"report: {nb.name} {sec.skipped}", flush=True)
                sec.body = render.skipped_body(sec)
                (tmp / f"{nb.stem}.html").write_text(render.section_page(sec))
            else:
                sec = executed[nb.stem]
            sections.append(sec)
        set_aside = {
            int(stem[:2]): why for stem, values in merged.items() if (why := parameters.departures(stem, values))
        }
        ledger = ledger_mod.set_aside(
            ledger_mod.collect(sorted((tmp / "ledger").glob("*.csv")), sources=tuple(ledger_mod.SOURCES)), set_aside
        )
        for sec in sections:  # a section that was not built says why its figures are missing
            if sec.skipped:
                ledger.loc[(ledger["section"] == sec.number) & (ledger["status"] == "missing"), "why"] = (
                    f"section {sec.number} was {sec.skipped}"
                )
        ledger.to_csv(tmp / "ledger.csv", index=False, float_format="%.10g", lineterminator="\n")
        shutil.rmtree(tmp / "ledger", ignore_errors=True)
        logs = [tmp / f"sweeps-{nb.stem}.jsonl" for nb in notebooks]  # execute's, in the notebooks' order
        info = provenance() | {"sweeps": [str(run) for log_path in logs for run in sweep.read_log(log_path)]}
        for log_path in logs:
            log_path.unlink(missing_ok=True)
        index = render.index_body(sections, ledger, info, params, _traces_note(merged), set_aside)
        ledger_html = render.ledger_body(ledger)
        (tmp / "index.html").write_text(render.page(render.TITLE, index))
        (tmp / "ledger.html").write_text(render.page("The reproduction ledger", render.NAV + ledger_html))
        validation_html = render.validation_page_body(sections)
        (tmp / "validation.html").write_text(render.page(render.VALIDATION_TITLE, render.NAV + validation_html))
        if pdf:
            log("report: rendering report.pdf ...", end=" ", flush=True)
            pdf_start = time.perf_counter()
            document = render.pdf_document(index, sections, validation_html, provenance()["built"])
            pages = render.write_pdf(document, tmp / "report.pdf", tmp)
            (tmp / "report-pages.json").write_text(json.dumps(pages, indent=1) + "\n")
            log(f"ok ({pages['num_pages']} pages, {time.perf_counter() - pdf_start:.1f} s)", flush=True)
        readme = out / "README.md"
        if readme.exists():
            shutil.copy2(readme, tmp / "README.md")
        tmp.chmod(0o755)
        _replace(out, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    counts = []
    for source, name in ledger_mod.SOURCE_NAMES.items():
        s = ledger_mod.summary(ledger, source)
        if s["total"]:
            counts.append(
                f"{name}: {s['pass']} of {s['compared']} figures reproduced, {s['fail']} not within "
                f"tolerance, {s['missing']} missing"
                + (f", {s['not_compared']} not compared: other parameters than its" if s["not_compared"] else "")
            )
    log(
        f"report: done in {time.perf_counter() - total_start:.1f} s: {out}/index.html, "
        f"{'report.pdf, ' if pdf else ''}ledger.csv ({'; '.join(counts)})"
    )
    return out


def quiet_kernels() -> None:
    """Kernels started for the report log nothing short of a crash, wherever `kvlab report` runs (make report sets
    the same up): not the transport warning every kernel start prints, nor the interrupt papermill's shutdown logs."""
    ipython_dir = Path(os.environ.setdefault("IPYTHONDIR", str(ROOT / ".cache" / "ipython")))
    config = ipython_dir / "profile_default" / "ipython_kernel_config.py"
    if not config.exists():
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text('c.IPKernelApp.log_level = "CRITICAL"\n')


def key_figure(executed: Path, out_dir: Path, section: Section) -> None:
    """Save the figure of the cell tagged key-figure as figures/<stem>.png and note it (and its caption) in section."""
    import nbformat

    for cell in nbformat.read(executed, as_version=4).cells:
        if cell.cell_type == "code" and KEY_FIGURE_TAG in cell.metadata.get("tags", []):
            for output in cell.get("outputs", []):
                if "image/png" in output.get("data", {}):
                    (out_dir / "figures").mkdir(exist_ok=True)
                    (out_dir / "figures" / f"{section.stem}.png").write_bytes(
                        base64.b64decode(output["data"]["image/png"])
                    )
                    section.key_figure = f"figures/{section.stem}.png"
                    section.key_caption = output.get("metadata", {}).get("image/png", {}).get("alt", "")
                    return


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
