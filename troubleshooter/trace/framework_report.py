"""What the trace says about framework-managed mixed precision (Accelerate, Lightning/Fabric, the
Hugging Face Trainer, FSDP): the report's "framework" section, the runtime findings AMP260-AMP262,
and the framework's names for protocol mistakes the recorder saw through the framework's GradScaler.

Never "looks right" for what did not run: when a framework refused float16 on this host and the
trace did not emulate it, the report says exactly what ran and what could not be observed; when it
emulated the framework's float16 path on the CPU, every observation is marked as emulated.
"""
from __future__ import annotations

from typing import Any

from ..findings import Finding, Location, Severity
from ..lint.rules import BY_ID

NOT_RUN = ("AMP260", "framework-fp16-not-run")  # the framework ran float32/bfloat16 instead: nothing observed
EMULATED = ("AMP261", "framework-fp16-emulated")  # its float16 path was exercised on the CPU by the trace
FRAMEWORK_SCHEDULER = ("AMP262", "framework-scheduler-on-skipped-step")  # Lightning's own loop stepped it
SEEN = "seen at run time"
NAMES = {"accelerate": "Accelerate", "lightning": "Lightning", "fabric": "Fabric", "hf_trainer": "the Hugging Face Trainer"}
# A protocol mistake seen through a framework's own GradScaler is the framework rule's business.
FRAMEWORK_RULE = {"AMP101": "AMP130", "AMP102": "AMP130", "AMP107": "AMP133", "AMP110": "AMP134", "AMP112": "AMP131",
                  "AMP115": "AMP141", "AMP116": "AMP132"}
_WORD = {"fp16": "float16", "16-mixed": "float16", "bf16": "bfloat16", "bf16-mixed": "bfloat16"}
NOT_OBSERVED = ["the loss scale and the steps it skips", "whether the LR scheduler steps on skipped steps",
                "whether gradients are clipped before or after the unscale", "float16 overflow in the forward pass"]


def _entries(raw: dict) -> list[dict]:
    return list((raw.get("framework") or {}).get("frameworks") or [])


def _owner(raw: dict) -> dict | None:
    """The framework entry that made the loss scaling (the one that matters for the protocol)."""
    entries = _entries(raw)
    scaling = [e for e in entries if e.get("scaler")]
    return (scaling or [e for e in entries if e.get("framework") != "hf_trainer"] or entries or [None])[0]


def _framework_scalers_only(raw: dict) -> bool:
    fw = raw.get("framework") or {}
    made = len((raw.get("precision") or {}).get("scalers") or [])
    return bool(fw.get("framework_scalers")) and fw["framework_scalers"] >= made


def adjust(raw: dict) -> dict:
    """Rename protocol violations seen through a framework's GradScaler to the framework rules
    (AMP101 -> AMP130, ...), and LR scheduler steps Lightning's own loop made after a skipped step
    to AMP262 (info: Lightning's design, not the user's code). Returns raw, changed in place."""
    fw = raw.get("framework") or {}
    if not fw.get("frameworks"):
        return raw
    owner = _owner(raw) or {}
    name = NAMES.get(owner.get("framework"), owner.get("framework") or "the framework")
    lightning_steps = set(fw.get("lightning_scheduler_steps") or [])
    mapped = _framework_scalers_only(raw)
    # steps a fused optimizer skipped inside its own step(): Accelerate (and the HF Trainer on it) took them
    # for taken ones, so the scheduler it steps "only after an applied step" advanced (AMP145)
    fused_skips = {s["step"] for s in raw.get("series") or [] if s.get("fused_step") and s.get("skipped")}
    unseen = owner.get("framework") in ("accelerate", "hf_trainer")
    out = []
    for v in raw.get("violations") or []:
        v = dict(v)
        if v["rule"] == "AMP107" and (v.get("data") or {}).get("skipped_step") in lightning_steps:
            fw.setdefault("lightning_stepped_on_skip", []).append(v)  # reported as AMP262 (info), not as the user's
            continue
        if v["rule"] == "AMP107" and unseen and (v.get("data") or {}).get("skipped_step") in fused_skips:
            v.update(rule="AMP145", message=f"{v['message']}: the optimizer is fused, so GradScaler called its step() "
                     f"and the kernel skipped the update; {name} took the step for a taken one and its "
                     "scheduler advanced (huggingface/accelerate#4242)")
            out.append(v)
            continue
        if mapped and v["rule"] in FRAMEWORK_RULE:
            v.update(rule=FRAMEWORK_RULE[v["rule"]], message=f"{v['message']} ({name}'s GradScaler; the same mistake "
                     f"as {v['rule']} in framework code)")
        out.append(v)
    raw["violations"] = out
    if fw.get("framework_schedulers") or fw.get("lightning_scheduler_steps") or \
            any(e.get("framework") == "hf_trainer" for e in fw["frameworks"]):
        # the framework steps the scheduler (AcceleratedScheduler and the HF Trainer only after an applied
        # step; Lightning's loop, reported as AMP262): the "inconclusive" AMP107 note is not about this script
        raw["scheduler_after_scaler_steps"] = 0
    return raw


