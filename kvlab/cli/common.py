"""What every `kvlab` command shares: the one-line parser, library errors in flag names, typed flags, JSON output.

Imports nothing beyond the standard library, so building the parser costs no more than argparse."""

from __future__ import annotations

import argparse
import json
import re
import sys


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2; flags are never abbreviated."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --num would silently mean --num-requests otherwise
        super().__init__(*args, **kwargs)

    def error(self, message):
        """Print message on one line and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# Names that are a model's own figures when the model comes from --model or --config: in a message they become
# their flag only where the user typed that flag.
MODEL_FIGURES = ("num_layers", "num_kv_heads", "head_dim", "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim")


def flag_error(
    parser: argparse.ArgumentParser, error: ValueError, flags: dict[str, str], given: set[str] = frozenset()
) -> int:
    """Report a library ValueError in the command's own flag names; exit status 2.

    The parameter the message starts with becomes its flag, and so does a setting named elsewhere in it
    (max_model_len: --max-model-len, the flag that changes it); a model's own figure (MODEL_FIGURES) does so
    only where the user typed its flag: a model's num_attention_heads stays the model's."""
    if "--config" in given and "model" in flags:  # the model came from a config.json: "model" is that flag
        flags = {**flags, "model": "--config"}
    message = str(error)
    name = re.match(r"[\w\[\]]+", message).group(0) if re.match(r"\w", message) else ""
    if name in flags:
        message = flags[name] + message[len(name) :]
    for library_name, flag in sorted(flags.items(), key=lambda item: -len(item[0])):
        if "_" in library_name and (flag in given or library_name not in MODEL_FIGURES):
            message = re.sub(rf"(?<![\w'-]){library_name}(?![\w'])", flag, message)  # not a quoted field name
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    return 2


def typed_flags(argv: list[str]) -> set[str]:
    """The flags the user typed (--name), so that a default is never mistaken for a choice."""
    return {token.split("=", 1)[0] for token in argv if token.startswith("--")}


def exclusive(given: set[str], flag: str, others, why: str) -> None:
    """A one-line error when flag was typed beside any of others: naming both and why they conflict."""
    if flag not in given:
        return
    for other in others:
        if other in given:
            raise ValueError(f"{flag} and {other} cannot be used together: {why}")


def requires(given: set[str], flag: str, needed: str, why: str) -> None:
    """A one-line error when flag was typed without needed, which it only applies to."""
    if flag in given and needed not in given:
        raise ValueError(f"{flag} applies only with {needed}: {why}")


def model_from_flags(args, given: set[str]):
    """The model --model names (data/models.csv) or --config reads (a config.json: its parameters --num-params-b, or
    counted from the file where kvlab can), None when neither was given; one-line errors for a clash, and for a
    config.json whose parameters are neither given nor countable (the weights and the step cost need them)."""
    from kvlab.core import models, validate

    exclusive(given, "--model", ["--config"], "--config reads the model from a config.json instead")
    requires(given, "--num-params-b", "--config", "a catalog model has its own parameter count")
    if args.config is None:
        return models.get_model(args.model) if args.model else None
    given_b = 0.0 if args.num_params_b is None else validate.positive_number("num_params_b", args.num_params_b)
    model = models.from_config(args.config, num_params_b=given_b)
    if model.num_params_b <= 0:
        why = models.count_params(models.load_config(args.config)[0])[1]
        raise ValueError(f"--config {args.config}: {why}; give --num-params-b (the model's parameters, billions)")
    return model


QUANTIZATION_HELP = (
    "vLLM's --quantization: fp8 holds a 16-bit checkpoint's linear layers in FP8 (1 byte a weight and a scale a "
    "layer; embeddings, lm_head and norms stay 16-bit); none (default) as the checkpoint is"
)


def add_quantization_flag(group) -> None:
    """--quantization {fp8,none}, as `vllm serve` names it."""
    group.add_argument("--quantization", choices=["fp8", "none"], help=QUANTIZATION_HELP)


def apply_quantization(model, quantization: str | None):
    """The model as --quantization loads it: fp8 on a 16-bit checkpoint makes its weights per-tensor FP8 (a
    checkpoint already in FP8 is loaded as it is, as vLLM loads it); none keeps a 16-bit checkpoint; one line for a
    checkpoint quantized otherwise (vLLM refuses a --quantization other than its quantization_config's method)."""
    import dataclasses

    if quantization is None or model is None:
        return model
    if quantization not in ("fp8", "none"):
        raise ValueError(f"--quantization={quantization!r} is not allowed: kvlab serves fp8 and none")
    if not model.quantization:
        return dataclasses.replace(model, quantization="fp8") if quantization == "fp8" else model
    if quantization == "fp8" and model.quantization in ("fp8", "fp8_block"):
        return model
    raise ValueError(
        f"--quantization={quantization!r} is not allowed: {model.name}'s checkpoint is already {model.quantization}, "
        "which vLLM loads as it is; drop --quantization"
    )


def print_json(result: dict) -> None:
    """Print result as one indented JSON object (--json)."""
    print(json.dumps(result, indent=2, sort_keys=False))


class VersionAction(argparse._VersionAction):
    """--version: kvlab's version, looked up (importlib.metadata) only when asked for."""

    def __call__(self, parser, namespace, values, option_string=None):
        self.version = f"kvlab {__import__('kvlab').__version__}"
        super().__call__(parser, namespace, values, option_string)
