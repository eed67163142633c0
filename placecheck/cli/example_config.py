"""``placecheck example-config``: print the commented example config that ships with placecheck."""

from __future__ import annotations

from importlib import resources
from typing import Any

import typer

from placecheck.cli.app import app
from placecheck.cli.common import PanelCommand, declared_options
from placecheck.cli.output import errors_reported

EXAMPLE_CONFIG = "configs/example.toml"
"""The example's path inside the installed package (package data)."""


def example_config_text() -> str:
    """The text of the example config, read from the installed package."""
    return resources.files("placecheck").joinpath(EXAMPLE_CONFIG).read_text(encoding="utf-8")


@app.command("example-config", cls=PanelCommand)
@declared_options("example-config")
def example_config(**given: Any) -> None:
    """Print a config documenting every key: placecheck example-config > placecheck.toml."""
    with errors_reported(given["debug"]):
        typer.echo(example_config_text(), nl=False)
