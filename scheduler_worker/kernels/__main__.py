"""`python -m scheduler_worker.kernels`: build the CPU kernels now (the install does this).

Exits 0 when they are built or cannot be built here (the engine then serves without them,
and says so); `--require` makes a failed build exit 1 (the Makefile passes it under CI);
`--rebuild` compiles again even when a library or a failed build's marker is there.
"""

from __future__ import annotations

import argparse
import sys

from scheduler_worker.kernels import KernelBuildError, best_isa, build


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build zeroserve's C++ CPU kernels.")
    ap.add_argument("--require", action="store_true", help="exit 1 when the build fails")
    ap.add_argument("--verbose", action="store_true", help="print the compiler command")
    ap.add_argument(
        "--rebuild",
        action="store_true",
        help="compile again, even over an existing library or a remembered failed build",
    )
    args = ap.parse_args(argv)
    try:
        path = build(verbose=args.verbose, force=args.rebuild)
    except KernelBuildError as e:
        print(
            f"zeroserve: CPU kernels not built ({e}); the engine will use its pure-torch path",
            file=sys.stderr,
        )
        return 1 if args.require else 0
    print(f"zeroserve: CPU kernels ready ({best_isa()} on this CPU): {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
