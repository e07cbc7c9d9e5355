"""The ``code_execution`` reward: run the completion's code against the row's ``tests`` in the sandbox.

The program is the last fenced block of the completion tagged ``python``/``py``/``python3`` or untagged
(a completion without one scores 0.0). The ``tests`` column holds, per row:

* stdin/stdout pairs -- a list of ``{"input": str, "output": str}``, or ``{"inputs": [...],
  "outputs": [...]}`` (APPS style), or either as a JSON string: one sandboxed run per pair; a pair
  passes when the run exits 0 within the limits and its stdout equals the expected output, compared
  stripped and with trailing whitespace of every line ignored;
* assert checks -- a string of Python, or a list of strings (one check each). A string is split at its
  top-level ``assert`` statements: each check is one assert with the statements before it (setup),
  code after the last assert belongs to it; a string without asserts is one check. All checks of a
  row run in **one** process, after the program and in its namespace (as if appended to it), each
  in its own ``try`` (a failing or crashing check does not stop the next); a check passes when it
  finishes without an exception. The program crashing, exiting or timing out fails every check
  not yet reported (checks report as they finish, so the ones before a hanging check count).

Reward = passed / number of tests. A row whose ``tests`` is None or empty scores None (does not
apply). Runs are spread over a thread pool (each thread waits on one sandboxed process).

The reward rewards behaviour, not intent: a program that reads its own ``main.py`` to forge the
result lines of the assert driver, or returns objects whose ``__eq__`` is always true, can cheat;
stdin/stdout tests are harder to game.
"""

from __future__ import annotations

import ast
import json
import os
import re
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from grpo.rewards.sandbox import Isolation, Limits, run_sandboxed
from grpo.rewards.text import as_text

_FENCE = re.compile(r"```[ \t]*([\w+.#-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = frozenset({"", "python", "py", "python3", "py3"})

#: Runs after the program, in its globals: each check in its own try; results go to fd 1 tagged.
_ASSERT_DRIVER = """\
def __grpo_run_checks(__program, __checks, __tag, __write=__import__("os").write):
    __scope = globals()
    exec(compile(__program, "solution.py", "exec"), __scope)
    for __i, __check in enumerate(__checks):
        try:
            exec(compile(__check, "check_%d.py" % __i, "exec"), __scope)
            __ok = 1
        except BaseException:
            __ok = 0
        __write(1, ("\\n%s %d %d\\n" % (__tag, __i, __ok)).encode())


__grpo_run_checks({program!r}, {checks!r}, {tag!r})
"""


def extract_code(completion: Any) -> str | None:
    """The last fenced block tagged python/py/python3 or untagged; None without one."""
    blocks = [code for tag, code in _FENCE.findall(as_text(completion)) if tag.lower() in _PYTHON_TAGS]
    return blocks[-1] if blocks else None


def parse_tests(tests: Any) -> tuple[str, list] | None:
    """A row's ``tests`` -> ("io", [(stdin, expected stdout), ...]) or ("asserts", [check, ...]); None if absent."""
    if tests is None:
        return None
    if isinstance(tests, str):
        stripped = tests.strip()
        if stripped[:1] in ("[", "{"):
            try:
                return parse_tests(json.loads(stripped))
            except ValueError:
                pass
        return ("asserts", split_asserts(tests)) if stripped else None
    if isinstance(tests, dict):
        if "inputs" in tests and "outputs" in tests:
            return _io_pairs(list(zip(tests["inputs"], tests["outputs"])))
        return parse_tests([tests])
    if isinstance(tests, (list, tuple)):
        if not tests:
            return None
        if all(isinstance(t, dict) and "input" in t and "output" in t for t in tests):
            return _io_pairs([(t["input"], t["output"]) for t in tests])
        if all(isinstance(t, str) for t in tests):
            return "asserts", list(tests)
    raise ValueError(f"unsupported tests value {str(tests)[:80]!r}: expected a list of {{'input', 'output'}} "
                     "pairs, {'inputs': [...], 'outputs': [...]}, or assert statements (a string or list of strings)")


def _io_pairs(pairs: list) -> tuple[str, list] | None:
    def text(value: Any) -> str:
        return "\n".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)

    return ("io", [(text(i), text(o)) for i, o in pairs]) if pairs else None


