"""The front page's findings: a few sentences of what the report found, each number read from the ledger (kvlab's
value beside its source's) or from a section's own finding sentence (its cell tagged finding)."""

from __future__ import annotations

from kvlab.sections.shared import ledger as ledger_mod
from kvlab.sections.shared import present

# The figures that state each of the article's three claims (section, table, row, column), in the order told.
ARTICLE_CLAIMS = {
    1: [
        (1, "allocation", "16", "waste_pct"),
        (1, "allocation", "4096", "waste_pct"),
        (1, "claims", "16 vs 4096", "fit_ratio"),
    ],
    2: [(2, "claims", "static vs continuous", "mean_latency_ratio")],
    3: [(3, "fit", "1000", "max_num_requests"), (3, "fit", "128000", "max_num_requests")],
}
# The vLLM paper's figures that say what its experiment shows: vLLM's lead in sustained rate over each baseline, on
# the dataset the paper states it for (data/paper_figures.csv, §6.2).
PAPER_CLAIMS_DATASET = "ShareGPT"
PAPER_CLAIMS = [
    (6, "s6.2", "vLLM over Orca (Max)", "sustained_rate_ratio_x"),
    (6, "s6.2", "vLLM over Orca (Oracle)", "sustained_rate_ratio_x"),
]


def _figures(ledger, keys) -> list[dict] | None:
    """The ledger rows of keys with their printed values ("kvlab", "source" at the source's decimals), or None when
    one is not there or was not reproduced (its section not built or set aside)."""
    published = ledger_mod.figures().set_index(ledger_mod.KEY)
    indexed = ledger.set_index(ledger_mod.KEY)
    found = []
    for key in keys:
        if key not in indexed.index or indexed.loc[key, "status"] not in ("pass", "fail"):
            return None
        row, figure = indexed.loc[key], published.loc[key]
        decimals = int(figure["decimals"])
        found.append(
            {
                "kvlab": present.cell(row["reproduced"], decimals),
                "source": present.published(figure, decimals),
                "pass": row["status"] == "pass",
            }
        )
    return found


def article_finding(ledger) -> str:
    """The article's three claims in one sentence, kvlab's numbers beside the article's ('' when none was built)."""
    clauses, held = [], []
    s1 = _figures(ledger, ARTICLE_CLAIMS[1])
    if s1:
        small, large = (int(key[2]) for key in ARTICLE_CLAIMS[1][:2])
        clauses.append(
            f"blocks of {small} tokens waste {s1[0]['kvlab']}% of reserved KV memory against {s1[1]['kvlab']}% "
            f"for reservations of {large:,}, so {s1[2]['kvlab']}x as many requests fit (the article: "
            f"{s1[0]['source']}%, {s1[1]['source']}%, {s1[2]['source']}x)"
        )
        held.append(all(f["pass"] for f in s1))
    s2 = _figures(ledger, ARTICLE_CLAIMS[2])
    if s2:
        clauses.append(
            f"continuous batching cuts mean latency {s2[0]['kvlab']}x against static batching (the article: "
            f"{s2[0]['source']}x)"
        )
        held.append(s2[0]["pass"])
    s3 = _figures(ledger, ARTICLE_CLAIMS[3])
    if s3:
        short, long = (int(key[2]) for key in ARTICLE_CLAIMS[3])
        clauses.append(
            f"a request's KV memory grows with its context, so {s3[0]['kvlab']} requests fit at {short:,} "
            f"tokens and {s3[1]['kvlab']} at {long:,} (the article: {s3[0]['source']} and {s3[1]['source']})"
        )
        held.append(all(f["pass"] for f in s3))
    if not clauses:
        return ""
    lead = (
        "The article's three claims hold"
        if len(held) == 3 and all(held)
        else f"Of the article's claims, {sum(held)} of {len(held)} hold within their tolerances"
    )
    return f"{lead}: {present.joined(clauses)}."


def paper_finding(ledger) -> str:
    """What the vLLM paper's experiment shows on kvlab's engine, and how many of its figures kvlab reproduces."""
    counted = ledger_mod.summary(ledger, "vllm-paper") if "source" in ledger else {"total": 0}
    figures = _figures(ledger, PAPER_CLAIMS)
    if not counted["total"] or figures is None:
        return ""
    over_max, over_oracle = figures
    return (
        f"The vLLM paper's experiment on kvlab's engine, with a mid-2023 scheduler (vLLM 0.1.4; the paper names no version) and a clock of "
        f"its system fitted to independent measurements: on {PAPER_CLAIMS_DATASET} vLLM sustains {over_max['kvlab']}x "
        f"Orca (Max)'s request rate (the paper: {over_max['source']}x) and {over_oracle['kvlab']}x Orca (Oracle)'s (the paper: "
        f"{over_oracle['source']}x); {counted['pass']} of the paper's {counted['compared']} figures are within "
        "tolerance."
    )


# What each finding rests on, said after it (the kinds of evidence: arithmetic, kvlab's engine, a time model, a real
# vLLM run, a GPU measurement).
EVIDENCE = {
    "article": "arithmetic on the article's model (section 3) and on request lengths drawn from a distribution "
    "fitted to the article's totals (section 1), and kvlab's slot model of its workload (section 2), each figure in "
    "the ledger",
    4: "three public request traces, counted",
    5: "GPU measurements (whole-model operator profiles, vLLM's kernels timed one at a time, kvlab's own H200) "
    "composed into kvlab's measured clock, and that clock set against real vLLM runs",
    "paper": "kvlab's engine with a clock of the 2023 system: its whole step fitted to an independent benchmark "
    "(Anyscale's, June 2023) and its attention term to the paper's own kernel timings (Fig. 18a), never to a figure "
    "the ledger holds it to",
    7: "kvlab's engine (vLLM 0.33's scheduler, matched against vLLM's own decision by decision) on the measured clock, "
    "corrected by that clock's error on a real vLLM run",
    8: "kvlab's engine as each instance, behind each router as its code writes it, on a public trace, on the "
    "section's clock",
}
# The question each section's finding answers on the front page (sections 1-3 and 6 are said through the ledger).
QUESTIONS = {
    4: "What real traces change",
    5: "What a step costs in time",
    7: "How to configure vLLM for a workload",
    8: "What a fleet's router changes",
}


def findings(ledger, sections) -> list[str]:
    """The front page's findings, each followed by its evidence: the article's claims, what real traces change
    (section 4's finding), what a step costs in time (section 5's), what the vLLM paper's experiment shows, how to
    configure vLLM for a workload (section 7's), what a fleet's router changes (section 8's); a sentence is left out
    when what it needs was not built."""
    by_number = {s.number: s for s in sections}

    def said(text: str, evidence: str) -> str:
        return f"{text} Evidence: {evidence}." if text else ""

    def section(number: int) -> str:
        sec = by_number.get(number)
        return said(f"{QUESTIONS[number]}: {sec.finding}", EVIDENCE[number]) if sec is not None and sec.finding else ""

    lines = [
        said(article_finding(ledger), EVIDENCE["article"]),
        section(4),
        section(5),
        said(paper_finding(ledger), EVIDENCE["paper"]),
        section(7),
        section(8),
    ]
    return [line for line in lines if line]
