"""What the engine records: per request (times, preemptions) and per step (what section 6 plots)."""
from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

# Per step, read after the step's update (as vLLM's num_running/num_waiting are read right after schedule()):
STEP_FIELDS = {
    "start_s": "d", "end_s": "d",
    "num_scheduled_tokens": "q",   # tokens computed in the step (prefill chunks + decodes)
    "num_running": "q",            # requests in the running list after schedule()
    "num_waiting": "q",            # requests waiting after schedule() (arrived, not running)
    "num_blocks_in_use": "q",      # blocks requests hold after the step (reservations: reserved slots / block_size, up)
    "num_kv_tokens": "q",          # tokens whose KV the running requests hold (computed tokens) after the step
    "num_reserved_tokens": "q",    # token slots reserved for them: blocks x block_size, or the reservations
    "num_preemptions": "q",        # requests preempted in the step
    "num_hit_tokens": "q",         # prompt tokens found in the prefix cache by the step's admissions
}


class StepLog:
    """Per-step columns in compact arrays (8 bytes a value), appended step by step or a run at a time."""

    def __init__(self):
        self.columns = {name: array(code) for name, code in STEP_FIELDS.items()}

    def __len__(self) -> int:
        return len(self.columns["start_s"])

    def extend(self, **values) -> None:
        """Append a run of steps: each field a numpy array (or a number repeated) of the same length."""
        n = len(values["start_s"])
        for name, code in STEP_FIELDS.items():
            value = values[name]
            value = np.full(n, value) if np.ndim(value) == 0 else value
            self.columns[name].frombytes(np.ascontiguousarray(value, dtype="f8" if code == "d" else "i8").tobytes())

    def as_arrays(self) -> dict[str, np.ndarray]:
        """The columns as numpy arrays."""
        return {name: np.frombuffer(column, dtype="f8" if STEP_FIELDS[name] == "d" else "i8").copy()
                for name, column in self.columns.items()}


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