def split_asserts(source: str) -> list[str]:
    """Split Python at its top-level asserts: each check = the statements since the previous assert + one assert."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return [source]
    lines, checks, start = source.splitlines(), [], 0
    for node in body:
        if isinstance(node, ast.Assert):
            checks.append("\n".join(lines[start:node.end_lineno]))
            start = node.end_lineno
    if not checks:
        return [source]
    if start < len(lines):
        checks[-1] += "\n" + "\n".join(lines[start:])
    return checks


def same_output(got: str, expected: str) -> bool:
    """Outputs compare equal stripped, ignoring trailing whitespace on every line."""
    def norm(s: str) -> list[str]:
        return [line.rstrip() for line in s.strip().splitlines()]

    return norm(got) == norm(expected)


def make_code_execution(timeout: float = 5.0, workers: int | None = None, memory_mb: int = 512,
                        max_processes: int = 32, output_kib: int = 64, isolation: Isolation | None = None,
                        tmp_root: str | None = None) -> Callable[..., list[float | None]]:
    """A ``code_execution`` reward with these limits: `timeout` seconds per run, `workers` parallel runs
    (default os.cpu_count()), `memory_mb` address space and `max_processes` per run, `output_kib`
    captured per stream; `isolation`/`tmp_root` as in ``run_sandboxed`` (for tests)."""
    limits = Limits(memory_mb=memory_mb, max_processes=max_processes, output_bytes=output_kib * 1024)

    def run(code: str, stdin: str = ""):
        return run_sandboxed(code, stdin=stdin, timeout=timeout, limits=limits, isolation=isolation,
                             tmp_root=tmp_root)

    def code_execution(prompts: list, completions: list, tests: list | None = None,
                       **_: object) -> list[float | None]:
        """Fraction of the row's ``tests`` the completion's last python block passes (see grpo.rewards.code)."""
        tests = [None] * len(completions) if tests is None else tests
        jobs: list[tuple[int, Callable[[], int]]] = []       # (completion index, run -> tests passed)
        n_tests: list[int | None] = []
        for i, (completion, row_tests) in enumerate(zip(completions, tests)):
            spec, code = parse_tests(row_tests), extract_code(completion)
            n_tests.append(None if spec is None else len(spec[1]))
            if spec is not None and code is not None:
                jobs += _jobs(i, code, spec, run)
        passed = [0] * len(completions)
        n_workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
        if n_workers == 1:
            outcomes = [job() for _, job in jobs]
        else:
            with ThreadPoolExecutor(n_workers, thread_name_prefix="code-reward") as pool:
                outcomes = list(pool.map(lambda job: job[1](), jobs))
        for (i, _), n in zip(jobs, outcomes):
            passed[i] += n
        return [None if n is None else k / n for k, n in zip(passed, n_tests)]

    return code_execution


def _jobs(i: int, code: str, spec: tuple[str, list], run: Callable) -> list[tuple[int, Callable[[], int]]]:
    """The sandboxed runs of one completion, each returning how many tests it passed."""
    kind, items = spec
    if kind == "io":
        return [(i, lambda stdin=stdin, out=out: int(_io_passes(run(code, stdin), out))) for stdin, out in items]
    return [(i, lambda: _asserts_passed(run, code, items))]


def _io_passes(result, expected: str) -> bool:
    return result.ok and same_output(result.stdout, expected)


def _asserts_passed(run: Callable, code: str, checks: list[str]) -> int:
    """Run the program followed by its checks in one process; count the checks reported as passed."""
    tag = "grpo-check-" + secrets.token_hex(8)
    result = run(_ASSERT_DRIVER.format(program=code, checks=checks, tag=tag))
    found = {int(m.group(1)): m.group(2) == "1"
             for m in re.finditer(rf"^{tag} (\d+) ([01])$", result.stdout, re.MULTILINE)}
    return sum(found.get(k, False) for k in range(len(checks)))


#: The built-in reward (registered as ``code_execution``): 5 s per run, one worker per CPU.
code_execution = make_code_execution()
