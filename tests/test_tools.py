"""No test fails because a program is missing: every program a test runs comes with Python's pinned packages or
make, or is in tests/conftest.py TOOLS and its test is skipped, with the fix, where it is missing."""

import ast
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, TOOLS

TESTS = ROOT / "tests"
RUNS = {"run", "Popen", "call", "check_call", "check_output"}
# What a test may start without a mark: this Python, a script of the pinned .venv, make (the README needs it);
# str(script) and *exe are the kvlab script beside this Python (test_cli_allocate, test_cli_capacity).
PROVIDED = {"sys.executable", "str(ROOT / '.venv' / 'bin' / 'papermill')", "'make'", "str(script)", "*exe"}


def programs_started() -> list[tuple[str, int, str]]:
    """(file, line, the program's expression) of every subprocess a test module starts."""
    found = []
    for path in sorted(TESTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in RUNS
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "subprocess"
                and node.args
            ):
                first = node.args[0]
                program = first.elts[0] if isinstance(first, ast.List) and first.elts else first
                found.append((path.name, node.lineno, ast.unparse(program)))
    return found


def test_every_program_a_test_starts_is_provided_or_a_tool_with_its_fix():
    for name, line, program in programs_started():
        provided = program in PROVIDED
        a_tool = program == "CHROMIUM"  # tests/browser.py: tool_path("chromium"), its tests marked needs_tool
        assert provided or a_tool, (
            f"{name}:{line} starts {program}, which neither Python's pinned packages nor make "
            "provide: add it to TOOLS in tests/conftest.py and mark its tests needs_tool"
        )


def test_every_test_that_opens_a_browser_is_marked():
    for path in sorted(TESTS.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(n, ast.Name) and n.id == "Browser" for n in ast.walk(node)
            ):
                marks = [ast.unparse(d) for d in node.decorator_list]
                assert "needs_tool('chromium')" in marks, f"{path.name}::{node.name} opens Chromium unmarked"


def hidden_path(tmp_path: Path) -> str:
    """A PATH with every program of this one but the TOOLS and poppler's (pdftoppm, pdftotext, pdfinfo)."""
    hidden = set(TOOLS) | {"chromium-browser", "pdftoppm", "pdftotext", "pdfinfo"}
    folder = tmp_path / "bin"
    folder.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            target = folder / entry.name
            if entry.name not in hidden and not target.exists():
                target.symlink_to(entry.path)
    return str(folder)


def test_without_the_tools_their_tests_are_skipped_saying_the_fix(tmp_path):
    env = {**os.environ, "PATH": hidden_path(tmp_path)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "tests/test_report_output.py",
            "-k",
            "chromium",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert "1 skipped" in done.stdout and "chromium is not installed (fix: make setup installs" in done.stdout, (
        done.stdout[-2000:]
    )
