"""``probe live``: a local web page on one loaded model; every edit of its text re-runs the model
(:mod:`probe.live`)."""

from __future__ import annotations

import signal

import click

from ..settings import LiveSettings
from .group import main, user_errors
from .options import build, model_option, model_placement, setting_option


@main.command("live")
@model_option
@setting_option(LiveSettings, "port", "--port", "-p", show_default=True, help="The port to serve on (0: a free one).")
@setting_option(LiveSettings, "host", "--host", show_default=True,
                help="The address to serve on. Another than 127.0.0.1 or localhost lets other machines reach the "
                     "model (with the token); a warning says so.")
@setting_option(LiveSettings, "max_chars", "--max-chars", show_default=True,
                help="Most characters of a text the page takes (a longer one: 400 and one line).")
@setting_option(LiveSettings, "max_tokens", "--max-tokens",
                help="Most tokens of a text the page runs [default: 128, or the model's limit where lower].")
@model_placement
@user_errors
def live_command(model_name, port, host, max_chars, max_tokens, device=None, dtype=None) -> None:
    """A local web page on one model: type a text and watch every head's label and statistics, the head
    and model views, a head's attention steps and why it attends where it does, heads switched off and
    activation patching against a corrupted text, all redrawn at every edit. The model loads once; the
    printed address (with its random token) opens the page; Ctrl-C stops the server."""
    settings = build(LiveSettings, locals())
    from ..live.server import ANY_ADDRESS, bind, make_app, new_token, served_hosts, server
    from ..live.session import check_live_model, open_session

    check_live_model(model_name)  # an encoder-decoder: before the port is bound and the weights load
    host = settings.host
    sock = bind(host, settings.port)  # a port in use fails before the model loads
    try:
        if host not in ("127.0.0.1", "localhost", "::1"):
            click.echo(f"warning: serving on {host}: other machines that reach this address can drive the model "
                       "(the token is still required); use the default 127.0.0.1 unless you mean it", err=True)
        real_port = sock.getsockname()[1]
        session = open_session(model_name, settings, dtype=dtype, device=device)
        lm = session.lm
        token = new_token()
        app = make_app(session, token, served_hosts(host, real_port), any_address=host in ANY_ADDRESS)
        shown = "127.0.0.1" if host in ANY_ADDRESS else host
        shown = f"[{shown}]" if ":" in shown else shown
        click.echo(f"probe live: {lm.name} ({lm.kind}, {len(lm.sites)} layers x {lm.geometry.n_heads} heads)")
        click.echo(f"http://{shown}:{real_port}/?token={token}", color=False)
        click.echo("Ctrl-C stops the server.", err=True)
        # uvicorn catches Ctrl-C, shuts down, then raises the signal again: under Python's own handler that is a
        # KeyboardInterrupt, which the group ends with 'Interrupted.' and status 130 (also where SIGINT was ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        server(app, sock).run(sockets=[sock])
    finally:
        sock.close()
