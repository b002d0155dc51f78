"""The ``probe`` click group, its one-line error handling, logging set-up and the console script
(the commands in the sibling modules register themselves on :func:`main`)."""

from __future__ import annotations

import functools
import logging
import os
import sys

import click

from .. import __version__
from ..bounds import positive_int
from ..errors import ProbeError, UsageInputError, cut_long
from ..threads import ENV as THREADS_ENV
from ..threads import set_threads
from .options import click_callback


def user_errors(fn):
    """Turn :class:`ProbeError` into click's one-line ``Error: ...`` with exit status 1
    (:class:`~probe.errors.UsageInputError`: a usage error, exit status 2), and so an
    exception raised inside the model's own forward pass that no step of probe named
    (:mod:`probe.capture.failures`; the command is the step)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UsageInputError as exc:  # options that do not go together: exit status 2
            raise click.UsageError(str(exc), click.get_current_context(silent=True)) from None
        except ProbeError as exc:
            raise click.ClickException(str(exc)) from None
        except Exception as exc:
            if "torch" not in sys.modules:  # no model ran: not the model's
                raise
            from ..capture.failures import failure, from_model

            if not from_model(exc):
                raise
            raise click.ClickException(str(failure(click.get_current_context().command_path, exc))) from None

    return wrapper


def hold(folder):
    """Keep a folder claim (:func:`probe.runfolder.claim`) until the command ends, however it
    ends; return the folder's path."""
    click.get_current_context().call_on_close(folder.release)
    return folder.path


#: Exit status of an interrupted command: 128 + SIGINT.
INTERRUPTED = 130


class _Interrupted(Exception):
    """A KeyboardInterrupt inside a command (click would turn it into Abort and exit status 1)."""


class ProbeGroup(click.Group):
    """A click group whose usage errors are one line (``Error: ... (see 'probe analyze --help')``)
    and whose commands, interrupted, exit with status 130 after one line."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise _Interrupted() from None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            click.echo(f"Error: {cut_long(exc.format_message())}{where}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            exc.message = cut_long(exc.message)  # a value the user typed, echoed: cut where it is long
            exc.show()
            sys.exit(exc.exit_code)
        except (_Interrupted, KeyboardInterrupt):
            click.echo("Interrupted.", err=True)
            sys.exit(INTERRUPTED)
        except click.Abort as exc:
            if isinstance(exc.__context__, KeyboardInterrupt):
                click.echo("Interrupted.", err=True)
                sys.exit(INTERRUPTED)
            click.echo("Aborted.", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


class _Stderr(logging.StreamHandler):
    """A handler that writes to ``sys.stderr`` as it is when a record comes, not as it was when the
    handler was made: a second command in one process (a notebook, click's test runner) prints its
    notes on its own stderr, not on the first command's."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ sets it: the current stderr is read instead
        pass


def _setup_logging() -> None:
    """probe's own notes go to stderr as 'note: ...'; other libraries' log lines stay quiet."""
    log = logging.getLogger("probe")
    if not log.handlers:
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("note: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.WARNING)
        log.propagate = False
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)


@click.group(cls=ProbeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="probe")
@click.option("--threads", type=int, default=None, envvar=THREADS_ENV, metavar="N",
              callback=click_callback(lambda n: positive_int("--threads", n)),
              help=f"Run on N threads, torch's and the statistics kernel's (>= 1) [default: ${THREADS_ENV}, "
                   "else the cores this process may use]. Waiting threads sleep unless OMP_WAIT_POLICY says "
                   "otherwise.")
def main(threads: int | None) -> None:
    """probe: see what the attention heads of a pretrained transformer do."""
    _setup_logging()
    if threads is not None:
        set_threads(threads)  # before the command imports torch: OMP_NUM_THREADS, else torch's own setting


def entry() -> None:
    """The ``probe`` console script and ``python -m probe``: run the command, then leave at once.

    Tearing down the interpreter after torch and transformers are loaded takes about a second on
    two cores and would be wall time the user waits for nothing, so after the command has written
    everything and flushed its output, the process exits without that teardown.
    """
    code = 0
    try:
        main(prog_name="probe")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            click.echo(str(exc.code), err=True)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
