"""The linter's regular expressions are compiled on first use (lint/lazy_re.py) and then answer as
compiled ones do."""
import re

from troubleshooter.lint.lazy_re import lazy


def test_a_lazy_pattern_is_compiled_on_first_use_and_answers_like_re():
    pattern, text = r"(?P<word>sched\w*)|opt", "lr_Scheduler and opt, scheduler"
    lz, compiled = lazy(pattern, re.I), re.compile(pattern, re.I)
    assert "_compiled" not in vars(lz)  # nothing compiled at import
    assert lz.search(text).span() == compiled.search(text).span()
    assert "_compiled" in vars(lz) and vars(lz)["search"] == compiled.search  # later calls: the bound method
    assert lz.match(text) is compiled.match(text) is None
    assert lz.fullmatch("opt").group(0) == "opt"
    assert lz.findall(text) == compiled.findall(text)
    assert [m.span() for m in lz.finditer(text)] == [m.span() for m in compiled.finditer(text)]
    assert lz.sub("X", text) == compiled.sub("X", text) and lz.subn("X", text) == compiled.subn("X", text)
    assert lz.split(text) == compiled.split(text)
    assert lz.groupindex == compiled.groupindex and (lz.pattern, lz.flags) == (pattern, re.I)


def test_a_bad_pattern_still_fails_when_used():
    bad = lazy(r"(unclosed")
    try:
        bad.search("x")
    except re.error:
        pass
    else:
        raise AssertionError("an invalid pattern must raise re.error on use")
