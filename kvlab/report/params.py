"""The report's parameters: params.yaml and --set overrides, checked against each notebook before any runs.

Every check runs here, before the report's build imports papermill, nbconvert or WeasyPrint: a bad parameter is
refused in well under a second (yaml, numpy and kvlab's own rules only; the notebooks are read as JSON)."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from kvlab.report.paths import NOTEBOOK_DIR
from kvlab.sections.shared import parameters


class ReportError(Exception):
    """A build problem reported as one line (bad parameters, a failed notebook)."""


class ParamsError(ReportError, ValueError):
    """A parameter refused before any notebook runs: one line naming what was given, its value, what is allowed."""


MAX_MINUTES = 120  # a default report takes about one minute; refuse what would take hours unless asked


def notebook_parameters(path: Path) -> dict:
    """The parameters cell of a notebook (the cell tagged parameters, NAME = literal lines): name -> default value."""
    cells = json.loads(Path(path).read_text(encoding="utf-8")).get("cells", [])
    cell = next((c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    if cell is None:
        return {}
    source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
    found = {}
    for node in ast.parse(source).body:  # what papermill.inspect_notebook reads, without importing papermill
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = ast.literal_eval(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            found[node.target.id] = ast.literal_eval(node.value)
    return found


def _parse_value(item: str, text: str):
    """The value of --set item (NAME=text) as YAML reads it; text that reads as a number is one."""
    if not text.strip():
        return ""  # NAME= sets an empty string (e.g. TRACE= for no trace)
    try:
        value = yaml.safe_load(text)
        if isinstance(value, str):
            try:
                return float(value)  # YAML reads 1e-3 as text; a person means a number
            except ValueError:
                pass
        return value
    except yaml.YAMLError as error:
        raise ParamsError(
            f"--set {item!r} is not allowed: its value {text!r} is not valid YAML ({error.problem}); "
            "give a number, true or false, text, or a list like [1, 2]"
        ) from None


def _kind(default) -> str:
    """How a value like default is described: 'an integer like 20000'."""
    names = {bool: "true or false", int: "an integer", float: "a number", str: "text", list: "a list", tuple: "a list"}
    return f"{names.get(type(default), type(default).__name__)} like {default!r}"


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


def _read_yaml(text: str):
    """text as YAML, read by libyaml where PyYAML has it (8x faster); its errors are the pure-Python reader's."""
    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        return yaml.safe_load(text)  # raises again, with the message and position PyYAML's own reader gives


def _yaml_problem(name: str, error: yaml.YAMLError) -> str:
    """A YAML error in one line, FILE:LINE:COLUMN: the problem (and what was being read, from where)."""
    mark = getattr(error, "problem_mark", None)
    where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
    problem = getattr(error, "problem", None) or str(error).replace("\n", " ")
    context, start = getattr(error, "context", None), getattr(error, "context_mark", None)
    if context:
        problem += f" ({context}" + (f" from {start.line + 1}:{start.column + 1}" if start else "") + ")"
    return (
        f"{where}: {problem}: not valid YAML; the file maps each notebook's name to its NAME: VALUE lines, "
        "indented below it with spaces"
    )


def load_params(params_path: Path, overrides: list[str], notebooks: list[Path]) -> dict[str, dict]:
    """Parameters per notebook stem from the YAML file and --set overrides, checked against each notebook."""
    return _load_params(params_path, overrides, notebooks)[0]


