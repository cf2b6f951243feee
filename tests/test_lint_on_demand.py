"""The parts of the lint file model that are skipped or left for later when a file cannot need them
(issue 28) give what the full computation gives, on every in-repo lint script:

- the step walker scans only the statements whose lines hold an event trigger (prefilter.EVENT_LINES)
  and leaves the other statements' call names for the first read of `scope.calls`: the same events,
  call names and autocast regions as a walk that scans every expression;
- `FileModel.calls_resolving` resolves only the calls whose qualified name can match: the same calls
  and names as resolving every call;
- `FileModel.may_hold_scaler` is False only where `is_scaler` is False for every name of the file.
"""
import ast
from pathlib import Path

import pytest

from troubleshooter.lint.analysis import FileModel, Scope, Walker, tail
from troubleshooter.lint.source import parse

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*(ROOT / "tests" / "fixtures" / "lint").glob("*.py"), *(ROOT / "tests" / "lint_corpus").glob("*.py"),
                  *(ROOT / "tests" / "lint_corpus_frameworks").rglob("*.py")])


@pytest.fixture(scope="module")
def models():
    out = []
    for path in SCRIPTS:
        text = path.read_text()
        try:
            out.append((path.name, FileModel(parse(text, str(path)), text)))
        except SyntaxError:
            continue  # the corpus keeps a few broken files on purpose
    assert len(out) >= 150
    return out


def _event_facts(scope: Scope) -> list[tuple]:
    return [(e.kind, e.line, e.col, e.order, e.branches, tuple(id(g.node) for g in e.guards),
             tuple(id(lp.node) for lp in e.loops), e.autocast, e.nograd, e.recv, e.scaled, e.managed, e.via_call)
            for e in scope.events]


