"""``python -m app.runtime_check``: the installer's proof that the runtime runs.

Prints the check's result (what it loaded and decoded, or the signal, the likely cause
and the fix) and exits with a status the shell can act on (packaging/lib.sh,
``verify_llama_runtime``):

- 0: the runtime loaded the tiny model and decoded one token at a time and a batch;
- 3: it crashed or hung: another build of llama-cpp-python may run (the installer
  rebuilds once with the portable flags);
- 1: it failed otherwise (a Python error, llama-cpp-python missing): a rebuild would
  not help, the message says what would.

``--record BUILD`` keeps the result in the environment (``install_record``), as the
installer's check of that build, for ``draftpen doctor``.
"""

from __future__ import annotations

import argparse
import json
import sys

from app.runtime_check.check import (
    DEFAULT_TIMEOUT_S,
    render_check,
    run_runtime_check,
    stderr_excerpt,
)
from app.runtime_check.install_record import record_path, write_install_check

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CRASHED = 3  # packaging/lib.sh matches this number


def main(argv: list[str] | None = None) -> int:
    """Run the check once and report it."""
    parser = argparse.ArgumentParser(
        prog="python -m app.runtime_check",
        description="Decode a few tokens with llama-cpp-python in a child process.",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds before it counts as hung"
    )
    parser.add_argument(
        "--record",
        metavar="BUILD",
        help="keep the result in this environment as the installer's check of BUILD "
        "(draftpen doctor shows it)",
    )
    args = parser.parse_args(argv)
    check = run_runtime_check(timeout_s=args.timeout)
    if args.record:
        try:
            write_install_check(record_path(), check, args.record)
        except OSError as error:  # the check's result matters more than its record
            print(f"warning: could not keep the runtime check's result: {error}", file=sys.stderr)
    if args.json:
        print(json.dumps(check.as_json(), indent=2))
    else:
        lines = render_check(check)
        print(f"Runtime check: {lines[0]}")
        for line in lines[1:]:
            print(line)
        excerpt = stderr_excerpt(check.stderr_tail) if not check.ok else []
        if excerpt:
            print("  the child's error output:")
            for line in excerpt:
                print(f"    {line}")
    if check.ok:
        return EXIT_OK
    return EXIT_CRASHED if check.rebuild_may_help else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
