"""Autocast regions, dtypes and devices as far as the source tells them (resolved through the file)."""
from __future__ import annotations

import ast
from dataclasses import dataclass

from .astutil import func_tail, is_false, is_true, tail
from .vocab import BF16_DTYPES, FP16_DTYPES, FP32_DTYPES


@dataclass(frozen=True)
class Autocast:
    """An autocast region's settings, as far as the source tells them."""

    dtype: str  # fp16 | bf16 | fp32 | unknown
    device: str  # cuda | cpu | unknown
    enabled: str  # yes | no | dynamic
    line: int
    col: int
    # The device came from a variable whose value depends on the machine (`"cuda" if
    # torch.cuda.is_available() else "cpu"`, a `device` argument): true on CUDA only.
    conditional: bool = False

    @property
    def active(self) -> bool:
        return self.enabled != "no" and self.dtype != "fp32"

    @property
    def fp16(self) -> bool:
        return self.active and self.dtype == "fp16"




class AutocastResolution:
    """FileModel's part that answers: which dtype, which device, is this `with` an autocast region?"""

    def dtype_of(self, node: ast.AST | None, depth: int = 0) -> str:
        if node is None:
            return "unknown"
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            s = node.value.lower()
        elif isinstance(node, ast.Call) and func_tail(node) == "getattr" and len(node.args) == 2 \
                and isinstance(node.args[1], ast.Constant):
            s = str(node.args[1].value).lower()
        else:
            s = self.names.qual(node) or ""
            if isinstance(node, ast.Name) and node.id in self.consts and depth < 3:
                return self.dtype_of(self.consts[node.id], depth + 1)
        if s in FP16_DTYPES:
            return "fp16"
        if s in BF16_DTYPES:
            return "bf16"
        if s in FP32_DTYPES:
            return "fp32"
        return "unknown"

    def device_of(self, node: ast.AST | None, depth: int = 0) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            d = node.value.split(":")[0].lower()
            return d if d in {"cuda", "cpu"} else "unknown"
        if isinstance(node, ast.Name) and node.id in self.consts and depth < 3:
            return self.device_of(self.consts[node.id], depth + 1)
        return "unknown"

    def device_candidates(self, node: ast.AST | None, depth: int = 0) -> set[str]:
        """Every device a device expression can take, following `str(d)`, `d.type`, `torch.device(...)`,
        `x if c else y` and every assignment of a name in the file; 'unknown' where a value is opaque."""
        if node is None or depth > 4:
            return {"unknown"}
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            d = node.value.split(":")[0].lower()
            return {d if d in {"cuda", "cpu", "mps", "xpu"} else "unknown"}
        if isinstance(node, ast.IfExp):
            return self.device_candidates(node.body, depth + 1) | self.device_candidates(node.orelse, depth + 1)
        if isinstance(node, ast.Call):
            t = func_tail(node)
            if t in {"str", "device"} and node.args:
                return self.device_candidates(node.args[0], depth + 1)
            if t == "split" and isinstance(node.func, ast.Attribute):
                return self.device_candidates(node.func.value, depth + 1)
            return {"unknown"}
        if isinstance(node, ast.Subscript):
            return self.device_candidates(node.value, depth + 1)
        if isinstance(node, ast.Attribute) and node.attr == "type":
            return self.device_candidates(node.value, depth + 1)
        if isinstance(node, (ast.Name, ast.Attribute)):
            values = self.assigns.get(tail(node) or "", [])
            if not values:
                return {"unknown"}
            out: set[str] = set()
            for v in values:
                out |= self.device_candidates(v, depth + 1)
            return out
        return {"unknown"}

    @property
    def moves_to_cuda(self) -> bool:
        """The script puts something on a CUDA device (`.cuda()`, `.to("cuda")`, `device="cuda"`)."""
        return self.memo.get(("moves_to_cuda",), lambda: "cuda" in self.calls_by_tail() or any(
            isinstance(n.value, str) and n.value.split(":")[0] == "cuda" for n in self.of_class(ast.Constant)))

    def resolve_device(self, node: ast.AST | None) -> tuple[str, bool]:
        """(device, conditional) of an autocast device argument; conditional when it may also be the CPU."""
        direct = self.device_of(node)
        if direct != "unknown" or node is None or isinstance(node, ast.Constant):
            return direct, False
        cands = self.device_candidates(node)
        if cands == {"cuda"}:
            return "cuda", False
        if "cuda" in cands or ("unknown" in cands and self.moves_to_cuda):
            return "cuda", True
        if cands == {"cpu"}:
            return "cpu", False
        return "unknown", False

    def is_autocast_callable(self, func: ast.AST) -> bool:
        q = self.names.qual(func) or ""
        return q.endswith("autocast") and (q.startswith("torch") or q == "autocast")

    def autocast_of_call(self, call: ast.Call, extra: ast.Call | None = None) -> Autocast | None:
        """Autocast settings of `torch.autocast(...)`, `torch.cuda.amp.autocast(...)`, aliases."""
        if not self.is_autocast_callable(call.func):
            return None
        q = self.names.qual(call.func) or ""
        args = list(call.args)
        kws = {k.arg: k.value for k in call.keywords if k.arg}
        if extra is not None:  # partial(torch.autocast, device_type=..., dtype=...)
            args = list(extra.args[1:]) + args
            kws = {**{k.arg: k.value for k in extra.keywords if k.arg}, **kws}
        old_cuda = ".cuda.amp" in q
        old_cpu = ".cpu.amp" in q
        conditional = False
        if not (old_cuda or old_cpu) and q == "autocast":  # unresolved bare name: guess by first arg
            old_cuda = not (("device_type" in kws) or (args and isinstance(args[0], ast.Constant)
                                                       and isinstance(args[0].value, str)))
        if old_cuda or old_cpu:
            device = "cuda" if old_cuda else "cpu"
            enabled = kws.get("enabled", args[0] if args else None)
            dtype_node = kws.get("dtype", args[1] if len(args) > 1 else None)
        else:
            device, conditional = self.resolve_device(kws.get("device_type", args[0] if args else None))
            dtype_node = kws.get("dtype", args[1] if len(args) > 1 else None)
            enabled = kws.get("enabled", args[2] if len(args) > 2 else None)
        if dtype_node is None:
            dtype = {"cuda": "fp16", "cpu": "bf16"}.get(device, "unknown")
        else:
            dtype = self.dtype_of(dtype_node)
        en = "yes" if enabled is None or is_true(enabled) else "no" if is_false(enabled) else "dynamic"
        return Autocast(dtype, device, en, call.lineno, call.col_offset, conditional)

    def autocast_of_with(self, expr: ast.AST) -> Autocast | None:
        """The autocast region a `with` item opens, if it is one."""
        if isinstance(expr, ast.Call):
            ac = self.autocast_of_call(expr)
            if ac is not None:
                return ac
            k = func_tail(expr)
            if k in self.autocast_factories:
                f = self.autocast_factories[k]
                return self.autocast_of_call(ast.Call(func=f.args[0], args=expr.args, keywords=expr.keywords,
                                                      lineno=expr.lineno, col_offset=expr.col_offset), extra=f)
            if k and "autocast" in k.lower():
                return Autocast("unknown", "unknown", "dynamic", expr.lineno, expr.col_offset)
            return None
        k = tail(expr)
        if k in self.autocast_vars:
            a = self.autocast_vars[k]
            return Autocast(a.dtype, a.device, a.enabled, expr.lineno, expr.col_offset, a.conditional)
        if k and "autocast" in k.lower():
            return Autocast("unknown", "unknown", "dynamic", expr.lineno, expr.col_offset)
        return None

    def is_nograd(self, expr: ast.AST) -> bool:
        if isinstance(expr, ast.Call):
            t = func_tail(expr)
            if t in {"no_grad", "inference_mode"}:
                return not (expr.args and is_false(expr.args[0]))
            if t == "set_grad_enabled" and expr.args and is_false(expr.args[0]):
                return True
        return False

