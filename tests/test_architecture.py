"""The shape of the code: the house's parts import only downward, no import cycles between modules, no
private names of another module, no function over 60 lines, no file over 400 lines, strategies know
nothing of the model or the population, and no module-level state changes but a registry's."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "nesgpu"
# the house, bottom to top (docs/architecture.md): a module may import its own part and the parts below
PARTS = {"version": 0, "noise": 1, "rounding": 1, "memory": 1, "files": 1, "options": 1, "registry": 1, "quantize": 1, "kinds": 2, "layers": 3, "conversion": 4, "exporting": 4, "autofallback": 4, "masters": 4, "model": 4, "trainable": 4,
         "distributed": 5, "precision": 5, "blocks": 5, "decode": 5, "population": 6, "engines": 6, "inplace": 6, "strategies": 6, "probe": 7, "tasks": 7, "train": 8, "exactness": 8, "frontends": 9, "tune": 9,
         "cli": 10, "__main__": 11, "__init__": 11}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module imported, names taken from it, line) of every import in the file, relative ones resolved."""
    here = module_name(path).split(".")
    package = here if is_package(path) else here[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found.append((target, [alias.name for alias in node.names], node.lineno))
    return [(t, names, line) for t, names, line in found if t == "nesgpu" or t.startswith("nesgpu.")]


FILES = sorted(SRC.rglob("*.py"))


def part(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    return PARTS[top]


def test_every_module_has_a_part():
    assert {module_name(f).split(".")[1] for f in FILES if "." in module_name(f)} <= set(PARTS)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_go_downward_and_take_no_private_names(path):
    me = module_name(path)
    for target, names, line in imports(path):
        assert part(target) <= part(me), f"{me}:{line} imports {target}, a part above it"
        if target.split(".")[:2] != me.split(".")[:2]:  # another part of the house: public names only
            private = [n for n in names if n.startswith("_") and not n.endswith("__")]  # dunders are public
            assert not private, f"{me}:{line} takes private names {private} of {target}"


def test_strategies_know_nothing_of_the_model_or_the_population():
    for path in (SRC / "strategies").glob("*.py"):
        for target, _, line in imports(path):
            # what they share with the house: how a component declares its options and is registered
            assert target.startswith("nesgpu.strategies") or target in ("nesgpu.options", "nesgpu.registry"), \
                f"{path.name}:{line} imports {target}"


def test_no_import_cycles_between_modules():
    modules = {module_name(f): f for f in FILES}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for target, names, _ in imports(path):
            for candidate in [f"{target}.{n}" for n in names] + [target]:
                if candidate in modules and candidate != name:
                    edges.add(candidate)
                    break
        # a package's own __init__ re-exporting its submodules is not a cycle of theirs
        graph[name] = {e for e in edges if not (name.startswith(e + ".") and is_package(modules[e]))}
    seen, stack, cycles = set(), [], []

    def visit(node):
        if node in stack:
            cycles.append(stack[stack.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for nxt in sorted(graph[node]):
            visit(nxt)
        stack.pop()

    for name in sorted(graph):
        visit(name)
    assert not cycles, f"import cycles: {cycles[:3]}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_functions_and_files_stay_small(path):
    text = path.read_text()
    assert len(text.splitlines()) <= 400, f"{path.relative_to(SRC)} has {len(text.splitlines())} lines"
    long = [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60]
    assert not long, f"{path.relative_to(SRC)}: functions over 60 lines {long}"


# the module-level containers the code may change: registries (a module's own state lives in objects)
REGISTRIES: dict[str, set[str]] = {}  # none: registries are nesgpu.registry.Registry objects
_CONTAINERS = {"dict", "list", "set", "defaultdict", "OrderedDict", "WeakKeyDictionary", "WeakValueDictionary",
               "deque", "Counter"}
_MUTATORS = {"append", "add", "update", "setdefault", "pop", "clear", "extend", "insert", "remove", "discard",
             "popitem"}


def module_containers(tree: ast.Module) -> set[str]:
    """Names the module binds at its top level to a mutable container (a dict, list or set)."""
    pairs = []
    for node in tree.body:
        targets, value = (node.targets, node.value) if isinstance(node, ast.Assign) else (
            ([node.target], node.value) if isinstance(node, ast.AnnAssign) else ([], None))
        for t in targets:  # A = {} and A, B = {}, []
            both = isinstance(t, ast.Tuple) and isinstance(value, ast.Tuple) and len(t.elts) == len(value.elts)
            pairs += list(zip(t.elts, value.elts)) if both else [(t, value)]
    names = set()
    for target, value in pairs:
        call = getattr(getattr(value, "func", None), "id", getattr(getattr(value, "func", None), "attr", None))
        if isinstance(target, ast.Name) and (isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp,
                                                                ast.ListComp, ast.SetComp)) or
                                             isinstance(value, ast.Call) and call in _CONTAINERS):
            names.add(target.id)
    return names


def changed_module_state(tree: ast.Module) -> set[str]:
    """The module-level state the module's code changes: its containers changed in place, names declared
    ``global``, and caches (``@functools.cache``/``lru_cache``, as "@function")."""
    names, found = module_containers(tree), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found |= set(node.names)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            if isinstance(node.func.value, ast.Name) and node.func.value.id in names:
                found.add(node.func.value.id)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            found |= {t.value.id for t in targets if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                      and t.value.id in names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                d = d.func if isinstance(d, ast.Call) else d
                if getattr(d, "attr", getattr(d, "id", None)) in ("cache", "lru_cache"):
                    found.add(f"@{node.name}")
    return found


def test_the_state_rule_finds_what_it_forbids():
    code = "import functools\nA, B = {}, []\nC = set()\ndef f():\n    A['k'] = 1\n    B.append(2)\n"
    code += "@functools.cache\ndef g():\n    global D\n"
    assert changed_module_state(ast.parse(code)) == {"A", "B", "@g", "D"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_level_mutable_state_outside_registries(path):
    found = changed_module_state(ast.parse(path.read_text())) - REGISTRIES.get(module_name(path), set())
    assert not found, (f"{path.relative_to(SRC)} changes module-level state {sorted(found)}: keep it in an object "
                       f"its owner holds, or name the registry in REGISTRIES")


def test_no_public_name_of_the_package_is_also_a_submodule_name():
    # importing a submodule binds its name on the package, over the lazily loaded public name of the same
    # name: `from nesgpu.train import train` once made `nesgpu.export(model)` a call of a module
    import nesgpu

    submodules = {p.stem for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    clashes = sorted(set(nesgpu.__all__) & submodules - {"kinds"})  # nesgpu.kinds is the module itself
    assert not clashes, f"public names that a submodule import would overwrite: {clashes}"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def own_private_names(tree: ast.Module) -> set[str]:
    """The private attribute names a file defines: ``self._x = ...`` (or ``cls._x``), and a class body's
    assignments, annotated fields (a dataclass's, a NamedTuple's) and defs."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    return {n for n in names if _private(n)}


def foreign_private_reads(files: list[Path], root: Path = SRC) -> list[str]:
    """``file:line _name`` for every attribute access ``x._name`` of a name some file of nesgpu defines but
    this file does not: one module's private state read by another (a mixin's, a caller's). Names nesgpu
    never defines (torch's ``_parameters``, ``_modules``) are other libraries' and not counted."""
    trees = {path: ast.parse(path.read_text()) for path in files}
    own = {path: own_private_names(tree) for path, tree in trees.items()}
    ours = set().union(*own.values())
    return sorted((f"{path.relative_to(root)}:{node.lineno} {node.attr}" for path, tree in trees.items()
                   for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in ours - own[path]),
                  key=lambda hit: (hit.split(":")[0], int(hit.split(":")[1].split()[0]), hit))


def test_the_private_read_rule_finds_what_it_forbids(tmp_path):
    owner, reader = tmp_path / "owner.py", tmp_path / "reader.py"
    owner.write_text("class A:\n    _k = 1\n    def __init__(self):\n        self._x = 1\n"
                     "    def _m(self):\n        return self._x + self._parameters\n")
    reader.write_text("def f(a):\n    a.__init__()\n    return a._x + a._m() + a._k + a._modules\n")
    assert foreign_private_reads([owner, reader], tmp_path) == ["reader.py:3 _k", "reader.py:3 _m", "reader.py:3 _x"]


def test_no_module_reads_another_modules_private_attributes():
    found = foreign_private_reads(FILES)
    assert not found, (f"{len(found)} reads of private attributes defined in another file (give the owner a public "
                       f"field, property or method): {found[:40]}")
