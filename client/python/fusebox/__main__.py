"""``python3 -m fusebox run -- CMD``: what ``fusebox run`` does, with the Python SDK.

Allocates a fresh sandbox, uploads ``--upload DIR`` into its workspace, runs the command
streaming its output, releases the sandbox and exits with the command's exit code.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
from typing import List, Optional

from . import _core
from ._sync import Sandbox
from .errors import CommandTimeoutError, FuseboxError

_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_duration(s: str) -> float:
    """Parses a Go-style duration ("1m30s", "500ms", "2s") or plain seconds ("2.5") into seconds."""
    try:
        v = float(s)
    except ValueError:
        parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|µs|ns|m|s)", s)
        if not parts or "".join(n + u for n, u in parts) != s:
            raise argparse.ArgumentTypeError(f"invalid duration {s!r} (e.g. 30s, 1m30s, 500ms, or seconds)") from None
        v = sum(float(n) * _UNITS[u] for n, u in parts)
    if v < 0:
        raise argparse.ArgumentTypeError(f"invalid duration {s!r}: negative")
    return v


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m fusebox", description="fusebox from Python.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one command in a fresh sandbox and exit with its exit code",
                       description="Allocates a fresh sandbox from the manager, uploads --upload DIR into its workspace, "
                                   "runs the command there streaming its output, releases the sandbox (it is destroyed, "
                                   "never reused) and exits with the command's exit code.",
                       epilog="examples:\n  python3 -m fusebox run -- uname -a\n"
                              "  python3 -m fusebox run --upload ./repo -- sh -c 'cd repo && make test'",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--manager", default=_core.manager_address(), help="manager address (default $FUSEBOX_MANAGER or %(default)s)")
    r.add_argument("--ca-file", help="PEM CA that signed a tcp:// manager's certificate ($FUSEBOX_CA_FILE)")
    r.add_argument("--token-file", help="file holding a ServiceAccount token with the manager's audience, "
                                        "read again when it changes; for tcp:// managers ($FUSEBOX_TOKEN_FILE)")
    r.add_argument("--tls-server-name", help="name to check in the manager's certificate (default: the address's host) "
                                             "($FUSEBOX_TLS_SERVER_NAME)")
    r.add_argument("--egress", action="append", default=[], metavar="HOST:PORT",
                   help="allowed destination (HOST may be *.domain); repeat or comma-separate")
    r.add_argument("--upload", metavar="DIR", help="local directory to copy into the workspace first")
    r.add_argument("--timeout", type=parse_duration, help="kill the command (and everything it started) after this long")
    r.add_argument("--shell", action="store_true", help="run the arguments as one bash script (exported variables are kept)")
    r.add_argument("-q", "--quiet", action="store_true", help="print only the command's output")
    r.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD [ARG...]")
    return p


def run(args: argparse.Namespace) -> int:
    argv: List[str] = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        print("fusebox: no command given: python3 -m fusebox run -- CMD [ARG...]", file=sys.stderr)
        return 2

    def status(msg: str) -> None:
        if not args.quiet:
            print("fusebox: " + msg, file=sys.stderr, flush=True)

    egress = [e for arg in args.egress for e in arg.split(",") if e]
    start = time.monotonic()
    try:
        sb = Sandbox.allocate(args.manager, ca_file=args.ca_file, token_file=args.token_file, server_name=args.tls_server_name,
                              egress=egress, labels={"via": "python3-m-fusebox-run"})
    except FuseboxError as e:
        print(f"fusebox: {e}", file=sys.stderr)
        return 1
    try:
        status(f"sandbox {sb.id} ready in {(time.monotonic() - start) * 1000:.0f}ms")
        if args.upload:
            t0 = time.monotonic()
            st = sb.write_tree(args.upload, "")
            status(f"uploaded {st.files} files ({st.bytes >> 10} KiB) in {st.batches} batches + {st.streamed} streams, "
                   f"{(time.monotonic() - t0) * 1000:.0f}ms")
        command = " ".join(argv) if args.shell else argv
        out, err = sys.stdout.buffer, sys.stderr.buffer
        try:
            res = sb.exec(command, timeout=args.timeout, stdout=out, stderr=err)
        except CommandTimeoutError as e:
            status(str(e))
            res = e.result
        if res.signal and not res.timed_out:
            status(f"command killed by {res.signal}")
        if res.truncated:
            status("output was truncated by the sandbox's limit")
        return res.exit_code
    except FuseboxError as e:
        print(f"fusebox: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fusebox: interrupted", file=sys.stderr)
        return 130
    finally:
        try:
            sb.close()
        except FuseboxError as e:
            status(f"warning: {e}")


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "run":
        return run(args)
    return 2


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
