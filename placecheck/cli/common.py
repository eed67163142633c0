"""The command-line grammar every command shares: each command's options generated from their one
declaration, and help panels.

Every option of every command is declared once, in :mod:`placecheck.basics.declared`: its flags,
metavar, panel, help and default, and the commands that take it. :func:`declared_options` gives a
command's function the typer parameter of each (the function names only its arguments, and takes
the options as ``**given``), so ``--device``, ``--gpus``, ``--engine``, ``--select``, ``--ignore``,
``--format``, ``--output``, ``--fail-on``, ``--exit-zero``, ``--timeout``, ``--steps`` and ``--debug``
(and the model options ``audit``, ``fix`` and ``checkpoint`` share) mean the same, with the same help,
metavar, panel and default, in every command that has them (``tests/test_cli_grammar.py`` checks all
of it on every typer of the supported range); :func:`options_from` turns what was given into the
command's options object.

Every flag is spelled in its declaration, never derived from the parameter's name: typer 0.27.0 to
0.27.3 derive it from the metavar instead (``--ENGINE``). A short flag has one meaning in every
command (``-m`` is only ``run``'s ``--module``). torch-free, like the rest of the CLI.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperCommand

from placecheck.basics.declared import DEFAULT_STEPS as DEFAULT_STEPS
from placecheck.basics.declared import FLAG as FLAG
from placecheck.basics.declared import PANEL_CI as PANEL_CI
from placecheck.basics.declared import PANEL_DEVICE as PANEL_DEVICE
from placecheck.basics.declared import PANEL_FIX as PANEL_FIX
from placecheck.basics.declared import PANEL_INPUTS as PANEL_INPUTS
from placecheck.basics.declared import PANEL_REPORTING as PANEL_REPORTING
from placecheck.basics.declared import PANEL_TARGET as PANEL_TARGET
from placecheck.basics.declared import PANELS as PANELS
from placecheck.basics.declared import Declared, of_command
from placecheck.basics.options import CommonOptions


class PanelCommand(TyperCommand):
    """A command whose ``--help`` lists its options under their panels (``rich_help_panel``).

    typer draws panels only with rich's boxed help, which ``rich_markup_mode=None`` turns off
    (its 25-character help column at 80 columns is hard to read); this draws them as click's
    plain sections, the same on every typer of the supported range.
    """

    def get_short_help_str(self, limit: int = 45) -> str:
        """The command's line in ``placecheck --help``: the first paragraph of its help, whole (click
        cuts it to ``limit`` with "..."; the command list wraps it within the width instead)."""
        first = (self.short_help or self.help or "").strip().split("\n\n")[0]
        return " ".join(first.split())

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments: list[tuple[str, str]] = []
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
            elif param.param_type_name == "option":
                panels.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        for panel in sorted(panels, key=lambda p: PANELS.index(p) if p in PANELS else len(PANELS)):
            with formatter.section(panel):
                formatter.write_dl(panels[panel])


_O = TypeVar("_O", bound=CommonOptions)


def configured(ctx: typer.Context, options: _O) -> _O:
    """``options`` (built from the command line) with the values of ./pyproject.toml's
    ``[tool.placecheck.COMMAND]`` table for the options the command line did not give.

    The table's values are checked as the command line's are
    (:func:`placecheck.basics.config.command_values`); the result is checked by the caller.
    """
    from placecheck.basics.config import pyproject_command_values

    _, table = pyproject_command_values(options.COMMAND)
    if not table:
        return options
    names = {d.parameter: d.name for d in of_command(options.COMMAND)}
    given = set()
    for param in ctx.params:
        source = ctx.get_parameter_source(param)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            given.add(names.get(param, param))
    return options.replace(**{name: value for name, value in table.items()
                              if name not in given and name in options.configurable()})


def typer_option(option: Declared) -> Any:
    """``option``'s typer parameter: ``Annotated[TYPE, typer.Option(...)]``."""
    settings: dict[str, Any] = {"help": option.help}
    if option.hidden:
        settings["hidden"] = True
    else:
        settings.update(metavar=option.metavar, rich_help_panel=option.panel)
    if option.minimum is not None:
        settings["min"] = option.minimum
    return Annotated[option.kind, typer.Option(*option.flags, **settings)]


_F = TypeVar("_F", bound=Callable[..., Any])


def declared_options(command: str) -> Callable[[_F], _F]:
    """Give ``command``'s function (its arguments, then ``**given``) a keyword parameter for each
    option declared for ``command``, in the declaration's order, which typer reads as its
    options; typer then passes their values in ``given``, by parameter name."""
    def decorate(func: _F) -> _F:
        signature = inspect.signature(func, eval_str=True)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        generated = [inspect.Parameter(o.parameter, inspect.Parameter.KEYWORD_ONLY, default=o.default,
                                       annotation=typer_option(o)) for o in of_command(command)]
        setattr(func, "__signature__", signature.replace(parameters=[*own, *generated]))  # noqa: B010
        return func

    return decorate


def options_from(cls: type[_O], given: Mapping[str, Any], **fixed: Any) -> _O:
    """``cls`` (the command's options object) from the command line's values ``given`` (by parameter):
    every declared option of its command that is one of its fields and was given a value; ``fixed``
    are fields the command sets itself."""
    names = set(cls.__dataclass_fields__)
    values = {o.name: o.field_value(given[o.parameter]) for o in of_command(cls.COMMAND)
              if o.name in names and given.get(o.parameter) is not None}
    return cls(**{**values, **fixed})
