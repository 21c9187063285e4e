"""Checks trainer on the lowest and on the newest Keras and TensorFlow, each in a scratch venv.

pyproject.toml names every runtime dependency with a lower bound measured to work and an
upper bound below the next minor (Keras, TensorFlow, TensorBoard, Hydra) or major release;
`constraints.txt` is the exact set CI passed with. This script installs a version set into a
fresh virtual environment and runs the Keras contract subset there with that venv's python:
the default cells of `tests/test_keras_contract.py` and the exactness tests
(`tests/test_parity.py`, `tests/test_loop.py`, `tests/test_accumulate.py`).

- `--lowest`: every runtime dependency of pyproject at its lower bound (`name==lower`), the
  packages those need at whatever pip resolves for them ("lowest-direct"); the extras are not
  installed. The listing test (`test_every_keras_test_is_a_scenario_or_says_why_not`) is left
  out: it compares the scenarios with the installed Keras's own test files, which an older
  Keras has fewer of.
- `--newest`: the set CI passed (`-c constraints.txt`), then the newest keras, tensorflow and
  tensorboard on PyPI over it (no constraint and no upper bound for those three: this is the
  upgrade check that tells whether the bounds may move up). Also runs the scoreboard
  (`scripts/keras_contract.py`'s scenarios; `--scoreboard-columns`, `--no-scoreboard`).

For each failure it names the function of trainer the traceback came through: the deepest
frame under `trainer/internals/` (`internals.<module>.<function>`), else the deepest under
`trainer/`. It prints one line per installed version set and per failure, then a table; the
exit code is 1 when anything failed (an install pip refused included), 0 otherwise. Only PyPI
is reached (pip); every step has a timeout; the scratch venv is deleted unless `--keep` or
`--venv DIR` (kept, and reused by the next run with the same DIR).

    python scripts/check_versions.py --lowest
    python scripts/check_versions.py --newest --scoreboard-columns fit:2
    python scripts/check_versions.py --lowest --pin keras==3.12.0 --venv /tmp/v   # a candidate
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SUBSET = ("tests/test_keras_contract.py", "tests/test_parity.py", "tests/test_loop.py",
          "tests/test_accumulate.py")
LISTING = "tests/test_keras_contract.py::test_every_keras_test_is_a_scenario_or_says_why_not"
NEWEST = ("keras", "tensorflow", "tensorboard")  # tensorboard is released with TensorFlow
TEST_TOOLS = ("pytest", "pytest-xdist")
# What the version line shows: these, then every runtime dependency of pyproject.
SHOWN = ("keras", "tensorflow", "tensorboard", "numpy", "protobuf", "ml-dtypes")


# -- pure parts: bounds, constraints, tracebacks --------------------------------------------

def requirements(pyproject: dict) -> dict[str, list[Requirement]]:
    """pyproject's requirements by section (`dependencies`, then each extra), without the
    project's own `trainer[...]`."""
    project = pyproject["project"]
    name = canonicalize_name(project["name"])
    sections = {"dependencies": project.get("dependencies", []),
                **project.get("optional-dependencies", {})}
    return {section: [r for r in map(Requirement, texts) if canonicalize_name(r.name) != name]
            for section, texts in sections.items()}


def bounds(requirement: Requirement) -> tuple[str | None, str | None]:
    """The requirement's lower (`>=`) and upper (`<`) bound, None where it has none."""
    lower = upper = None
    for spec in requirement.specifier:
        if spec.operator == ">=":
            lower = spec.version
        elif spec.operator == "<":
            upper = spec.version
    return lower, upper


def lowest_pins(runtime: list[Requirement]) -> dict[str, str]:
    """{name: version}: each runtime requirement at its lower bound."""
    pins = {}
    for requirement in runtime:
        lower, _ = bounds(requirement)
        if lower is None:
            raise ValueError(f"{requirement} has no lower bound (>=) to install")
        pins[canonicalize_name(requirement.name)] = lower
    return pins


