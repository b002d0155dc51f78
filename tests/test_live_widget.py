"""``probe.Explorer``: the live page as a notebook widget (anywidget). Its messages are answered by the same
session and routes as the server's; it renders in a notebook executed headless (nbclient); and in a browser
harness that plays the notebook host (the widget's module loaded as anywidget loads it, its messages carried
to the kernel-side widget) it draws and answers typing, a head clicked and a head switched off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("anywidget")

import probe  # noqa: E402
from conftest import CHROMIUM_ARGS, ServedApp, tiny_model  # noqa: E402
from probe.live.api import answer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXT = "The cat sat on the mat and then it slept."


@pytest.fixture(scope="module")
def explorer():
    return probe.Explorer(tiny_model("gpt2"), TEXT)


def test_messages_are_answered_by_the_session(explorer):
    """A message {id, route, body} gets {id, status, body}: the answer of the same route as the server's."""
    sent = []
    explorer.send = sent.append
    try:
        explorer._on_message(explorer, {"id": 7, "route": "edit", "body": {"text": TEXT, "layer": 1}}, [])
        explorer._on_message(explorer, {"id": 8, "route": "head", "body": {"text": TEXT, "layer": 0, "head": 9}}, [])
    finally:
        del explorer.send
    assert sent[0]["id"] == 7 and sent[0]["status"] == 200
    assert sent[0]["body"] == answer(explorer.session, "edit", {"text": TEXT, "layer": 1})[1]
    assert sent[1]["id"] == 8 and sent[1]["status"] == 400 and "head L0H9 out of range" in sent[1]["body"]["error"]
    assert "probeViews.live" in explorer._esm and "export default" in explorer._esm
    assert "http://" not in explorer._esm.replace("http://www.w3.org/2000/svg", "")  # nothing loaded from outside
    assert explorer.text == TEXT


def _kernel():
    try:
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
        from jupyter_client.kernelspec import KernelSpecManager

        return "python3" in KernelSpecManager().find_kernel_specs()
    except Exception:  # noqa: BLE001
        return False


def test_widget_renders_in_a_notebook_executed_headless(tmp_path, monkeypatch):
    """In a Jupyter kernel: the Explorer's output is a widget view, and its state holds the views and the app."""
    if not _kernel():
        pytest.skip("nbclient, nbformat or a python3 kernel is missing")
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import probe\nfrom conftest import tiny_model\n"
                                          f"explorer = probe.Explorer(tiny_model('gpt2'), {TEXT!r})\nexplorer"),
                nbformat.v4.new_code_cell("status, out = explorer.request('edit', {'text': explorer.text})\n"
                                          "assert status == 200 and out['tokens'], out\nprint(len(out['tokens']))")]
    client = NotebookClient(nb, timeout=600, kernel_name="python3", store_widget_state=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = nb.cells[0].outputs
    views = [o for o in outputs if o.get("output_type") == "execute_result"
             and "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(views) == 1, outputs
    model_id = views[0]["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"][model_id]["state"]
    assert "probeViews.live" in state["_esm"] and state["text"] == TEXT
    printed = [o for o in nb.cells[1].outputs if o.get("name") == "stdout"]
    assert printed and printed[-1]["text"].strip().splitlines()[-1].isdigit(), nb.cells[1].outputs


HARNESS = """<!doctype html><html><head><meta charset="utf-8"><title>widget harness</title>
<link rel="icon" href="data:,"><style>%(css)s</style></head><body><div id="out"></div>
<script type="application/json" id="esm">%(esm)s</script>
<script type="module">
// The host's part, as anywidget's front end plays it: the module imported from a blob, render({model, el})
// called with a model whose send() reaches the kernel-side widget and whose "msg:custom" gets its answers.
const listeners = {};
const model = {
  get: (k) => ({text: %(text)s})[k],
  on: (ev, cb) => { (listeners[ev] = listeners[ev] || []).push(cb); },
  off: (ev, cb) => { listeners[ev] = (listeners[ev] || []).filter((f) => f !== cb); },
  send: (msg) => fetch("/msg", {method: "POST", body: JSON.stringify(msg)}).then((r) => r.json())
    .then((reply) => (listeners["msg:custom"] || []).forEach((cb) => cb(reply))),
};
const url = URL.createObjectURL(new Blob([JSON.parse(document.getElementById("esm").textContent)],
                                         {type: "text/javascript"}));
const mod = await import(url);
mod.default.render({model, el: document.getElementById("out")});
</script></body></html>"""


def Harness(widget) -> ServedApp:
    """The harness page and the kernel's side (the widget's own message handler) on a free port."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse
    from starlette.routing import Route

    page = HARNESS % {"css": widget._css, "esm": json.dumps(widget._esm).replace("</", "<\\/"),
                      "text": json.dumps(widget.text)}

    async def index(request):
        return HTMLResponse(page)

    lock = threading.Lock()  # the kernel answers one message at a time

    def kernel(content):
        replies = []
        with lock:
            widget.send = replies.append
            try:
                widget._on_message(widget, content, [])
            finally:
                del widget.send
        return replies[0]

    async def msg(request: Request):
        return JSONResponse(await run_in_threadpool(kernel, json.loads(await request.body())))

    app = Starlette(routes=[Route("/", index), Route("/msg", msg, methods=["POST"])])
    return ServedApp(lambda port: app)


def test_widget_draws_and_answers_in_a_host_harness(chromium, explorer):
    """The widget's module in a page playing the notebook host: it draws the grid for its text, types a new one,
    opens a head's steps and why, switches a head off; no console message, no request but to the host."""
    sync_api, executable = chromium
    with Harness(explorer) as base, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 900})
            messages, requests = [], []
            page.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(base + "/")
            page.wait_for_selector(".probe-live[data-edits='1']", timeout=60_000)
            assert page.input_value("textarea.pl-text:not(.pl-corrupt)") == TEXT
            page.fill("textarea.pl-text:not(.pl-corrupt)", "A dog ran in the park.")
            page.wait_for_selector(".probe-live[data-edits='2']", timeout=60_000)
            tokens = page.eval_on_selector_all(".pl-tok", "ts => ts.map(t => t.textContent)")
            assert tokens == explorer.session.edit("A dog ran in the park.")["tokens"]
            page.click("td.pl-cell[data-layer='1'][data-head='0']")
            page.wait_for_selector(".probe-live[data-heads='1'] .probe-sv table", timeout=60_000)
            assert "check holds" in page.inner_text(".pl-check")
            page.select_option("select >> nth=0", "off")
            page.click("td.pl-cell[data-layer='0'][data-head='2']")
            page.wait_for_selector(".probe-live[data-ablations='1'] table.pl-probs", timeout=60_000)
        finally:
            browser.close()
    assert messages == []
    assert all(u.startswith(base + "/") or u.startswith("blob:") for u in requests), requests


