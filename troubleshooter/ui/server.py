"""How the app is served: command-line arguments, auth, and the settings callbacks read.

The settings are a module-level object the callbacks read (in the server process; workers get
what they need as arguments), set once by `apply` before the page is built.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import tempfile
from dataclasses import dataclass

from ..errors import UserError

AUTH_ENV = "AMP_TROUBLESHOOTER_AUTH"
DEFAULT_MAX_FILE_MB = 100.0
MIN_JOB_MEMORY_MB = 512.0


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 7860
    auth: tuple[str, str] | None = None
    allow_exec: bool = False  # only then may uploaded Python model files run (in a child process)
    max_file_mb: float = DEFAULT_MAX_FILE_MB
    job_timeout_s: float = 600.0  # wall-clock limit of one check/speedup job in its worker
    job_memory_mb: float = 0.0  # RLIMIT_DATA of each job process; 0: no limit
    max_nproc: int = 2  # most torch.distributed ranks one trace/check may start (the host bounds it too)

    @property
    def max_file_bytes(self) -> int:
        return int(self.max_file_mb * 1024 * 1024)


SETTINGS = Settings()


def parse_auth(text: str) -> tuple[str, str]:
    """`USER:PASS` -> (user, pass); the password may contain colons, the user may not be empty."""
    user, sep, password = (text or "").partition(":")
    if not sep or not user.strip() or not password:
        raise UserError("auth must look like USER:PASS (both non-empty)")
    return user.strip(), password


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_ipv6_literal(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).version == 6
    except ValueError:
        return False


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python app.py",
        description="Serve the AMP Troubleshooter web page (and its Gradio API).",
    )
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 for the network)")
    p.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    p.add_argument("--auth", metavar="USER:PASS", default=None,
                   help=f"require a login; or set the environment variable {AUTH_ENV}=USER:PASS")
    p.add_argument("--allow-exec", action="store_true",
                   help="allow uploaded Python model files (build_model()/make_batch()) to run, "
                        "each in a child process with a time limit; off by default")
    p.add_argument("--max-file-mb", type=float, default=DEFAULT_MAX_FILE_MB, metavar="N",
                   help=f"largest upload accepted, in MiB (default {DEFAULT_MAX_FILE_MB:g})")
    p.add_argument("--job-timeout", type=float, default=600.0, metavar="S",
                   help="time limit of one check or speedup job, in seconds (default 600)")
    p.add_argument("--job-memory-mb", type=float, default=0.0, metavar="MB",
                   help="memory limit of each job process (RLIMIT_DATA), in MiB; at least "
                        f"{MIN_JOB_MEMORY_MB:g} (PyTorch alone needs about 300); default 0: no limit")
    p.add_argument("--max-nproc", type=int, default=2, metavar="N",
                   help="most processes (torch.distributed ranks) one trace or check may start; the host's CPU "
                        "cores, or GPUs for GPU jobs, bound it too (default 2; 1 turns multi-process runs off)")
    return p


def settings_from_args(argv: list[str] | None = None, environ: dict | None = None) -> Settings:
    """Parse arguments into `Settings`; bad values raise `UserError` with a readable message."""
    environ = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    if _is_ipv6_literal(args.host):
        raise UserError(f"--host {args.host}: Gradio cannot serve on an IPv6 address literal (it writes the URL "
                        "without brackets); use a host name such as localhost, or an IPv4 address")
    if not 0 < args.port < 65536:
        raise UserError(f"--port must be between 1 and 65535, not {args.port}")
    if not args.max_file_mb > 0:
        raise UserError(f"--max-file-mb must be positive, not {args.max_file_mb:g}")
    if not args.job_timeout > 0:
        raise UserError(f"--job-timeout must be positive, not {args.job_timeout:g}")
    if args.max_nproc < 1:
        raise UserError(f"--max-nproc must be at least 1, not {args.max_nproc}")
    if args.job_memory_mb and not args.job_memory_mb >= MIN_JOB_MEMORY_MB:
        raise UserError(f"--job-memory-mb must be 0 (no limit) or at least {MIN_JOB_MEMORY_MB:g}, "
                        f"not {args.job_memory_mb:g}: a job imports PyTorch, which alone needs about 300 MiB")

    auth_text = args.auth if args.auth is not None else environ.get(AUTH_ENV)
    auth = parse_auth(auth_text) if auth_text else None
    _check_upload_folder(environ.get("GRADIO_TEMP_DIR"))
    if args.allow_exec and not is_loopback(args.host) and auth is None:
        raise UserError(
            "--allow-exec on a non-loopback address needs --auth USER:PASS "
            f"(or {AUTH_ENV}): otherwise anyone who can reach the port can run code here"
        )
    return Settings(host=args.host, port=args.port, auth=auth, allow_exec=args.allow_exec,
                    max_file_mb=args.max_file_mb, job_timeout_s=args.job_timeout,
                    job_memory_mb=args.job_memory_mb, max_nproc=args.max_nproc)


def _check_upload_folder(folder: str | None) -> None:
    """The app reads any file in Gradio's upload folder as the caller's upload, so that folder must
    hold uploads only: not the system's temporary folder, a home, or a folder above this code."""
    if not folder:
        return  # Gradio's default, <tmp>/gradio
    real = os.path.realpath(folder)
    broad = {os.path.sep, os.path.realpath(tempfile.gettempdir()), os.path.realpath(os.path.expanduser("~"))}
    package = os.path.realpath(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    if real in broad or os.path.commonpath([real, package]) == real or os.path.commonpath([real, os.getcwd()]) == real:
        raise UserError(f"GRADIO_TEMP_DIR={folder} is too broad: the app treats every file in Gradio's upload "
                        "folder as an upload, so point it at a folder of its own (e.g. /tmp/gradio)")


def settings_or_exit(argv: list[str] | None = None) -> Settings:
    """`settings_from_args`, or `error: ...` on stderr and exit status 2 (never a traceback)."""
    try:
        return settings_from_args(argv)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def apply(settings: Settings) -> None:
    """Make `settings` the ones every callback reads, and the limits every job process gets: the
    memory limit, and a minimal environment (`worker.job_environment`) in place of the server's,
    which may hold the login password and cloud keys."""
    from .. import worker

    for name, value in vars(settings).items():
        setattr(SETTINGS, name, value)
    worker.LIMITS.memory_mb = settings.job_memory_mb or None
    worker.LIMITS.clean_env = True


def apply_and_probe(settings: Settings) -> None:
    """`apply(settings)`, then start probing the host in the background (ui/host.py), before gradio
    is imported: the probe's worker imports torch beside that import instead of after it. After
    `apply`, so the probe's process gets the jobs' clean environment, never the server's secrets."""
    from .host import start_probe

    apply(settings)
    start_probe()


def launch_kwargs(settings: Settings) -> dict:
    """Keyword arguments for `demo.launch` (gradio 6: theme/css also go here)."""
    from .common import download_root

    extra = {}
    if settings.auth is not None:  # routes Gradio serves without its login check get one
        from starlette.middleware import Middleware

        from .guard import LoginForUnguardedRoutes

        extra["app_kwargs"] = {"middleware": [Middleware(LoginForUnguardedRoutes)]}
    return {
        **extra,
        "server_name": settings.host,
        "server_port": settings.port,
        "auth": settings.auth,
        "max_file_size": settings.max_file_bytes,
        "show_error": True,  # gr.Error messages reach the page and API clients
        "footer_links": ["api"],
        # API endpoints hand out generated reports and plots from here (random folder names)
        "allowed_paths": [str(download_root())],
    }
