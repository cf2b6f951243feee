"""AMP117 unstable-op-under-autocast."""
import ast
import re

from ..analysis import walk, tail, text
from ..lazy_re import lazy
from ._steps import training_regions
from .base import Hit, Rule

_NUMERIC_MODULES = {"math", "np", "numpy", "jnp", "random"}


def _unstable(m, n: ast.AST) -> str | None:
    """Describe why `n` is numerically risky in float16, or None."""
    if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) and _big_exponent(n.right):
        return f"`{text(n)}` raises to a large power"
    if not isinstance(n, ast.Call):
        return None
    t = tail(n.func)
    recv = n.func.value if isinstance(n.func, ast.Attribute) else None
    if recv is not None and isinstance(recv, ast.Name) and recv.id in _NUMERIC_MODULES:
        return None
    if isinstance(n.func, ast.Name) and (m.names.qual(n.func) or "").split(".")[0] in _NUMERIC_MODULES:
        return None
    is_torch_fn = recv is not None and (m.names.qual(recv) or "").startswith("torch")
    operand = (n.args[0] if n.args else None) if is_torch_fn else recv
    if operand is not None and not ({x.id for x in walk(operand) if isinstance(x, ast.Name)} - set(m.names.alias)):
        return None  # a constant such as torch.log(torch.tensor(10000.0))
    if t == "exp" and isinstance(recv, ast.Attribute) and isinstance(recv.value, ast.Name) and recv.value.id == "self":
        return None  # a float32 parameter such as CLIP's logit_scale.exp()
    if t == "exp" and operand is not None and _bounded_exp(operand):
        return None  # exp(-loss) <= 1 (focal loss), exp(0.5 * logvar) (Gaussian / VAE std)
    if t == "exp" and (is_torch_fn or (recv is not None and not isinstance(recv, ast.Name)) or
                       (recv is not None and recv.id not in m.names.alias)):
        return f"`{text(n)[:40]}` can overflow float16 (exp(x) > 65504 for x > 11)"
    if t == "log":
        arg = n.args[0] if (is_torch_fn and n.args) else recv
        if arg is not None and any(tail(c.func) in {"softmax", "sigmoid"} for c in walk(arg) if isinstance(c, ast.Call)):
            return "manual softmax -> log loses precision and gives -inf in float16"
        if arg is not None and not any(isinstance(c, ast.Call) and tail(c.func) in {"clamp", "clamp_min", "clip"}
                                       for c in walk(arg)) and not isinstance(arg, ast.BinOp):
            return f"`{text(n)[:40]}` gives -inf for values that underflow float16"
    if t == "pow" and ((is_torch_fn and len(n.args) > 1 and _big_exponent(n.args[1])) or
                       (not is_torch_fn and n.args and _big_exponent(n.args[0]))):
        return f"`{text(n)[:40]}` raises to a large power"
    return None


_LOG_SCALE = lazy(r"^log_?(var|variance|std|sigma|scale|alpha)s?$|^logit_scale$", re.I)
_LOSS_NAME = lazy(r"loss|bce|^ce$|_ce$|^ce_|nll", re.I)


def _bounded_exp(operand: ast.AST) -> bool:
    """Exponents real training code keeps small: a negated loss, a log-variance/log-std parameter, or a
    sinusoidal frequency table built from `arange` (timestep / positional embeddings)."""
    if any(isinstance(c, ast.Call) and tail(c.func) in {"arange", "linspace", "logspace"} for c in walk(operand)):
        return True
    if isinstance(operand, ast.BinOp) and isinstance(operand.op, ast.Sub) and any(
            isinstance(c, ast.Call) and tail(c.func) in {"max", "amax", "logsumexp"} for c in walk(operand.right)):
        return True  # exp(x - x.max()) <= 1: the max-subtracted (stable) softmax numerator
    if isinstance(operand, ast.UnaryOp) and isinstance(operand.op, ast.USub):
        inner = operand.operand
        return isinstance(inner, (ast.Name, ast.Attribute)) and bool(_LOSS_NAME.search(tail(inner) or ""))
    if isinstance(operand, ast.BinOp) and isinstance(operand.op, (ast.Mult, ast.Div)):
        sides = [operand.left, operand.right]
        const = [x for x in sides if isinstance(x, ast.Constant) and isinstance(x.value, (int, float))
                 and abs(x.value) <= 1]
        other = [x for x in sides if x not in const]
        if isinstance(operand.op, ast.Div):
            const = [operand.right] if operand.right in const or (isinstance(operand.right, ast.Constant)
                                                                 and isinstance(operand.right.value, (int, float))
                                                                 and abs(operand.right.value) >= 1) else []
            other = [operand.left]
        return len(const) == 1 and len(other) == 1 and _log_scale_name(other[0])
    return _log_scale_name(operand)


