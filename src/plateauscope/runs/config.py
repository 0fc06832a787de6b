"""The config of a whole run: the task it names (and that task's config), the model and the training;
and the one path from a preset, a task and overrides to a validated :class:`RunConfig`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, get_args, get_origin, get_type_hints

from plateauscope.errors import ConfigError
from plateauscope.model.config import JsonConfig, ModelConfig, TrainConfig
from plateauscope.tasks.loading import task_class
from plateauscope.tasks.selector_config import TaskConfig


@dataclass(frozen=True)
class RunConfig(JsonConfig):
    """Everything that defines a run: same RunConfig, same numbers (on the same device)."""

    task: Any = field(default_factory=TaskConfig)
    """The data set: the configuration dataclass of the task named by ``task_name`` (``TaskConfig``
    for the selector task)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The architecture."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The optimiser and schedule."""
    preset: str | None = None
    """Name of the preset this run started from, for the record."""
    task_name: str = "selector"
    """The task (``plateauscope.tasks.loading``): a built-in name (``selector``, ``induction``), or a task
    of your own as ``path/to/file.py:Class`` or ``module:Class``. Runs written before tasks existed
    read as ``selector``."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        """The inverse of ``to_dict`` (the task's config class comes from ``task_name``)."""
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"RunConfig: unknown field(s) {', '.join(unknown)}")
        task_name = d.get("task_name", "selector")
        return cls(
            task=task_class(task_name).Config.from_dict(d.get("task", {})),
            model=ModelConfig.from_dict(d.get("model", {})),
            train=TrainConfig.from_dict(d.get("train", {})),
            preset=d.get("preset"),
            task_name=task_name,
        )

    def validate(self) -> RunConfig:
        """Validate the task, model and training configs together; return self."""
        if hasattr(self.task, "validate"):  # a task config not built on JsonConfig may lack it
            self.task.validate()
        self.model.validate()
        self.train.validate()
        return self

    def replace(self, **overrides: Any) -> RunConfig:
        """Apply flat overrides (``K=3``, ``lr=3e-3``) to whichever sub-config has that field."""
        parts = {"task": self.task, "model": self.model, "train": self.train}
        for key, value in overrides.items():
            owners = [name for name, part in parts.items() if key in {f.name for f in fields(part)}]
            if key == "seed":  # one seed moves the data order and the init; the data set stays
                owners = ["model", "train"]
            if not owners:
                names = {name: ", ".join(f.name for f in fields(part)) for name, part in parts.items()}
                raise ConfigError(f"no option named {key!r}: the {self.task_name} task has {names['task']}; "
                                  f"the model {names['model']}; training {names['train']}")
            for owner in owners:
                parts[owner] = dataclasses.replace(parts[owner], **{key: value})
        return RunConfig(**parts, preset=self.preset, task_name=self.task_name)

    def with_options(self, assignments: list[str], flag: str = "--set") -> RunConfig:
        """Apply ``KEY=VALUE`` texts from a command line, each value read as the declared type of the
        field it sets (``true``/``false`` for flags, ``a,b`` for tuples, ``none`` for an optional field)."""
        hints = {k: v for part in (self.train, self.model, self.task) for k, v in get_type_hints(type(part)).items()}
        overrides = {}
        for text in assignments:
            key, sep, value = text.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key:
                raise ConfigError(f"{flag} expects KEY=VALUE, got {text!r}")
            try:
                overrides[key] = _read_value(value, hints.get(key, Any))
            except ValueError as e:
                raise ConfigError(f"{flag} {text}: {key} takes {e}, got {value!r}") from None
        return self.replace(**overrides)


def _read_value(text: str, hint: Any) -> Any:
    """``text`` read as a value of type ``hint``; a ValueError names what was expected."""
    lowered = text.lower()
    args = [a for a in get_args(hint) if a is not type(None)]
    if type(None) in get_args(hint):  # X | None
        return None if lowered == "none" else _read_value(text, args[0] if len(args) == 1 else Any)
    if get_origin(hint) is tuple:
        item = args[0] if args else Any
        return tuple(_read_value(t.strip(), item) for t in text.split(",") if t.strip())
    if hint is bool:
        if lowered not in ("true", "false"):
            raise ValueError("true or false")
        return lowered == "true"
    for kind, name in ((int, "an integer"), (float, "a number")):
        if hint is kind:
            try:
                return kind(text)
            except ValueError:
                raise ValueError(name) from None
    return text