def read_constraints(text: str) -> dict[str, str]:
    """{name: version} of a constraints file's `name==version` lines."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not re.fullmatch(r"[A-Za-z0-9._-]+", name.strip()):
            raise ValueError(f"constraints line {line!r} is not name==version")
        pins[canonicalize_name(name.strip())] = version.strip()
    return pins


def parse_pins(texts: list[str]) -> dict[str, str]:
    """{name: version} of `--pin name==version` options."""
    pins = {}
    for text in texts:
        name, sep, version = text.partition("==")
        if not sep or not name or not version:
            raise ValueError(f"--pin {text!r}: expected name==version, e.g. keras==3.12.0")
        Version(version)  # raises InvalidVersion with the bad value
        pins[canonicalize_name(name)] = version
    return pins


# A frame of Python's traceback (`File "f.py", line 3, in fn`), or of pytest's short one
# (`f.py:3: in fn`, how pytest shows a module that failed to import).
FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in (\S+)|^(\S+\.py):\d+: in (\S+)', re.M)


def frames(traceback_text: str) -> list[tuple[str, str]]:
    """(file, function) of each frame of a traceback, in printed order (chained exceptions
    one after another, each outermost call first)."""
    return [(a or c, b or d) for a, b, c, d in FRAME.findall(traceback_text)]


def trainer_function(traceback_text: str, package: Path) -> str | None:
    """The function of trainer a traceback came through: the deepest frame under
    `package/internals/` as `internals.<module>.<function>`, else the deepest under `package`
    (or an installed `site-packages/trainer/`) as `<subpackage>.<module>.<function>`; None
    when no frame is trainer's."""
    found = {}
    root = os.path.normpath(package.resolve())
    installed = f"{os.sep}site-packages{os.sep}trainer{os.sep}"
    for file, function in frames(traceback_text):
        path = os.path.normpath(os.path.join(REPO, file))  # a relative one: from the repo
        if path.startswith(root + os.sep):
            inside = path[len(root) + 1:]
        elif installed in path:
            inside = path[path.rindex(installed) + len(installed):]
        else:
            continue
        module = inside.removesuffix(".py").replace(os.sep, ".").removesuffix(".__init__")
        kind = "internals" if module.startswith("internals.") else "trainer"
        found[kind] = f"{module}.{function}"
    return found.get("internals") or found.get("trainer")


def known_differences(test_file: Path) -> dict[tuple[str, str], str]:
    """The contract test's KNOWN cells ({(scenario, column): why}), read from its top-level
    assignments without importing it (its conftest splits the CPU for the tests)."""
    tree = ast.parse(test_file.read_text())
    wanted = [node for node in tree.body if isinstance(node, ast.Assign)
              and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets)]
    namespace: dict = {}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(test_file), "exec"), namespace)
    return namespace["KNOWN"]


def scoreboard_failures(board: dict, known: dict[tuple[str, str], str]) -> list[dict]:
    """The scoreboard's failed cells: a traceback, plain Keras failing, or a difference that
    is not one of the known ones (a `refused` cell is trainer's one-line refusal, not one)."""
    failed = []
    header = board["header"]
    for row, tracebacks in zip(board["rows"], board["tracebacks"], strict=True):
        name = row[0]
        for column, text, trace in zip(header[1:], row[1:], tracebacks, strict=False):
            if text == "pass" or text.startswith("refused: ") or (
                    text.startswith("differs") and (name, column) in known):
                continue
            failed.append({"name": f"scoreboard {name} [{column}]", "message": text,
                           "traceback": trace or ""})
    return failed


