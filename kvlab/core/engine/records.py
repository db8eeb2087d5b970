"""What the engine records: per request (times, preemptions) and per step (what section 6 plots)."""
from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

# Per step, read after the step's update (vLLM's num_running / num_waiting are read right after schedule()):
STEP_FIELDS = (
    "start_s", "end_s",
    "num_scheduled_tokens",   # tokens computed in the step (prefill chunks + decodes)
    "num_running",            # requests in the running list after schedule()
    "num_waiting",            # requests waiting after schedule() (arrived, not running)
    "num_blocks_in_use",      # blocks requests hold after the step (reservations: reserved slots / block_size, up)
    "num_reserved_tokens",    # token slots held for the running requests: blocks x block_size, or reservations
    "num_kv_tokens",          # tokens whose KV the running requests hold (their computed tokens) after the step
    "num_preemptions",        # requests preempted in the step
    "num_hit_tokens",         # prompt tokens the step's admissions found in the prefix cache
)


class StepLog:
    """Per-step records in compact arrays (8 bytes a value); a decode run's k steps are added at once.

    Stored: times, scheduled tokens, running, waiting, KV tokens and what is held (blocks for the paged
    pool, token slots for a reservation); preemptions and prefix hits, rare, as (step, count) events."""

    def __init__(self, block_size: int, paged: bool):
        self.block_size, self.paged = block_size, paged
        self.start_s, self.end_s = array("d"), array("d")
        self.num_scheduled_tokens, self.num_running, self.num_waiting = array("q"), array("q"), array("q")
        self.held = array("q")                # blocks in use (paged) or reserved token slots
        self.num_kv_tokens = array("q")
        self.preemptions: list[tuple[int, int]] = []
        self.hits: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self.start_s)

    def append(self, start_s: float, end_s: float, num_tokens: int, num_running: int, num_waiting: int, held: int,
               num_kv_tokens: int, num_preemptions: int = 0, num_hit_tokens: int = 0) -> None:
        """Add one step."""
        if num_preemptions:
            self.preemptions.append((len(self.start_s), num_preemptions))
        if num_hit_tokens:
            self.hits.append((len(self.start_s), num_hit_tokens))
        self.start_s.append(start_s)
        self.end_s.append(end_s)
        self.num_scheduled_tokens.append(num_tokens)
        self.num_running.append(num_running)
        self.num_waiting.append(num_waiting)
        self.held.append(held)
        self.num_kv_tokens.append(num_kv_tokens)

    def extend(self, times: list[float], num_running: int, num_waiting: list[int], held: list[int],
               num_kv_tokens: list[int]) -> None:
        """Add the k steps of a decode run: k + 1 step boundaries, num_running tokens and requests a step."""
        k = len(times) - 1
        self.start_s.extend(times[:k])
        self.end_s.extend(times[1:])
        constant = array("q", (num_running,)) * k
        self.num_scheduled_tokens.extend(constant)
        self.num_running.extend(constant)
        self.num_waiting.extend(num_waiting)
        self.held.extend(held)
        self.num_kv_tokens.extend(num_kv_tokens)

    def as_arrays(self) -> dict[str, np.ndarray]:
        """Every field of STEP_FIELDS as a numpy array, one entry per step."""
        def column(values, dtype):
            return np.frombuffer(values, dtype=dtype).copy() if len(values) else np.zeros(0, dtype=dtype)

        held = column(self.held, "i8")
        bs = self.block_size
        steps = {"start_s": column(self.start_s, "f8"), "end_s": column(self.end_s, "f8"),
                 "num_scheduled_tokens": column(self.num_scheduled_tokens, "i8"),
                 "num_running": column(self.num_running, "i8"), "num_waiting": column(self.num_waiting, "i8"),
                 "num_blocks_in_use": held if self.paged else -(-held // bs),
                 "num_reserved_tokens": held * bs if self.paged else held,
                 "num_kv_tokens": column(self.num_kv_tokens, "i8")}
        for name, events in (("num_preemptions", self.preemptions), ("num_hit_tokens", self.hits)):
            steps[name] = np.zeros(len(held), dtype=np.int64)
            for step, count in events:
                steps[name][step] = count
        return {name: steps[name] for name in STEP_FIELDS}


@dataclass(frozen=True, eq=False)
class EngineResult:
    """One engine run: per-request arrays (index = input order), per-step arrays, and how it was configured."""

    allocation: str
    num_gpu_blocks: int
    block_size: int
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray           # asked for
    num_output_tokens: np.ndarray       # produced (fewer when prompt + output exceeds max_model_len)
    first_scheduled_s: np.ndarray       # start of the first step that scheduled it
    first_token_s: np.ndarray           # end of the step that sampled its first token
    finish_s: np.ndarray                # end of the step that sampled its last token
    num_preemptions: np.ndarray
    steps: dict                         # STEP_FIELDS -> array, one entry per step
    scheduled: list | None = None       # per step ([(request_id, tokens)] in vLLM's batch order, [preempted ids])
    block_ids: list | None = None       # per step [(request_id, block table)] after schedule() (record_block_ids)
    freed_tables: list | None = None    # [(request_id, block table)] at every free, in order (record_frees)

    @property
    def num_requests(self) -> int:
        """Requests served."""
        return len(self.arrival_s)

    @property
    def num_steps(self) -> int:
        """Steps run."""
        return len(self.steps["start_s"])

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
        """Mean / p95 TTFT (s), mean TPOT (s), preemptions, steps, peak KV blocks, mean running, output tokens/s."""
        steps = self.steps
        makespan = float(self.finish_s.max() - self.arrival_s.min())
        tpot = self.tpot_s
        output = int(self.num_output_tokens.sum())
        return {
            "num_requests": self.num_requests,
            "mean_ttft_s": float(self.ttft_s.mean()),
            "p95_ttft_s": float(np.percentile(self.ttft_s, 95)),
            "mean_tpot_s": float(np.nanmean(tpot)) if np.isfinite(tpot).any() else float("nan"),
            "num_preemptions": int(self.num_preemptions.sum()),
            "num_steps": self.num_steps,
            "peak_kv_blocks": int(steps["num_blocks_in_use"].max()) if self.num_steps else 0,
            "mean_running": float(steps["num_running"].mean()) if self.num_steps else 0.0,
            "output_tokens_per_s": output / makespan if makespan > 0 else float("nan"),
            "num_output_tokens": output,
            "makespan_s": makespan,
            "mean_kv_token_share": float(np.nanmean(self.kv_token_share)) if self.num_steps else float("nan"),
        }

    def requests_table(self) -> dict[str, np.ndarray]:
        """One row per request (request_id = 0-based input order): the columns of kvlab simulate --requests-csv."""
        return {"request_id": np.arange(self.num_requests), "arrival_s": self.arrival_s,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "first_scheduled_s": self.first_scheduled_s, "first_token_s": self.first_token_s,
                "finish_s": self.finish_s, "num_preemptions": self.num_preemptions}
