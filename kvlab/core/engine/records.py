"""What the engine records: per request (times, preemptions) and per step (what section 6 plots)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

# How a run of the time loop (engine_core.run_sync, run_async) ended: every request finished, a compiled loop's chunk of step
# records is full, a step scheduled nothing (the Python engine then says why), or the clock reached the engine's until_s
# (a fleet's instance waits there for its router: kvlab.core.fleet); STEP: next_step found a step to take.
DONE, FULL, NO_PROGRESS, PAUSED, STEP = 0, 1, 2, 3, -1

# Per step, read after the step's update (vLLM's num_running / num_waiting are read right after schedule()):
STEP_FIELDS = (
    "start_s",
    "end_s",
    "num_scheduled_tokens",  # tokens computed in the step (prefill chunks + decodes)
    "num_running",  # requests in the running list after schedule()
    "num_waiting",  # requests waiting after schedule() (arrived, not running)
    "num_blocks_in_use",  # blocks requests hold after the step (reservations: reserved slots / block_size, up)
    "num_reserved_tokens",  # token slots held for the running requests: blocks x block_size, or reservations
    "num_kv_tokens",  # tokens whose KV the running requests hold (their computed tokens, prefix hits
    # included: a shared block counts once per request holding it) after the step
    "num_preemptions",  # requests preempted in the step
    "num_hit_tokens",  # prompt tokens the step's admissions found in the prefix cache
    # The vLLM paper's Fig. 2 split of num_reserved_tokens - num_kv_tokens (reservations: from the buddy allocator;
    # paged: every slot held beyond the token states is internal fragmentation, the empty end of a last block):
    "num_reservation_tokens",  # slots held for the requests' future tokens within their final lengths
    "num_internal_frag_tokens",  # slots held beyond the requests' final lengths, the buddy's rounding included
    "num_rounding_tokens",  # of those, the buddy's: chunk slots beyond the size asked
    "num_external_frag_tokens",  # free slots in buddy chunks too small for the waiting queue's head (0: none waits)
)


class RequestLog:
    """Per request, written once when it finishes (compact arrays; NaN until then): what EngineResult reports."""

    __slots__ = ("first_scheduled_s", "first_token_s", "finish_s", "num_preemptions", "num_output_tokens")

    def __init__(self, num_requests: int):
        self.first_scheduled_s = array("d", [math.nan]) * num_requests
        self.first_token_s = array("d", [math.nan]) * num_requests
        self.finish_s = array("d", [math.nan]) * num_requests
        self.num_preemptions = array("q", [0]) * num_requests
        self.num_output_tokens = array("q", [0]) * num_requests

    @classmethod
    def of(cls, first_scheduled_s, first_token_s, finish_s, num_preemptions, num_output_tokens) -> RequestLog:
        """A log of whole columns (float64 and int64 arrays, one entry a request)."""
        log = cls(0)
        log.first_scheduled_s = array("d", first_scheduled_s.tobytes())
        log.first_token_s = array("d", first_token_s.tobytes())
        log.finish_s = array("d", finish_s.tobytes())
        log.num_preemptions = array("q", num_preemptions.tobytes())
        log.num_output_tokens = array("q", num_output_tokens.tobytes())
        return log

    def finished(self, request, end_s: float) -> None:
        """Write a finished request's record."""
        i = request.request_id
        self.first_scheduled_s[i] = request.first_scheduled_s
        self.first_token_s[i] = request.first_token_s
        self.finish_s[i] = end_s
        self.num_output_tokens[i] = request.num_output_tokens
        self.num_preemptions[i] = request.num_preemptions

    def columns(self) -> tuple:
        """num_output_tokens, first_scheduled_s, first_token_s, finish_s and num_preemptions as arrays (EngineResult's
        order)."""
        return (
            np.frombuffer(self.num_output_tokens, "i8"),
            np.frombuffer(self.first_scheduled_s, "f8"),
            np.frombuffer(self.first_token_s, "f8"),
            np.frombuffer(self.finish_s, "f8"),
            np.frombuffer(self.num_preemptions, "i8"),
        )


