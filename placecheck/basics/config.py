"""TOML configuration for ``placecheck audit --config FILE`` (or ``[tool.placecheck]`` in pyproject.toml).

A config lists the models a CI step audits. Its shape (``configs/example.toml``
documents every key)::

    jobs = 2                    # optional: --jobs
    timeout = 600               # optional: --timeout, seconds per model
    fail_on = "warning"         # optional: --fail-on
    baseline = "placecheck-baseline.json"   # optional: --baseline

    [defaults]                  # optional: any model key except target/name
    device = "cuda"

    [[models]]
    target = "torchvision.models:resnet18"
    kwargs = { num_classes = 10 }
    allow = [{ code = "PC204", where = "head*", reason = "sync is intended" }]

In ``pyproject.toml`` the same keys live under ``[tool.placecheck]`` (models as
``[[tool.placecheck.models]]``).

Every error is a :class:`~placecheck.basics.errors.UsageError` naming the file, the
line and the key (``tomllib`` gives no positions, so :class:`_LineIndex` finds
them by scanning the text: table headers and ``key =`` lines). This module
does not import torch: the config is read before any model is.
"""

from __future__ import annotations

import datetime
import fnmatch
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, TypeVar

from placecheck.basics import declared
from placecheck.basics.choices import FAIL_ON_CHOICES
from placecheck.basics.codes import expand
from placecheck.basics.declared import ISOLATION_CHOICES as ISOLATION_CHOICES
from placecheck.basics.declared import PROGRESS_CHOICES as PROGRESS_CHOICES
from placecheck.basics.errors import UsageError
from placecheck.basics.options import (
    AuditOptions,
    CheckpointOptions,
    CommonOptions,
    FixOptions,
    RunOptions,
    check_value,
    flag_of,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib



class Allowable(Protocol):
    """What an ``allow`` entry is matched against: a finding's code and ``where`` (the report's
    :class:`placecheck.findings.finding.Finding`, which this layer, below the findings, does not import)."""

    @property
    def code(self) -> str: ...

    @property
    def where(self) -> str: ...


F = TypeVar("F", bound=Allowable)

DEFAULT_JOBS = 1
DEFAULT_TIMEOUT = 600.0
"""Seconds one model's audit may take before it is killed and reported (PC901)."""


@dataclass(frozen=True)
class Allow:
    """A finding the config accepts: its code (or prefix), a ``where`` glob and why."""

    code: str
    """A code or prefix (``PC204``, ``PC2``, ``ALL``)."""
    where: str
    """The finding's ``where`` exactly as a report shows it, or an ``fnmatch`` glob over it
    (``*`` for anywhere, ``head*``)."""
    reason: str
    """Why this finding is acceptable: required, so that suppressions explain themselves."""
    line: int = 0
    """Line of the entry in the config file, for messages."""

    def matches(self, finding: Allowable) -> bool:
        """True when ``finding`` is the one this entry allows."""
        if finding.code not in expand([self.code]):
            return False
        # exact first: a where copied from a report holds brackets (heads[0], cache['k']) that a
        # glob reads as a character class, so as a glob alone it would never match itself
        return finding.where == self.where or fnmatch.fnmatchcase(finding.where, self.where)


@dataclass(frozen=True)
class ModelConfig:
    """One ``[[models]]`` entry, with the ``[defaults]`` and command-line overrides applied."""

    target: str
    """``MODULE:ATTR`` or ``path/to/file.py:ATTR``, as the CLI's TARGET."""
    name: str = ""
    """How reports and baselines name this model (defaults to ``target``)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor arguments (``--kwargs``)."""
    args: tuple[str, ...] = ()
    """Constructor arguments as ``KEY=VALUE`` strings (``--arg``); they win over ``kwargs``."""
    options: AuditOptions = field(default_factory=AuditOptions)
    """How to audit it: the entry's keys that are audit options (``device``, ``inputs``, ...)."""
    allow: tuple[Allow, ...] = ()
    timeout: float | None = None
    """Overrides the run's timeout for this model."""
    family: str = ""
    """A free-form label (configs/torchvision.toml's model family); not used by the audit."""
    unsupported: str = ""
    """Why placecheck cannot audit this model yet (documentation; the model is still audited)."""
    line: int = 0
    """Line of the entry's header in the config file."""

    @property
    def label(self) -> str:
        """The model's name in reports: ``name`` or else ``target``."""
        return self.name or self.target


@dataclass(frozen=True)
class RunConfig:
    """A whole config: the models and the run-wide settings."""

    path: str
    """The file it came from (for messages and SARIF locations)."""
    models: tuple[ModelConfig, ...]
    jobs: int = DEFAULT_JOBS
    timeout: float = DEFAULT_TIMEOUT
    fail_on: str = "warning"
    baseline: str | None = None
    group: bool = True
    """One row per problem (``false``: one per instance, as ``--no-group``)."""
    hints: bool = False
    """The fix hint on every row (``--hints``)."""
    isolation: str = "fork"
    """How each model gets its own process (``--isolation``, :data:`ISOLATION_CHOICES`)."""
    progress: str = "auto"
    """What stderr shows while the models run (``--progress``, :data:`PROGRESS_CHOICES`)."""
    text: str = field(default="", repr=False, compare=False)
    """The config file's text (a sharded run records its digest, so that shards of different
    configs are not merged)."""


# ---- the schema ---------------------------------------------------------------------------------

Check = Callable[[Any], str | None]
"""Returns None when a value is acceptable, else what was expected."""


def _is_str(v: Any) -> str | None:
    return None if isinstance(v, str) else "a string"


def _is_bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _is_table(v: Any) -> str | None:
    return None if isinstance(v, dict) else "a table, e.g. { num_classes = 10 }"


def _is_str_list(v: Any) -> str | None:
    ok = isinstance(v, list) and all(isinstance(x, str) for x in v)
    return None if ok else 'a list of strings, e.g. ["a", "b"]'


def _is_positive_int(v: Any) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
    return None if ok else "an integer >= 1"


def _is_positive_number(v: Any) -> str | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    return None if ok else "a number of seconds > 0"


def _one_of(choices: tuple[str, ...]) -> Check:
    def check(v: Any) -> str | None:
        return None if v in choices else "one of " + ", ".join(f'"{c}"' for c in choices)

    return check


def _option(name: str, shape: Check | None = None) -> Check:
    """The check of an options field's value: ``shape`` (the TOML type), then the options module's own
    check of the value (:func:`placecheck.basics.options.check_value`), whose one-line error the config
    prefixes with the file, line and key."""
    def check(v: Any) -> str | None:
        problem = shape(v) if shape is not None else None
        if problem is None:
            check_value(name, v)
        return problem

    return check


def _is_device_string(v: Any) -> str | None:
    return None if isinstance(v, str) else 'a device string such as "cuda"'


def _is_selectors(v: Any) -> str | None:
    return _is_str_list(v) and 'a list of code prefixes, e.g. ["PC1", "PC204"]'


def _is_selector(v: Any) -> str | None:
    if not isinstance(v, str):
        return 'a code or prefix, e.g. "PC204"'
    check_value("select", [v])
    return None


def _is_allow_list(v: Any) -> str | None:
    ok = isinstance(v, list) and all(isinstance(x, dict) for x in v)
    return None if ok else 'a list of tables, e.g. [{ code = "PC204", where = "*", reason = "..." }]'


SHAPES: dict[str, Check] = {
    "str": _is_str,
    "bool": _is_bool,
    "table": _is_table,
    "str_list": _is_str_list,
    "device": _is_device_string,
    "selectors": _is_selectors,
    "seconds": _is_positive_number,
    "positive_int": _is_positive_int,
    "allow_list": _is_allow_list,
    "models": lambda v: None if isinstance(v, list) and all(isinstance(x, dict) for x in v)
    else "an array of tables ([[models]])",
    "fail_on": _one_of(FAIL_ON_CHOICES),
    "isolation": _one_of(ISOLATION_CHOICES),
    "progress": _one_of(PROGRESS_CHOICES),
}
"""The TOML shapes a declared option's value may have (:attr:`placecheck.basics.declared.Declared.toml`)."""


def _keys(table: str) -> dict[str, tuple[Check, str]]:
    """A config table's keys from the declaration: each key's check (its TOML shape, then, for an
    options field, the options module's own check) and its meaning."""
    keys: dict[str, tuple[Check, str]] = {}
    for name, option in declared.in_config(table).items():
        shape = SHAPES[option.toml] if option.toml else None
        keys[name] = (_option(name, shape), option.config[table])
    return keys


MODEL_KEYS: dict[str, tuple[Check, str]] = _keys(declared.MODELS)
"""Every key a ``[[models]]`` entry (or ``[defaults]``) may hold: its check and its meaning."""

TOP_KEYS: dict[str, tuple[Check, str]] = _keys(declared.TOP)
"""Every top-level key of a config."""

PYPROJECT_KEYS: dict[str, tuple[Check, str]] = {
    "run": (_is_table, "placecheck run's options where its command line does not give them"),
    "fix": (_is_table, "placecheck fix's options where its command line does not give them"),
    "checkpoint": (_is_table, "placecheck checkpoint's options where its command line does not give them"),
}
"""The tables ``[tool.placecheck]`` in pyproject.toml holds besides a config's keys:
``[tool.placecheck.run]``, ``.fix`` and ``.checkpoint`` (:func:`pyproject_command_values`)."""

ALLOW_KEYS: dict[str, tuple[Check, str]] = {
    "code": (_is_selector, "a code or prefix (required)"),
    "where": (_is_str, "a glob over the finding's where (default \"*\")"),
    "reason": (lambda v: None if isinstance(v, str) and v.strip() else "a non-empty string",
               "why the finding is acceptable (required)"),
}
"""Every key of an ``allow`` entry."""

COMMAND_OPTIONS: dict[str, type[CommonOptions]] = {
    "run": RunOptions, "fix": FixOptions, "checkpoint": CheckpointOptions}
"""The commands a config's ``[run]``, ``[fix]`` and ``[checkpoint]`` tables (in pyproject.toml:
``[tool.placecheck.run]``...) give defaults to, and their options objects."""

_NOT_CONFIGURED = frozenset(d.name for d in declared.DECLARED if not d.configurable)
"""Fields that say what one command line targets, not how: never a config's."""


def command_keys(command: str) -> dict[str, tuple[Check, str]]:
    """Every key of a command's table (``[run]``...): a field of its options object, checked by the
    options module (the TOML type first), with its flag."""
    keys: dict[str, tuple[Check, str]] = {}
    for f in fields(COMMAND_OPTIONS[command]):
        if f.name in _NOT_CONFIGURED:
            continue
        kind = str(f.type)
        shape: Check | None = None
        if kind == "bool":
            shape = _is_bool
        elif kind.startswith("tuple"):
            shape = _is_str_list
        elif kind.startswith("str") and f.name != "device":
            shape = _is_str
        keys[f.name] = (_option(f.name, shape), f"as {flag_of(f.name)}")
    return keys


_NOT_IN_DEFAULTS = ("target", "name")
_MODEL_FIELDS = frozenset(f.name for f in fields(ModelConfig)) - {"options", "allow", "line"}
"""Model keys that describe the model or its entry; the others are :class:`AuditOptions` fields."""


# ---- finding line numbers -------------------------------------------------------------------

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY_PART = r"""(?:"[^"]*"|'[^']*'|[A-Za-z0-9_-]+)"""
# a key line, dotted keys included (``kwargs.width = 4`` sets key ``kwargs`` of the table): group 1
# is the first part, the key of the table the line is in
_KEY = re.compile(rf"^\s*({_KEY_PART})(?:\s*\.\s*{_KEY_PART})*\s*=")


class _LineIndex:
    """Where tables and keys are in a TOML text, found by scanning (tomllib gives no positions).

    A table is named by its path: ``("models", 2)`` for the third ``[[models]]``,
    ``("models", 2, "allow", 0)`` for its first ``[[models.allow]]``, ``("defaults",)``.
    Keys of inline tables are looked up after their parent key's line.
    """

    def __init__(self, text: str, prefix: tuple[str, ...]) -> None:
        self.lines = text.splitlines()
        self.headers: dict[tuple[Any, ...], int] = {(): 1}
        self.keys: dict[tuple[Any, ...], dict[str, int]] = {(): {}}
        counts: dict[tuple[Any, ...], int] = {}
        current: tuple[Any, ...] | None = () if not prefix else None
        for number, line in enumerate(self.lines, start=1):
            header = _HEADER.match(line)
            if header and not _KEY.match(line):
                parts = tuple(p.strip().strip('"') for p in header.group(2).split("."))
                if parts[:len(prefix)] != prefix:
                    current = None
                    continue
                parts = parts[len(prefix):]
                path: tuple[Any, ...] = ()
                # an array-of-tables header indexes its last part; parents take their latest index
                for i, part in enumerate(parts):
                    # a sub-table header ([models.kwargs]) is where its key of the parent table is set
                    self.keys.setdefault(path, {}).setdefault(part, number)
                    path += (part,)
                    is_last = i == len(parts) - 1
                    if is_last and header.group(1) == "[[":
                        index = counts.get(path, 0)
                        counts[path] = index + 1
                        path += (index,)
                    elif path in counts:
                        path += (counts[path] - 1,)
                current = path
                self.headers.setdefault(path, number)
                self.keys.setdefault(path, {})
                continue
            key = _KEY.match(line)
            if key and current is not None:
                self.keys.setdefault(current, {}).setdefault(key.group(1).strip("\"'"), number)

    def line(self, table: tuple[Any, ...], key: str | None = None) -> int:
        """Line of ``key`` in ``table`` (or of the table's header); 0 when not found."""
        if key is not None and key in self.keys.get(table, {}):
            return self.keys[table][key]
        if table in self.headers:
            return self.headers[table]
        return self.line(table[:-1], None) if table else 0

    def inline_line(self, table: tuple[Any, ...], parent_key: str, key: str, nth: int) -> int:
        """Line of ``key`` inside the ``nth`` inline table of ``parent_key``'s value."""
        start = self.line(table, parent_key)
        if not start:
            return 0
        opened = -1
        pattern = re.compile(rf"(^|[{{,\s]){re.escape(key)}\s*=")
        for number in range(start, len(self.lines) + 1):
            text = self.lines[number - 1]
            if number > start and (_HEADER.match(text) or _KEY.match(text)):
                break  # past the array
            # strings are blanked so that a brace or key name inside a value does not count
            plain = re.sub(r'"[^"]*"|\'[^\']*\'', lambda m: " " * len(m.group()), text)
            for column, char in enumerate(plain):
                if char == "{":
                    opened += 1
                    if opened == nth:
                        rest = "\n".join([plain[column:], *self.lines[number:]])
                        found = pattern.search(rest.split("}", 1)[0])
                        if found is None:
                            return number
                        return number + rest[:found.end()].count("\n")
        return start


# ---- loading ------------------------------------------------------------------------------------


class _Reader:
    """Validates one parsed TOML document against the schema, raising UsageErrors with lines."""

    def __init__(self, path: str, text: str, prefix: tuple[str, ...]) -> None:
        self.path = path
        self.index = _LineIndex(text, prefix)
        self.prefix = prefix

    def error(self, line: int, key: str, why: str) -> UsageError:
        where = f"{self.path}:{line}" if line else self.path
        return UsageError(f"{where}: {key}: {why}")

    def check_table(self, data: Mapping[str, Any], schema: Mapping[str, tuple[Check, str]],
                    table: tuple[Any, ...], label: str, line_of: Callable[[str], int]) -> None:
        for key, value in data.items():
            shown = f"{label}.{key}" if label else key
            if key not in schema:
                known = ", ".join(schema)
                raise self.error(line_of(key), shown, f"unknown key; {label or 'the config'} takes: {known}")
            try:
                problem = schema[key][0](value)
            except UsageError as exc:  # an options value the options module refuses: its own words
                raise self.error(line_of(key), shown, str(exc)) from None
            if problem is not None:
                raise self.error(line_of(key), shown,
                                 f"expected {problem}, got {_describe(value)}")

    def model(self, raw: Mapping[str, Any], defaults: Mapping[str, Any], index: int,
              overrides: Mapping[str, Any]) -> ModelConfig:
        table = ("models", index)
        label = f"models[{index}]"

        def line_of(key: str) -> int:
            return self.index.line(table, key)

        self.check_table(raw, MODEL_KEYS, table, label, line_of)
        if "target" not in raw:
            raise self.error(self.index.line(table), label, "missing required key 'target'")
        merged: dict[str, Any] = {**defaults, **raw}
        allows = [*self.allows(defaults.get("allow", []), ("defaults",), "defaults"),
                  *self.allows(raw.get("allow", []), table, label)]
        merged.pop("allow", None)
        merged.update(overrides)
        values: dict[str, Any] = {}
        options: dict[str, Any] = {}
        for key, value in merged.items():
            value = tuple(value) if isinstance(value, list) else value
            if key in _MODEL_FIELDS:
                values[key] = value
            else:  # every other model key is an audit option of the same name
                options[key] = value
        values["timeout"] = float(values["timeout"]) if "timeout" in values else None
        return ModelConfig(**values, options=AuditOptions(**options), allow=tuple(allows),
                           line=self.index.line(table))

    def command(self, command: str, raw: Mapping[str, Any]) -> dict[str, Any]:
        """A ``[run]``, ``[fix]`` or ``[checkpoint]`` table: its values by field name, each checked."""
        table = (command,)

        def line_of(key: str) -> int:
            return self.index.line(table, key)

        self.check_table(raw, command_keys(command), table, command, line_of)
        return {key: tuple(value) if isinstance(value, list) else value for key, value in raw.items()}

    def allows(self, raw: list[dict[str, Any]], table: tuple[Any, ...], label: str) -> list[Allow]:
        out = []
        for nth, entry in enumerate(raw):
            entry_label = f"{label}.allow[{nth}]"
            sub = (*table, "allow", nth)

            def line_of(key: str, nth: int = nth, sub: tuple[Any, ...] = sub) -> int:
                if sub in self.index.headers:  # [[models.allow]] form
                    return self.index.line(sub, key)
                return self.index.inline_line(table, "allow", key, nth)

            self.check_table(entry, ALLOW_KEYS, sub, entry_label, line_of)
            for required in ("code", "reason"):
                if required not in entry:
                    raise self.error(line_of("code" if required == "reason" else "reason"), entry_label,
                                     f"missing required key {required!r}"
                                     + (": say why this finding is acceptable" if required == "reason"
                                        else ""))
            out.append(Allow(code=entry["code"].strip().upper(), where=entry.get("where", "*"),
                             reason=entry["reason"].strip(), line=line_of("code")))
        return out


# a TOML date, time or date-time literal (1979-05-27, 07:32:00, 1979-05-27T07:32:00Z)
_DATETIME = r"(?:\d{4}-\d{2}-\d{2}|\d{2}:\d{2}:\d{2})"


def _datetimes(value: Any, label: str) -> list[tuple[str, str]]:
    """``(dotted label, last key)`` of every date/time value in a parsed TOML value, in order."""
    if isinstance(value, (datetime.date, datetime.time)):  # datetime.datetime is a date
        return [(label, label.rsplit(".", 1)[-1].split("[", 1)[0])]
    found: list[tuple[str, str]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _datetimes(item, f"{label}.{key}" if label else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _datetimes(item, f"{label}[{i}]")
    return found


def _reject_datetimes(reader: _Reader, data: Any) -> None:
    """Refuse TOML date/time values: no placecheck key takes one, and a model's ``kwargs`` (the
    only free-form values) travel to its audit process as JSON, which has no dates."""
    found = _datetimes(data, "")
    if not found:
        return
    label, key = found[0]
    pattern = re.compile(rf"(^|[{{,\s.\"']){re.escape(key)}[\"']?\s*=\s*[\[\s]*{_DATETIME}")
    line = 0
    for number, text in enumerate(reader.index.lines, start=1):
        plain = re.sub(r'"[^"]*"|\'[^\']*\'', lambda m: " " * len(m.group()), text)
        if pattern.search(text) or (not line and re.search(_DATETIME, plain)):
            line = number
            if pattern.search(text):
                break
    raise reader.error(line, label, "a TOML date/time is not accepted here: write it as a string "
                       "(\"1979-05-27\") or a number")


def _describe(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "an array", dict: "a table"}
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{names.get(type(value), type(value).__name__)} {shown}"


def parse(text: str, path: str = "<config>", prefix: tuple[str, ...] = (),
          overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """Validate a config's text; ``prefix`` is ``("tool", "placecheck")`` for pyproject.toml.

    ``overrides`` (model keys given on the command line) win over every model's values.
    """
    reader, data = _document(text, path, prefix)
    top_line = reader.index.line(())
    if prefix:
        top_line = next((n for n, line in enumerate(reader.index.lines, 1)
                         if _HEADER.match(line) and ".".join(prefix) in line), 0)

    def top_line_of(key: str) -> int:
        return reader.index.line((), key) or reader.index.line((key, 0)) or reader.index.line((key,)) \
            or top_line

    _reject_datetimes(reader, data)
    reader.check_table(data, {**TOP_KEYS, **PYPROJECT_KEYS} if prefix else TOP_KEYS, (), "", top_line_of)
    for command in COMMAND_OPTIONS:
        reader.command(command, data.get(command, {}))
    defaults = data.get("defaults", {})

    def default_line_of(key: str) -> int:
        return reader.index.line(("defaults",), key)

    for key in _NOT_IN_DEFAULTS:
        if key in defaults:
            raise reader.error(default_line_of(key), f"defaults.{key}",
                               "not allowed in [defaults]: every model names its own")
    reader.check_table(defaults, MODEL_KEYS, ("defaults",), "defaults", default_line_of)
    reader.allows(defaults.get("allow", []), ("defaults",), "defaults")
    raw_models = data.get("models")
    if not raw_models:
        table = "[[tool.placecheck.models]]" if prefix else "[[models]]"
        raise reader.error(top_line, "models", f"no models: add at least one {table} with a target")
    models = [reader.model(raw, defaults, i, overrides or {}) for i, raw in enumerate(raw_models)]
    seen: dict[str, ModelConfig] = {}
    for model in models:
        if model.label in seen:
            raise reader.error(model.line, f"models[{models.index(model)}]",
                               f"{model.label!r} is already audited by the entry on line "
                               f"{seen[model.label].line}: give one of them a distinct 'name'")
        seen[model.label] = model
    return RunConfig(
        path=path, models=tuple(models),
        jobs=data.get("jobs", DEFAULT_JOBS),
        timeout=float(data.get("timeout", DEFAULT_TIMEOUT)),
        fail_on=data.get("fail_on", "warning"),
        baseline=data.get("baseline"),
        group=data.get("group", True),
        hints=data.get("hints", False),
        isolation=data.get("isolation", "fork"),
        progress=data.get("progress", "auto"),
        text=text,
    )


def load(path: str | Path, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """Read and validate a config file: a placecheck TOML file, or a pyproject.toml."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read --config {str(path)!r}: {exc.strerror or exc}") from None
    prefix = ("tool", "placecheck") if file.name == "pyproject.toml" else ()
    if prefix and "placecheck" not in tomllib.loads(text).get("tool", {}):
        raise UsageError(f"{path} has no [tool.placecheck] table: add one, or pass a placecheck config")
    return parse(text, str(path), prefix, overrides)


def _document(text: str, path: str, prefix: tuple[str, ...]) -> tuple[_Reader, Any]:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}") from None
    data: Any = document
    for part in prefix:
        data = data.get(part, {}) if isinstance(data, dict) else {}
    return _Reader(path, text, prefix), data


def command_values(command: str, text: str, path: str = "<config>",
                   prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    """The ``[COMMAND]`` table of a config's text (``[tool.placecheck.COMMAND]`` with ``prefix``
    ``("tool", "placecheck")``), each value checked as the command line's: field name -> value;
    {} when the table is missing. The rest of the config is not read."""
    reader, data = _document(text, path, prefix)
    raw = data.get(command, {}) if isinstance(data, dict) else {}
    if not isinstance(raw, dict):
        raise reader.error(reader.index.line((), command), command, f"expected a table, got {_describe(raw)}")
    _reject_datetimes(reader, raw)
    return reader.command(command, raw)


def command_options(command: str, text: str, path: str = "<config>",
                    prefix: tuple[str, ...] = ()) -> CommonOptions:
    """The options object (:class:`~placecheck.basics.options.RunOptions`, ...) a config's ``[COMMAND]``
    table builds, every other field at the command line's default."""
    return COMMAND_OPTIONS[command].from_dict(command_values(command, text, path, prefix))


def pyproject_command_values(command: str, directory: str | Path = ".") -> tuple[str, dict[str, Any]]:
    """``[tool.placecheck.COMMAND]`` of ``directory``'s pyproject.toml, as :func:`command_values`, and
    the file's path; ``("", {})`` when there is none. ``placecheck run``, ``fix`` and ``checkpoint``
    take it for the options their command line does not give."""
    found = find_pyproject(directory)
    if found is None:
        return "", {}
    text = found.read_text(encoding="utf-8")
    return str(found), command_values(command, text, str(found), ("tool", "placecheck"))


def find_pyproject(directory: str | Path = ".") -> Path | None:
    """``pyproject.toml`` in ``directory`` when it has a ``[tool.placecheck]`` table."""
    candidate = Path(directory) / "pyproject.toml"
    if not candidate.is_file():
        return None
    try:
        data = tomllib.loads(candidate.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None
    tool = data.get("tool")
    return candidate if isinstance(tool, dict) and "placecheck" in tool else None


def apply_allows(findings: tuple[F, ...], allows: tuple[Allow, ...]
                 ) -> tuple[list[F], list[tuple[F, Allow]], list[Allow]]:
    """Split findings into kept and allowed; also return the allow entries that matched nothing."""
    kept: list[F] = []
    allowed: list[tuple[F, Allow]] = []
    used: set[int] = set()
    for finding in findings:
        for i, entry in enumerate(allows):
            if entry.matches(finding):
                allowed.append((finding, entry))
                used.add(i)
                break
        else:
            kept.append(finding)
    unused = [entry for i, entry in enumerate(allows) if i not in used]
    return kept, allowed, unused
