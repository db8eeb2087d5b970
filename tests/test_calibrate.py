"""Calibration: the measured cost model loads and interpolates without torch; the measurement runs on the CPU."""

import math
import sys

import numpy as np
import pytest

from kvlab import cli
from kvlab.core import batching, service_time
from kvlab.core import calibration as calibrate
from kvlab.sections import s05_calibration as section
from kvlab.workloads import synthetic

HEADER = "kind,batch_size,context_tokens,prompt_tokens,value,unit\n"
# decode step (ms) at batch 1, 4, 16 x context 1024, 4096; batch 16 x 4096 did not fit (no row)
GRID = {(1, 1024): 10.0, (1, 4096): 12.0, (4, 1024): 11.0, (4, 4096): 16.0, (16, 1024): 14.0}


def write(tmp_path, body: str, name: str = "gpu.csv"):
    path = tmp_path / name
    path.write_text("# gpu_name: Test GPU\n# device: cuda\n" + HEADER + body)
    return path


def grid_csv(tmp_path):
    rows = "".join(f"decode_step_ms,{b},{c},,{ms},ms\n" for (b, c), ms in GRID.items())
    return write(
        tmp_path, "kv_bytes_per_token,1,4096,,524288,B\n" + rows + "prefill_ms,1,,128,20,ms\nprefill_ms,1,,1024,80,ms\n"
    )


# ---------------------------------------------------------------- reading and interpolating (no torch)
def test_the_file_reads_back_with_its_header_block(tmp_path):
    calibration = calibrate.read_calibration(grid_csv(tmp_path))
    assert calibration.name == "Test GPU" and calibration.metadata["device"] == "cuda"
    assert [r["value"] for r in calibration.kind("kv_bytes_per_token")] == [524288.0]
    assert len(calibration.kind("decode_step_ms")) == len(GRID)


@pytest.mark.parametrize("point", list(GRID))
def test_interpolation_at_a_grid_point_is_the_measured_value(tmp_path, point):
    cost = service_time.CalibratedServiceTime.from_csv(grid_csv(tmp_path), batch_size=point[0])
    assert cost.step_time_ms(point[1])[0] == GRID[point]


def test_between_points_is_bilinear_in_log2_batch_and_context(tmp_path):
    cost = service_time.CalibratedServiceTime.from_csv(grid_csv(tmp_path), batch_size=2)  # halfway from 1 to 4 in log2
    mid = cost.step_time_ms(2048)[0]  # halfway from 1024 to 4096
    assert mid == pytest.approx((10 + 12 + 11 + 16) / 4)
    inside = cost.step_time_ms(np.arange(1024, 4097, 7))
    assert np.all((inside >= 10.0) & (inside <= 16.0)) and np.all(np.diff(inside) >= 0)


def test_outside_the_grid_clamps_or_refuses(tmp_path):
    path = grid_csv(tmp_path)
    clamped = service_time.CalibratedServiceTime.from_csv(path, batch_size=1)
    assert clamped.step_time_ms([10, 100_000]).tolist() == [10.0, 12.0]
    assert service_time.CalibratedServiceTime.from_csv(path, batch_size=64).step_time_ms(1024)[0] == 14.0
    strict = service_time.CalibratedServiceTime.from_csv(path, batch_size=1, outside="raise")
    with pytest.raises(
        ValueError, match=r"^context_tokens=100000 is not allowed: lies outside the measured 1024..4096"
    ):
        strict.step_time_ms([2048, 100_000])
    with pytest.raises(ValueError, match="^batch_size=64 is not allowed: lies outside"):
        service_time.CalibratedServiceTime.from_csv(path, batch_size=64, outside="raise").step_time_ms(2048)


def test_a_cell_with_an_unmeasured_corner_refuses(tmp_path):
    cost = service_time.CalibratedServiceTime.from_csv(grid_csv(tmp_path), batch_size=16)
    assert cost.step_time_ms(1024)[0] == 14.0
    with pytest.raises(ValueError, match="^context_tokens=2048 is not allowed: .*unmeasured corner"):
        cost.step_time_ms(2048)


def test_service_time_sums_the_steps_of_a_growing_context(tmp_path):
    cost = service_time.CalibratedServiceTime.from_csv(grid_csv(tmp_path), batch_size=4)
    prompt, output = np.array([1024, 3000]), np.array([3, 500])
    expected = [cost.step_time_ms(np.arange(p, p + n)).sum() / 1000 for p, n in zip(prompt, output)]
    assert cost.service_s(output, prompt) == pytest.approx(expected)
    with_prefill = service_time.CalibratedServiceTime.from_csv(grid_csv(tmp_path), batch_size=4, include_prefill=True)
    assert with_prefill.service_s(output, prompt) == pytest.approx(np.array(expected) + 0.080)  # 1024+ tokens: 80 ms