def _message(problem: ET.Element) -> str:
    """A failure's one line: the contract cell it got (`+ traceback: ...`, which pytest's
    own message cuts short), else pytest's message, else its first `E   ` line."""
    text = problem.text or ""
    cell = re.search(r"^\s*\+ ((?:traceback|differs|refused|plain Keras failed).*)$", text, re.M)
    error = re.search(r"^E\s+(\S.*)$", text, re.M)
    message = (problem.get("message") or "").strip()
    if cell:
        return cell.group(1)[:160]
    if error and message in ("", "collection failure"):
        return error.group(1)[:160]
    return message.splitlines()[0][:160] if message else ""


def junit_failures(xml_text: str) -> tuple[int, list[dict]]:
    """(tests run, failures) of a pytest junit XML report; each failure its test id (or the
    test file that failed to import), one-line message and traceback."""
    root = ET.fromstring(xml_text)
    ran, failed = 0, []
    for case in root.iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if case.find("skipped") is not None and problem is None:
            continue
        ran += 1
        if problem is not None:
            classname, name = case.get("classname", ""), case.get("name", "")
            test = (f"{classname.replace('.', '/')}.py::{name}" if classname
                    else f"{name.replace('.', '/')}.py")  # a collection error
            failed.append({"name": test, "message": _message(problem),
                           "traceback": problem.text or ""})
    return ran, failed


def table(results: list[dict]) -> str:
    """The Markdown table: one row per version set, the failures' trainer functions."""
    lines = ["| set | versions | passed | failed | failures: trainer function |",
             "|---|---|---|---|---|"]
    for result in results:
        functions = [f"{f['name']}: {f.get('function') or '(no trainer frame)'}"
                     for f in result["failures"]]
        versions = ", ".join(f"{n} {v}" for n, v in result["versions"].items()
                             if n in ("python", "keras", "tensorflow"))
        lines.append(f"| {result['set']} | {versions} | {result['passed']} | "
                     f"{len(result['failures'])} | {'<br>'.join(functions) or '-'} |")
    return "\n".join(lines)


# -- running things -------------------------------------------------------------------------

def run(command: list[str], log: Path, timeout: float, cwd: Path = REPO,
        env: dict | None = None) -> int:
    """Runs `command` in its own process group, output to `log`; kills the whole group and
    returns -1 after `timeout` seconds."""
    with open(log, "a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            out.write(f"\n[timed out after {timeout:.0f} s]\n")
            return -1
        except BaseException:  # Ctrl-C or SIGTERM: no pip or pytest left behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise


def clean_env() -> dict[str, str]:
    """This environment without what would make the venv import something else."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_CONSTRAINT")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_PROGRESS_BAR="off",
               TF_CPP_MIN_LOG_LEVEL="2")
    return env


def pip_error(log: Path) -> str:
    """pip's reason, from the end of its log: the last ERROR line, else the last line."""
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")
              and "dependency resolver does not currently" not in line]
    return (errors[0] if errors else lines[-1] if lines else "no output")[:300]


def install(mode: str, venv: Path, log: Path, args: argparse.Namespace) -> str | None:
    """Installs the mode's version set into `venv` (created if missing); pip's one-line
    reason when it fails, None when it worked."""
    env, python = clean_env(), venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    constraints = read_constraints((REPO / "constraints.txt").read_text())
    tools = [f"{name}=={constraints[name]}" for name in TEST_TOOLS]
    pins = parse_pins(args.pin)
    if mode == "lowest":
        pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
        pins = {**lowest_pins(requirements(pyproject)["dependencies"]), **pins}
        # the pins first (--pin may go below pyproject's bounds), then trainer on top
        steps = [[*pip, *(f"{n}=={v}" for n, v in pins.items()), *tools],
                 [*pip, "--no-deps", "-e", str(REPO)]]
    else:
        newest = [f"{n}=={pins[n]}" if n in pins else n for n in NEWEST]
        steps = [[*pip, "-e", str(REPO), *tools, "-c", str(REPO / "constraints.txt")],
                 [*pip, "--upgrade", *newest]]
    if not python.exists():
        steps.insert(0, [args.python, "-m", "venv", str(venv)])
        steps.insert(1, [*pip, "--upgrade", "pip"])
    for step in steps:
        code = run(step, log, args.install_timeout, env=env)
        if code:
            return "pip timed out" if code == -1 else pip_error(log)
    return None