def apply_to_precision(raw: dict, precision: dict) -> dict:
    """The precision section, corrected for what a framework does beyond autocast and parameter
    dtype: FSDP computes in its `param_dtype` from float32 sharded parameters (the optimizer's
    parameters read "float32"), and an emulated framework float16 path says it was emulated."""
    fw = raw.get("framework") or {}
    section = dict(precision)
    for f in fw.get("fsdp") or []:
        dtype = f.get("param_dtype")
        if dtype in ("float16", "bfloat16") and not section.get("mixed"):
            compute = f"{dtype} parameters (FSDP{f['version']} param_dtype; float32 sharded master weights)"
            section["summary"] = section.get("summary", "").replace(str(section.get("compute")), compute, 1)
            section.update(compute=compute, mixed=True, fsdp=f)
            break
    emulated = [e for e in _entries(raw) if e.get("emulated")]
    if emulated:
        e = emulated[0]
        section["emulated"] = True
        asked = _WORD.get(e.get("asked"), e.get("asked"))
        section["summary"] = (f"EMULATED {NAMES.get(e['framework'], e['framework'])} {asked} path on the CPU "
                              f"({e.get('emulation')}): " + section.get("summary", ""))
    return section


def _scaler_summary(raw: dict) -> dict | None:
    series = [s for s in raw.get("series") or [] if s.get("via_scaler") and s.get("scale") is not None]
    if not series:
        return None
    skipped = [s["step"] for s in series if s.get("skipped")]
    last = series[-1].get("scale_after") or series[-1]["scale"]
    return {"steps": len(series), "scale_first": series[0]["scale"], "scale_last": last, "skipped_steps": skipped}


def _scheduler_on_skipped(raw: dict) -> dict | None:
    skipped = {s["step"] for s in raw.get("series") or [] if s.get("skipped")}
    if not skipped:
        return None
    stepped = sorted(r["step"] for r in raw.get("timeline") or []
                     if r.get("step") in skipped and any(e.get("kind") == "scheduler.step" for e in r.get("events") or []))
    return {"skipped_steps": sorted(skipped), "scheduler_stepped_after": stepped}


def _clip_order(raw: dict) -> str:
    rules = {v["rule"] for v in raw.get("violations") or []}
    if rules & {"AMP101", "AMP130"}:
        return "on scaled gradients (before the unscale)"
    clips = unscale_first = 0
    for r in raw.get("timeline") or []:
        seen_unscale = False
        for e in r.get("events") or []:
            if e.get("kind") == "scaler.unscale_":
                seen_unscale = True
            elif e.get("kind") in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"):
                clips += 1
                unscale_first += seen_unscale
    if not clips:
        return "no clipping seen"
    return "after the unscale" if unscale_first == clips else "without an unscale in the same step"


def section(raw: dict, precision: dict) -> dict[str, Any] | None:
    """The report's "framework" section; None for a script that uses none of them."""
    fw = raw.get("framework") or {}
    entries = _entries(raw)
    if not entries and not fw.get("fsdp"):
        return None
    owner = _owner(raw) or {}
    refused = owner.get("refused") and not owner.get("emulated")
    scaling_ran = _scaler_summary(raw) is not None
    out = {"frameworks": entries, "fsdp": fw.get("fsdp") or [], "asked": owner.get("asked"),
           "ran": precision.get("compute"), "emulated": any(e.get("emulated") for e in entries),
           "loss_scaling": _scaler_summary(raw), "scheduler_on_skipped": _scheduler_on_skipped(raw),
           "clip_order": _clip_order(raw) if scaling_ran else "not observable: no loss scaling ran",
           "not_observed": NOT_OBSERVED if refused else []}
    return out