def _log_scale_name(n: ast.AST) -> bool:
    return isinstance(n, (ast.Name, ast.Attribute)) and bool(_LOG_SCALE.search(tail(n) or ""))


def _big_exponent(n: ast.AST) -> bool:
    return isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool) \
        and abs(n.value) >= 4


class UnstableOpUnderAutocast(Rule):
    id = "AMP117"
    name = "unstable-op-under-autocast"
    severity = "warning"
    summary = ("`exp`, `log`, `pow` with large exponents or a manual softmax->log in code that runs under float16 "
               "autocast, including helpers and model `forward`s in the same file called from the autocast block.")
    why = ("float16 overflows above 65504 and underflows below 6e-8: `exp(x)` overflows for x > 11, `log` of a "
           "probability that underflowed is -inf, and `softmax` followed by `log` loses the precision "
           "`log_softmax` keeps. One inf becomes NaN in the loss.")
    example_bad = """
with torch.autocast("cuda", dtype=torch.float16):
    probs = torch.softmax(logits, dim=-1)
    loss = -torch.log(probs[range(n), y]).mean()
"""
    example_good = """
with torch.autocast("cuda", dtype=torch.float16):
    logits = model(x)
loss = torch.nn.functional.cross_entropy(logits.float(), y)
"""
    fix = ("Use `log_softmax` / `cross_entropy` / `logsumexp`, or compute the risky part in float32: "
           '`with torch.autocast("cuda", enabled=False): y = torch.exp(x.float())`.')

    known_problems = 'Only the ops the rule knows (`exp`, `log`, `pow` with large exponents, manual softmax->log) in code of the same file are checked; autocast already runs many of them in float32.'
    references = ('https://pytorch.org/docs/stable/amp.html (Autocast op reference)',)

    def check(self, m):
        roots: list[ast.AST] = []
        seen_regions = set()
        for s, ac, with_node in training_regions(m, ("fp16",)):
            if id(with_node) not in seen_regions:
                seen_regions.add(id(with_node))
                roots.extend(with_node.body)
        if not roots:
            return
        reported = set()
        for node, via in self._reachable(m, roots):
            for n in walk(node):
                why = _unstable(m, n)
                if why and n.lineno not in reported:
                    reported.add(n.lineno)
                    where = f" (in `{via}`, called under float16 autocast)" if via else " under float16 autocast"
                    yield Hit.at(n, why + where)

    @staticmethod
    def _reachable(m, roots):
        """Yield (statement root, helper name) for the autocast bodies and local code they call."""
        out = [(r, None) for r in roots]
        seen: set[int] = set()
        queue = list(roots)
        while queue and len(seen) < 300:
            node = queue.pop()
            for c in walk(node):
                if not isinstance(c, ast.Call):
                    continue
                for d in _targets(m, c):
                    if id(d) not in seen:
                        seen.add(id(d))
                        out.extend((st, d.name) for st in d.body)
                        queue.extend(d.body)
        return out


def _targets(m, call: ast.Call):
    """Local functions a call may run: f(), self.f(), model(x) -> Model.forward, self.block(x) -> Block.forward."""
    t = tail(call.func)
    if t is None:
        return []
    out = list(m.functions.get(t, [])) if t not in {"__init__"} else []
    cls = m.instances.get(t)
    if cls in m.classes:
        out += _forwards(m.classes[cls])
    elif not out and _MODEL_NAME.search(t):  # model = build_model(): any local module may be it
        for c in m.classes.values():
            out += _forwards(c)
    return out


_MODEL_NAME = lazy(r"model|net$|^net|module|encoder|decoder|backbone", re.I)


def _forwards(cls: ast.ClassDef) -> list:
    return [d for d in cls.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == "forward"]
