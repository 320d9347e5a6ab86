"""The user's training command as a trial's: its `{knob}` placeholders, the `--set` keys of its config file, the
knobs the probe applies, each checked before anything runs and filled for one configuration.

A placeholder is a knob's name as the result YAML writes it (`{per_device_batch_size}`, `{num_workers}`,
`{precision}`...) or `{config}`, the path of the tuned copy of --config-file. A value is written as the training's
own command line or YAML would read it: true/false for a flag, the number or the word otherwise; a knob that is unset
for a configuration (prefetch_factor without workers) is written as torch's default, and the training passes it
only where its DataLoader has workers, as torch requires. A framework's word may be empty: a flag that is either
given or left out (WeNet's --pin_memory), so a placeholder standing alone whose word is empty leaves no word.
"""

from __future__ import annotations

import shlex
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.errors import UserError
from autotune.knobs import declarations
from autotune.knobs.config import TrialConfig
from autotune.probe import config_file
from autotune.probe.settings import APPLICABLE

__all__ = ["CONFIG_PLACEHOLDER", "OWN_TASK", "TrainingCommand", "fill_value"]

CONFIG_PLACEHOLDER = "config"
OWN_TASK = "own-training"  # a result's workload task when it measured the user's own command
_ABSENT = "\x1e"  # what an empty word is filled with, then dropped: no command's own word is this character alone
# The knobs a command may carry: those a training takes as an argument (not the run's shape nor autotune's own
# machinery: world_size is the user's launcher's, preloading and feature placement are the built-in recipes'; the
# accumulation is a fixed recipe setting in every space, read back by the probe, not searched).
COMMAND_KNOBS = (
    "per_device_batch_size",
    "num_workers",
    "prefetch_factor",
    "pin_memory",
    "persistent_workers",
    "precision",
    "intra_op_threads",
    "cudnn_benchmark",
)


