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
FLOORS = {"internals": -1, "config": 0, "plan": 1, "rundir": 2, "distribute": 3, "data": 4,
          "models": 5, "task": 6, "track": 7, "run": 8}
TOP = 9
# Leaf modules at the package's top: they import nothing of ours, so every floor may import
# them (the version; the one way a fresh process starts).
LEAVES = {"trainer.version": -2, "trainer.processes": -2}


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
    if module in LEAVES:
        return LEAVES[module]
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
    """Below it only the internals room, and of that only Hydra's side (no TensorFlow)."""
    graph = _graph()
    assert [f"{a} -> {b}" for a, targets in graph.items() if a.startswith("trainer.config")
            for b in targets if not b.startswith("trainer.config")
            and b not in ("trainer.internals", "trainer.internals.hydra_app")] == []
    assert [f"{a} -> {b}" for a, targets in graph.items() if a.startswith("trainer.internals")
            for b in targets if not b.startswith("trainer.internals")] == []
    assert [a for a, targets in graph.items() if "trainer.__main__" in targets] == []


def test_the_leaves_import_nothing_of_ours_and_nothing_imports_the_packages_top():
    """A leaf imports nothing of ours; and no module imports a name from `trainer` itself
    (`from trainer import __version__`: an arrow to the top of the house)."""
    graph = _graph()
    assert {leaf: graph[leaf] for leaf in LEAVES} == {leaf: set() for leaf in LEAVES}
    modules = _modules()
    upward = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "trainer" and not node.level:
                upward += [f"{name}: from trainer import {alias.name}" for alias in node.names
                           if f"trainer.{alias.name}" not in modules]
    assert upward == []


def _calls_in(path: Path, wanted: set[str]) -> list[str]:
    """The dotted names of `wanted` (`subprocess.Popen`, `sys.executable`) a file reads."""
    found = []
    shown = path.relative_to(PACKAGE.parent) if PACKAGE.parent in path.parents else path
    for node in ast.walk(ast.parse(path.read_text())):
        # a call (`subprocess.Popen(...)`, not the type in an annotation), or a read of
        # `sys.executable`
        target = node.func if isinstance(node, ast.Call) else node
        if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                and (target is not node or target.attr == "executable")):
            dotted = f"{target.value.id}.{target.attr}"
            if dotted in wanted:
                found.append(f"{shown}:{node.lineno} {dotted}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("subprocess", "multiprocessing"):
            found.append(f"{shown}:{node.lineno} from {node.module}")
        elif isinstance(node, ast.Import) and any(
                a.name == "multiprocessing" for a in node.names):
            found.append(f"{shown}:{node.lineno} multiprocessing")
    return found


SOURCES = [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "hydra_plugins").rglob("*.py")]
STARTS = {"subprocess.Popen", "subprocess.run", "subprocess.call", "subprocess.check_call",
          "subprocess.check_output", "os.fork", "os.spawnv", "os.execv", "os.execvp",
          "os.posix_spawn", "sys.executable"}


def test_a_fresh_process_is_started_one_way():
    """Every fresh process (`trainer.fit`'s child, a sweep's job, a `tune=batch` try, the
    launcher's workers) starts through `trainer.processes`; nothing else starts one."""
    starts = [hit for path in SOURCES for hit in _calls_in(path, STARTS)]
    assert starts and all(hit.startswith("trainer/processes.py:") for hit in starts), starts
    users = sorted(str(path.relative_to(PACKAGE.parent)) for path in SOURCES
                   if "from trainer.processes import" in path.read_text())
    assert {"trainer/child.py", "trainer/track/sweep.py", "trainer/run/tune.py",
            "trainer/distribute/launch.py"} <= set(users), users


def test_a_planted_process_start_is_seen(tmp_path):
    planted = tmp_path / "x.py"
    planted.write_text("import subprocess, sys\nsubprocess.run([sys.executable])\n")
    assert len(_calls_in(planted, STARTS)) == 2


OVERRIDE_TEXT = ('.split("=", 1)', '.partition("=")', 'lstrip("+~")', '.startswith("hydra.')


def test_override_text_is_read_in_one_place():
    """Only `trainer.config.overrides` splits an override's text into key and value."""
    found = [f"{path.relative_to(PACKAGE.parent)}: {pattern}" for path in SOURCES
             for pattern in OVERRIDE_TEXT if pattern in path.read_text()
             and path != PACKAGE / "config" / "overrides.py"]
    assert found == []
    assert '.partition("=")' in (PACKAGE / "config" / "overrides.py").read_text()


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