def _jupyter_lab() -> str | None:
    """The jupyter-lab executable (``PROBE_JUPYTER_LAB``, else on PATH), or None."""
    import shutil

    return os.environ.get("PROBE_JUPYTER_LAB") or shutil.which("jupyter-lab")


def test_widget_in_jupyterlab(chromium, tmp_path):
    """A notebook opened in JupyterLab (headless Chromium), its cell run: the Explorer draws its grid, answers a
    typed text and a clicked head; every request stays on the JupyterLab server; no page error."""
    lab = _jupyter_lab()
    if lab is None:
        pytest.skip("JupyterLab is not installed (pip install jupyterlab, or PROBE_JUPYTER_LAB=path/to/jupyter-lab)")
    import nbformat

    from probe.live.server import bind

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import probe\nfrom conftest import tiny_model\n"
                                          f"probe.Explorer(tiny_model('gpt2'), {TEXT!r})")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "live.ipynb")
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    data = [Path(sys.prefix) / "share" / "jupyter", Path(sys.base_prefix) / "share" / "jupyter"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
           "JUPYTER_PATH": os.pathsep.join(map(str, data)), "PYTHONWARNINGS": "ignore"}
    token = "lab-token-for-tests"
    proc = subprocess.Popen([lab, "--no-browser", f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1",
                             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
                             "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=", "--ServerApp.allow_root=True",
                             "--LabApp.extension_manager=readonly",
                             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    sync_api, executable = chromium
    try:
        import httpx

        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(f"{base}/api/status?token={token}", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline and proc.poll() is None, "JupyterLab did not start"
            time.sleep(0.5)
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1200, "height": 900})
                errors, requests = [], []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "probe" in m.text else None)
                page.on("request", lambda r: requests.append(r.url))
                page.goto(f"{base}/lab/tree/live.ipynb?token={token}")
                page.wait_for_function("window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell')",
                                       timeout=180_000)
                page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle'], "
                                       ".jp-Toolbar-kernelStatus", timeout=180_000)
                page.wait_for_timeout(2000)
                page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
                page.wait_for_selector(".probe-live[data-edits='1']", timeout=300_000)
                page.fill(".probe-live textarea.pl-text:not(.pl-corrupt)", "A dog ran in the park.")
                page.wait_for_selector(".probe-live[data-edits='2']", timeout=120_000)
                page.click(".probe-live td.pl-cell[data-layer='1'][data-head='0']")
                page.wait_for_selector(".probe-live[data-heads='1'] .probe-sv table", timeout=120_000)
                assert "check holds" in page.inner_text(".probe-live .pl-check")
                tokens = page.eval_on_selector_all(".probe-live .pl-tok", "ts => ts.map(t => t.textContent)")
                assert tokens and tokens[0] != "" and len(tokens) >= 5
            finally:
                browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert errors == []
    assert all(u.startswith(base + "/") or u.startswith(("blob:", "data:", "ws://127.0.0.1")) for u in requests), \
        sorted({u for u in requests if not u.startswith(base)})[:5]
