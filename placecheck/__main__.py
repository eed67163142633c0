"""``python -m placecheck``."""

from placecheck.cli import entrypoint

if __name__ == "__main__":
    entrypoint()