# run/'s rooms by phase, bottom first; the modules at run/'s top (the recipe `train`, its
# session and guards, `tune`, the process's owner) sit above them all. Each room's
# `__init__.py` says what it holds and may import, as a subpackage's does.
ROOMS = {"prepare": 0, "assembly": 1, "fit": 2, "end": 3}
RUN_TOP = len(ROOMS)


def _room(module: str) -> int | None:
    """The floor of a module among run/'s rooms; None for a module outside run/."""
    parts = module.split(".")
    if parts[:2] != ["trainer", "run"]:
        return None
    return ROOMS[parts[2]] if len(parts) > 2 and parts[2] in ROOMS else RUN_TOP


def _upward_in_run(graph: dict[str, set[str]]) -> list[str]:
    return [f"{a} -> {b}" for a, targets in graph.items() for b in targets
            if _room(a) is not None and _room(b) is not None and _room(b) > _room(a)]


def test_run_rooms_import_downward():
    """A room of run/ imports only the rooms before it, never the modules at run/'s top."""
    assert _upward_in_run(_graph()) == []


def test_the_rooms_check_sees_an_upward_import():
    graph = _graph()
    graph["trainer.run.prepare.resolve"] = (graph["trainer.run.prepare.resolve"]
                                            | {"trainer.run.assembly.step"})
    graph["trainer.run.end.summary"] = graph["trainer.run.end.summary"] | {"trainer.run.train"}
    assert sorted(_upward_in_run(graph)) == [
        "trainer.run.end.summary -> trainer.run.train",
        "trainer.run.prepare.resolve -> trainer.run.assembly.step"]


def test_every_room_of_run_has_a_floor_and_says_what_it_holds_and_may_import():
    run = PACKAGE / "run"
    assert {p.name for p in run.iterdir() if (p / "__init__.py").exists()} == set(ROOMS)
    for room in ROOMS:
        doc = ast.get_docstring(ast.parse((run / room / "__init__.py").read_text()))
        assert doc and "import" in doc, room


def test_the_prepare_room_holds_decide_modules_only():
    """Its docstring's promise: the pre-flight's room imports no TensorFlow, at any level."""
    assert sorted(m for m in _build_modules() if m.startswith("trainer.run.prepare")) == []


def test_no_folder_holds_more_than_15_modules():
    """A folder a newcomer can read: at most 15 `.py` files directly in it, `__init__` too."""
    crowded = {str(folder.relative_to(PACKAGE.parent)): count for folder in
               [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]
               if (count := len(list(folder.glob("*.py")))) > 15}
    assert crowded == {}


def test_the_entry_points_import_without_tensorflow():
    """TensorFlow starts only once the devices are chosen (and its start-up lines quieted)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['tensorflow'] = sys.modules['keras'] = None; "
            "sys.modules['matplotlib'] = None; "
            "import trainer.__main__, trainer.evaluate, trainer.predict, trainer.launch, "
            "trainer.run.prepare.preflight, trainer.data.tfrecords.__main__, "
            "trainer.run.prepare.resolve")
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


# The entry points: they parse, start TensorFlow quietly (`trainer.run.process`), then import
# the run's build side inside the function that dispatches to it. `trainer.data` resolves
# `Source` and `DataError` on first use (the names users import), `trainer.data.tfrecords`
# its reader's and writer's names (its command starts TensorFlow quietly first).
ENTRY = {"trainer.__main__", "trainer.api", "trainer.child", "trainer.evaluate",
         "trainer.predict", "trainer.launch", "trainer.run.process", "trainer.data",
         "trainer.data.tfrecords", "trainer.data.tfrecords.__main__"}
TENSORFLOW = {"tensorflow", "keras"}


def _imported(path: Path, top_only: bool) -> set[str]:
    """Every module name an import in `path` names (at the top, or anywhere)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def _build_modules() -> set[str]:
    """Modules that import TensorFlow or Keras at their top, or a module that does."""
    modules = _modules()
    tops = {name: _imported(path, True) for name, path in modules.items()}
    build = {name for name, top in tops.items()
             if any(m.split(".")[0] in TENSORFLOW for m in top)}
    grown = True
    while grown:
        grown = False
        for name, top in tops.items():
            if name not in build and any(m in build for m in top):
                build.add(name)
                grown = True
    return build


