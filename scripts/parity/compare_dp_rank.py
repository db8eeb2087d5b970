"""make parity, data parallelism: kvlab's RankChooser against vLLM 0.33's own DPLBAsyncMPClient rank choice on the
same recorded statistics: random sequences of new requests, finishes and coordinator snapshots (2-8 ranks, one or
several API-server clients), every choice identical. Usage: python compare_dp_rank.py --vllm-python PYTHON"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from kvlab.core.engine.data_parallel import RankChooser

HERE = Path(__file__).resolve().parent
NUM_SEQUENCES, NUM_EVENTS, SEED = 200, 300, 0


def sequences(rng: np.random.Generator) -> list[dict]:
    """Random event sequences: a choice (70%), a finish of a request in flight (20%), a snapshot (10%) whose
    waiting and running counts are small and whose KV usage spans 0-1 (the penalty's ramp starts at 0.5)."""
    out = []
    for _ in range(NUM_SEQUENCES):
        n, clients = int(rng.integers(2, 9)), int(rng.choice([1, 1, 2, 3]))
        events, in_flight, next_id = [], [], 0
        for _ in range(NUM_EVENTS):
            u = rng.random()
            if u < 0.7 or not in_flight:
                events.append(["choose", f"r{next_id}"])
                in_flight.append(f"r{next_id}")
                next_id += 1
            elif u < 0.9:
                events.append(["finish", in_flight.pop(int(rng.integers(len(in_flight))))])
            else:
                counts = [
                    [int(rng.integers(0, 6)), int(rng.integers(0, 12)), round(float(rng.random()), 3)] for _ in range(n)
                ]
                events.append(["snapshot", counts])
        out.append(
            {"num_ranks": n, "client_count": clients, "client_index": int(rng.integers(clients)), "events": events}
        )
    return out


def kvlab_choices(sequence: dict) -> list[int]:
    chooser = RankChooser(sequence["num_ranks"], sequence["client_count"], sequence["client_index"])
    rank_of, chosen = {}, []
    for kind, arg in sequence["events"]:
        if kind == "choose":
            rank_of[arg] = chooser.choose()
            chosen.append(rank_of[arg])
        elif kind == "finish":
            chooser.finished(rank_of.pop(arg))
        else:
            chooser.snapshot(arg)
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vllm-python", required=True, help="python of the environment with vllm==0.33.0")
    args = parser.parse_args()
    cases = sequences(np.random.default_rng(SEED))
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps({"sequences": cases}))
        done = subprocess.run(
            [args.vllm_python, str(HERE / "vllm_dp_rank.py"), str(src), str(dst)], capture_output=True, text=True
        )
        if done.returncode:
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
        vllm = json.loads(dst.read_text())
    differ = [i for i, s in enumerate(cases) if kvlab_choices(s) != vllm["chosen"][i]]
    num_choices = sum(len(c) for c in vllm["chosen"])
    for i in differ[:5]:
        print(
            f"data parallel ranks: sequence {i} differs: kvlab {kvlab_choices(cases[i])[:20]} vLLM {vllm['chosen'][i][:20]}"
        )
    print(
        f"data parallel ranks: {len(cases) - len(differ)} of {len(cases)} sequences ({num_choices:,} choices) "
        f"identical to vLLM {vllm['vllm_version']}'s DPLBAsyncMPClient.get_core_engine_for_request"
    )
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
