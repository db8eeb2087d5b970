"""The report build: parameters checked first, atomic replacement, every ledger row on the index."""

import html
import re
import shutil

import nbformat
import pandas as pd
import pytest

import kvlab.report.build as report_build
import kvlab.report.params as report_params
from conftest import ROOT
from kvlab.sections.shared import ledger

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _params(tmp_path, text):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, overrides, message",
    [
        (
            "03_capacity:\n  NUM_LAYERS: -1\n",
            [],
            "03_capacity.NUM_LAYERS=-1 is not allowed: must be an integer from 1 to 1,000,000,000 (from params.yaml)",
        ),
        (
            "03_capacity:\n  NUM_LAYRES: 32\n",
            [],
            "03_capacity.NUM_LAYRES=32 is not allowed: 03_capacity has parameters",
        ),
        ("99_nothing:\n  X: 1\n", [], "notebook '99_nothing' is not allowed"),
        ("03_capacity:\n  CONTEXTS: 1000\n", [], "03_capacity.CONTEXTS=1000 is not allowed: must be a list like [1000"),
        (
            "02_batching:\n  NUM_REQUESTS: many\n",
            [],
            "02_batching.NUM_REQUESTS='many' is not allowed: must be an integer like 600",
        ),
        (
            "",
            ["03_capacity.GPU_MEMORY_GIB=0"],
            "03_capacity.GPU_MEMORY_GIB=0 is not allowed: must be a number from 0.001 to 100,000 GiB (from --set)",
        ),
        (
            "",
            ["03_capacity.WEIGHTS_GIB=90"],
            "03_capacity.WEIGHTS_GIB=90 is not allowed: must be below GPU_MEMORY_GIB=80",
        ),
        (
            "",
            ["03_capacity.PLAN_GPU=H100"],
            "03_capacity.PLAN_GPU='H100' is not allowed: not a gpu of data/gpus.csv; did you mean H100-SXM-80GB",
        ),
        (
            "",
            ["03_capacity.TABLE_MODELS=[Qwen3-14]"],
            "03_capacity.TABLE_MODELS[0]='Qwen3-14' is not allowed: not a model of data/models.csv; did you mean Qwen/Qwen3-14B",
        ),
        (
            "",
            ["05_calibration.GPUS=[H200]"],
            "05_calibration.GPUS[0]='H200' is not allowed: not a gpu of data/gpus.csv; did you mean H200-141GB",
        ),
        (
            "",
            ["TRACE_DIR=/no/such/folder"],
            "01_allocation.TRACE_DIR='/no/such/folder' is not allowed: must be an existing folder",
        ),
        ("", ["02_batching.SWEEP_RATES=[8, 7]"], "02_batching.SWEEP_RATES=[8, 7] is not allowed: must be increasing"),
        (
            "",
            ["02_batching.ARRIVAL_RATE=1e-300"],
            "02_batching.ARRIVAL_RATE=1e-300 is not allowed: must be a number from 0.001 to 1,000,000 requests/s",
        ),
        ("", ["NO_SUCH_PARAM=3"], "no notebook has a parameter 'NO_SUCH_PARAM'"),
        ("", ["GPU_MEMORY_GIB"], "must look like NOTEBOOK.NAME=VALUE or NAME=VALUE"),
    ],
)
def test_bad_parameters_fail_before_any_notebook_runs(tmp_path, text, overrides, message):
    with pytest.raises(report_params.ReportError, match=re.escape(message)):
        report_params.load_params(_params(tmp_path, text), overrides, NOTEBOOKS)


def test_overrides_reach_the_right_notebook(tmp_path):
    params = report_params.load_params(
        _params(tmp_path, "03_capacity:\n  WEIGHTS_GIB: 16\n"),
        ["03_capacity.GPU_MEMORY_GIB=141", "WEIGHTS_GIB=20"],
        NOTEBOOKS,
    )
    assert params["03_capacity"] == {"WEIGHTS_GIB": 20, "GPU_MEMORY_GIB": 141}


def test_the_committed_params_file_is_valid():
    params = report_params.load_params(ROOT / "params.yaml", [], NOTEBOOKS)
    assert set(params) == {nb.stem for nb in NOTEBOOKS}