def installed_versions(venv: Path, shown: list[str], log: Path) -> dict[str, str]:
    """{name: version} in the venv: its python, then `shown` in that order."""
    code = ("import importlib.metadata as m, json, platform;"
            "print(json.dumps({'python': platform.python_version(), **{"
            "d.metadata['Name'].lower().replace('_', '-'): d.version "
            "for d in m.distributions()}}))")
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                          text=True, timeout=120, env=clean_env())
    found = json.loads(done.stdout)
    return {name: found[name] for name in ["python", *shown] if name in found}


def run_tests(mode: str, venv: Path, scratch: Path, args: argparse.Namespace
              ) -> tuple[int, list[dict]]:
    """The contract subset with the venv's python: (tests passed, failures)."""
    report = scratch / f"{mode}-junit.xml"
    command = [str(venv / "bin" / "python"), "-m", "pytest", *SUBSET, "--tb=native", "-q",
               "-p", "no:cacheprovider", f"--junitxml={report}", "-n", str(args.processes)]
    if mode == "lowest":
        command += ["--deselect", LISTING]
    code = run(command, scratch / f"{mode}-pytest.log", args.test_timeout, env=clean_env())
    if not report.exists():
        reason = "timed out" if code == -1 else f"exit {code}, no report"
        return 0, [{"name": "pytest", "message": reason, "traceback": ""}]
    ran, failed = junit_failures(report.read_text())
    passed = ran - len(failed)
    if code == -1:
        failed.append({"name": "pytest", "message": "timed out", "traceback": ""})
    return passed, failed


def run_scoreboard(venv: Path, scratch: Path, args: argparse.Namespace
                   ) -> tuple[int, list[dict]]:
    """keras_contract.py's scenarios in the venv, tracebacks kept: (cells passed, failures)."""
    out = scratch / "scoreboard.json"
    command = [str(venv / "bin" / "python"), str(Path(__file__).resolve()),
               "--scoreboard-driver", str(out), "--scoreboard-columns",
               args.scoreboard_columns, "--scenarios", args.scenarios]
    code = run(command, scratch / "scoreboard.log", args.test_timeout, env=clean_env())
    if not out.exists():
        reason = "timed out" if code == -1 else f"exit {code}, no table"
        return 0, [{"name": "scoreboard", "message": reason, "traceback": ""}]
    board = json.loads(out.read_text())
    known = known_differences(REPO / "tests" / "test_keras_contract.py")
    failed = scoreboard_failures(board, known)
    return sum(len(row) - 1 for row in board["rows"]) - len(failed), failed


def drive_scoreboard(out: Path, columns: str, scenarios: str) -> int:
    """Inside the venv: each scenario's row (keras_contract.row; all without `scenarios`),
    each cell's traceback kept, written to `out` as JSON."""
    import traceback

    sys.path.insert(0, str(HERE))
    import keras_contract as kc

    current: list[str | None] = []
    plain_cell, plain_keras = kc.cell, kc.plain_keras

    def traced(run_cell):
        def call(*a):
            try:
                return run_cell(*a)
            except Exception:
                current.append(traceback.format_exc())
                raise
        return call

    def cell(reference, run_it):
        before = len(current)
        text = plain_cell(reference, traced(run_it))
        if len(current) == before:
            current.append(None)
        return text

    kc.cell, kc.plain_keras = cell, traced(plain_keras)
    chosen = kc._columns(columns)
    kc.start(max(r for _, r in chosen))
    header = ["scenario", *(f"{loop} x{r}" for loop, r in chosen)]
    rows, tracebacks = [], []
    for name in [s for s in scenarios.split(",") if s] or kc.ks.SCENARIOS:
        current.clear()
        rows.append(kc.row(name, chosen, False))
        tracebacks.append(list(current))
        print(" | ".join(rows[-1]), flush=True)
    out.write_text(json.dumps({"header": header, "rows": rows, "tracebacks": tracebacks}))
    return 0