def findings(raw: dict, precision: dict, fw_section: dict | None) -> list[Finding]:
    """AMP260 (a framework refused float16 here and nothing of its float16 path was observed) or
    AMP261 (its float16 path was emulated on the CPU: what was observed), both info."""
    if not fw_section:
        return []
    emulated = [e for e in _entries(raw) if e.get("emulated")]
    owner = emulated[0] if emulated else (_owner(raw) or {})
    where = Location(path=owner.get("path"), line=owner.get("line"))
    name = NAMES.get(owner.get("framework"), owner.get("framework") or "the framework")
    if owner.get("framework") == "accelerate" and any(e.get("framework") == "hf_trainer" for e in _entries(raw)):
        name = "The Hugging Face Trainer's Accelerate"
    version = f" {owner['version']}" if owner.get("version") else ""
    steps = int(raw.get("steps_observed") or 0)
    if owner.get("refused") and not owner.get("emulated"):
        msg = (f"{name[0].upper() + name[1:]}{version} was asked for {owner.get('asked')}; on this CPU it {owner['refused']}. The {steps} traced steps "
               f"computed in {precision.get('compute')}; not observed: " + ", ".join(NOT_OBSERVED) + ".")
        return [Finding(NOT_RUN[0], NOT_RUN[1], Severity.INFO, msg,
                        "Trace where the script runs (a CUDA GPU), or let the trace emulate the framework's float16 path "
                        "on the CPU (the default; TROUBLESHOOTER_TRACE_EMULATE=0 turns it off)", where, None,
                        {"seen": SEEN, **{k: owner.get(k) for k in ("framework", "version", "asked", "refused")}})]
    if owner.get("emulated"):
        ls = fw_section.get("loss_scaling") or {}
        sched = fw_section.get("scheduler_on_skipped")
        word = _WORD.get(owner.get("asked"), "float16")
        parts = [f"{name}{version} was asked for {owner.get('asked')}; on a CPU it {owner.get('refused')}. The trace emulated "
                 f"its {word} path ({owner.get('emulation')}) and every observation below is of that emulation"]
        if ls:
            parts.append(f"loss scale {ls['scale_first']:g} -> {ls['scale_last']:g} over {ls['steps']} scaled steps, "
                         f"{len(ls['skipped_steps'])} skipped" + (f" ({', '.join(map(str, ls['skipped_steps'][:10]))})"
                                                                  if ls["skipped_steps"] else ""))
        elif word == "bfloat16":
            parts.append("bfloat16 needs no GradScaler: there is no loss scale, skipped step or unscale to observe")
        else:
            parts.append("no scaled optimizer step completed")
        if sched:
            n = len(sched["scheduler_stepped_after"])
            parts.append(f"the LR scheduler stepped after {n} of the {len(sched['skipped_steps'])} skipped steps")
        elif ls:
            parts.append("no step was skipped, so whether the LR scheduler steps on skipped steps was not observed")
        if ls or word != "bfloat16":
            parts.append(f"clipping: {fw_section.get('clip_order')}")
        msg = "; ".join(parts) + "."
        return [Finding(EMULATED[0], EMULATED[1], Severity.INFO, msg[0].upper() + msg[1:],
                        f"On a GPU the same code runs this path natively; numbers (skips, overflow) depend on the GPU's "
                        f"{word} kernels and may differ", where, "bf16" if word == "bfloat16" else "fp16",
                        {"seen": SEEN, "emulated": True, **{k: owner.get(k) for k in ("framework", "version", "asked")},
                         "loss_scaling": ls or None, "scheduler_on_skipped": sched})]
    return []


def fsdp_findings(raw: dict) -> list[Finding]:
    """AMP135 (seen at run time): FSDP1 computing in float16 with a plain GradScaler (not ShardedGradScaler)."""
    fw = raw.get("framework") or {}
    fsdp1 = [f for f in fw.get("fsdp") or [] if f["version"] == 1 and f.get("param_dtype") == "float16"]
    scalers = [s for s in (raw.get("precision") or {}).get("scalers") or [] if s.get("enabled")]
    if not fsdp1 or len(scalers) <= fw.get("sharded_scalers", 0):
        return []
    site = scalers[0]
    spec = BY_ID["AMP135"]
    return [Finding(spec.id, spec.name, Severity(spec.severity),
                    f"a plain GradScaler (made at line {site.get('line')}) scales an FSDP1 model that computes in float16 "
                    f"(FSDP wrapped at line {fsdp1[0].get('line')}): each rank checks only its own gradient shard for "
                    "inf/NaN, so with several ranks they disagree on skipping and drift apart. This trace ran one "
                    "process, whose shard is the whole model: the disagreement itself could not be observed here",
                    spec.fix, Location(path=site.get("path"), line=site.get("line")), "fp16",
                    {"seen": SEEN, "fsdp": fsdp1[0]})]


def lightning_scheduler_findings(raw: dict) -> list[Finding]:
    """AMP262 (info): Lightning's own loop stepped the LR scheduler after a step its GradScaler skipped."""
    seen = (raw.get("framework") or {}).get("lightning_stepped_on_skip") or []
    if not seen:
        return []
    first = seen[0]
    steps = sorted({v["data"]["skipped_step"] for v in seen})
    return [Finding(FRAMEWORK_SCHEDULER[0], FRAMEWORK_SCHEDULER[1], Severity.INFO,
                    f"Lightning's training loop stepped the LR scheduler right after step(s) {', '.join(map(str, steps[:10]))}, "
                    "which its GradScaler skipped (inf/NaN gradients): the schedule runs ahead of the updates. This is "
                    "Lightning's loop (LightningModule.lr_scheduler_step), not code in this script",
                    "Usually harmless (a few calibration skips at the start). To keep the schedule exact, override "
                    "`lr_scheduler_step` and skip when `self.trainer.precision_plugin.scaler.get_scale()` dropped",
                    Location(path=first.get("path"), line=first.get("line")), "fp16",
                    {"seen": SEEN, "skipped_steps": steps})]
