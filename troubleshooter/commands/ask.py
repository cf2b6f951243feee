"""`ask`: the questionnaire, in the terminal or from an answers file; writes the recipe with -o."""
from __future__ import annotations

import argparse
import json
import sys

from ..errors import UserError
from ..questionnaire import check_answer, decide, load_answers, questions
from ..recipes import render_recipe


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "ask",
        help="answer a few questions: FP16 or BF16 (or stay FP32), why, and a training loop",
        description="Interactive in a terminal; or pass --answers FILE (YAML or JSON with the keys "
        "gpu, model_family, params_millions, symptoms, current_precision, grad_clipping, grad_accumulation, "
        "custom_exp_log_loss, batchnorm, multi_gpu, num_gpus, framework (none/accelerate/lightning/hf_trainer/"
        "deepspeed: the answer also comes as that framework's settings), bitexact_fp16, bf16_pretrained, training "
        "(train/finetune/lora/inference), fp16_weights; only gpu is required). "
        "gpu: any GPU name from any vendor, a count ('8x V100'), or a compute capability (sm_86, 8.6).",
    )
    p.add_argument("--answers", metavar="FILE", help="answers file (.yaml/.yml/.json); '-' reads YAML/JSON from stdin")
    p.add_argument("--log", metavar="FILE", help="an error message or training log: the symptoms it shows are added")
    p.add_argument("-o", "--output", metavar="PATH", help="write the recommended training script here")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=run)


def _read(prompt: str) -> str:
    try:
        return input(prompt)
    except EOFError:
        raise UserError("the answers ended early: answer in a terminal, or pass --answers FILE") from None


def ask_interactively() -> dict:
    """One question at a time; a bad answer is explained and asked again."""
    answers: dict = {}
    for q in questions():
        if any(str(answers.get(k)).lower() != str(v) for k, v in (q.get("only_if") or {}).items()):
            continue
        hint = f" [{q['default']}]" if q.get("default") not in (None, []) else ""
        if q["type"] == "list":
            print("  " + "; ".join(f"{k}: {v}" for k, v in q.get("choice_help", {}).items()), file=sys.stderr)
        elif q["type"] == "choice":
            hint = f" ({'/'.join(q['choices'])})" + hint
        elif q["type"] == "bool":
            hint = {True: " [Y/n]", False: " [y/N]"}.get(q.get("default"), " [y/n]")
        while True:
            if q.get("multiline"):
                print(q["prompt"], file=sys.stderr)
                lines = []
                while (line := _read("")) != "":
                    lines.append(line)
                raw = "\n".join(lines)
            else:
                raw = _read(f"{q['prompt']}{hint}: ").strip()
            if raw == "":
                answers[q["key"]] = q.get("default")
                break
            value, problem = check_answer(q, raw)
            if problem is None:
                answers[q["key"]] = value
                break
            print(f"  {problem}", file=sys.stderr)
    return {k: v for k, v in answers.items() if v is not None}


def _answers_from(args) -> dict:
    if args.answers == "-":
        from ..bounded import read_bytes
        from ..safeyaml import MAX_BYTES, load

        data = load(read_bytes("-", MAX_BYTES, "the answers on stdin"), "the answers on stdin")  # JSON is YAML too
        return data if data is not None else {}
    if args.answers:
        return load_answers(args.answers)
    return ask_interactively()


def run(args: argparse.Namespace) -> int:
    answers = _answers_from(args)
    if args.log:
        try:
            with open(args.log, encoding="utf-8", errors="replace") as fh:
                log_text = fh.read()
        except OSError as exc:
            raise UserError(f"cannot read {args.log}: {exc.strerror or exc}") from None
        if isinstance(answers, dict):
            answers = {**answers, "log": "\n".join(filter(None, [answers.get("log"), log_text]))}
    decision = decide(answers)
    if args.output:
        from .recipe import write_script

        path = write_script(render_recipe(**decision.recipe_options), args.output)
        print(f"wrote {path}: run it with `python {path}`", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(decision.to_dict(), indent=2))
    else:
        print(decision.to_text())
    return 0
