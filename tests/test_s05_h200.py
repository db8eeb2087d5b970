"""Section 5's answer and its two H200 sources: sentences built from the data they speak of (flip the data, the
sentence changes)."""

from pathlib import Path

import pandas as pd

from kvlab.core.calibration import find_calibrations, read_calibration
from kvlab.sections import s05_calibration as calibration

H200 = Path(__file__).parents[1] / "data" / "calibration" / "nvidia-h200.csv"


def test_the_answer_reads_the_committed_h200_measurement():
    text = calibration.answer_text(find_calibrations())
    assert "524,288 bytes, 0.5 MiB: exactly the article's 0.5 MB" in text
    assert "5.92 ms at batch 1 and 6.78 ms at batch 8: under the article's 8 ms up to batch 8" in text
    assert "8.08 ms from batch 16, over it" in text
    assert "No GPU has measured" in calibration.answer_text([])


def test_the_answer_turns_when_the_gpu_is_slower_than_the_article(tmp_path):
    slow = tmp_path / "slow.csv"
    lines = H200.read_text().splitlines()
    out = []
    for line in lines:
        parts = line.split(",")
        if parts[0] == "decode_step_ms":
            parts[4] = f"{float(parts[4]) + 10:.2f}"
        if parts[0] == "kv_bytes_per_token":
            parts[4] = "600000"
        out.append(",".join(parts))
    slow.write_text("\n".join(out) + "\n")
    text = calibration.answer_text([read_calibration(slow)])
    assert "more than the article's 8 ms at every batch measured" in text and "upper bound" not in text
    assert "more than the article's 0.5 MB" in text


def test_the_two_h200_sources_are_compared_at_shared_shapes_only():
    gemm = calibration.h200_gemm_table()
    assert (gemm["shapes"] > 0).all() and gemm["shapes"].sum() > 500
    assert (gemm["min_pct"] <= gemm["median_pct"]).all() and (gemm["median_pct"] <= gemm["max_pct"]).all()
    attention = calibration.h200_attention_table()
    text = calibration.h200_sources_text(gemm, attention)
    assert "agree at the median" in text
    shifted = gemm.assign(median_pct=gemm["median_pct"] + 20)
    assert "differ even at the median" in calibration.h200_sources_text(shifted, attention)
    flipped = attention.assign(fa3_vs_cudnn_pct=-attention["fa3_vs_cudnn_pct"])
    first = calibration.h200_sources_text(gemm, attention).split("FlashAttention 3 is ")[1].split(" than")[0]
    second = calibration.h200_sources_text(gemm, flipped).split("FlashAttention 3 is ")[1].split(" than")[0]
    assert first.split()[-1] != second.split()[-1]  # slower <-> faster


def test_the_whole_step_gap_is_read_from_the_measurement_and_its_direction_from_its_sign():
    table = calibration.h200_whole_step_table()
    assert list(table.index) == ["decode", "prefill", "mixed"] and table.loc["decode", "steps"] == 11
    assert "took longer than the sum by" in calibration.h200_whole_step_text(table)
    faster = pd.DataFrame(table).assign(least_pct=-table["least_pct"])
    assert "differed from the sum by" in calibration.h200_whole_step_text(faster)


def test_the_clock_against_whole_steps_names_the_kernel_relation_from_the_table():
    table = calibration.h200_clock_table()
    assert list(table.index) == ["decode", "prefill", "mixed"]
    attention = calibration.h200_attention_table()
    assert "as long as vLLM's FlashAttention 3" in calibration.h200_clock_text(table, attention)
    faster = attention.assign(flash_us=attention["fa3_us"] / 2)
    assert "2.0x as fast as vLLM's FlashAttention 3" in calibration.h200_clock_text(table, faster)


def test_the_whole_step_text_says_what_the_clock_adds_and_what_it_does_not():
    table = calibration.h200_whole_step_table()
    text = calibration.h200_whole_step_text(table)
    assert "6.7 us a decoder layer (the median of 11 steps)" in text and "stays short there" in text
    smaller = table.assign(median_pct=table["median_pct"].where(table.index != "prefill", 0.0))
    assert "stays short there" not in calibration.h200_whole_step_text(smaller)
