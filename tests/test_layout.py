"""The package's layout: imports run one way, downward, with no cycle (read from the AST).

Function-local imports count as much as module-level ones: they hide an arrow, they do not
remove it. The floors, bottom first, are the subpackages' order below; each subpackage's
`__init__.py` says what it holds and what it may import.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "trainer"
# The floor of each subpackage; the entry points (`__main__`, `evaluate`, `launch`) sit on top.
FLOORS = {"config": 0, "plan": 1, "rundir": 2, "distribute": 3, "data": 4, "models": 5,
          "task": 6, "track": 7, "run": 8}
TOP = 9


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["trainer", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's own modules that `name` imports, at module level or inside functions."""
    targets = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in names:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and target != "trainer":
                targets.add(target)
    return targets


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS.get(parts[1], TOP) if len(parts) > 1 else TOP


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_cycle():
    assert _cycles(_graph()) == []


def test_imports_run_downward():
    upward = [f"{a} -> {b}" for a, targets in _graph().items() for b in targets
              if _floor(b) > _floor(a)]
    assert upward == []


def test_config_imports_nothing_of_ours_and_nothing_imports_main():
    graph = _graph()
    assert [f"{a} -> {b}" for a, targets in graph.items() if a.startswith("trainer.config")
            for b in targets if not b.startswith("trainer.config")] == []
    assert [a for a, targets in graph.items() if "trainer.__main__" in targets] == []


def test_below_run_nothing_imports_run():
    assert [f"{a} -> {b}" for a, targets in _graph().items() if _floor(a) < FLOORS["run"]
            for b in targets if b.split(".")[1] == "run"] == []


def test_the_layout_check_sees_a_planted_cycle_and_an_upward_import():
    graph = _graph()
    graph["trainer.config.errors"] = graph["trainer.config.errors"] | {"trainer.run.train"}
    assert _cycles(graph)
    assert _floor("trainer.run.train") > _floor("trainer.config.errors")


def test_every_subpackage_says_what_it_holds_and_may_import():
    for name in FLOORS:
        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
        assert doc and "import" in doc, name


def test_the_entry_points_import_without_tensorflow():
    """TensorFlow starts only once the devices are chosen (and its start-up lines quieted)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['tensorflow'] = sys.modules['keras'] = None; "
            "sys.modules['matplotlib'] = None; "
            "import trainer.__main__, trainer.evaluate, trainer.launch, trainer.run.preflight, "
            "trainer.run.resolve")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr.strip().splitlines()[-1:]


def test_matplotlib_is_imported_only_where_a_picture_is_drawn():
    """matplotlib takes about a second to import: inside the functions that draw (curves.png,
    the scaling report), never at a module's top, so the entry points and the pre-flight,
    before TensorFlow, do not pay it."""
    top = []
    for name, path in _modules().items():
        for node in ast.parse(path.read_text()).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            top += [f"{name}:{node.lineno}" for n in names if n.split(".")[0] == "matplotlib"]
    assert top == []


def test_every_function_local_import_of_ours_says_why():
    """An import inside a function hides an arrow; it is kept only where TensorFlow must not
    start yet, and says so (`# lazy: ...` on the line above its block)."""
    unexplained = []
    for name, path in _modules().items():
        lines = path.read_text().splitlines()
        for function in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                        "trainer"):
                    row = node.lineno - 1
                    while row > 0 and lines[row - 1].strip().startswith(("from ", "import ")):
                        row -= 1
                    if "# lazy" not in lines[row - 1]:
                        unexplained.append(f"{name}:{node.lineno}")
    assert unexplained == []
