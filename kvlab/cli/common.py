"""What every `kvlab` command shares: the one-line parser, library errors in flag names, typed flags, the flags of
kvlab.studies.serving's options (FLAGS: vLLM's names where vLLM has one) and the options a command's flags give.

Beyond the standard library it imports kvlab.studies.serving (numpy, no more), whose table names every flag."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys

from kvlab.studies.serving import FLAGS, ServingOptions


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


def check_model_flags(given: set[str]) -> None:
    """--model and --config give the model one way; --num-params-b is a config.json model's (one-line errors)."""
    exclusive(given, "--model", ["--config"], "--config reads the model from a config.json instead")
    requires(given, "--num-params-b", "--config", "a catalog model has its own parameter count")


def flag_table(*names: str, **flags: str) -> dict[str, str]:
    """The flags of the options names (FLAGS), and flags: a command's own, for flag_error (name -> flag)."""
    return {name: FLAGS[name] for name in names} | flags


def add_flag(group, name: str, **kwargs):
    """Add option name's flag (FLAGS) to group; its dest is name where the flag is name in dashes (vLLM's are)."""
    return group.add_argument(FLAGS[name], **kwargs)


def options_of(args, cls=ServingOptions, flags: dict[str, str] = FLAGS, **changes):
    """The options (cls, a frozen dataclass) that the parsed flags give: each field from its flag's value where the
    command has that flag and it is set (else the field's default), then changes."""
    values = {}
    for field in dataclasses.fields(cls):
        dest = flags[field.name].removeprefix("--").replace("-", "_") if field.name in flags else field.name
        if getattr(args, dest, None) is not None:
            values[field.name] = getattr(args, dest)
    return cls(**values | changes)


QUANTIZATION_HELP = (
    "vLLM's --quantization: fp8 holds a 16-bit checkpoint's linear layers in FP8 (1 byte a weight and a scale a "
    "layer; embeddings, lm_head and norms stay 16-bit); none (default) as the checkpoint is"
)


def add_quantization_flag(group) -> None:
    """--quantization {fp8,none}, as `vllm serve` names it."""
    add_flag(group, "quantization", choices=["fp8", "none"], help=QUANTIZATION_HELP)


class VersionAction(argparse._VersionAction):
    """--version: kvlab's version, looked up (importlib.metadata) only when asked for."""

    def __call__(self, parser, namespace, values, option_string=None):
        self.version = f"kvlab {__import__('kvlab').__version__}"
        super().__call__(parser, namespace, values, option_string)
