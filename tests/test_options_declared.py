"""One declaration per option (``placecheck.basics.declared``): the command line, a config and Python
agree with it, and nothing declares an option outside it."""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any

import pytest
import typer
from cli_runner import CliRunner

from placecheck.basics import config, declared
from placecheck.basics.errors import UsageError
from placecheck.basics.options import AuditOptions, CheckpointOptions, CommonOptions, FixOptions, RunOptions
from placecheck.cli import app

OBJECTS: dict[str, type[CommonOptions]] = {
    "audit": AuditOptions, "run": RunOptions, "fix": FixOptions, "checkpoint": CheckpointOptions}

SAMPLES: dict[str, Any] = {
    # a value each config key accepts, as TOML would give it
    "target": "m.py:Net", "name": "net", "kwargs": {"n": 1}, "args": ["n=1"], "inputs": ["float32[2,3]"],
    "example_inputs": "d.py:batch", "train": True, "forward": False, "device": "cuda:1", "engine": "tagged",
    "gpus": 2, "wrap": "ddp", "world_size": 2, "init": "meta", "device_map": "auto",
    "gpu_memory": "24GiB", "cpu_memory": "8GB", "checkpoint": "w.pt", "checkpoint_key": "model.ema",
    "trust": True, "select": ["PC2"], "ignore": ["PC204"], "allow": [],
    "timeout": 5, "family": "vision", "unsupported": "why", "library_findings": True, "reuse_calls": False,
    "jobs": 2, "fail_on": "error", "baseline": "b.json", "group": False, "hints": True,
    "isolation": "spawn", "progress": "lines", "steps": 3, "unsafe": True, "memory": "1GiB",
    "nproc_per_node": 2,
}


def _command(name: str) -> Any:
    return typer.main.get_command(app).commands[name]


def _help(command: str) -> str:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("command", declared.COMMANDS)
def test_every_option_of_a_command_is_declared_for_it_in_order(command: str) -> None:
    params = [p for p in _command(command).params if p.param_type_name == "option" and p.name != "help"]
    options = list(declared.of_command(command))
    assert [p.name for p in params] == [o.parameter for o in options]
    for param, option in zip(params, options, strict=True):
        assert [*param.opts, *param.secondary_opts] == list(option.flags)
        assert (param.help, param.hidden) == (option.help, option.hidden)
        assert param.default == option.default
        if not option.hidden:
            assert (param.metavar, param.rich_help_panel) == (option.metavar, option.panel)


@pytest.mark.parametrize("command, option", [(c, o) for c in declared.COMMANDS for o in declared.of_command(c)
                                             if not o.hidden])
def test_every_declared_option_is_in_the_help_of_its_commands(command: str,
                                                              option: declared.Declared) -> None:
    shown = _help(command)
    for flag in option.flags:
        assert f" {flag}" in shown, flag
    assert "".join(option.help.split()) in "".join(shown.split())  # wrapped at spaces and hyphens


def test_the_commands_are_the_apps() -> None:
    assert list(typer.main.get_command(app).commands) == list(declared.COMMANDS)
    assert {c for o in declared.DECLARED for c in o.commands} == set(declared.COMMANDS)


@pytest.mark.parametrize("command", sorted(OBJECTS))
def test_every_field_of_an_options_object_is_declared(command: str) -> None:
    names = {o.name for o in declared.DECLARED}
    cls = OBJECTS[command]
    fields = {f.name for f in dataclasses.fields(cls)}
    assert fields <= names, fields - names
    # an option of the command's command line that is a field sets it, and the command line's
    # default is the field's (the command line gives None or the same value)
    default = cls()
    for option in declared.of_command(command):
        if option.name in fields and option.default is not None:
            assert option.field_value(option.default) == getattr(default, option.name), option.name


def test_every_declared_option_is_somewhere() -> None:
    fields = {f.name for cls in OBJECTS.values() for f in dataclasses.fields(cls)}
    for option in declared.DECLARED:
        assert option.commands or option.config or option.name in fields, option.name
        assert option.help or option.config, option.name


@pytest.mark.parametrize("table", [declared.MODELS, declared.TOP])
def test_every_declared_config_key_is_accepted_and_nothing_else(table: str) -> None:
    keys = {"models": config.MODEL_KEYS, "top": config.TOP_KEYS}[table]
    assert set(keys) == {o.name for o in declared.DECLARED if table in o.config}
    assert set(declared.CONFIG_ORDER[table]) <= set(keys)
    for key in keys:
        if key == "models":  # every config below has one
            continue
        value = SAMPLES.get(key)
        model = {"target": "m.py:Net"} | ({key: value} if table == declared.MODELS else {})
        top = {key: value} if table == declared.TOP else {}
        if key == "defaults":
            top = {"defaults": {"device": "cpu"}}
        text = "".join(f"{k} = {json.dumps(v)}\n" for k, v in top.items() if not isinstance(v, dict))
        text += "".join(f"{k} = {{ device = \"cpu\" }}\n" for k, v in top.items() if isinstance(v, dict))
        entry = "".join(f"{k} = {json.dumps(v)}\n" if not isinstance(v, dict) else f"{k} = {{ n = 1 }}\n"
                        for k, v in model.items())
        config.parse(f"{text}[[models]]\n{entry}", "c.toml")
    with pytest.raises(UsageError, match="unknown key"):
        config.parse('[[models]]\ntarget = "m.py:Net"\ncolour = "red"\n', "c.toml")


@pytest.mark.parametrize("command", ["run", "fix", "checkpoint"])
def test_a_command_table_takes_the_configurable_fields(command: str) -> None:
    cls = OBJECTS[command]
    fields = [f.name for f in dataclasses.fields(cls)]
    expected = [n for n in fields if declared.declared(n, command).configurable]
    assert list(config.command_keys(command)) == expected
    for name in expected:
        option = declared.declared(name, command)
        assert config.command_keys(command)[name][1] == f"as {option.flag}"
        if name in SAMPLES:
            config.command_values(command, f"[{command}]\n{name} = {json.dumps(SAMPLES[name])}\n")


@pytest.mark.parametrize("command", sorted(OBJECTS))
def test_every_field_is_a_python_keyword(command: str) -> None:
    cls = OBJECTS[command]
    for f in dataclasses.fields(cls):
        value = SAMPLES.get(f.name)
        if value is None or f.name in ("kwargs", "args"):
            continue
        value = tuple(value) if isinstance(value, list) else value
        built = cls(**{f.name: value})
        assert getattr(built, f.name) == value, f.name
    with pytest.raises(TypeError):
        cls(colour="red")  # type: ignore[call-arg]


def test_the_python_functions_keywords_are_the_options_fields() -> None:
    import placecheck
    import placecheck.run  # the package, now placecheck.run, still has run()'s signature

    for function, cls, own in ((placecheck.audit, AuditOptions, {"model", "options"}),
                               (placecheck.run, RunOptions, {"target", "args", "options"})):
        signature = inspect.signature(function)
        keywords = {n: p.default for n, p in signature.parameters.items() if n not in own}
        assert set(keywords) == {f.name for f in dataclasses.fields(cls)}, function
        assert cls(**keywords) == cls()


def test_no_command_declares_an_option_of_its_own() -> None:
    # every option reaches typer through declared_options: a command module names none
    import placecheck.cli as cli

    for module in (cli.audit, cli.run, cli.fix, cli.checkpoint, cli.merge, cli.rules, cli.example_config):
        assert "typer.Option(" not in inspect.getsource(module), module.__name__
