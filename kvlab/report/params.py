"""The report's parameters: params.yaml and --set overrides, checked against each notebook before any runs."""
from __future__ import annotations

import ast
from pathlib import Path

import yaml

from kvlab.sections import parameters


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
        value = yaml.safe_load(text)
        if isinstance(value, str):
            try:
                return float(value)  # YAML reads 1e-3 as text; a person means a number
            except ValueError:
                pass
        return value
    except yaml.YAMLError as error:
        raise ReportError(f"--set value {text!r} is not valid YAML: {error.problem}") from None


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
                raise ReportError(f"{where} is not allowed: must be {_kind(default)}")
        try:
            parameters.check(stem, {**declared[stem], **values})
        except ValueError as error:
            source = "--set" if stem in from_command_line else params_path.name
            raise ReportError(f"{stem}.{error} (from {source})") from None
    return params