class Recorder:
    """What a run keeps beyond the records every run has, asked for up front and passed to the engine whole: each
    step's batch and preemptions (scheduled), each step's block tables (block_ids: the per-step loop only) and every
    freed block table, in order (frees)."""

    def __init__(self, scheduled: bool = False, block_ids: bool = False, frees: bool = False):
        self.scheduled: list | None = [] if scheduled else None  # [([(request_id, tokens)], [preempted ids])]
        self.block_ids: list | None = [] if block_ids else None  # [[(request_id, block table)]]
        self.freed_tables: list | None = [] if frees else None  # [(request_id, block table)]

    def step(self, out) -> None:
        """Keep a step's batch (a SchedulerOutput) and its block tables, as asked."""
        if self.scheduled is not None:
            self.scheduled.append(
                ([(r.request_id, n) for r, n in out.scheduled], sorted(r.request_id for r in out.preempted))
            )
        if self.block_ids is not None:
            self.block_ids.append([(r.request_id, list(r.block_ids)) for r, _ in out.scheduled])

    def freed(self, request) -> None:
        """Keep a request's block table as it is freed (KV-cache managers call this)."""
        if self.freed_tables is not None:
            self.freed_tables.append((request.request_id, tuple(request.block_ids)))


class Runs:
    """A column of integers stored as runs of equal values (a decode run repeats the same counts k times)."""

    __slots__ = ("values", "counts")

    def __init__(self):
        self.values, self.counts = array("q"), array("q")

    def add(self, value: int, count: int = 1) -> None:
        """Append count copies of value."""
        if self.values and self.values[-1] == value:
            self.counts[-1] += count
        else:
            self.values.append(value)
            self.counts.append(count)

    def expand(self) -> np.ndarray:
        """The column, one value a step."""
        if not self.values:
            return np.zeros(0, dtype=np.int64)
        return np.repeat(np.frombuffer(self.values, dtype="i8"), np.frombuffer(self.counts, dtype="i8"))


class StepLog:
    """Per-step records, compact (24 bytes a step).

    Stored: each step's end time (its start is the previous step's end except after an idle gap, kept
    aside), what the running requests hold (blocks of the paged pool, or reserved token slots) and their
    computed tokens; scheduled tokens, running and waiting requests as runs of equal values; preemptions
    and prefix hits, rare, as (step, count) events; for a reservation pool also the final lengths of the
    chunks' holders, the buddy's rounding and the external fragmentation, as runs of equal values."""

    def __init__(self, block_size: int, paged: bool):
        self.block_size, self.paged = block_size, paged
        self.end_s = array("d")
        self.starts: list[tuple[int, float]] = []  # (step, start_s) where a step does not start at the last end
        self.held, self.num_kv_tokens = array("q"), array("q")
        self.num_scheduled_tokens, self.num_running, self.num_waiting = Runs(), Runs(), Runs()
        self.preemptions: list[tuple[int, int]] = []
        self.hits: list[tuple[int, int]] = []
        # Reservations only (empty when paged): final lengths of the chunks' holders, the buddy's rounding and the
        # external fragmentation, as runs (they change only when a chunk is taken or freed or the head changes).
        self.num_final_tokens, self.num_rounding_tokens, self.num_external_frag_tokens = Runs(), Runs(), Runs()

    def __len__(self) -> int:
        return len(self.end_s)

    def append(
        self,
        start_s: float,
        end_s: float,
        num_tokens: int,
        num_running: int,
        num_waiting: int,
        held: int,
        num_kv_tokens: int,
        num_preemptions: int = 0,
        num_hit_tokens: int = 0,
    ) -> None:
        """Add one step."""
        ends = self.end_s
        if not ends or ends[-1] != start_s:
            self.starts.append((len(ends), start_s))
        if num_preemptions:
            self.preemptions.append((len(ends), num_preemptions))
        if num_hit_tokens:
            self.hits.append((len(ends), num_hit_tokens))
        ends.append(end_s)
        self.held.append(held)
        self.num_kv_tokens.append(num_kv_tokens)
        self.num_scheduled_tokens.add(num_tokens)
        self.num_running.add(num_running)
        self.num_waiting.add(num_waiting)

    def add_split(self, num_final_tokens: int, num_rounding_tokens: int, num_external_frag_tokens: int) -> None:
        """Add a reservation pool's Fig. 2 counts for the last step added."""
        self.num_final_tokens.add(num_final_tokens)
        self.num_rounding_tokens.add(num_rounding_tokens)
        self.num_external_frag_tokens.add(num_external_frag_tokens)