class _ScanAll(Walker):
    """The walker as it was: every expression of every statement scanned, every `if` keyed."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._event_lines = None


def test_walks_scanning_event_lines_only_match_full_scans(models):
    walked = deferred = 0
    for name, m in models:
        for scope in m.scopes:
            if scope.events or scope.name == "<module>":
                deferred += getattr(scope, "_walk", None) is not None  # call names left for later
                body = scope.node.body
                full = _ScanAll(m, Scope(scope.node, scope.name, scope.cls, nograd_func=scope.nograd_func)).run(body)
                assert _event_facts(scope) == _event_facts(full), (name, scope.name)
                # what rules read through the events: the branch kinds of the statements holding one, and the
                # accumulation guards with an event inside (rules/_steps.py skips the others)
                held = {s for e in full.events for s, _, _, _ in e.branches}
                assert {s: scope.branch_kinds.get(s) for s in held} == {s: full.branch_kinds.get(s) for s in held}
                used = {id(g) for e in full.events for g in e.guards}
                assert [id(g.node) for g in scope.guards if id(g) in {id(x) for e in scope.events for x in e.guards}] \
                    == [id(g.node) for g in full.guards if id(g) in used]
                assert scope.calls == full.calls, (name, scope.name)
                assert [(a, id(w), g) for a, w, g in scope.regions] == [(a, id(w), g) for a, w, g in full.regions]
                walked += 1
    assert walked > 300 and deferred > 100  # the corpus does exercise the skip


def test_calls_resolving_finds_every_matching_call(models):
    checks = [(lambda last: last == "autocast", ()), (lambda last: last == "initialize", ()),
              (lambda last: last.endswith("DistributedDataParallel"), ("DDP",)),
              (lambda last: last.endswith("FullyShardedDataParallel"), ("FSDP", "fully_shard")),
              (lambda last: last.endswith("GradScaler"), ())]
    found = 0
    for name, m in models:
        for last, tails in checks:
            every = [(c, m.names.qual(c.func) or "") for c in m.calls]
            expected = [(id(c), q) for c, q in every if last(q.rpartition(".")[2]) or tail(c.func) in tails]
            got = [(id(c), q) for c, q in m.calls_resolving(last, tails)]
            assert [x for x in got if x in expected] == expected, (name, expected, got)
            found += len(expected)
    assert found > 50


def test_no_scaler_name_means_no_scaler(models):
    quiet = 0
    for name, m in models:
        if m.may_hold_scaler:
            continue
        quiet += 1
        keys = {tail(n) for n in m.nodes if isinstance(n, (ast.Name, ast.Attribute))} | set(m.assigns)
        assert not any(m.is_scaler(k) for k in keys), name
    assert quiet > 20


def test_config_folders_are_listed_once_per_run(tmp_path, monkeypatch):
    """Every script asks for the config files beside it; a run lists each folder once, and the next run
    lists it again (a config written between two runs is read)."""
    import shutil

    from troubleshooter.lint import lint_paths
    from troubleshooter.lint.frameworks import configs

    src = ROOT / "tests" / "fixtures" / "lint_configs" / "accelerate_yaml"
    for i in range(3):
        shutil.copy(src / "train.py", tmp_path / f"train_{i}.py")
    listed = []
    real = configs.os.listdir
    monkeypatch.setattr(configs.os, "listdir", lambda folder: listed.append(folder) or real(folder))
    first = lint_paths([str(tmp_path)])
    assert listed == [str(tmp_path)]
    assert not any("default_config.yaml" in f.message for f in first.findings)
    shutil.copy(src / "default_config.yaml", tmp_path / "default_config.yaml")
    second = lint_paths([str(tmp_path)])
    assert listed == [str(tmp_path)] * 2
    assert sum("default_config.yaml:8" in f.message for f in second.findings if f.rule == "AMP130") == 3


def test_helper_kinds_skipped_only_where_none_can_be_found(models):
    """`Walker._find_direct_kinds` answers nothing, without walking, for a file with no `.grad`, no
    backward call and no scaler name: a walk of each of its functions finds nothing either."""
    from troubleshooter.lint.analysis.walker import _DIRECT_KINDS_POSSIBLE

    gated = 0
    for name, m in models:
        defs = m.of_class(ast.FunctionDef) + m.of_class(ast.AsyncFunctionDef)
        walker = Walker(m, Scope(m.tree, "<module>", None))
        answers = [walker._find_direct_kinds(d) for d in defs]
        if not defs or m.memo.peek(_DIRECT_KINDS_POSSIBLE):
            continue
        gated += 1
        m.memo.put(_DIRECT_KINDS_POSSIBLE, True)  # force the walk
        assert [walker._find_direct_kinds(d) for d in defs] == answers == [frozenset()] * len(defs), name
    assert gated > 10


def test_event_scopes_are_the_scopes_with_events_for_good(models):
    """Rules that read only events loop over `event_scopes`: the scopes with an event, in order; a lazy
    scope's later walk (reading `calls`) adds none."""
    with_events = 0
    for name, m in models:
        before = [id(s) for s in m.event_scopes]
        assert before == [id(s) for s in m.scopes if s.events], name
        for s in m.scopes:
            s.calls  # runs every deferred walk
        assert [id(s) for s in m.scopes if s.events] == before, name
        with_events += bool(before)
    assert with_events > 100


