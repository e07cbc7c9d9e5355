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
    "vision": set(),                                                # the shapes world: numpy and torch only
    "types": {"config", "algorithms"},
    "config": {"algorithms"},                                       # validation reads the registries
    "modeling": {"config", "types", "events"},
    "rewards": {"config", "types", "algorithms", "modeling"},
    "rollout": {"config", "types", "modeling"},
    "data": {"config", "types", "rewards", "vision"},
    "state": {"config", "types", "events", "algorithms", "modeling", "data"},
    "health": {"config", "types", "state"},                         # rules read metric histories only
    "envs": {"config", "types", "rewards", "rollout", "modeling", "data"},   # environments drive the rollout
    "training": {"config", "types", "events", "algorithms", "modeling", "rewards", "rollout", "data", "state",
                 "health", "envs"},
    "flow": {"config", "types", "algorithms", "state", "health", "training", "vision"},   # Flow-GRPO's sibling loop
    "api": {"config", "types", "events", "algorithms", "modeling", "rewards", "rollout", "data", "state", "training",
            "health", "envs"},
    "cli": {"config", "types", "events", "algorithms", "modeling", "rewards", "rollout", "data", "state", "training",
            "api", "health", "envs", "flow"},
}
#: edges the issue names as forbidden (they must stay outside ALLOWED).
FORBIDDEN = [("algorithms", "training"), ("rollout", "rewards"), ("rewards", "training"), ("data", "training"),
             ("algorithms", "modeling"), ("modeling", "rollout"), ("modeling", "training"), ("state", "training")]
EXEMPT = {"grpo", "grpo.__main__", "grpo._compat"}   # the lazy public exports, `python -m grpo`, the old paths


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    """grpo.training.loop -> training; grpo.types -> types."""
    return module.split(".")[1]


def imported_modules(source: str, module: str) -> list[tuple[str, int]]:
    """Every grpo module `source` imports (function-level imports too): (module, line)."""
    found = []
    for node in ast.walk(ast.parse(source)):
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


def test_the_checker_catches_a_forbidden_edge():
    """A forbidden import, including one hidden inside a function, is reported with its line."""
    source = "import torch\n\ndef f():\n    from grpo.training.loop import run\n    return run\n"
    edges = [("grpo.algorithms.loss", dst, line) for dst, line in imported_modules(source, "grpo.algorithms.loss")]
    assert violations(edges) == ["grpo.algorithms.loss:4 imports grpo.training.loop (algorithms -> training)"]
    edges = [("grpo.rollout.sampler", dst, line)
             for dst, line in imported_modules("from grpo import rewards\n", "grpo.rollout.sampler")]
    assert violations(edges) == ["grpo.rollout.sampler:1 imports grpo.rewards (rollout -> rewards)"]


def test_every_import_names_a_module_that_exists():
    """No code in the package goes through an old path (which would warn)."""
    from grpo._compat import MOVED

    stale = [f"{src}:{line} imports {dst}" for src, dst, line in package_edges() if dst in MOVED]
    assert stale == []


@pytest.mark.parametrize("old,name", [("grpo.loss", "grpo_loss"), ("grpo.trainer", "train"),
                                      ("grpo.guards", "OutputDirLock"), ("grpo.guards", "BadSteps"),
                                      ("grpo.tasks.arithmetic", "solve"), ("grpo.kernels", "DnnLinear")])
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