def fill_value(name: str, value: Any) -> str:
    """A knob's value as the command's text carries it."""
    if value is None:
        value = declarations.get(name).torch_default
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _placeholders(text: str, where: str) -> list[str]:
    """The `{name}` fields of a template, checked: each a knob a command may carry or {config}; `{{` is a brace."""
    try:
        fields = [name for _, name, spec, conversion in string.Formatter().parse(text) if name is not None]
    except ValueError as error:
        raise UserError(f"{where}: {error} in {text!r}; write a literal brace as {{{{ or }}}}") from None
    for name in fields:
        if name == CONFIG_PLACEHOLDER or name in COMMAND_KNOBS:
            continue
        raise UserError(
            f"{where}: {{{name}}} names no knob a command can carry; the placeholders are "
            f"{', '.join('{' + knob + '}' for knob in COMMAND_KNOBS)} and {{config}} (the tuned copy of --config-file)"
        )
    return fields


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingCommand:
    """One training command and how a configuration reaches it."""

    template: str
    config_path: str | None = None  # the user's config file; the trials get a tuned copy of it, never it
    sets: tuple[tuple[str, str], ...] = ()  # (dotted key, value template) applied to the copy
    apply: tuple[str, ...] = ()  # knobs the probe sets inside the training (APPLICABLE)
    cwd: str = "."  # where the command runs: the folder autotune was started in
    knobs_by: dict[str, str] = field(default_factory=dict)  # knob -> "command" | "config" | "autotune"
    lightning: str | None = None  # the factory of a --lightning run (probe/lightning.py writes its template)
    recipe: str | None = None  # the framework of a --recipe run (exports/recipes.py writes its overrides)
    # A framework's own word for a knob's value (SpeechBrain's --precision fp32 for fp32-default), and for a knob a
    # configuration leaves unset (YAML's null for prefetch_factor without workers): the one mapping its export uses.
    words: dict[str, dict[str, str]] = field(default_factory=dict)
    unset: dict[str, str] = field(default_factory=dict)
    # A knob the framework counts for all processes together (3D-Speaker's and ESPnet's batch_size is the global
    # batch): its value times this, the command's world size.
    scale: dict[str, int] = field(default_factory=dict)
    # The precisions the framework can train as asked, per device type ("cpu", "cuda"): the search offers only these.
    precisions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The least value the framework takes for a knob (WeNet's loader cannot run without workers): the search's floor.
    least: dict[str, int] = field(default_factory=dict)

    @classmethod
    def checked(
        cls,
        template: str,
        *,
        config_path: str | None = None,
        sets: list[str] | tuple[str, ...] = (),
        apply: list[str] | tuple[str, ...] = (),
        cwd: str = ".",
        lightning: str | None = None,
        recipe: str | None = None,
        words: dict[str, dict[str, str]] | None = None,
        unset: dict[str, str] | None = None,
        precisions: dict[str, tuple[str, ...]] | None = None,
        scale: dict[str, int] | None = None,
        least: dict[str, int] | None = None,
    ) -> TrainingCommand:
        """The command, with every placeholder, key and knob checked against what it names; one line otherwise."""
        if not template.strip():
            raise UserError("--command is empty; give the command that starts your training, e.g. 'python train.py'")
        try:
            split = shlex.split(template)
        except ValueError as error:
            raise UserError(f"--command cannot be split into words as a shell would: {error}") from None
        if not split:
            raise UserError("--command is empty; give the command that starts your training")
        knobs_by: dict[str, str] = {}
        in_command = _placeholders(template, "--command")
        for name in in_command:
            if name != CONFIG_PLACEHOLDER:
                knobs_by[name] = "command"
        parsed_sets = tuple(_parse_set(text) for text in sets)
        if parsed_sets and config_path is None:
            raise UserError("--set needs --config-file: the file whose copy the keys are set in")
        if config_path is not None:
            document = config_file.read(config_path)
            if CONFIG_PLACEHOLDER not in in_command:
                raise UserError(
                    f"--command never reads the tuned copy of {config_path}: write {{config}} where it names the file"
                )
            for key, value in parsed_sets:
                config_file.check_key(document, key, config_path)
                for name in _placeholders(value, f"--set {key}"):
                    if name == CONFIG_PLACEHOLDER:
                        raise UserError(f"--set {key}: {{config}} is the file itself; a key takes a knob's value")
                    knobs_by.setdefault(name, "config")
        elif CONFIG_PLACEHOLDER in in_command:
            raise UserError("--command uses {config} but no --config-file was given: name the file it stands for")
        for name in apply:
            if name not in APPLICABLE:
                raise UserError(
                    f"--apply {name}: the probe can set only the DataLoader's {', '.join(APPLICABLE)} itself; "
                    "carry other knobs in --command or --set"
                )
            if name in knobs_by:
                raise UserError(
                    f"--apply {name}: the {'command' if knobs_by[name] == 'command' else '--set'} "
                    "carries it already; name it in one place"
                )
            knobs_by[name] = "autotune"
        return cls(
            template=template,
            config_path=config_path,
            sets=parsed_sets,
            apply=tuple(apply),
            cwd=str(Path(cwd).resolve()),
            knobs_by=knobs_by,
            lightning=lightning,
            recipe=recipe,
            words=dict(words or {}),
            unset=dict(unset or {}),
            precisions=dict(precisions or {}),
            scale=dict(scale or {}),
            least=dict(least or {}),
        )

    @property
    def knobs(self) -> tuple[str, ...]:
        """The knobs this command lets a configuration change, in COMMAND_KNOBS order."""
        return tuple(name for name in COMMAND_KNOBS if name in self.knobs_by)

    def values(self, config: TrialConfig) -> dict[str, Any]:
        """The values of this command's knobs in a configuration, as the trial asks for them."""
        return {name: getattr(config, name) for name in self.knobs}

    def fill(self, name: str, value: Any) -> str:
        """A knob's value as this command writes it: the framework's word where it has one."""
        if value is None and name in self.unset:
            return self.unset[name]
        if name in self.scale and isinstance(value, int) and not isinstance(value, bool):
            value = value * self.scale[name]
        text = fill_value(name, value)
        return self.words.get(name, {}).get(text, text)

    def argv(self, config: TrialConfig, config_copy: Path | None) -> list[str]:
        """The command's words for one configuration (no shell: each word as the template split it)."""
        fills = {name: shlex.quote(self.fill(name, getattr(config, name)) or _ABSENT) for name in COMMAND_KNOBS}
        if config_copy is not None:
            fills[CONFIG_PLACEHOLDER] = shlex.quote(str(config_copy))
        words = shlex.split(self.template.format(**fills))
        return [word.replace(_ABSENT, "") for word in words if word != _ABSENT]

    def write_config(self, config: TrialConfig, folder: Path) -> Path | None:
        """The tuned copy of the user's config file for one configuration, in folder; None without a file."""
        if self.config_path is None:
            return None
        changes = {
            key: config_file.safe_scalar(
                value.format(**{name: self.fill(name, getattr(config, name)) for name in COMMAND_KNOBS})
            )
            for key, value in self.sets
        }
        copy = folder / Path(self.config_path).name
        if copy.resolve() == Path(self.config_path).resolve():
            raise ValueError(f"the tuned copy would replace the user's own {self.config_path}")
        folder.mkdir(parents=True, exist_ok=True)
        config_file.write_changed(self.config_path, changes, copy)
        return copy

    def apply_values(self, config: TrialConfig) -> dict[str, Any]:
        """What the probe sets in the training for this configuration."""
        return {name: getattr(config, name) for name in self.apply}

    def to_dict(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "config_path": self.config_path,
            "sets": [f"{key}={value}" for key, value in self.sets],
            "apply": list(self.apply),
            "cwd": self.cwd,
            "knobs_by": dict(self.knobs_by),
            **({"lightning": self.lightning} if self.lightning else {}),
            **(
                {
                    "recipe": self.recipe,
                    "words": self.words,
                    "unset": self.unset,
                    "precisions": {device: list(names) for device, names in self.precisions.items()},
                    "scale": self.scale,
                    "least": self.least,
                }
                if self.recipe
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainingCommand:
        """A command as a result recorded it (not checked again: its config file may have moved since)."""
        return cls(
            template=str(data["template"]),
            config_path=data.get("config_path"),
            sets=tuple(_parse_set(text) for text in data.get("sets", ())),
            apply=tuple(data.get("apply", ())),
            cwd=str(data.get("cwd", ".")),
            knobs_by=dict(data.get("knobs_by") or {}),
            lightning=data.get("lightning"),
            recipe=data.get("recipe"),
            words=dict(data.get("words") or {}),
            unset=dict(data.get("unset") or {}),
            precisions={key: tuple(value) for key, value in (data.get("precisions") or {}).items()},
            scale={key: int(value) for key, value in (data.get("scale") or {}).items()},
            least={key: int(value) for key, value in (data.get("least") or {}).items()},
        )


def _parse_set(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key.strip() or not value.strip():
        raise UserError(f"--set {text!r}: write KEY=VALUE, e.g. --set train.batch_size={{per_device_batch_size}}")
    return key.strip(), value.strip()
