"""Trace loaders: the three formats, bad rows, trace_dir, the manifest and the download check."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab import cli
from kvlab.core.service_time import TokenServiceTime
from kvlab.sections import s01_allocation as allocation_section
from kvlab.sections import s02_batching as batching_section
from kvlab.sections import s04_traces as section
from kvlab.sections.s02_batching import Experiment
from kvlab.workloads import download, poisson_arrivals, traces

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
SHAREGPT_HEADER = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio"


def write(tmp_path, name: str, text: str, newline: str = "\n"):
    path = tmp_path / name
    path.write_bytes(text.replace("\n", newline).encode())
    return path


def azure_text(rows, terminate_last=False) -> str:
    text = "\n".join([AZURE_HEADER] + rows)
    return text + ("\n" if terminate_last else "")


def moon(t, n_in, n_out, ids=None) -> str:
    ids = list(range(-(-n_in // 512))) if ids is None else ids
    return f'{{"timestamp": {t}, "input_length": {n_in}, "output_length": {n_out}, "hash_ids": {ids}}}'


# ---------------------------------------------------------------------------------- the formats


def test_azure_crlf_seven_digits_and_no_last_terminator(tmp_path):
    path = write(
        tmp_path,
        "az.csv",
        azure_text(
            [
                "2023-11-16 18:15:46.6805900,374,44",
                "2023-11-16 18:15:50.9951690,396,109",
                "2023-11-16 18:16:46.6805909,10,1",
            ]
        ),
        newline="\r\n",
    )
    load = traces.load_trace(path)
    w = load.workload
    assert load.trace_format == "azure" and w.name == "azure" and load.num_rows == 3 and load.bad_rows == ()
    np.testing.assert_allclose(w.arrival_s, [0.0, 4.314579, 60.0])
    assert w.prompt_tokens.tolist() == [374, 396, 10]
    assert w.output_tokens.tolist() == [44, 109, 1]
    assert w.prefix_hashes is None and not load.poisson_arrivals


def test_mooncake_ms_relative_to_first_and_prefix_hashes(tmp_path):
    path = write(
        tmp_path,
        "m.jsonl",
        "\n".join([moon(1000, 1025, 5, [0, 1, 2]), moon(1000, 512, 7, [0]), moon(4500, 1, 1, [9])]) + "\n",
    )
    w = traces.load_trace(path, name="kimi").workload
    assert w.name == "kimi"
    assert w.arrival_s.tolist() == [0.0, 0.0, 3.5]
    assert w.prompt_tokens.tolist() == [1025, 512, 1] and w.output_tokens.tolist() == [5, 7, 1]
    assert [h.tolist() for h in w.prefix_hashes] == [[0, 1, 2], [0], [9]]
    assert w.prefix_block_tokens == 512


def test_sharegpt_gets_seeded_poisson_arrivals(tmp_path):
    path = write(tmp_path, "s.csv", SHAREGPT_HEADER + "\n74,918,992,0.08\n290,905,1195,0.32\n5,3,8,1.6\n")
    load = traces.load_trace(path, arrival_rate_per_s=4.0, rng=np.random.default_rng(7))
    expected = poisson_arrivals(3, 4.0, np.random.default_rng(7))
    assert load.poisson_arrivals and load.trace_format == "sharegpt"
    assert load.workload.arrival_s.tolist() == expected.tolist()
    assert load.workload.prompt_tokens.tolist() == [74, 290, 5]
    assert load.workload.output_tokens.tolist() == [918, 905, 3]
    assert "Poisson arrivals" in load.summary()


def test_explicit_format_and_max_requests(tmp_path):
    path = write(tmp_path, "s.csv", SHAREGPT_HEADER + "\n1,2,3,0.5\n4,5,9,0.8\n6,7,13,0.9\n")
    load = traces.load_trace(path, "sharegpt", arrival_rate_per_s=1.0, rng=np.random.default_rng(0), max_requests=2)
    assert load.workload.prompt_tokens.tolist() == [1, 4]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {},
            "arrival_rate_per_s is needed: the sharegpt trace has no timestamps, so its requests arrive as a "
            "Poisson process at a rate you give (requests/s)",
        ),
        (
            {"arrival_rate_per_s": 0.0},
            "arrival_rate_per_s=0.0 is not allowed: must be a number from 0.001 to 1,000,000 requests/s",
        ),
        (
            {"arrival_rate_per_s": 2.0},
            "rng=None is not allowed: a numpy.random.Generator is needed to draw Poisson arrivals",
        ),
    ],
)
def test_sharegpt_needs_rate_and_rng(tmp_path, kwargs, message):
    path = write(tmp_path, "s.csv", SHAREGPT_HEADER + "\n1,2,3,0.5\n")
    with pytest.raises(ValueError) as err:
        traces.load_trace(path, **kwargs)
    assert str(err.value) == message


def test_timed_trace_refuses_an_arrival_rate(tmp_path):
    path = write(tmp_path, "az.csv", azure_text(["2023-11-16 18:15:46.6805900,374,44"]))
    with pytest.raises(
        ValueError,
        match=r"^arrival_rate_per_s=3.0 is not allowed: the azure trace has its own timestamps; leave the rate unset$",
    ):
        traces.load_trace(path, arrival_rate_per_s=3.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"trace_format": "jsonl"},
            "trace_format='jsonl' is not allowed: must be one of auto, azure, mooncake, sharegpt, csv",
        ),
        ({"on_bad_row": "ignore"}, "on_bad_row='ignore' is not allowed: must be one of raise, skip"),
        ({"max_requests": 0}, "max_requests=0 is not allowed: must be an integer >= 1"),
    ],
)
def test_bad_parameters(tmp_path, kwargs, message):
    path = write(tmp_path, "az.csv", azure_text(["2023-11-16 18:15:46.6805900,374,44"]))
    with pytest.raises(ValueError) as err:
        traces.load_trace(path, **kwargs)
    assert str(err.value) == message


def test_unknown_header_and_wrong_explicit_format(tmp_path):
    path = write(tmp_path, "x.csv", "a,b,c\n1,2,3\n")
    with pytest.raises(ValueError) as err:
        traces.load_trace(path)
    assert str(err.value) == (
        f"{path}:1: cannot tell the trace format from 'a,b,c': name it with trace_format, "
        "one of azure, mooncake, sharegpt, csv"
    )
    az = write(tmp_path, "az.csv", azure_text(["2023-11-16 18:15:46.6805900,374,44"]))
    with pytest.raises(ValueError) as err:
        traces.load_trace(az, "sharegpt", arrival_rate_per_s=1.0, rng=np.random.default_rng(0))
    assert str(err.value) == (
        f"{az}:1: the header lacks column(s) num_prefill_tokens, num_decode_tokens that a "
        "sharegpt trace needs (found: TIMESTAMP, ContextTokens, GeneratedTokens)"
    )


def test_a_plain_csv_of_arrivals_and_lengths_is_a_workload(tmp_path):
    path = write(tmp_path, "plain.csv", "arrival_s,prompt_tokens,output_tokens\n0.5,10,3\n0.75,20,4\n0.75,5,1\n")
    load = traces.load_trace(path)
    assert load.trace_format == "csv"
    assert load.workload.arrival_s.tolist() == [0.0, 0.25, 0.25]  # seconds from the first request
    assert load.workload.prompt_tokens.tolist() == [10, 20, 5] and load.workload.output_tokens.tolist() == [3, 4, 1]
    bad = write(tmp_path, "bad.csv", "arrival_s,prompt_tokens,output_tokens\n-1,10,3\n")
    with pytest.raises(ValueError, match=r"bad.csv:2: arrival_s='-1' is not allowed: must be a number of seconds >= 0"):
        traces.load_trace(bad)


# ---------------------------------------------------------------------------------- bad rows

GOOD = "2023-11-16 18:15:46.6805900,374,44"
LATER = "2023-11-16 18:15:50.0000000,10,2"
AZURE_BAD_ROWS = [
    ("2023-11-16 18:15:47.0,12", "2 columns where the header has 3 (TIMESTAMP, ContextTokens, GeneratedTokens)"),
    ("2023-11-16 18:15:47.0,abc,3", "ContextTokens='abc' is not allowed: must be a whole number >= 0 (a token count)"),
    (
        "2023-11-16 18:15:47.0,5,-3",
        "GeneratedTokens='-3' is not allowed: must be a whole number >= 1 (a request generates at least one token)",
    ),
    ("2023-11-16 18:15:47.0,,3", "ContextTokens='' is not allowed: must be a whole number >= 0 (a token count)"),
    ("2023-11-16 18:15:47.0,4.5,3", "ContextTokens='4.5' is not allowed: must be a whole number >= 0 (a token count)"),
    ("yesterday,5,3", "TIMESTAMP='yesterday' is not allowed: must be a time YYYY-MM-DD HH:MM:SS.ffffff"),
    # an offset cannot be compared with the file's plain times: a bad row, not a TypeError traceback
    (
        "2023-11-16 18:15:47+00:00,5,3",
        "TIMESTAMP='2023-11-16 18:15:47+00:00' is not allowed: must be a time YYYY-MM-DD HH:MM:SS.ffffff",
    ),
    (
        "2023-11-16 18:15:40.0000000,5,3",
        "timestamp 2023-11-16 18:15:40 is not allowed: it goes backwards from "
        "the previous row's 2023-11-16 18:15:46.680590",
    ),
]


@pytest.mark.parametrize("bad, reason", AZURE_BAD_ROWS)
def test_azure_bad_row_raises_naming_file_and_line_or_is_skipped(tmp_path, bad, reason):
    path = write(tmp_path, "az.csv", azure_text([GOOD, bad, LATER]), newline="\r\n")
    with pytest.raises(ValueError) as err:
        traces.load_trace(path)
    assert str(err.value) == f"{path}:3: {reason}"
    load = traces.load_trace(path, on_bad_row="skip")
    assert load.bad_rows == (traces.BadRow(3, reason),)
    assert load.num_rows == 3 and load.num_skipped == 1
    assert load.workload.prompt_tokens.tolist() == [374, 10]
    assert load.summary() == (
        f"azure trace az.csv: 2 requests from 3 rows, 1 bad rows skipped (first: line 3: {reason})"
    )


@pytest.mark.parametrize(
    "bad, reason",
    [
        ('{"timestamp": 5, "input_length": 3, "output_length": 1}', "missing column(s) hash_ids"),
        (
            moon(5, 3, 1).replace('"input_length": 3', '"input_length": "3"'),
            "input_length='3' is not allowed: must be a whole number >= 0 (a token count)",
        ),
        (moon(5, -3, 1, []), "input_length=-3 is not allowed: must be a whole number >= 0 (a token count)"),
        (
            moon(5, 3, 0),
            "output_length=0 is not allowed: must be a whole number >= 1 (a request generates at least one token)",
        ),
        (moon(5, 1025, 1, [0, 1]), "hash_ids has 2 blocks but input_length=1025 needs 3 blocks of 512 tokens"),
        (moon(5, 3, 1, [-1]), "hash_ids=[-1] is not allowed: must be a list of whole numbers >= 0 and < 2^63"),
        (
            moon(5, 3, 1, [2**64]),
            "hash_ids=[18446744073709551616] is not allowed: must be a list of whole numbers >= 0 and < 2^63",
        ),
        (moon('"soon"', 3, 1), "timestamp='soon' is not allowed: must be a number of ms"),
        (moon(1, 3, 1), "timestamp 1 is not allowed: it goes backwards from the previous row's 2"),
        ('{"timestamp": 5, "input', "not a JSON object (Unterminated string starting at, column 18)"),
        ("[1, 2]", "not a JSON object: '[1, 2]'"),
    ],
)
def test_mooncake_bad_row(tmp_path, bad, reason):
    path = write(tmp_path, "m.jsonl", "\n".join([moon(2, 10, 1), "", bad, moon(9, 10, 1)]))
    with pytest.raises(ValueError) as err:
        traces.load_trace(path)
    assert str(err.value) == f"{path}:3: {reason}"
    assert "\n" not in str(err.value)
    load = traces.load_trace(path, on_bad_row="skip")
    assert load.bad_rows == (traces.BadRow(3, reason),) and load.workload.arrival_s.tolist() == [0.0, 0.007]


def test_sharegpt_bad_row(tmp_path):
    path = write(tmp_path, "s.csv", SHAREGPT_HEADER + "\n1,2,3,0.5\n-4,5,1,0.8\n")
    with pytest.raises(ValueError) as err:
        traces.load_trace(path, arrival_rate_per_s=1.0, rng=np.random.default_rng(0))
    assert (
        str(err.value)
        == f"{path}:3: num_prefill_tokens='-4' is not allowed: must be a whole number >= 0 (a token count)"
    )


def test_a_binary_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_bytes(b"TIMESTAMP,ContextTokens\xff\xfe\x00\n")
    with pytest.raises(ValueError) as err:
        traces.load_trace(path)
    assert str(err.value).startswith(f"{path}: is not UTF-8 text (byte 0xff at offset 23)")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text", ["", "\n\n", "\r\n  \r\n"])
def test_empty_file_is_an_error_even_when_skipping(tmp_path, text):
    path = write(tmp_path, "empty.csv", text)
    for on_bad_row in ("raise", "skip"):
        with pytest.raises(ValueError) as err:
            traces.load_trace(path, on_bad_row=on_bad_row)
        assert str(err.value) == f"{path}:1: the file is empty: a trace needs a header or JSON rows"


def test_header_only_and_all_bad(tmp_path):
    path = write(tmp_path, "az.csv", AZURE_HEADER + "\r\n")
    with pytest.raises(ValueError) as err:
        traces.load_trace(path)
    assert str(err.value) == f"{path}: no requests: no data rows"
    path = write(tmp_path, "az2.csv", azure_text(["x,1,1", "y,1,1"]))
    with pytest.raises(ValueError) as err:
        traces.load_trace(path, on_bad_row="skip")
    assert str(err.value) == (
        f"{path}: no requests: all 2 rows are bad (first: line 2: TIMESTAMP='x' is not "
        "allowed: must be a time YYYY-MM-DD HH:MM:SS.ffffff)"
    )


rows_strategy = st.lists(
    st.tuples(
        st.integers(0, 5_000_000),
        st.integers(-3, 9000),
        st.integers(-3, 2000),
        st.sampled_from(["ok", "ok", "ok", "short", "text"]),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(rows=rows_strategy, crlf=st.booleans(), terminate_last=st.booleans())
def test_skip_keeps_exactly_the_good_rows(tmp_path_factory, rows, crlf, terminate_last):
    """Reference: a row is good iff it has 3 numeric fields, prompt >= 0, output >= 1 and time not before the last good one."""
    lines, expected, expected_bad, last_us = [], [], [], None
    for i, (us, prompt, output, kind) in enumerate(rows):
        stamp = f"2023-11-16 {18 + us // 3_600_000_000:02d}:{us // 60_000_000 % 60:02d}:{us // 1_000_000 % 60:02d}.{us % 1_000_000:06d}7"
        line = {"ok": f"{stamp},{prompt},{output}", "short": f"{stamp},{prompt}", "text": f"{stamp},n/a,{output}"}[kind]
        lines.append(line)
        good = kind == "ok" and prompt >= 0 and output >= 1 and (last_us is None or us >= last_us)
        if good:
            expected.append((us, prompt, output))
            last_us = us
        else:
            expected_bad.append(i + 2)
    path = write(tmp_path_factory.mktemp("h"), "az.csv", azure_text(lines, terminate_last), "\r\n" if crlf else "\n")
    if not expected:
        with pytest.raises(ValueError, match="no requests: all"):
            traces.load_trace(path, on_bad_row="skip")
        return
    load = traces.load_trace(path, on_bad_row="skip")
    assert [b.line for b in load.bad_rows] == expected_bad
    assert load.num_rows == len(rows)
    w = load.workload
    assert w.prompt_tokens.tolist() == [p for _, p, _ in expected]
    assert w.output_tokens.tolist() == [o for _, _, o in expected]
    np.testing.assert_allclose(w.arrival_s, [(us - expected[0][0]) / 1e6 for us, _, _ in expected], atol=1e-9)
    if expected_bad:
        with pytest.raises(ValueError, match=rf"^{path}:{expected_bad[0]}: "):
            traces.load_trace(path)


# ---------------------------------------------------------------------------------- tables


def test_summary_tables_and_arrival_rate(tmp_path):
    path = write(
        tmp_path,
        "m.jsonl",
        "\n".join([moon(0, 100, 150), moon(0, 300, 300), moon(30_000, 5000, 500), moon(90_000, 700, 1200)]),
    )
    w = traces.load_trace(path).workload
    table = section.summary_table({"m": w})
    assert table.loc["m", "requests"] == 4 and table.loc["m", "duration_s"] == 90.0
    assert table.loc["m", "rate_per_s"] == round(4 / 90, 2) and table.loc["m", "prompt_max_tokens"] == 5000
    assert table.loc["m", "output_mean_tokens"] == 537.5
    gaps = np.array([0, 30, 60.0])
    assert table.loc["m", "interarrival_cv"] == round(gaps.std() / gaps.mean(), 2)
    cmp = section.article_comparison({"m": w})
    assert cmp.index.tolist() == [section.ARTICLE_ROW, "m"]
    assert cmp.loc["m", "over_4096_tokens_pct"] == 25.0 and cmp.loc["m", "output_40_to_200_tokens_pct"] == 25.0
    assert cmp.loc["m", "output_400_to_1000_tokens_pct"] == 25.0 and cmp.loc["m", "mean_tokens_per_request"] == 2062.5
    rate = section.arrival_rate(w, window_s=30.0)  # the trace ends at 90 s: three whole windows
    assert rate.index.tolist() == [0.0, 0.5, 1.0] and rate.tolist() == [2 / 30, 1 / 30, 0.0]
    assert section.arrival_rate(w, window_s=40.0).tolist() == [3 / 40, 0.0]  # 80-120 s is cut short
    assert section.arrival_rate(w, window_s=600.0).tolist() == [4 / 600]  # the only window is kept
    with pytest.raises(ValueError, match=r"^window_s=0 is not allowed"):
        section.arrival_rate(w, window_s=0)


def test_article_comparison_rounds_the_output_mean_once():
    """The comparison keeps the mean output unrounded, so the table (0 decimals) and section 2's prose round it once:
    a mean of 261.49 reads 261, not 262 by way of 261.5."""
    from kvlab.core.workload import Workload
    from kvlab.sections.shared.ledger import round_half_up

    out = np.array([261] * 51 + [262] * 49)  # mean 261.49
    w = Workload(np.arange(100, dtype=float), np.full(100, 10), out)
    shown = section.article_comparison({"m": w}).loc["m", "output_mean_tokens"]
    assert shown == out.mean() and round_half_up(shown, 0) == 261


# ---------------------------------------------------------------------------------- where the files are


def test_trace_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_DIR", str(tmp_path / "env"))
    assert traces.trace_dir() == tmp_path / "env"
    assert traces.trace_dir(tmp_path / "given") == tmp_path / "given"
    assert traces.trace_path("azure") == tmp_path / "env" / "AzureLLMInferenceTrace_conv.csv"
    assert traces.missing_traces() == ["azure", "mooncake", "sharegpt"]
    monkeypatch.setenv("TRACE_DIR", "")
    repo = tmp_path / "clone"
    monkeypatch.setattr(traces, "REPO_DIR", repo)
    assert traces.trace_dir() == repo / "data" / "traces"
    (tmp_path / "shared" / "traces").mkdir(parents=True)
    assert traces.trace_dir() == tmp_path / "shared" / "traces"
    with pytest.raises(ValueError, match=r"^trace='kimi' is not allowed: must be one of azure, mooncake, sharegpt$"):
        traces.trace_path("kimi")


def test_manifest_lists_url_licence_hash_and_commit():
    manifest = traces.read_manifest()
    assert sorted(manifest) == ["azure", "mooncake", "sharegpt"]
    for name, entry in manifest.items():
        assert entry["format"] == name
        assert entry["url"].startswith("https://raw.githubusercontent.com/") and entry["commit"] in entry["url"]
        assert len(entry["sha256"]) == 64 and int(entry["sha256"], 16) >= 0
        assert entry["license"] and entry["attribution"] and entry["rows"] > 0


# ---------------------------------------------------------------------------------- download


def local_manifest(tmp_path, payload: bytes, sha: str | None = None):
    source = tmp_path / "source.csv"
    source.write_bytes(payload)
    sha = sha or hashlib.sha256(payload).hexdigest()
    manifest = tmp_path / "m.toml"
    manifest.write_text(f'[tiny]\nfile = "tiny.csv"\nurl = "{source.as_uri()}"\nsha256 = "{sha}"\n')
    return manifest


def test_download_fetches_and_checks_the_hash(tmp_path, monkeypatch):
    manifest = local_manifest(tmp_path, b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n")
    dest = tmp_path / "dest"
    report = download.download(dest, manifest)
    assert (dest / "tiny.csv").read_bytes() == b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
    assert report == [f"tiny: downloaded {dest / 'tiny.csv'} (41 bytes), sha256 ok"]
    assert sorted(p.name for p in dest.iterdir()) == ["tiny.csv"]

    def no_fetch(url, path):
        raise AssertionError("a file with the right hash must not be fetched again")

    assert download.download(dest, manifest, fetch=no_fetch) == [
        f"tiny: {dest / 'tiny.csv'} already present, sha256 ok"
    ]


def test_download_refuses_a_wrong_hash_and_leaves_nothing(tmp_path, capsys):
    manifest = local_manifest(tmp_path, b"tampered", sha="0" * 64)
    dest = tmp_path / "dest"
    with pytest.raises(ValueError) as err:
        download.download(dest, manifest)
    got = hashlib.sha256(b"tampered").hexdigest()
    assert str(err.value) == (
        f"{(tmp_path / 'source.csv').as_uri()}: sha256 {got} is not the manifest's "
        f"{'0' * 64} for tiny; nothing was written"
    )
    assert list(dest.iterdir()) == []
    assert cli.main(["traces", "download", "--dest", str(dest), "--manifest", str(manifest)]) == 2
    err_text = capsys.readouterr().err
    assert err_text.startswith("kvlab traces: error: file://") and err_text.count("\n") == 1


def test_download_cli_unknown_trace(tmp_path, capsys):
    manifest = local_manifest(tmp_path, b"x")
    assert (
        cli.main(["traces", "download", "--dest", str(tmp_path / "d"), "--manifest", str(manifest), "--trace", "big"])
        == 2
    )
    assert capsys.readouterr().err == "kvlab traces: error: --trace='big' is not allowed: must be one of tiny\n"


# ---------------------------------------------------------------------------------- the real files

MISSING = traces.missing_traces()
real = pytest.mark.skipif(
    bool(MISSING),
    reason=f"real trace files {', '.join(MISSING)} not in {traces.trace_dir()} (set TRACE_DIR or run make traces)",
)


@real
def test_real_files_match_the_manifest_hashes():
    for name, entry in traces.read_manifest().items():
        path = traces.trace_path(name)
        assert path.stat().st_size == entry["bytes"]
        assert download.sha256_of(path) == entry["sha256"], name


@real
@pytest.mark.parametrize("name", ["azure", "mooncake", "sharegpt"])
def test_real_files_load_clean(name):
    entry = traces.read_manifest()[name]
    kwargs = {"arrival_rate_per_s": 10.0, "rng": np.random.default_rng(0)} if name == "sharegpt" else {}
    load = traces.load_trace(traces.trace_path(name), **kwargs)
    w = load.workload
    assert load.trace_format == name and load.num_rows == entry["rows"] == w.num_requests
    assert load.bad_rows == ()
    assert w.arrival_s[0] == 0.0 and np.all(np.diff(w.arrival_s) >= 0)
    assert w.prompt_tokens.min() >= 0 and w.output_tokens.min() >= 1
    if name == "mooncake":
        assert all(len(h) == -(-p // 512) for h, p in zip(w.prefix_hashes, w.prompt_tokens))
        assert all(h[0] == 0 for h in w.prefix_hashes)  # the shared system-prompt block
    if name == "azure":
        assert 3500 < w.arrival_s[-1] < 3600  # about one hour, 18:15 to 19:14


# ---------------------------------------------------------------------------------- the figures


def test_trace_figures_draw_one_curve_per_trace(tmp_path):
    from kvlab.sections.shared import plots

    path = write(
        tmp_path,
        "m.jsonl",
        "\n".join(
            [moon(0, 100, 150, [0]), moon(2000, 600, 30, [0, 1]), moon(5000, 700, 1200, [0, 1]), moon(9000, 80, 3, [0])]
        ),
    )
    w = traces.load_trace(path).workload
    fig = plots.length_cdfs({"a": w, "b": w}, "output_tokens", {"mark": 200})
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b", "mark"]
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "output (tokens, log scale)"
    assert fig.caption.endswith("one line per workload; the vertical line marks mark.")
    unmarked = plots.length_cdfs({"drawn": np.array([5, 50, 500]), "a": w}, "total_tokens")
    assert "vertical" not in unmarked.caption  # no marks drawn, none promised
    ax = unmarked.axes[0]
    assert ax.get_xlabel() == "request length, prompt + output (tokens, log scale)"
    assert np.array_equal(w.total_tokens, w.prompt_tokens + w.output_tokens) and len(ax.lines) == 2
    ax = plots.interarrival_cdfs({"a": w}).axes[0]
    assert ax.get_legend().get_texts()[-1].get_text() == "Poisson arrivals (exponential gaps)"
    ax = plots.arrival_rates({"a": section.arrival_rate(w, 3.0)}).axes[0]
    assert ax.get_ylabel() == "arrival rate (requests/s)" and len(ax.lines) == 1
    ax = plots.prefix_hit_rate(section.hit_rate_curve(w, [1, 2])).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "block hit rate",
        "block hit rate, unbounded cache (66.7%)",  # 4 of 6 blocks
        "prefill tokens saved",
        "prefill tokens saved, unbounded cache (87.3%)",
    ]  # 1,292 of 1,480


def test_download_command_as_make_traces_runs_it(tmp_path):  # make traces: kvlab traces download
    import subprocess
    import sys

    manifest = local_manifest(tmp_path, b"num_prefill_tokens,num_decode_tokens\n1,2\n")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvlab",
            "traces",
            "download",
            "--dest",
            str(tmp_path / "d"),
            "--manifest",
            str(manifest),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (run.returncode, run.stderr) == (0, "")
    assert run.stdout == f"tiny: downloaded {tmp_path / 'd' / 'tiny.csv'} (41 bytes), sha256 ok\n"


# ---------------------------------------------------------------------- notebooks 01 and 02, and the report


def trace_folder(tmp_path, azure_rows):
    """A trace folder holding only an Azure file (named as the manifest says) with these rows."""
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / traces.read_manifest()["azure"]["file"]).write_text(azure_text(azure_rows))
    return folder


AZURE_ROWS = ["2023-11-16 18:15:46.0,374,44", "2023-11-16 18:15:47.5,30,300", "2023-11-16 18:15:50.0,5000,20"]


def test_request_lengths_are_prompt_plus_output_and_too_long_ones_an_error_or_dropped(tmp_path):
    w = traces.load_trace(write(tmp_path, "az.csv", azure_text(AZURE_ROWS))).workload
    lengths, dropped = traces.request_lengths(w)
    assert lengths.tolist() == [418, 330, 5020] and dropped == 0
    with pytest.raises(
        ValueError,
        match=r"^max_len_tokens=4096 is not allowed: 1 of the trace's 3 requests are "
        r"longer \(largest 5,020 tokens",
    ):
        traces.request_lengths(w, 4096)
    lengths, dropped = traces.request_lengths(w, 4096, over_max_len="drop")
    assert lengths.tolist() == [418, 330] and dropped == 1
    with pytest.raises(ValueError, match="over_max_len='cap' is not allowed"):
        traces.request_lengths(w, 4096, over_max_len="cap")


def test_open_trace_loads_a_window_or_says_plainly_why_not(tmp_path):
    folder = trace_folder(tmp_path, AZURE_ROWS)
    trace = section.open_trace("azure", folder, max_requests=2)
    assert trace.available and trace.load.workload.num_requests == 2
    assert trace.note == "The azure trace: the first 2 requests, over 1.5 s of its own timestamps."
    assert set(trace.with_others({"article": 1})) == {"article", "azure"}
    absent = section.open_trace("mooncake", folder)
    assert not absent.available and absent.with_others({"article": 1}) == {"article": 1}
    assert (
        absent.note.startswith(
            "The mooncake trace is not available (mooncake_conversation_trace.jsonl is not in the trace folder"
        )
        and str(tmp_path) not in absent.note
    )
    assert section.open_trace("", folder).note.startswith("No real trace chosen")
    with pytest.raises(ValueError, match="trace='kimi' is not allowed"):
        section.open_trace("kimi", folder)


def test_open_trace_gives_sharegpt_seeded_poisson_arrivals(tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / traces.read_manifest()["sharegpt"]["file"]).write_text(
        SHAREGPT_HEADER + "\n1,2,3,0.5\n4,5,9,0.8\n7,1,8,7\n"
    )
    trace = section.open_trace("sharegpt", folder, arrival_rate_per_s=2.0, seed=5)
    expected = poisson_arrivals(3, 2.0, np.random.default_rng(5))
    assert np.array_equal(trace.load.workload.arrival_s, expected)
    assert "Poisson arrivals at 2 requests/s (seed 5" in trace.note


def test_trace_tables_for_the_notebooks_and_their_empty_forms(tmp_path):
    trace = section.open_trace("azure", trace_folder(tmp_path, AZURE_ROWS))
    table = allocation_section.trace_allocation_table(
        trace, [1024, 16], max_len_tokens=4096, memory_gib=60, mib_per_token=0.5
    )
    assert table.loc[1024, "reserved_tokens"] == 2048 and table.loc[16, "reserved_tokens"] == 432 + 336
    assert table.loc[16, "used_tokens"] == 748 and (table["dropped_over_max_len"] == 1).all()
    assert (table["num_requests"] == 2).all()
    comparison = batching_section.trace_policy_comparison(trace, Experiment(max_num_seqs=1, cost=TokenServiceTime(10)))
    # one slot: 0.44 s from 0 s, then 3 s from 1.5 s, then 0.2 s from 4.5 s: makespan 4.7 s either way
    assert comparison.loc["continuous", "makespan_s"] == pytest.approx(4.7)
    absent = section.open_trace("mooncake", tmp_path / "traces")
    empty = allocation_section.trace_allocation_table(
        absent, [16], max_len_tokens=4096, memory_gib=60, mib_per_token=0.5
    )
    assert empty.empty and list(empty.columns) == list(table.columns)
    empty = batching_section.trace_policy_comparison(absent, Experiment(max_num_seqs=1, cost=TokenServiceTime(10)))
    assert empty.empty and list(empty.columns) == list(comparison.columns)


def test_availability_note_says_which_traces_were_there(tmp_path):
    folder = trace_folder(tmp_path, AZURE_ROWS)
    note = section.availability_note(folder)
    assert note.startswith("Real request traces were not available (mooncake, sharegpt missing")
    assert "present: azure" in note and str(tmp_path) not in note
    assert section.availability_note(tmp_path / "nowhere").startswith(
        "Real request traces were not available (azure, mooncake, sharegpt missing"
    )
    for entry in traces.read_manifest().values():
        (folder / entry["file"]).touch()
    assert section.availability_note(folder).startswith(
        "Real request traces were available (azure, mooncake, sharegpt)"
    )


def test_file_format_reads_the_first_line(tmp_path):
    assert traces.file_format(write(tmp_path, "a.csv", "\n" + azure_text(AZURE_ROWS))) == "azure"
    assert traces.file_format(write(tmp_path, "s.csv", SHAREGPT_HEADER + "\n")) == "sharegpt"
    assert traces.file_format(write(tmp_path, "m.jsonl", moon(0, 10, 1) + "\n")) == "mooncake"
    assert traces.file_format(write(tmp_path, "e.csv", "")) == "auto"