def _load_params(
    params_path: Path, overrides: list[str], notebooks: list[Path]
) -> tuple[dict[str, dict], dict[str, dict]]:
    """load_params, and the parameters each notebook declares with its defaults (notebook_parameters)."""
    if not params_path.exists():
        raise ParamsError(f"--params={str(params_path)!r} is not allowed: the file does not exist")
    try:
        raw = _read_yaml(params_path.read_text()) or {}
    except OSError as error:
        raise ParamsError(
            f"--params={str(params_path)!r} is not allowed: cannot be read ({error.strerror or error})"
        ) from None
    except yaml.YAMLError as error:
        raise ParamsError(_yaml_problem(params_path.name, error)) from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{params_path.name}: must map notebook names to their parameters")
    stems = {nb.stem: nb for nb in notebooks}
    declared = {stem: notebook_parameters(path) for stem, path in stems.items()}
    params: dict[str, dict] = {stem: {} for stem in stems}
    from_command_line: set[str] = set()
    for stem, values in raw.items():
        if stem not in stems:
            raise ParamsError(
                f"{params_path.name}: notebook {stem!r} is not allowed: must be one of {', '.join(stems)}"
            )
        if not isinstance(values or {}, dict):
            raise ParamsError(
                f"{params_path.name}: {stem}={values!r} is not allowed: must map its parameter names "
                "to values, as NAME: VALUE lines indented below it"
            )
        params[stem].update(values or {})
    for item in overrides:
        name, sep, text = item.partition("=")
        if not sep:
            raise ParamsError(f"--set {item!r} is not allowed: must look like NOTEBOOK.NAME=VALUE or NAME=VALUE")
        value = _parse_value(item, text)
        stem, dot, pname = name.rpartition(".")
        targets = [stem] if dot else [s for s in stems if pname in declared[s]]
        if dot and stem not in stems:
            raise ParamsError(f"--set {item!r} is not allowed: notebook {stem!r} must be one of {', '.join(stems)}")
        if not targets:
            raise ParamsError(f"--set {item!r} is not allowed: no notebook has a parameter {pname!r}")
        for target in targets:
            params[target][pname] = value
            from_command_line.add(target)
    for stem, values in params.items():
        for pname, value in values.items():
            where = f"{stem}.{pname}={value!r}"
            if pname not in declared[stem]:
                raise ParamsError(f"{where} is not allowed: {stem} has parameters {', '.join(declared[stem])}")
            default = declared[stem][pname]
            if not _same_kind(default, value):
                raise ParamsError(f"{where} is not allowed: must be {_kind(default)}")
        try:
            parameters.check(stem, {**declared[stem], **values})
        except ValueError as error:
            source = "--set" if stem in from_command_line else params_path.name
            raise ParamsError(f"{stem}.{error} (from {source})") from None
    return params, declared


def report_notebooks(notebook_dir: Path = NOTEBOOK_DIR) -> list[Path]:
    """The report's notebooks, NN_*.ipynb in notebook_dir, in order; none is a ParamsError."""
    notebooks = sorted(Path(notebook_dir).glob("[0-9][0-9]_*.ipynb"))
    if not notebooks:
        raise ParamsError(f"no notebooks found in {notebook_dir}")
    return notebooks


@dataclass(frozen=True)
class CheckedParams:
    """A report's parameters once every check passed: per notebook stem those given (params.yaml, --set) and those
    it runs with (its defaults merged in)."""

    notebooks: list[Path]
    given: dict[str, dict]
    merged: dict[str, dict]


def check_params(
    params_path: Path,
    overrides: list[str],
    notebook_dir: Path = NOTEBOOK_DIR,
    max_minutes: float = MAX_MINUTES,
    log=print,
) -> CheckedParams:
    """Every check before any notebook runs: each parameter (load_params: name, kind, range, catalogs, memory) and
    the whole report's estimated time, refused past max_minutes (minutes)."""
    notebooks = report_notebooks(notebook_dir)
    given, declared = _load_params(params_path, overrides, notebooks)
    merged = {stem: {**declared[stem], **values} for stem, values in given.items()}
    seconds = sum(parameters.estimate(stem, values).seconds for stem, values in merged.items())
    if seconds > 60 * max_minutes:
        heavy = max(merged, key=lambda stem: parameters.estimate(stem, merged[stem]).seconds)
        raise ParamsError(
            f"the report would take about {seconds / 60:,.0f} min on this machine, over the limit of "
            f"{max_minutes:g} min (--max-minutes); {heavy} takes most: lower its "
            + parameters.TIME_PARAMETERS.get(heavy, parameters.SIZE_PARAMETER.get(heavy, "parameters"))
        )
    if seconds > 120:
        log(f"report: about {seconds / 60:,.0f} min on this machine")
    return CheckedParams(notebooks, given, merged)