def _notebook(path, source):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cells = [
        nbformat.v4.new_markdown_cell("# A test section"),
        nbformat.v4.new_code_cell("X = 1  # a number"),
        nbformat.v4.new_code_cell(source),
    ]
    cells[1].metadata["tags"] = ["parameters"]
    nb.cells = cells
    nbformat.write(nb, path)


def test_a_failing_notebook_leaves_the_previous_report(tmp_path):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    _notebook(notebooks / "01_ok.ipynb", "print('fine')")
    _notebook(notebooks / "02_bad.ipynb", "raise ValueError(f'X={X} is not allowed: must be 2')")
    out = tmp_path / "report"
    out.mkdir()
    (out / "index.html").write_text("the previous report")
    with pytest.raises(report_params.ReportError) as error:
        report_build.build(_params(tmp_path, ""), [], out, notebook_dir=notebooks, pdf=False, log=lambda *a, **k: None)
    assert str(error.value) == "notebook 02_bad.ipynb failed in cell 2: ValueError: X=1 is not allowed: must be 2"
    assert (out / "index.html").read_text() == "the previous report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notebooks", "params.yaml", "report"]


def test_notebooks_run_two_at_a_time_in_order_of_their_estimates_where_memory_holds_both(monkeypatch):
    """Two at once on two cores or more, the longest by its estimate first (section 8's fleets); one at a time where
    the two heaviest would not fit in memory together, or on one core."""
    checked = report_params.check_params(ROOT / "params.yaml", [], log=lambda *a, **k: None)
    notebooks = checked.notebooks
    monkeypatch.setattr(report_build.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(report_build.resources, "available_memory_bytes", lambda: 64 * 2**30)
    assert report_build.num_at_once(checked, notebooks) == 2
    assert [nb.stem for nb in report_build.longest_first(checked, notebooks)[:2]] == ["08_fleet", "06_memory_budget"]
    peaks = sorted(report_build.parameters.estimate(nb.stem, checked.merged[nb.stem]).peak_bytes for nb in notebooks)
    too_little = int(sum(peaks[-2:]) / report_build.resources.USABLE_SHARE) - 1
    monkeypatch.setattr(report_build.resources, "available_memory_bytes", lambda: too_little)
    assert report_build.num_at_once(checked, notebooks) == 1
    monkeypatch.setattr(report_build.resources, "available_memory_bytes", lambda: 64 * 2**30)
    monkeypatch.setattr(report_build.os, "cpu_count", lambda: 1)
    assert report_build.num_at_once(checked, notebooks) == 1


def test_a_failing_notebook_stops_the_one_running_beside_it(tmp_path, monkeypatch):
    """A notebook fails while another runs for minutes beside it: the build stops at once, with the failure's line."""
    monkeypatch.setattr(report_build.os, "cpu_count", lambda: 2)
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    _notebook(notebooks / "01_slow.ipynb", "import time\ntime.sleep(300)")
    _notebook(notebooks / "02_bad.ipynb", "raise ValueError(f'X={X} is not allowed: must be 2')")
    with pytest.raises(report_params.ReportError, match="notebook 02_bad.ipynb failed in cell 2"):
        report_build.build(
            _params(tmp_path, ""), [], tmp_path / "report", notebook_dir=notebooks, pdf=False, log=lambda *a, **k: None
        )


def test_a_kernel_that_dies_is_one_line_naming_the_notebook_and_the_likely_cause(tmp_path):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    _notebook(notebooks / "01_dies.ipynb", "import os\nos._exit(9)  # as the kernel the out-of-memory killer ends")
    out = tmp_path / "report"
    with pytest.raises(report_params.ReportError) as error:
        report_build.build(_params(tmp_path, ""), [], out, notebook_dir=notebooks, pdf=False, log=lambda *a, **k: None)
    assert re.fullmatch(
        r"notebook 01_dies\.ipynb: its kernel died, most likely out of memory \([\d.]+ GiB available "
        r"now\); lower its NUM_REQUESTS or NUM_SEEDS",
        str(error.value),
    ), str(error.value)
    assert not out.exists()


def test_build_writes_pages_and_ledger_and_replaces_old_files(tmp_path):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    _notebook(notebooks / "01_ok.ipynb", "print('headline: 42 requests')")
    out = tmp_path / "report"
    out.mkdir()
    (out / "stale.html").write_text("old")
    report_build.build(
        _params(tmp_path, "01_ok:\n  X: 5\n"), [], out, notebook_dir=notebooks, pdf=True, log=lambda *a, **k: None
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "01_ok.html",
        "index.html",
        "ledger.csv",
        "ledger.html",
        "notebooks",
        "report-pages.json",
        "report.pdf",
        "validation.html",
    ]
    index = (out / "index.html").read_text()
    assert "headline: 42 requests" in index and 'href="01_ok.html"' in index and "X=5" in index
    assert (out / "report.pdf").read_bytes().startswith(b"%PDF")
    assert "print(" not in (out / "01_ok.html").read_text()  # no code on section pages
    assert 'href="index.html"' in (out / "01_ok.html").read_text()


def test_the_ledger_page_lists_every_figure_and_the_index_every_one_not_reproduced():
    from kvlab.report import render
    from kvlab.sections.shared import present

    rows = ledger.collect([])
    page = render.ledger_body(rows)
    for _, r in rows.iterrows():
        figure = f"{ledger.table_name(r['table'])}: {r['row']}, {present.label(r['column'])}"
        assert f'<td class="">{html.escape(figure)}</td>' in page
    assert page.count("– missing") == 2 * len(rows)  # each one not reproduced: in the first table and its section's
    index = render.index_body([], rows, report_build.provenance(), {}, "", {})
    assert (
        f"<strong>0 of {len(rows)}</strong> figures the article publishes reproduced (0 not within tolerance, "
        f"{len(rows)} missing)" in index
    )
    assert "– missing" not in index and 'href="ledger.html"' in index  # the table of misses is on the ledger page
    assert "What the report found" not in index  # nothing was built, so nothing is claimed


def _built(values):
    """The whole ledger, with each key of values reproduced as that value (or (median, band low, band high)) and every
    other figure missing."""
    reproduced = pd.DataFrame(
        [
            dict(zip(ledger.KEY, key), reproduced=v[0], band_low=v[1], band_high=v[2])
            if isinstance(v, tuple)
            else dict(zip(ledger.KEY, key), reproduced=v)
            for key, v in values.items()
        ]
    )
    return ledger.compare(reproduced, sources=tuple(ledger.SOURCES))


def test_the_front_page_leads_with_findings_read_from_the_ledger_and_a_sentence_per_section():
    from kvlab.report import findings, render
    from kvlab.report.render import Section

    values = {
        (1, "allocation", "16", "waste_pct"): 1.312,
        (1, "allocation", "4096", "waste_pct"): 86.194,
        (1, "claims", "16 vs 4096", "fit_ratio"): 7.133,
        (2, "claims", "static vs continuous", "mean_latency_ratio"): (4.408, 4.05, 4.89),
        (3, "fit", "1000", "max_num_requests"): 131,
        (3, "fit", "128000", "max_num_requests"): 1,
        (6, "s6.2", "vLLM over Orca (Max)", "sustained_rate_ratio_x"): 4.0,
        (6, "s6.2", "vLLM over Orca (Oracle)", "sustained_rate_ratio_x"): 1.41,
    }
    rows = _built(values)
    sections = [
        Section("04_traces", "4. Traces", finding="Real prompts are long."),
        Section("06_memory_budget", "6. Budget", "headline", finding="vLLM sustains 4.00x."),
    ]
    lines = findings.findings(rows, sections)
    assert lines[0] == (
        "The article's three claims hold: blocks of 16 tokens waste 1.3% of reserved KV memory against "
        "86.2% for reservations of 4,096, so 7.1x as many requests fit (the article: 1.3%, 86.2%, 7.1x), "
        "continuous batching cuts mean latency 4.4x against static batching (the article: 4.4x) and a "
        "request's KV memory grows with its context, so 131 requests fit at 1,000 tokens and 1 at "
        "128,000 (the article: 131 and 1). Evidence: arithmetic on the article's model (section 3) and on request "
        "lengths drawn from a distribution fitted to the article's totals (section 1), and kvlab's slot model of its "
        "workload (section 2), each figure in the ledger."
    )
    assert lines[1] == "What real traces change: Real prompts are long. Evidence: three public request traces, counted."
    assert lines[2].startswith(
        "The vLLM paper's experiment on kvlab's engine, with a mid-2023 scheduler (vLLM 0.1.4; the paper names no "
        "version) "
        "and a clock of its system fitted to independent measurements: on ShareGPT vLLM sustains 4.0x Orca "
        "(Max)'s request rate (the paper: 2.7 to 8.0x) and 1.4x Orca (Oracle)'s (the paper: 1.7 "
        "to 2.7x); 1 of"
    )
    assert lines[2].endswith(
        "Evidence: kvlab's engine with a clock of the 2023 system: its whole step fitted to an independent benchmark "
        "(Anyscale's, June 2023) and its attention term to the paper's own kernel timings (Fig. 18a), never to a "
        "figure the ledger holds it to."
    )
    with_time = findings.findings(rows, [*sections, Section("05_calibration", "5. Time", finding="A step: 8 ms.")])
    assert with_time[2].startswith("What a step costs in time: A step: 8 ms. Evidence: GPU measurements")
    index = render.index_body(sections, rows, report_build.provenance(), {}, "", {})
    assert index.index("What the report found") < index.index("Sections") < index.index("Reproduction ledger")
    assert "<p>vLLM sustains 4.00x.</p>" in index and "<pre>headline</pre>" not in index
    # a claim that misses its tolerance is not said to hold
    missed = findings.article_finding(
        _built(values | {(2, "claims", "static vs continuous", "mean_latency_ratio"): (2.0, 1.5, 2.5)})
    )
    assert missed.startswith("Of the article's claims, 2 of 3 hold within their tolerances: ")


def test_a_section_run_with_other_settings_than_the_articles_is_not_compared():
    from kvlab.report import render

    rows = ledger.set_aside(ledger.collect([]), {3: "GPU_MEMORY_GIB=141 (the article's 80)"})
    summary = ledger.summary(rows)
    assert (
        summary["not_compared"] == (rows["section"] == 3).sum()
        and summary["compared"] == len(rows) - summary["not_compared"]
    )
    index = render.index_body([], rows, report_build.provenance(), {}, "", {3: "GPU_MEMORY_GIB=141 (the article's 80)"})
    assert "section 3 ran with GPU_MEMORY_GIB=141 (the article's 80)" in index


def _outputs(path):
    nb = nbformat.read(path, as_version=4)
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def test_two_builds_give_identical_numbers(tmp_path, built_report):
    """Section 1 (the quickest) built again, alone, gives the numbers of make report's own build (the one beside the
    tests): the same outputs and the same ledger rows."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    shutil.copy(ROOT / "notebooks" / "01_allocation.ipynb", notebooks)
    import yaml

    only_01 = {"01_allocation": yaml.safe_load((ROOT / "params.yaml").read_text())["01_allocation"]}
    params = _params(tmp_path, yaml.safe_dump(only_01))
    a = report_build.build(params, [], tmp_path / "a", notebook_dir=notebooks, pdf=False, log=lambda *a, **k: None)
    b = built_report
    assert _outputs(a / "notebooks" / "01_allocation.ipynb") == _outputs(b / "notebooks" / "01_allocation.ipynb")
    rows, again = (pd.read_csv(out / "ledger.csv", dtype=str, keep_default_na=False) for out in (a, b))
    rows, again = (r[r["section"] == "1"].reset_index(drop=True) for r in (rows, again))
    pd.testing.assert_frame_equal(rows, again)
    assert len(rows) and (rows["status"] == "pass").all()


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_papermill_sees_every_parameter(notebook):
    """papermill skips a parameter line it cannot parse (e.g. '=' or quotes in its comment): catch that."""
    nb = nbformat.read(notebook, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    names = {line.split("=")[0].strip() for line in cell.source.splitlines() if line[:1].isupper() and "=" in line}
    assert set(report_params.notebook_parameters(notebook)) == names


@pytest.mark.parametrize(
    "override, message",
    [
        ("01_allocation.LENGTHS=zipf", "01_allocation.LENGTHS='zipf' is not allowed: must be one of article-s1"),
        (
            "01_allocation.BLOCK_SIZES=[16, 0]",
            "01_allocation.BLOCK_SIZES[1]=0 is not allowed: must be an integer from 1 to 1,048,576 tokens",
        ),
        (
            "02_batching.ARRIVAL_RATE=-2",
            "02_batching.ARRIVAL_RATE=-2 is not allowed: must be a number from 0.001 to 1,000,000 requests/s",
        ),
        ("02_batching.BAND_LOW_PCT=96", "02_batching.BAND_LOW_PCT=96 is not allowed: must be below BAND_HIGH_PCT=95.0"),
        ("SEED=-1", "SEED=-1 is not allowed: must be an integer from 0 to"),
        (
            "03_capacity.GPU_MEMORY_UTILIZATION=1.5",
            "GPU_MEMORY_UTILIZATION=1.5 is not allowed: must be a number in (0, 1]",
        ),
    ],
)
def test_semantic_rules_name_the_parameter(override, message):
    with pytest.raises(report_params.ReportError, match=re.escape(message)):
        report_params.load_params(ROOT / "params.yaml", [override], NOTEBOOKS)


def test_index_says_whether_traces_were_available(tmp_path):
    rows = ledger.collect([])
    from kvlab.report import render

    absent = render.index_body(
        [], rows, report_build.provenance(), {}, report_build._traces_note({"x": {"TRACE_DIR": str(tmp_path)}}), {}
    )
    assert "Real request traces were not available" in absent and "set TRACE_DIR or run make traces" in absent


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_parameter_has_a_rule_and_every_rule_a_parameter(notebook):
    from kvlab.sections.shared import parameters

    declared = set(report_params.notebook_parameters(notebook)) - {"LEDGER_CSV"}  # LEDGER_CSV: set by the report
    assert set(parameters.RULES[notebook.stem]) == declared


def test_trace_parameter_is_checked():
    with pytest.raises(
        report_params.ReportError, match="TRACE='azur' is not allowed: must be one of azure, mooncake, sharegpt"
    ):
        report_params.load_params(ROOT / "params.yaml", ["TRACE=azur"], NOTEBOOKS)
    assert report_params.load_params(ROOT / "params.yaml", ["TRACE="], NOTEBOOKS)["01_allocation"]["TRACE"] == ""


def test_two_trace_folders_get_one_sentence_each_naming_their_notebooks(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    note = report_build._traces_note(
        {
            "01_allocation": {"TRACE_DIR": str(empty)},
            "02_batching": {"TRACE_DIR": str(empty)},
            "04_traces": {"TRACE_DIR": str(ROOT / "data")},
            "03_capacity": {},
        }
    )
    assert note.count("For ") == 2 and "For 01_allocation, 02_batching: Real request traces were not available" in note
    assert "03_capacity" not in note  # a notebook without traces is not mentioned
    same = report_build._traces_note(
        {"01_allocation": {"TRACE_DIR": str(empty)}, "02_batching": {"TRACE_DIR": str(empty)}}
    )
    assert not same.startswith("For ") and same.count("Real request traces") == 1


# Terms of kvlab's own (and vLLM's) that a reader cannot decode without a definition.
REPORT_TERMS = (
    "measured clock",
    "roofline clock",
    "twins",
    "rung",
    "knee",
    "regime",
    "sustains",
    "null block",
    "KV cache groups",
    "watermark",
    "goodput",
    "normalized latency",
    "preemption",
    "token states",
    "composed clock",
    "AIConfigurator",
    "LLMServingSim",
    "Vidur",
    "nccl-tests",
    "FlyDSL",
    "AITER",
    "TP, DP, EP",
    "gpu_memory_utilization",
)
# Pointers a section page may not use for what it moved to the validation chapter: the chapter is named instead.
STALE_POINTERS = ("further down", "checked at the end", "last part of this section", "the check above")


def test_a_section_page_names_the_validation_chapter_for_what_it_moved_there():
    import json

    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text())["cells"]:
            if "validation" in cell["metadata"].get("tags", []):
                continue
            text = "".join(cell["source"]) + "".join(
                "".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/markdown", ""))
                for o in cell.get("outputs", [])
            )
            assert [p for p in STALE_POINTERS if p in text] == [], (path.name, text[:200])


def test_every_report_term_the_notebooks_use_is_defined_in_the_glossary_before_any_section():
    import json

    from kvlab.report import render
    from kvlab.report.glossary import GLOSSARY

    text = ""
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text())["cells"]:
            text += "".join(cell["source"]) if cell["cell_type"] == "markdown" else ""
            for output in cell.get("outputs", []):
                text += "".join(output.get("text", "")) + "".join(output.get("data", {}).get("text/markdown", ""))
    defined = " | ".join(GLOSSARY).lower()
    used = [t for t in REPORT_TERMS if t.lower() in text.lower()]
    assert len(used) >= 10  # the report does use them
    assert [t for t in used if t.lower() not in defined] == []
    index = render.index_body([], ledger.collect([]), report_build.provenance(), {}, "", {})
    assert index.index('id="terms"') < index.index("Sections")
    assert "<dt>kvlab</dt>" in index


def test_each_section_opens_with_its_question_then_its_answer(tmp_path):
    from kvlab.report import render
    from kvlab.report.render import Section

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# 9. How much fits?\n\nThe evidence follows."),
        nbformat.v4.new_markdown_cell("## Evidence\n\nA table."),
    ]
    path = tmp_path / "09_fit.ipynb"
    nbformat.write(notebook, path)
    body = render.section_body(path, Section("09_fit", "9. How much fits?", finding="Twelve requests fit."))
    assert body.index("How much fits?") < body.index("The answer, in short: </strong>Twelve requests fit.")
    assert body.index("Twelve requests fit.") < body.index("The evidence follows.")
    assert "The answer, in short" not in render.section_body(path, Section("09_fit", "9. How much fits?"))


def test_validation_cells_leave_their_section_for_the_closing_chapter(tmp_path):
    from kvlab.report import render
    from kvlab.report.render import Section

    notebook = nbformat.v4.new_notebook()
    evidence = nbformat.v4.new_markdown_cell("## Evidence\n\nTwelve rows.")
    checked = nbformat.v4.new_markdown_cell("## Reproduction ledger\n\nEvery row within tolerance.")
    checked.metadata["tags"] = [render.VALIDATION_TAG]
    notebook.cells = [nbformat.v4.new_markdown_cell("# 9. How much fits?"), evidence, checked]
    path = tmp_path / "09_fit.ipynb"
    nbformat.write(notebook, path)
    section = Section("09_fit", "9. How much fits?")
    body, validation = render.section_body(path, section), render.validation_body(path, section)
    assert "Twelve rows" in body and "Every row within tolerance" not in body
    assert 'href="validation.html#validation-09_fit"' in body  # the section says where its checks went
    assert "Every row within tolerance" in validation and "Twelve rows" not in validation
    assert "<h3" in validation and "<h2>9. How much fits?</h2>" in validation  # its headings under the section's
    checked.metadata["tags"] = []
    nbformat.write(notebook, path)
    assert render.validation_body(path, section) == ""
    assert "validation.html" not in render.section_body(path, section)


VALIDATION_HEADINGS = ("reproduction ledger", "make parity", "against vllm's own code", "seed", "what each term")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_ledger_parity_seed_and_term_checks_sit_in_the_validation_chapter(notebook):
    """A heading of validation detail (the ledger, parity with vLLM, seeds, the clock's term checks) is tagged, and so
    is every cell under it up to the next heading of its level."""
    from kvlab.report.render import VALIDATION_TAG

    cells = nbformat.read(notebook, as_version=4).cells
    for i, cell in enumerate(cells):
        first = cell.source.lstrip().splitlines()[0] if cell.cell_type == "markdown" and cell.source.strip() else ""
        if first.startswith("##") and any(h in first.lower() for h in VALIDATION_HEADINGS):
            level = len(first) - len(first.lstrip("#"))
            for under in cells[i:]:
                head = under.source.lstrip().splitlines()[0] if under.cell_type == "markdown" and under.source else ""
                if under is not cell and head.startswith("#") and len(head) - len(head.lstrip("#")) <= level:
                    break
                if "finding" in under.metadata.get("tags", []):
                    break
                assert VALIDATION_TAG in under.metadata.get("tags", []), (
                    f"{notebook.name}: {first} ({under.source[:60]})"
                )