def test_decide_modules_import_no_tensorflow_at_any_level():
    """The TensorFlow line, drawn by the layout: a module either imports TensorFlow (or a
    module that does) at its top, a build module, or imports neither anywhere, a decide
    module the pre-flight can use before TensorFlow starts."""
    build, graph = _build_modules(), _graph()
    crossing = []
    for name, path in _modules().items():
        if name in build or name in ENTRY:
            continue
        crossing += [f"{name} -> {m}" for m in _imported(path, False)
                     if m.split(".")[0] in TENSORFLOW]
        crossing += [f"{name} -> {m}" for m in graph[name] if m in build]
    assert crossing == []
    assert {"trainer.run.prepare.preflight", "trainer.run.prepare.resolve",
            "trainer.run.prepare.startup", "trainer.run.prepare.owner", "trainer.config.validate",
            "trainer.distribute.strategy", "trainer.distribute.device_plan",
            "trainer.data.augment", "trainer.models.formats", "trainer.task.finetune",
            "trainer.run.prepare.inputs", "trainer.run.prepare.reopen",
            "trainer.plan.speed", "trainer.internals",
            "trainer.internals.hydra_app"}.isdisjoint(build)


def test_only_the_entry_points_import_our_modules_inside_functions():
    """An import inside a function hides an arrow and a late TensorFlow start; past the
    entry points the build modules import TensorFlow at their top instead."""
    hidden = []
    for name, path in _modules().items():
        if name in ENTRY:
            continue
        for function in ast.walk(ast.parse(path.read_text())):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                hidden += [f"{name}:{node.lineno}" for node in ast.walk(function)
                           if isinstance(node, ast.ImportFrom)
                           and (node.module or "").startswith("trainer")
                           or isinstance(node, ast.Import)
                           and any(a.name.startswith("trainer") for a in node.names)]
    assert hidden == []


def test_no_function_is_longer_than_60_lines():
    long = [f"{name}:{node.name} ({node.end_lineno - node.lineno + 1})"
            for name, path in _modules().items()
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > 60]
    assert long == []


def _parameters(node: ast.AST) -> int:
    """The parameters a function takes: positional, keyword-only, `*args` and `**kwargs`,
    a method's `self` or `cls` not counted."""
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    if names[:1] in (["self"], ["cls"]):
        names = names[1:]
    return len(names) + (args.vararg is not None) + (args.kwarg is not None)


def _too_many_parameters(source: str, most: int = 10) -> list[str]:
    return [f"{getattr(node, 'name', 'lambda')}:{node.lineno} ({_parameters(node)})"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            and _parameters(node) > most]


def test_no_function_takes_more_than_10_parameters():
    """Many parameters go into a small frozen record (`trainer.data.pipeline.Batches`,
    `Prep`, `Order`), never into `**kwargs`; the check sees every kind of parameter."""
    wide = {name: found for name, path in _modules().items()
            if (found := _too_many_parameters(path.read_text()))}
    assert wide == {}
    planted = ("def f(a, /, b, c=1, *d, e, f=2, **g): pass\n"
               "class C:\n    def m(self, a, b, c, d, e, f, g, h, i, j): pass\n")
    assert _too_many_parameters(planted, most=6) == ["f:1 (7)", "m:3 (10)"]
    assert _too_many_parameters(planted) == []  # `self` is not counted
    assert _too_many_parameters(planted.replace("self, ", "self, z, ")) == ["m:3 (11)"]


def _callers(function: str) -> set[str]:
    """The package's modules that call `function` by its name."""
    return {name for name, path in _modules().items()
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and function in (getattr(node.func, "id", None),
                                                           getattr(node.func, "attr", None))}


def test_the_data_options_are_parsed_in_one_place():
    """`dataset.cache` and `dataset.service` are read once, by the config's check
    (`read_pipeline`, into the `Spec`); a resume's comparison of two recorded configs reads
    the older spelling of `cache` too."""
    assert _callers("cache_mode") <= {"trainer.config.validate", "trainer.rundir.resume"}
    assert _callers("service_of") == {"trainer.config.validate"}
    assert _callers("read_pipeline") == {"trainer.config.validate"}


