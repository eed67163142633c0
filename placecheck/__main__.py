"""``python -m placecheck``, and the ``placecheck`` console script (:func:`main`)."""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130
"""128 + SIGINT, as :data:`placecheck.findings.output.EXIT_INTERRUPTED`; repeated here, where nothing heavy is
imported yet."""


def main() -> None:
    """The command line: a Ctrl-C while the CLI's modules are still being imported exits 130 with one
    line too, as it does once a command runs (:func:`placecheck.cli.app.entrypoint`)."""
    try:
        from placecheck.cli import entrypoint
    except KeyboardInterrupt:
        sys.stderr.write("placecheck: interrupted\n")
        sys.exit(EXIT_INTERRUPTED)
    entrypoint()


if __name__ == "__main__":
    main()
