"""`python -m fitcheck` runs the command-line interface."""

from fitcheck.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