def test_run_modules_import_at_most_12_of_ours_and_the_recipe_fits_a_screen():
    graph = _graph()
    wide = {name: len(targets) for name, targets in graph.items()
            if name.startswith("trainer.run.") and len(targets) > 12}
    assert wide == {}
    tree = ast.parse((PACKAGE / "run" / "train.py").read_text())
    recipe = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    assert recipe.end_lineno - recipe.lineno + 1 <= 40


def _under(targets: set[str], *packages: str) -> list[str]:
    return sorted(t for t in targets if any(t.startswith(f"trainer.{p}.") or
                                            t == f"trainer.{p}" for p in packages))


def test_the_entry_points_go_through_the_run():
    """The entry points parse, dispatch and print one line: no run directory or tracker
    internals (`rundir.layout`, the public map of a run directory, aside, but not for the
    command line, whose run reports what it wrote itself); evaluation and
    prediction restore the run through `trainer.run.assembly.restore`, not from its parts."""
    graph = _graph()
    for entry in ("trainer.__main__", "trainer.api", "trainer.evaluate", "trainer.predict"):
        assert [t for t in _under(graph[entry], "rundir", "track")
                if t != "trainer.rundir.layout" or entry == "trainer.__main__"] == [], entry
    for entry in ("trainer.evaluate", "trainer.predict"):
        assert _under(graph[entry], "data", "distribute", "models") == [], entry
    assert [f"{a} -> {t}" for a, targets in graph.items() if a.startswith("trainer.track")
            for t in _under(targets, "distribute")] == []
    assert [f"{a} -> {t}" for a, targets in graph.items() if a.startswith("trainer.models")
            for t in _under(targets, "plan")] == []


# What only `trainer/internals/` may name: the private modules of Keras, TensorFlow and
# Hydra, and the private attributes and replaced methods the room lists.
ROOM = "trainer.internals"


def _private_names() -> tuple[tuple[str, ...], set[str]]:
    """(module prefixes, attribute names) from the room's own list."""
    tree = ast.parse((PACKAGE / "internals" / "__init__.py").read_text())
    listed = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                  and getattr(node.targets[0], "id", "") == "PRIVATE_NAMES")
    names = [ast.literal_eval(item) for item in listed.elts]
    return tuple(n for n in names if "." in n), {n for n in names if "." not in n}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)):
            found.add(id(body[0].value))
    return found


def _private_contacts(source: str, where: str) -> list[str]:
    """Every place in `source` that names one of the room's private names."""
    prefixes, attributes = _private_names()
    tree = ast.parse(source)
    docs, found = _docstrings(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            named = [node.module or ""]
        elif isinstance(node, ast.Attribute):
            named = [node.attr]
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docs):
            named = [node.value] if node.value in attributes else [
                p for p in prefixes if p in node.value]
        else:
            continue
        found += [f"{where}:{node.lineno} {name}" for name in named
                  if name in attributes or name.startswith(prefixes)]
    return found


def test_only_the_internals_room_names_private_keras_tensorflow_and_hydra():
    """An upgrade of Keras, TensorFlow or Hydra that moves a private name breaks one module
    of `trainer/internals/`, which the version check names; nowhere else names one."""
    outside = []
    for name, path in _modules().items():
        if name != ROOM and not name.startswith(f"{ROOM}."):
            outside += _private_contacts(path.read_text(), name)
    assert outside == []


PLANTED = '''from keras.src.losses import loss
import tensorflow.python.framework
model._compute_loss(x)
getattr(metric, "_direction", None)
def f():
    """keras.src named in a docstring is prose."""
'''


def test_the_private_names_check_sees_each_kind_of_contact_and_the_list_is_used():
    assert [line.split(" ")[1] for line in _private_contacts(PLANTED, "planted")] == [
        "keras.src.losses", "tensorflow.python.framework", "_compute_loss", "_direction"]
    room = "\n".join(path.read_text() for name, path in _modules().items()
                     if name.startswith(f"{ROOM}."))
    prefixes, attributes = _private_names()
    assert [n for n in (*prefixes, *attributes) if n not in room] == []


# The modules of a run's place (a run directory at a URL): the place is one object, opened
# once per command and passed to what writes or names the run, never a process-wide table.
PLACE_MODULES = ("rundir/remote.py", "rundir/lease.py", "rundir/backup.py",
                 "run/prepare/place.py")
MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "WeakValueDictionary",
                 "WeakKeyDictionary"}


