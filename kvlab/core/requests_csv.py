"""The per-request CSV of an engine run (kvlab simulate --requests-csv): its columns and its writer.

A file of it reads back as a trace (kvlab.workloads.traces' plain CSV: arrival_s, prompt_tokens, output_tokens)."""

from __future__ import annotations

from kvlab.core import validate

# The columns of EngineResult.requests_table (request_id: 0-based input order; times in s), then the scheduling mode.
REQUESTS_CSV_COLUMNS = (
    "request_id",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "first_scheduled_s",
    "first_token_s",
    "finish_s",
    "num_preemptions",
    "scheduling",
)


def write_requests_csv(path: str, result, async_scheduling: bool) -> None:
    """One row per request of an EngineResult (or a fleet's FleetResult), REQUESTS_CSV_COLUMNS (with data
    parallelism, data_parallel_rank before scheduling; a fleet's, the instance), times in full float precision; scheduling is async or sync. A path that cannot be written is
    a one-line ValueError naming requests_csv."""
    table = result.requests_table()
    columns = tuple(table)
    assert columns[:8] == REQUESTS_CSV_COLUMNS[:-1], f"EngineResult.requests_table has columns {columns}"
    scheduling = "async" if async_scheduling else "sync"
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(",".join((*columns, REQUESTS_CSV_COLUMNS[-1])) + "\n")
            for row in zip(*(column.tolist() for column in table.values())):
                f.write(",".join(map(repr, row)) + f",{scheduling}\n")
    except OSError as err:
        validate.fail("requests_csv", path, f"cannot be written ({err.strerror or err})")