SLICE_STEPS = 1 << 20  # steps a slice when a summary reads a long column piece by piece


class StepRecords(Mapping):
    """The per-step columns of STEP_FIELDS as numpy arrays, built from a StepLog when first asked for."""

    def __init__(self, log: StepLog):
        self._log, self._columns = log, {}

    def __len__(self) -> int:
        return len(STEP_FIELDS)

    def __iter__(self):
        return iter(STEP_FIELDS)

    @property
    def num_steps(self) -> int:
        """Steps recorded."""
        return len(self._log)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._columns:
            self._columns[name] = self._column(name)
        return self._columns[name]

    def slices(self, name: str, size: int = SLICE_STEPS):
        """The column in slices of size steps, without keeping it (a held column is sliced as it is)."""
        n = len(self._log)
        if name in self._columns or name not in ("num_reserved_tokens", "num_blocks_in_use"):
            column = self[name]
            return (column[low : low + size] for low in range(0, n, size))
        held = np.frombuffer(self._log.held, dtype="i8") if n else np.zeros(0, dtype=np.int64)
        return (self._from_held(name, held[low : low + size]) for low in range(0, n, size))

    def column_sum(self, name: str) -> int:
        """The sum of a column of STEP_FIELDS kept as runs of equal values (exact; the column is not expanded)."""
        runs = getattr(self._log, name)
        if not runs.values:
            return 0
        return int(np.dot(np.frombuffer(runs.values, dtype="i8"), np.frombuffer(runs.counts, dtype="i8")))

    def _from_held(self, name: str, held: np.ndarray) -> np.ndarray:
        """num_blocks_in_use or num_reserved_tokens from what the requests hold (blocks, or reserved slots)."""
        log = self._log
        if name == "num_blocks_in_use":
            return held if log.paged else -(-held // log.block_size)
        return held * log.block_size if log.paged else held

    def _column(self, name: str) -> np.ndarray:
        log, n = self._log, len(self._log)
        if name not in STEP_FIELDS:
            raise KeyError(name)

        def view(values, dtype):
            return np.frombuffer(values, dtype=dtype) if n else np.zeros(0, dtype=dtype)

        if name == "end_s":
            return view(log.end_s, "f8")
        if name == "start_s":
            start = np.empty(n)
            start[1:] = self["end_s"][:-1]
            for step, start_s in log.starts:
                start[step] = start_s
            return start
        if name in ("num_scheduled_tokens", "num_running", "num_waiting"):
            return getattr(log, name).expand()
        if name == "num_kv_tokens":
            return view(log.num_kv_tokens, "i8")
        held = view(log.held, "i8")
        if name in (
            "num_reservation_tokens",
            "num_internal_frag_tokens",
            "num_rounding_tokens",
            "num_external_frag_tokens",
        ):
            return self._split(name, held)
        if name in ("num_blocks_in_use", "num_reserved_tokens"):
            return self._from_held(name, held)
        counts = np.zeros(n, dtype=np.int64)
        for step, count in log.preemptions if name == "num_preemptions" else log.hits:
            counts[step] = count
        return counts

    def _split(self, name: str, held: np.ndarray) -> np.ndarray:
        """A column of Fig. 2's split: from the buddy's records for a reservation pool; paged, every slot held
        beyond the token states is internal fragmentation."""
        log = self._log
        if log.paged:
            if name == "num_internal_frag_tokens":  # a prefix hit shared by requests counts once per holder in
                # num_kv_tokens, so token states may exceed the slots held: then no slot is wasted
                return np.maximum(self["num_reserved_tokens"] - self["num_kv_tokens"], 0)
            return np.zeros(len(held), dtype=np.int64)
        if name in ("num_rounding_tokens", "num_external_frag_tokens"):
            return getattr(log, name).expand()
        final = log.num_final_tokens.expand()
        return final - self["num_kv_tokens"] if name == "num_reservation_tokens" else held - final


@dataclass(frozen=True, eq=False)
class EngineResult:
    """One engine run: per-request arrays (index = input order), per-step arrays, and how it was configured."""

    allocation: str
    num_gpu_blocks: int
    block_size: int
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray  # asked for
    num_output_tokens: np.ndarray  # produced (fewer when prompt + output exceeds max_model_len)
    first_scheduled_s: np.ndarray  # start of the first step that scheduled it
    first_token_s: np.ndarray  # end of the step that sampled its first token
    finish_s: np.ndarray  # end of the step that sampled its last token
    num_preemptions: np.ndarray
    steps: Mapping  # STEP_FIELDS -> array, one entry per step (StepRecords)
    scheduled: list | None = None  # per step ([(request_id, tokens)] in vLLM's batch order, [preempted ids])
    block_ids: list | None = None  # per step [(request_id, block table)] after schedule() (Recorder.block_ids)
    freed_tables: list | None = None  # [(request_id, block table)] at every free, in order (Recorder.freed_tables)
    data_parallel_rank: np.ndarray | None = None  # per request, the rank that served it (data parallelism only)

    @property
    def num_requests(self) -> int:
        """Requests served."""
        return len(self.arrival_s)

    @property
    def num_steps(self) -> int:
        """Steps run."""
        return len(self.steps["end_s"])

    @property
    def ttft_s(self) -> np.ndarray:
        """Time to first token: first_token_s - arrival_s (s)."""
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> np.ndarray:
        """Time per output token after the first: (finish - first token) / (outputs - 1) (s; NaN for one output)."""
        extra = self.num_output_tokens - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(extra > 0, (self.finish_s - self.first_token_s) / np.maximum(extra, 1), np.nan)

    @property
    def kv_token_share(self) -> np.ndarray:
        """Per step: share of the reserved KV memory that holds token states (num_kv_tokens / num_reserved_tokens)."""
        reserved = self.steps["num_reserved_tokens"]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(reserved > 0, self.steps["num_kv_tokens"] / np.maximum(reserved, 1), np.nan)

    def summary(self) -> dict:
        """Mean / p95 TTFT (s), mean TPOT (s), preemptions, steps, peak KV blocks, mean running (over steps),
        output tokens/s, and the mean share of reserved KV memory that holds token states (over steps)."""
        steps = self.steps
        makespan = float(self.finish_s.max() - self.arrival_s.min())
        tpot = self.tpot_s
        output = int(self.num_output_tokens.sum())
        n = self.num_steps
        share_sum = share_steps = 0.0
        kv_tokens, reserved_tokens = steps.slices("num_kv_tokens"), steps.slices("num_reserved_tokens")
        for kv, reserved in zip(kv_tokens, reserved_tokens):  # a million-request run has 20 million steps
            held = reserved > 0
            share_sum += float((kv[held] / reserved[held]).sum())
            share_steps += int(held.sum())
        return {
            "num_requests": self.num_requests,
            "mean_ttft_s": float(self.ttft_s.mean()),
            "p95_ttft_s": float(np.percentile(self.ttft_s, 95)),
            "mean_tpot_s": float(np.nanmean(tpot)) if np.isfinite(tpot).any() else float("nan"),
            "num_preemptions": int(self.num_preemptions.sum()),
            "num_steps": n,
            "peak_kv_blocks": int(steps["num_blocks_in_use"].max()) if n else 0,
            "mean_running": steps.column_sum("num_running") / n if n else 0.0,
            "output_tokens_per_s": output / makespan if makespan > 0 else float("nan"),
            "num_output_tokens": output,
            "makespan_s": makespan,
            "mean_kv_token_share": share_sum / share_steps if share_steps else float("nan"),
        }

    def requests_table(self) -> dict[str, np.ndarray]:
        """One row per request (request_id = 0-based input order): the columns of kvlab simulate --requests-csv."""
        ranks = {} if self.data_parallel_rank is None else {"data_parallel_rank": self.data_parallel_rank}
        return requests_table(self) | ranks


def requests_table(result) -> dict[str, np.ndarray]:
    """One row per request of a run (an EngineResult, or a fleet's FleetResult): request_id (0-based input order),
    arrival_s, prompt_tokens, output_tokens, first_scheduled_s, first_token_s, finish_s and num_preemptions."""
    names = ("arrival_s", "prompt_tokens", "output_tokens", "first_scheduled_s", "first_token_s", "finish_s",
             "num_preemptions")  # fmt: skip
    return {"request_id": np.arange(len(result.arrival_s))} | {name: getattr(result, name) for name in names}