def check(mode: str, args: argparse.Namespace) -> dict:
    """One version set: install, test, report; the result for the table."""
    began = time.monotonic()
    keep = args.keep or args.venv is not None
    scratch = Path(args.venv) / mode if args.venv else Path(
        tempfile.mkdtemp(prefix=f"trainer-versions-{mode}-"))
    scratch.mkdir(parents=True, exist_ok=True)
    venv = scratch / "venv"
    try:
        refused = install(mode, venv, scratch / "pip.log", args)
        installed = time.monotonic()
        pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
        shown = list(SHOWN) + [canonicalize_name(r.name) for r in
                               requirements(pyproject)["dependencies"]]
        versions = installed_versions(venv, list(dict.fromkeys(shown)), scratch / "pip.log") \
            if (venv / "bin" / "python").exists() else {}
        print(f"{mode}: {', '.join(f'{n} {v}' for n, v in versions.items())} "
              f"(installed in {installed - began:.0f} s)", flush=True)
        if refused:
            failures, passed = [{"name": "pip install", "message": refused,
                                 "traceback": ""}], 0
        else:
            passed, failures = run_tests(mode, venv, scratch, args)
            if mode == "newest" and not args.no_scoreboard:
                cells, board_failures = run_scoreboard(venv, scratch, args)
                passed, failures = passed + cells, failures + board_failures
        for failure in failures:
            failure["function"] = trainer_function(failure["traceback"], REPO / "trainer")
            print(f"FAIL {mode} {failure['name']}: "
                  f"{failure['function'] or '(no trainer frame)'}: {failure['message']}",
                  flush=True)
        print(f"{mode}: {passed} passed, {len(failures)} failed in "
              f"{time.monotonic() - began:.0f} s"
              + (f" (kept: {scratch})" if keep else ""), flush=True)
        return {"set": mode, "versions": versions, "passed": passed, "failures": failures}
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lowest", action="store_true",
                        help="pyproject's lower bounds of every runtime dependency")
    parser.add_argument("--newest", action="store_true",
                        help="constraints.txt, then the newest keras, tensorflow, tensorboard")
    parser.add_argument("--pin", action="append", default=[], metavar="NAME==VERSION",
                        help="install this version instead (repeatable), e.g. keras==3.12.0")
    parser.add_argument("--scoreboard-columns", default="fit:1,fit:2,custom:2",
                        help="--newest's scoreboard columns, loop:replicas (default: %(default)s)")
    parser.add_argument("--scenarios", default="",
                        help="the scoreboard's scenarios, comma-separated (default: all)")
    parser.add_argument("--no-scoreboard", action="store_true", help="--newest without it")
    parser.add_argument("--processes", type=int, default=2, help="pytest -n (default: 2)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter the venv is made from (default: this one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch venv")
    parser.add_argument("--venv", help="make (or reuse) the venvs under DIR/<set>, kept")
    parser.add_argument("--install-timeout", type=float, default=1800, help="seconds per pip")
    parser.add_argument("--test-timeout", type=float, default=3600,
                        help="seconds for the tests, and for the scoreboard")
    parser.add_argument("--scoreboard-driver", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scoreboard_driver:
        return drive_scoreboard(Path(args.scoreboard_driver), args.scoreboard_columns,
                                args.scenarios)
    if not (args.lowest or args.newest):
        parser.error("say --lowest, --newest or both")
    # SIGTERM as Ctrl-C: the running step is killed and the scratch venv deleted
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        parse_pins(args.pin)
    except ValueError as error:
        parser.error(str(error))
    results = [check(mode, args) for mode in ("lowest", "newest") if getattr(args, mode)]
    print(table(results))
    return 1 if any(result["failures"] for result in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