def test_a_flat_calibration_serves_exactly_as_the_articles_token_cost(tmp_path):
    path = write(
        tmp_path,
        "decode_step_ms,1,1024,,8,ms\ndecode_step_ms,8,1024,,8,ms\n"
        "decode_step_ms,1,2048,,8,ms\ndecode_step_ms,8,2048,,8,ms\n",
    )
    workload = synthetic.article_s2_workload(200, 11.0, "article", np.random.default_rng(0))
    article = batching.simulate(workload, "static").summary()
    measured = batching.simulate(workload, "static", cost=service_time.CalibratedServiceTime.from_csv(path)).summary()
    assert measured == pytest.approx(article, rel=1e-12)
    slower = batching.simulate(workload, "static", cost=service_time.TokenServiceTime(9.0)).summary()
    assert slower["mean_latency_s"] > article["mean_latency_s"]


@pytest.mark.parametrize(
    "body, line, message",
    [
        ("decode_step_ms,1,1024,,10,ms\nprefill_ms,1,,128,x,ms\n", 5, "value='x' is not allowed"),
        ("decode_step_ms,1,1024,,10,ms\ndecode_tok,1,1024,,10,ms\n", 5, "kind='decode_tok' is not allowed"),
        ("decode_step_ms,1,1024,,10,s\n", 4, "unit='s' is not allowed: decode_step_ms is in ms"),
        ("decode_step_ms,0,1024,,10,ms\n", 4, "batch_size='0' is not allowed"),
        ("decode_step_ms,1,1024,10,ms\n", 4, "5 fields are not allowed"),
        ("decode_step_ms,1,1024,,10,ms\ndecode_step_ms,1,1024,,11,ms\n", 5, "appears twice"),
        ("decode_step_ms,1,,,10,ms\n", 4, "decode_step_ms needs batch_size and context_tokens"),
        ("decode_step_ms,1,1024,,-3,ms\n", 4, "must be a finite number > 0"),
    ],
)
def test_a_bad_row_names_the_file_and_line(tmp_path, body, line, message):
    path = write(tmp_path, body)
    with pytest.raises(ValueError) as error:
        calibrate.read_calibration(path)
    text = str(error.value)
    assert text.startswith(f"{path}:{line}: ") and message in text and "\n" not in text


def test_bad_columns_a_bad_header_line_and_no_decode_rows_are_one_line_errors(tmp_path):
    columns = tmp_path / "columns.csv"
    columns.write_text("kind,batch,value\n")
    with pytest.raises(ValueError, match=rf"^{columns}:1: columns 'kind,batch,value' are not allowed"):
        calibrate.read_calibration(columns)
    header = tmp_path / "header.csv"
    header.write_text("# no colon here\n" + HEADER)
    with pytest.raises(ValueError, match=rf"^{header}:1: header line"):
        calibrate.read_calibration(header)
    prefill_only = write(tmp_path, "prefill_ms,1,,128,20,ms\n", "prefill.csv")
    with pytest.raises(ValueError, match="has no decode_step_ms rows"):
        service_time.CalibratedServiceTime.from_csv(prefill_only)
    with pytest.raises(ValueError, match="^path='.*missing.csv' is not allowed: no such calibration file"):
        calibrate.read_calibration(tmp_path / "missing.csv")


def test_an_empty_folder_says_no_measurement_and_how_to_make_one(tmp_path):
    assert calibrate.find_calibrations(tmp_path) == []
    line = section.status_line([], tmp_path)
    assert line.startswith("No GPU measurement is available yet") and "scripts/gpu_calibration.sh" in line
    assert section.step_table([]).empty


def test_the_analytic_figures_are_the_articles_shape():
    shape = calibrate.DecoderShape()
    assert shape.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2 == 2**19  # 0.5 MiB
    bytes_read = shape.weights_bytes - 32000 * 4096 * 2 + 8 * 1001 * 2**19  # the input embedding is not read whole
    assert calibrate.decode_bound_ms(shape, 3350, 8, 1000) == pytest.approx(bytes_read / 3350e9 * 1000)
    assert 6.7e9 < shape.num_params < 6.8e9  # a Llama-2-7B-sized decoder
    bound = section.bound_table(shape, ["H100-SXM-80GB", "H200-141GB"], [1, 256], [1024, 32768])
    assert bound.loc["H100-SXM-80GB", (1, 1024)] == pytest.approx(calibrate.decode_bound_ms(shape, 3350, 1, 1024))
    assert math.isnan(bound.loc["H200-141GB", (256, 32768)])  # 4 TiB of cache: does not fit, no bound shown
    # 256 x 1,024 tokens is 128 GiB of cache: with 12.55 GiB of weights, past the H200's 140.40 GiB
    assert math.isnan(bound.loc["H200-141GB", (256, 1024)])
    assert not math.isnan(bound.loc["H200-141GB", (1, 32768)])  # 16 GiB of cache fits


