"""The console entry point: Ctrl-C while the command is still importing (rich, typer, torch take seconds on a
busy machine) ends it with one line and exit 130, not a traceback."""

import sys


def main() -> None:
    try:
        from nnwizard.cli import main as cli_main
    except KeyboardInterrupt:
        print("nnwizard: interrupted", file=sys.stderr)
        sys.exit(130)
    cli_main()
