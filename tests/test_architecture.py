"""The house rules of docs/architecture.md: each folder's imports go one way, the math imports nothing
from the rest, old import paths forward to the new ones with a warning, every module stays small."""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import pytest

import grpo

PACKAGE = Path(grpo.__file__).parent

#: part -> the parts it may import (its own modules always). Top-level modules are parts of their own.
ALLOWED: dict[str, set[str]] = {
    "algorithms": set(),                                            # pure math: nothing from grpo
    "events": set(),
    "accelerator": set(),                                           # the device interface: torch only
    "vision": set(),                                                # the shapes world: numpy and torch only
    "types": {"config", "algorithms", "accelerator"},
    "config": {"algorithms"},                                       # validation reads the registries
    "modeling": {"config", "types", "events", "accelerator"},
    "cpu": {"modeling"},                                            # CPU-only machinery: fills modeling's hooks
    "rewards": {"config", "types", "algorithms", "modeling"},
    "rollout": {"config", "types", "modeling"},
    "data": {"config", "types", "rewards", "vision"},
    "state": {"config", "types", "events", "algorithms", "modeling", "data", "accelerator"},
    "health": {"config", "types", "state"},                         # rules read metric histories only
    "envs": {"config", "types", "rewards", "rollout", "modeling", "data"},   # environments drive the rollout
    "training": {"config", "types", "events", "algorithms", "modeling", "rewards", "rollout", "data", "state",
                 "health", "envs", "accelerator", "cpu"},           # cpu: from grpo.training.cpu_runtime only
    "flow": {"config", "types", "algorithms", "state", "health", "training", "vision"},   # Flow-GRPO's sibling loop
    "api": {"config", "types", "events", "algorithms", "modeling", "rewards", "rollout", "data", "state", "training",
            "health", "envs"},
    "cli": {"config", "types", "events", "algorithms", "modeling", "rewards", "rollout", "data", "state", "training",
            "api", "health", "envs", "flow"},
}
#: edges the issue names as forbidden (they must stay outside ALLOWED).
FORBIDDEN = [("algorithms", "training"), ("rollout", "rewards"), ("rewards", "training"), ("data", "training"),
             ("algorithms", "modeling"), ("modeling", "rollout"), ("modeling", "training"), ("state", "training"),
             ("modeling", "cpu"), ("rollout", "cpu"), ("api", "cpu"), ("cli", "cpu")]
#: The only module outside grpo/cpu that may import it (grpo._compat's table of old paths only names it).
CPU_IMPORTERS = {"grpo.training.cpu_runtime"}
EXEMPT = {"grpo", "grpo.__main__", "grpo._compat"}   # the lazy public exports, `python -m grpo`, the old paths


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    """grpo.training.loop -> training; grpo.types -> types."""
    return module.split(".")[1]


MAIN_GUARDS = {"__name__ == '__main__'", "'__main__' == __name__"}


def imported_modules(source: str, module: str) -> list[tuple[str, int]]:
    """Every grpo module `source` imports (function-level imports too): (module, line). The body of an
    ``if __name__ == "__main__":`` guard is left out: a module's ``python -m`` entry may hand over to grpo/cli/."""
    found = []
    tree = ast.parse(source)
    script = {id(n) for g in tree.body if isinstance(g, ast.If) and ast.unparse(g.test) in MAIN_GUARDS
              for n in ast.walk(g)}
    for node in ast.walk(tree):
        if id(node) in script:
            continue
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "grpo"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "grpo":
            if node.module == "grpo":                      # from grpo import training -> grpo.training
                found += [(f"grpo.{a.name}", node.lineno) for a in node.names]
            else:
                found.append((node.module, node.lineno))
    return found


def violations(edges: list[tuple[str, str, int]]) -> list[str]:
    bad = []
    for src, dst, line in edges:
        if src in EXEMPT or dst == "grpo":
            continue
        a, b = part_of(src), part_of(dst)
        if a != b and b not in ALLOWED.get(a, set()):
            bad.append(f"{src}:{line} imports {dst} ({a} -> {b})")
    return bad


def package_edges() -> list[tuple[str, str, int]]:
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        src = module_name(path)
        edges += [(src, dst, line) for dst, line in imported_modules(path.read_text(), src)]
    return edges


def test_every_part_is_known_and_imports_go_one_way():
    edges = package_edges()
    parts = {part_of(module_name(p)) for p in PACKAGE.rglob("*.py") if module_name(p) not in EXEMPT}
    assert parts <= set(ALLOWED), f"a part without import rules: {sorted(parts - set(ALLOWED))}"
    assert violations(edges) == []


def test_the_allowed_graph_has_no_cycle_and_excludes_the_named_edges():
    for a, b in FORBIDDEN:
        assert b not in ALLOWED[a], (a, b)
    seen: dict[str, int] = {}

    def depth(part: str, stack: tuple[str, ...] = ()) -> int:
        assert part not in stack, f"cycle: {' -> '.join(stack + (part,))}"
        if part not in seen:
            seen[part] = 1 + max((depth(d, stack + (part,)) for d in ALLOWED[part]), default=0)
        return seen[part]

    assert all(depth(p) >= 1 for p in ALLOWED)


def test_only_the_cpu_runtime_imports_the_cpu_package():
    """grpo.cpu is reached through grpo.training.cpu_runtime alone: every other module, function-level imports
    included, goes through the runtime or grpo.modeling.hooks. Checked on the import statements and grep-style."""
    importers = {src for src, dst, _ in package_edges()
                 if part_of(dst) == "cpu" and part_of(src) != "cpu" and src not in EXEMPT}
    assert importers == CPU_IMPORTERS
    texts = {module_name(p): p.read_text() for p in PACKAGE.rglob("*.py")}
    grepped = {m for m, text in texts.items() if "from grpo.cpu" in text or "import grpo.cpu" in text
               or "from grpo import cpu" in text}
    assert {m for m in grepped if part_of(m) != "cpu"} == CPU_IMPORTERS