# ---------------------------------------------------------------- the command without and with torch
def test_without_torch_the_command_prints_the_install_hint_and_exits_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    assert cli.main(["calibrate", "--device", "cpu", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "PyTorch is not installed: pip install 'kvlab[calibrate]'" in err


def test_the_measurement_runs_on_the_cpu_with_a_tiny_shape(tmp_path, capsys):
    pytest.importorskip("torch", reason="PyTorch is an optional extra (pip install 'kvlab[calibrate]'); CI has none")
    out = tmp_path / "cpu.csv"
    assert (
        cli.main(["calibrate", "--device", "cpu", "--quick", "--repeats", "2", "--warmup", "1", "--out", str(out)]) == 0
    )
    assert f"wrote {out}" in capsys.readouterr().out
    calibration = calibrate.read_calibration(out)
    assert calibration.metadata["device"] == "cpu" and calibration.metadata["torch_version"]
    assert [r["value"] for r in calibration.kind("kv_bytes_per_token")] == [calibrate.TINY_SHAPE.kv_bytes_per_token]
    decode = calibration.kind("decode_step_ms")
    assert sorted((r["batch_size"], r["context_tokens"]) for r in decode) == [
        (b, c) for b in calibrate.QUICK_GRID["batch_sizes"] for c in calibrate.QUICK_GRID["context_tokens"]
    ]
    assert [r["prompt_tokens"] for r in calibration.kind("prefill_ms")] == list(calibrate.QUICK_GRID["prompt_tokens"])
    cost = service_time.CalibratedServiceTime.from_csv(out, batch_size=2)
    assert math.isfinite(cost.service_s(np.array([10]), np.array([20]))[0])


def test_a_bad_flag_is_one_line_in_the_flags_name(capsys):
    pytest.importorskip("torch", reason="PyTorch is an optional extra (pip install 'kvlab[calibrate]'); CI has none")
    assert cli.main(["calibrate", "--device", "cpu", "--quick", "--num-heads", "0"]) == 2
    assert capsys.readouterr().err.startswith("kvlab calibrate: error: --num-heads=0 is not allowed")


def test_the_time_limit_skips_the_rest_of_the_grid_and_says_so():
    pytest.importorskip("torch", reason="PyTorch is an optional extra (pip install 'kvlab[calibrate]'); CI has none")
    metadata, rows = calibrate.measure(
        calibrate.TINY_SHAPE,
        device="cpu",
        batch_sizes=[1],
        context_tokens=[16],
        prompt_tokens=[16],
        kv_tokens=8,
        time_limit_s=1e-9,
        log=lambda m: None,
    )
    assert [r["kind"] for r in rows] == ["weights_bytes", "kv_bytes_per_token"]
    assert metadata["skipped"] == "prefill p=16; decode b=1 c=16 (time)"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0}, "^batch_size=0 is not allowed"),
        ({"outside": "extrapolate"}, "^outside='extrapolate' is not allowed: must be one of clamp, raise"),
        ({"include_prefill": True}, "^include_prefill=True is not allowed: .* has no prefill_ms rows"),
    ],
)
def test_a_bad_cost_model_setting_is_a_one_line_error(tmp_path, kwargs, message):
    path = write(tmp_path, "decode_step_ms,1,1024,,10,ms\n")
    with pytest.raises(ValueError, match=message):
        service_time.CalibratedServiceTime.from_csv(path, **kwargs)


def test_the_grid_must_increase_and_match_the_step_table():
    with pytest.raises(ValueError, match=r"^batch_sizes=\[4.0, 1.0\] is not allowed: must be positive and increasing"):
        service_time.CalibratedServiceTime(np.array([4.0, 1.0]), np.array([1024.0]), np.ones((2, 1)))
    with pytest.raises(ValueError, match=r"^step_ms=\(1, 1\) is not allowed: must have the shape \(2, 1\)"):
        service_time.CalibratedServiceTime(np.array([1.0, 4.0]), np.array([1024.0]), np.ones((1, 1)))
