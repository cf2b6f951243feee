"""The step-event walker skips functions that cannot record an event (lint/analysis/prefilter.py):
on every in-repo lint script, a full walk of each skipped function records nothing, so the skip
changes no finding."""
import ast
from pathlib import Path

import pytest

from troubleshooter.lint.analysis import FileModel, Scope, Walker
from troubleshooter.lint.analysis.prefilter import event_capable_defs
from troubleshooter.lint.source import parse

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*(ROOT / "tests" / "fixtures" / "lint").glob("*.py"), *(ROOT / "tests" / "lint_corpus").glob("*.py"),
                  *(ROOT / "tests" / "lint_corpus_frameworks").rglob("*.py")])


def _defs(m: FileModel) -> list[ast.AST]:
    return m.of_class(ast.FunctionDef) + m.of_class(ast.AsyncFunctionDef)


@pytest.fixture(scope="module")
def models():
    out = []
    for path in SCRIPTS:
        try:
            out.append((path.name, FileModel(parse(path.read_text(), str(path)), path.read_text())))
        except SyntaxError:
            continue  # the corpus keeps a few broken files on purpose
    return out


def test_corpus_is_large_enough(models):
    assert len(models) >= 150
    assert sum(len(_defs(m)) for _, m in models) >= 500


def test_skipped_functions_record_no_event(models):
    skipped = missed = 0
    for name, m in models:
        defs = _defs(m)
        capable = event_capable_defs(m, defs)
        for d in defs:
            if id(d) in capable:
                continue
            skipped += 1
            full = Walker(m, Scope(d, d.name, None)).run(d.body)
            if full.events:
                missed += 1
                print(name, d.name, [(e.kind, e.line) for e in full.events])
    assert missed == 0
    assert skipped > 0  # the filter does skip work on this corpus


def test_light_walk_keeps_call_names_and_regions(models):
    for name, m in models:
        for scope in m.scopes[1:]:
            full = Walker(m, Scope(scope.node, scope.name, scope.cls, nograd_func=scope.nograd_func)).run(scope.node.body)
            assert scope.calls == full.calls, (name, scope.name)
            assert [(a, id(w), g) for a, w, g in scope.regions] == [(a, id(w), g) for a, w, g in full.regions], \
                (name, scope.name)


def test_linting_leaves_no_reference_cycles():
    """lint/runner.py turns the cycle collector off while linting: that is only safe while a file's
    model is freed by reference counting (a cycle would keep every file's tree alive until the end)."""
    import gc

    from troubleshooter.lint import lint_paths

    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        assert lint_paths([str(p) for p in sorted((ROOT / "tests" / "lint_corpus").glob("*.py"))[:4]]).findings
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()


def test_helpers_outside_the_event_set_summarise_to_nothing(models):
    """`Walker._call` skips the helper summaries of a call whose local defs are all outside the
    prefilter's event-helper set: on every in-repo script, each such def has none of the kinds."""
    from troubleshooter.lint.analysis.events import GRAD, HELPER_BACKWARD, SCALER_STEP, UNSCALE, UPDATE
    from troubleshooter.lint.analysis.prefilter import EVENT_HELPERS

    outside = 0
    for name, m in models:
        helpers = m.memo.peek(EVENT_HELPERS)
        walker = Walker(m, Scope(m.tree, "<module>", None))
        for d in _defs(m):
            if id(d) in helpers:
                continue
            outside += 1
            assert not any(walker._def_has(d, k) for k in (HELPER_BACKWARD, UNSCALE, GRAD, SCALER_STEP, UPDATE)), \
                (name, d.name)
            assert not walker._plain_step_helper(d), (name, d.name)
    assert outside > 100