def test_the_checker_catches_a_forbidden_edge():
    """A forbidden import, including one hidden inside a function, is reported with its line."""
    source = "import torch\n\ndef f():\n    from grpo.training.loop import run\n    return run\n"
    edges = [("grpo.algorithms.loss", dst, line) for dst, line in imported_modules(source, "grpo.algorithms.loss")]
    assert violations(edges) == ["grpo.algorithms.loss:4 imports grpo.training.loop (algorithms -> training)"]
    edges = [("grpo.rollout.sampler", dst, line)
             for dst, line in imported_modules("from grpo import rewards\n", "grpo.rollout.sampler")]
    assert violations(edges) == ["grpo.rollout.sampler:1 imports grpo.rewards (rollout -> rewards)"]


#: Imports between modules of one folder that may close a circle: (importer, imported) -> why. Empty: none may.
CIRCLE_EXCEPTIONS: dict[tuple[str, str], str] = {}


def folder_of(module: str) -> str:
    """The folder a module sits in: grpo.config.build -> grpo.config; a package (its __init__) is in itself."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    return module if path.is_dir() else module.rpartition(".")[0]


def sibling_edges(edges: list[tuple[str, str, int]], modules: set[str]) -> dict[str, set[str]]:
    """importer -> the modules of its own folder it imports (`from grpo.config import build` names the submodule
    build; `from grpo.config import Config` the package itself), exceptions left out."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for src, dst, _ in edges:
        if dst in modules and dst != src and folder_of(dst) == folder_of(src) and (src, dst) not in CIRCLE_EXCEPTIONS:
            graph[src].add(dst)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other round a circle (strongly connected, more than one), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def submodule_edges() -> list[tuple[str, str, int]]:
    """package_edges, with `from grpo.x import y` pointing at grpo.x.y when y is a module."""
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        src = module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "grpo":
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    is_module = PACKAGE.parent.joinpath(*sub.split(".")).with_suffix(".py").is_file() or \
                        PACKAGE.parent.joinpath(*sub.split(".")).is_dir()
                    edges.append((src, sub if is_module else node.module, node.lineno))
            elif isinstance(node, ast.Import):
                edges += [(src, a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "grpo"]
    return edges


def test_no_import_circle_inside_a_folder():
    """Inside each folder imports go one way, function-level imports included: names two modules share sit in a
    third (grpo/cli/common.py, grpo/config/errors.py, grpo/config/names.py), not behind a late import."""
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    assert circles(sibling_edges(submodule_edges(), modules)) == []
    assert all(a in modules and b in modules for a, b in CIRCLE_EXCEPTIONS)


def test_the_circle_finder_sees_a_circle_hidden_in_a_function():
    graph = {"grpo.cli.main": {"grpo.cli.flow"}, "grpo.cli.flow": {"grpo.cli.main"}, "grpo.cli.plots": set(),
             "grpo.config.a": {"grpo.config.b"}, "grpo.config.b": {"grpo.config.c"}, "grpo.config.c": {"grpo.config.a"}}
    assert circles(graph) == [["grpo.cli.flow", "grpo.cli.main"], ["grpo.config.a", "grpo.config.b", "grpo.config.c"]]
    source = "import os\n\ndef f():\n    from grpo.cli.main import parse_overrides\n"
    edges = [("grpo.cli.flow", dst, line) for dst, line in imported_modules(source, "grpo.cli.flow")]
    edges.append(("grpo.cli.main", "grpo.cli.flow", 15))
    assert circles(sibling_edges(edges, {"grpo.cli.main", "grpo.cli.flow"})) == [["grpo.cli.flow", "grpo.cli.main"]]


def test_every_import_names_a_module_that_exists():
    """No code in the package goes through an old path (which would warn)."""
    from grpo._compat import MOVED

    stale = [f"{src}:{line} imports {dst}" for src, dst, line in package_edges() if dst in MOVED]
    assert stale == []


@pytest.mark.parametrize("old,name", [("grpo.loss", "grpo_loss"), ("grpo.trainer", "train"),
                                      ("grpo.guards", "OutputDirLock"), ("grpo.guards", "BadSteps"),
                                      ("grpo.tasks.arithmetic", "solve"), ("grpo.kernels", "DnnLinear"),
                                      ("grpo.modeling.cpu_kernels", "use_cpu_matmul"),
                                      ("grpo.modeling.native_gemm", "grad_accumulate"),
                                      ("grpo.modeling.native_attention", "use_native_attention"),
                                      ("grpo.modeling.native_elementwise", "swiglu_forward"),
                                      ("grpo.modeling.heap", "release_free_heap"), ("grpo.modeling.workspace", "held"),
                                      ("grpo.modeling.grad_in_place", "GradIntoLinear"),
                                      ("grpo.modeling.grad_in_place", "accumulate_grad"),
                                      ("grpo.modeling.vml_warmup", "warm_vml")])
def test_old_import_paths_forward_with_a_deprecation_warning(old, name):
    from grpo._compat import MOVED

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import sys

        sys.modules.pop(old, None)
        module = importlib.import_module(old)
        value = getattr(module, name)
    new = [importlib.import_module(t) for t in MOVED[old]]
    assert any(getattr(m, name, None) is value for m in new)
    assert any(issubclass(w.category, DeprecationWarning) and old in str(w.message) for w in caught)


def test_modules_stay_small():
    big = [f"{module_name(p)}: {n} lines" for p in PACKAGE.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 420]
    assert big == []