def _registries(source: str, where: str) -> list[str]:
    """Module-level names bound to a mutable dict, list or set (a registry of the process),
    outside UPPER_CASE constants and `__all__`; and any `global` statement."""
    found = []
    for node in ast.parse(source).body:
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, ast.AnnAssign) and node.value else [])
        value = getattr(node, "value", None)
        called = getattr(getattr(value, "func", None), "id", None) or getattr(
            getattr(value, "func", None), "attr", None)
        mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp,
                                     ast.SetComp)) or (isinstance(value, ast.Call)
                                                       and called in MUTABLE_CALLS)
        found += [f"{where}:{node.lineno} {t.id}" for t in targets
                  if mutable and isinstance(t, ast.Name) and not t.id.isupper()
                  and not t.id.startswith("__")]  # `__all__`: what the module exports
    found += [f"{where}:{n.lineno} global" for n in ast.walk(ast.parse(source))
              if isinstance(n, ast.Global)]
    return found


def test_the_run_place_keeps_no_process_wide_registry():
    """Backups reach the URL and messages name it through the run's place, passed to them
    (`trainer.rundir.remote.RunPlace`); a module-level table of mirrors would come back as
    a mutable dict or list bound at the top of one of these modules."""
    assert [r for rel in PLACE_MODULES
            for r in _registries((PACKAGE / rel).read_text(), rel)] == []


def test_the_registry_check_sees_a_planted_table():
    planted = ("PACKAGES = {'s3': 's3fs'}\n_mirrors: dict[str, int] = {}\n_names = dict()\n"
               "seen = []\ndef f():\n    global seen\n")
    assert [r.split(" ")[1] for r in _registries(planted, "planted")] == [
        "_mirrors", "_names", "seen", "global"]


def test_the_runs_place_is_opened_from_the_composed_config_not_the_command_line():
    """The run's place is opened once, from the composed config (`place.opened`), by the
    command line and `trainer.fit` alike: no module reads the command line's arguments for
    a run directory or a cluster (what `run/at_url.py` did, with a chief rule of its own),
    and the chief is `Cluster.is_chief` of the one reading (`cluster_of_config`)."""
    place = (PACKAGE / "run" / "prepare" / "place.py").read_text(encoding="utf-8")
    assert "argv" not in place and "OverridesParser" not in place
    assert "cluster_of_config(" in place and "is_chief" in place
    for entry in ("__main__.py", "api.py"):
        source = (PACKAGE / entry).read_text(encoding="utf-8")
        assert "opened(run)" in source, entry
    assert not (PACKAGE / "run" / "prepare" / "at_url.py").exists()


# The modules that write a file other than through `trainer.rundir.atomic` (temporary name,
# rename, checksum), and why: none of them writes a run's artefact.
BY_HAND = {
    "child.py": "the payloads a fresh process and its parent hand each other",
    "run/tune.py": "the spec a try of tune=batch reads, in a temporary folder",
    "data/fingerprint.py": "the data's hash cache, beside the data, named per thread",
    "rundir/backup.py": "a backup's files, inside its temporary folder renamed whole",
    "run/prepare/reopen.py": "a finished run's config, in a temporary folder Hydra reads",
    "models/instance.py": "a model's .keras snapshot, in a temporary folder Keras reads",
}
WRITES = ("write_text(", "write_bytes(", "os.replace(", ".rename(", "os.link(",
          "shutil.copy", "copyfile(", "OmegaConf.save(", ".savefig(")


def test_every_artefact_is_written_by_the_one_writer():
    """A run's files are written one way (`trainer.rundir.atomic`: a temporary name, a
    rename, a checksum where asked): no module writes, renames or links a file by hand but
    the few listed, none of which writes a run's artefact. A planted hand-written file is
    caught."""
    def by_hand(source: str) -> list[str]:
        calls = [line.strip() for line in source.splitlines()
                 if any(w in line for w in WRITES) and not line.strip().startswith("#")]
        return [c for c in calls if not c.startswith(("atomic.", "write_text(", "def "))
                and "(tmp" not in c]  # a temporary name of the one writer's (`written`)

    assert by_hand('    (run / "summary.json").write_text(text)\n')
    assert not by_hand('    write_text(run / "summary.json", text)\n')
    assert not by_hand('        figure.savefig(tmp, format="png")\n')
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "rundir/atomic.py" or rel in BY_HAND:
            continue
        calls = by_hand(path.read_text(encoding="utf-8"))
        if calls:
            found[rel] = calls
    assert found == {}