def _exact_identifiers(tree: ast.AST) -> set[str]:
    """The identifier set from a full walk: every Name, Attribute and def parameter (args and keyword-only),
    lower-cased."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            out.add(n.id.lower())
        elif isinstance(n, ast.Attribute):
            out.add(n.attr.lower())
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.update(a.arg.lower() for a in n.args.args + n.args.kwonlyargs)
    return out


# what the gates ask (prefilter, walker, roles, AMP106/118/127/142), and words that are not names
_GATE_WORDS = ("grad", "data", "scale", "step", "scaler", "autocast", "gradscaler", "custom_fwd", "custom_bwd",
               "backward", "not_a_name_here")
_GATE_PARTS = ("scaler", "scale_loss", "loss_scale", "scal")


def test_name_gates_answer_as_the_identifier_set(models):
    """`may_name` / `may_name_part` answer exactly what the identifier set says, for every name of every
    script and the words the gates ask; names are read as the parser reads them (NFKC)."""
    misses = 0
    for name, m in models:
        exact = _exact_identifiers(m.tree)
        assert m.identifiers == exact, name
        for word in _GATE_WORDS:
            assert m.may_name(word) == (word in exact), (name, word)
            misses += not m.may_name(word)
        for part in _GATE_PARTS:
            assert m.may_name_part(part) == any(part in i for i in exact), (name, part)
        assert m.scaler_named == any("scaler" in i for i in exact), name
    assert misses > 100  # the gates do say no
    src = 'p = model.ｇｒａｄ\nｕse_ﬁx = 1\nx = grad_x + xgrad\ns = "Gradscaler in a string"\n'
    m = FileModel(parse(src), src)
    assert {"grad", "use_fix"} <= m.identifiers == _exact_identifiers(m.tree)
    assert m.may_name("grad") and m.may_name("use_fix") and m.may_name_part("use_f")
    assert not m.may_name("grad_") and not m.may_name("rad") and not m.may_name("gradscaler")


def test_any_scaler_matches_the_scan_of_every_name(models):
    """`any_scaler` asks the text for a name holding "scaler" / "scale_loss" / "loss_scale" before the exact
    scan: the same answer as scanning every identifier."""
    import re

    from troubleshooter.lint.analysis.vocab import SKLEARN_SCALER_RE
    from troubleshooter.lint.analysis.astutil import func_tail

    gated = 0
    for name, m in models:
        exact = _exact_identifiers(m.tree)
        other = {k.lower() for k, vs in m.assigns.items() if any(
            isinstance(v, ast.Call) and re.search(r"(Standard|MinMax|Robust|MaxAbs)Scaler$", func_tail(v) or "")
            for v in vs)}
        expected = bool(m.scaler_ctor or m.scaler_method_keys) or any(
            ("scaler" in i and i not in other and not SKLEARN_SCALER_RE.search(i)) or "scale_loss" in i
            or "loss_scale" in i for i in exact if "scal" in i)
        assert m.any_scaler == expected, name
        gated += not expected
    assert gated > 20


def test_version_guard_tests_are_unparsed_only_where_they_can_match(models):
    """AMP106 unparses an `if` test to look for a version guard only when its source lines can spell one:
    the same guards as unparsing every test, on every in-repo script and on spellings the unparser
    rewrites (escapes, implicit string concatenation, continuation lines, non-ASCII names)."""
    from troubleshooter.lint.analysis import text
    from troubleshooter.lint.rules.amp106 import _GUARD_RE, may_guard

    src = ('import torch\nif "vers" "ion" in x: pass\nif "\\x76ersion": pass\nif a and \\\n   b: pass\n'
           'if ｖｅｒｓｉｏｎ: pass\nif (torch.\n    __version__ >= "2"): pass\nif TORCH_GE_2: pass\n'
           'y = 1 if hasattr(torch, "amp") else 2\nif x.parse (y): pass\nif ready: pass\n')
    scripts = models + [("crafted", FileModel(parse(src), src))]
    skipped = matched = 0
    for name, m in scripts:
        for node in m.of_class(ast.If) + m.of_class(ast.IfExp):
            found = bool(_GUARD_RE.search(text(node.test)))
            matched += found
            if not may_guard(m, node.test):
                skipped += 1
                assert not found, (name, node.lineno, text(node.test))
    crafted = scripts[-1][1]
    assert [may_guard(crafted, n.test) for n in crafted.of_class(ast.If)] == [True] * 7 + [False]
    assert skipped > 1000 and matched > 10


def _role_facts(m) -> dict:
    """The role tables of a model, nodes by identity."""
    from troubleshooter.lint.analysis.roles import ROLES

    def fact(value):
        if isinstance(value, list):
            return [id(v) for v in value]
        return value if isinstance(value, (str, tuple)) or value.__class__.__name__ == "Autocast" else id(value)

    out = {}
    for name in sorted(ROLES):
        table = getattr(m, name)
        out[name] = sorted(table) if isinstance(table, set) else {k: fact(v) for k, v in table.items()}
    return out


def test_role_tables_known_empty_are_empty(models):
    """A role table that the gates of roles.py (`_CAN_FILL`) answer without classifying is empty, and stays
    so once the others are built: each table read first on its own, then all, equals every table built at
    once (the gates forced open), on every in-repo script."""
    from troubleshooter.lint.analysis.roles import _CAN_FILL

    src = ("from torch.cuda.amp import GradScaler as GS\nfrom torch import autocast as ac\nimport functools\n"
           "from torch.optim.lr_scheduler import StepLR as Later\ns = GS()\nctx = ac('cuda')\n"
           "f = functools.partial(ac, 'cuda')\nw = Later(o, 3)\nm = Net().half()\n")
    crafted = FileModel(parse(src), src)
    assert crafted.scaler_ctor and crafted.autocast_vars and crafted.autocast_factories and crafted.scheduler_keys
    gated = 0
    for name, m in models + [("crafted", crafted)]:
        fresh = FileModel(m.tree, m.source)
        for table in _CAN_FILL:
            if not _CAN_FILL[table](fresh):
                gated += 1
                assert not getattr(fresh, table), (name, table)
        forced = FileModel(m.tree, m.source)
        forced._classify_roles()
        assert _role_facts(fresh) == _role_facts(forced), name
    assert gated > 200  # the gates do say no


def test_rules_needing_events_find_nothing_without_them(models):
    """The engine skips a rule that declares `needs_events` on a file with no training-step event: run on
    every in-repo script without events anyway, each such rule finds nothing."""
    from troubleshooter.lint import lint_text
    from troubleshooter.lint.rules import RULES

    gated = [r for r in RULES if r.needs_events]
    assert len(gated) >= 5
    eventless = [(name, m) for name, m in models if not m.event_scopes]
    assert len(eventless) > 20
    for name, m in eventless:
        for rule in gated:
            assert list(rule.check(m)) == [], (name, rule.id)
    for rule in gated:  # and where a file has events they run: each one's own bad example is still found
        src = ROOT / "tests" / "fixtures" / "lint" / f"bad_{rule.id}.py"
        assert rule.id in {f.rule for f in lint_text(src.read_text(), str(src)).findings}, rule.id


def test_framework_questions_ask_only_their_adapters(models):
    """`frameworks.of` searches only the adapters that can make a setup of the frameworks asked for: the
    same setups, in the same order, as filtering every adapter's (and each adapter makes only its own)."""
    from troubleshooter.lint import frameworks
    from troubleshooter.lint.frameworks import adapters, frameworks_of

    asked = [("accelerate",), ("fabric",), ("lightning", "fabric"), ("deepspeed",), ("fsdp1", "fsdp2"),
             ("accelerate", "fabric", "hf_trainer"), ("accelerate", "fabric", "hf_trainer", "lightning")]
    found = 0
    for name, m in models:
        fresh = FileModel(m.tree, m.source)
        answers = [[id(s) for s in frameworks.of(fresh, *fws)] for fws in asked]  # before the full search
        every = frameworks.setups(fresh)
        assert answers == [[id(s) for s in every if s.framework in fws] for fws in asked], name
        for a in adapters():
            assert {s.framework for s in frameworks._found(fresh, a)} <= frameworks_of(a), (name, a.NAME)
        found += len(every)
    assert found > 50


def test_light_walks_leave_call_names_for_later_and_find_them_all(models):
    """A function walked only for its `with` regions (LightWalker) leaves its expressions' call names for the
    first read of `calls`: the same names, regions and loops as the walk that scanned every expression."""
    from troubleshooter.lint.analysis.walker import LightWalker

    class _Eager(LightWalker):
        _scan = Walker._call_names

    checked = 0
    for name, m in models:
        for scope in m.scopes[1:]:
            if scope.events:
                continue
            fresh = Scope(scope.node, scope.name, scope.cls, nograd_func=scope.nograd_func)
            eager = _Eager(m, fresh).run(scope.node.body)
            assert scope.calls == eager.calls, (name, scope.name)
            assert [(a, id(w), g) for a, w, g in scope.regions] == [(a, id(w), g) for a, w, g in eager.regions]
            assert [id(lp.node) for lp in scope.loops] == [id(lp.node) for lp in eager.loops], (name, scope.name)
            checked += 1
    assert checked > 500
