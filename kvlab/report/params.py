"""The report's parameters: params.yaml and --set overrides, checked against each notebook before any runs."""
from __future__ import annotations

import ast
from pathlib import Path

import yaml

from kvlab.core import validate
from kvlab.workloads.synthetic import LENGTH_DISTRIBUTIONS
from kvlab.workloads.traces import TRACE_FORMATS


class ReportError(Exception):
    """A build problem reported as one line (bad parameters, a failed notebook)."""


def notebook_parameters(path: Path) -> dict:
    """The parameters cell of a notebook: name -> default value."""
    import papermill

    found = papermill.inspect_notebook(str(path))
    return {name: ast.literal_eval(info["default"]) for name, info in found.items()}


def _parse_value(text: str):
    if not text.strip():
        return ""  # NAME= sets an empty string (e.g. TRACE= for no trace)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ReportError(f"--set value {text!r} is not valid YAML: {error.problem}") from None


def _same_kind(default, value) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    if default is None:
        return True
    return isinstance(value, type(default))


def load_params(params_path: Path, overrides: list[str], notebooks: list[Path]) -> dict[str, dict]:
    """Parameters per notebook stem from the YAML file and --set overrides, checked against each notebook."""
    if not params_path.exists():
        raise ReportError(f"--params={str(params_path)!r} is not allowed: the file does not exist")
    try:
        raw = yaml.safe_load(params_path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ReportError(f"{params_path.name}: not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise ReportError(f"{params_path.name}: must map notebook names to their parameters")
    stems = {nb.stem: nb for nb in notebooks}
    declared = {stem: notebook_parameters(path) for stem, path in stems.items()}
    params: dict[str, dict] = {stem: {} for stem in stems}
    from_command_line: set[str] = set()
    for stem, values in raw.items():
        if stem not in stems:
            raise ReportError(f"{params_path.name}: notebook {stem!r} is not allowed: must be one of {', '.join(stems)}")
        params[stem].update(values or {})
    for item in overrides:
        name, sep, text = item.partition("=")
        if not sep:
            raise ReportError(f"--set {item!r} is not allowed: must look like NOTEBOOK.NAME=VALUE or NAME=VALUE")
        value = _parse_value(text)
        stem, dot, pname = name.rpartition(".")
        targets = [stem] if dot else [s for s in stems if pname in declared[s]]
        if dot and stem not in stems:
            raise ReportError(f"--set {item!r} is not allowed: notebook {stem!r} must be one of {', '.join(stems)}")
        if not targets:
            raise ReportError(f"--set {item!r} is not allowed: no notebook has a parameter {pname!r}")
        for target in targets:
            params[target][pname] = value
            from_command_line.add(target)
    for stem, values in params.items():
        for pname, value in values.items():
            where = f"{stem}.{pname}={value!r}"
            if pname not in declared[stem]:
                raise ReportError(f"{where} is not allowed: {stem} has parameters {', '.join(declared[stem])}")
            default = declared[stem][pname]
            if not _same_kind(default, value):
                raise ReportError(f"{where} is not allowed: must be a {type(default).__name__} like {default!r}")
        try:
            check_section(stem, {**declared[stem], **values})
        except ValueError as error:
            source = "--set" if stem in from_command_line else params_path.name
            raise ReportError(f"{source}: {stem}: {error}") from None
    return params


def _check_capacity(p: dict) -> None:
    from kvlab.core import capacity
    from kvlab.sections import capacity as section

    shape = capacity.KVShape(p["NUM_LAYERS"], p["NUM_KV_HEADS"], p["HEAD_DIM"], p["DTYPE_BYTES"])
    section.memory_table(shape, p["CONTEXTS"], p["CONCURRENCY"])
    section.fit_table(shape, p["GPU_MEMORY_GIB"], p["WEIGHTS_GIB"], p["CONTEXTS"])


def _each(check):
    """A rule for a list parameter: not empty, check on every element."""
    def rule(name, values):
        for i, value in enumerate(validate.non_empty(name, values)):
            check(f"{name}[{i}]", value)
    return rule


def _lengths(name, value):
    validate.one_of(name, value, LENGTH_DISTRIBUTIONS)


def _trace(name, value):
    if value:
        validate.one_of(name, value, TRACE_FORMATS)


def _percent(name, value):
    if validate.non_negative_number(name, value) > 100:
        validate.fail(name, value, "must be a percentile in [0, 100]")


_int1, _int0, _pos = validate.positive_int, validate.non_negative_int, validate.positive_number

# What each notebook parameter may be, checked before any notebook runs (a parameter without a
# rule is only checked for its type against the notebook's default).
PARAM_RULES = {
    "01_allocation": {
        "NUM_REQUESTS": _int1, "MAX_LEN_TOKENS": _int1, "LENGTHS": _lengths, "SEED": _int0,
        "BLOCK_SIZES": _each(_int1), "MEMORY_GIB": _pos, "MIB_PER_TOKEN": _pos, "POLICY_BLOCK_SIZE": _int1,
        "NUM_SEEDS": _int1, "TRACE": _trace, "TRACE_MAX_LEN_TOKENS": _int1,
    },
    "02_batching": {
        "NUM_REQUESTS": _int1, "MAX_NUM_SEQS": _int1, "MS_PER_TOKEN": _pos, "ARRIVAL_RATE": _pos,
        "CONSTANT_TOKENS": _int1, "SEED": _int0, "NUM_SEEDS": _int1, "BAND_LOW_PCT": _percent,
        "BAND_HIGH_PCT": _percent, "TIMELINE_S": _pos, "SWEEP_RATES": _each(_pos),
        "SWEEP_CVS": _each(validate.non_negative_number), "SWEEP_SEEDS": _int1, "TRACE": _trace,
        "TRACE_NUM_REQUESTS": _int1, "SHAREGPT_RATE_PER_S": _pos,
    },
    "03_capacity": {
        "GPU_MEMORY_UTILIZATION": lambda n, v: validate.fraction(n, v), "BLOCK_SIZE": _int1,
        "LOG_MAX_MODEL_LEN": _int1, "PLAN_CONTEXTS": _each(_int1), "PLAN_TENSOR_PARALLEL_SIZES": _each(_int1),
    },
    "04_traces": {
        "SHAREGPT_RATE_PER_S": _pos, "SEED": _int0, "RATE_WINDOW_S": _pos, "CACHE_SIZES_BLOCKS": _each(_int1),
    },
    "05_calibration": {
        "NUM_LAYERS": _int1, "NUM_HEADS": _int1,
        "HEAD_DIM": _int1, "HIDDEN_SIZE": _int1, "INTERMEDIATE_SIZE": _int1, "VOCAB_SIZE": _int1,
        "BATCH_SIZES": _each(_int1), "CONTEXTS": _each(_int1), "FREE_GIB": _pos, "CONTEXT_TOKENS": _int1,
        "MAX_NUM_SEQS": _int1, "SEED": _int0,
    },
}

# Checks that need several parameters together (run after the per-parameter rules).
SECTION_CHECKS = {
    "02_batching": lambda p: p["BAND_LOW_PCT"] < p["BAND_HIGH_PCT"] or validate.fail(
        "BAND_LOW_PCT", p["BAND_LOW_PCT"], f"must be below BAND_HIGH_PCT={p['BAND_HIGH_PCT']}"),
    "03_capacity": _check_capacity,
}


def check_section(stem: str, params: dict) -> None:
    """Raise ValueError if a notebook's parameters (its defaults merged with overrides) are not allowed."""
    for name, rule in PARAM_RULES.get(stem, {}).items():
        if name in params:
            rule(name, params[name])
    if stem in SECTION_CHECKS:
        SECTION_CHECKS[stem](params)
