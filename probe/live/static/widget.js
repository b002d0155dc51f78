/* probe live as a notebook widget (anywidget): the same app and views as the `probe live` page
 * (probe/live/static/live.js and the view modules before this file in the widget's module), its requests
 * sent to the kernel as the widget's messages {id, route, body} and answered {id, status, body} by the
 * same session (probe/live/widget.py), not over HTTP: no server, no token. */
function render({ model, el }) {
  var pending = {}, next = 0, progress = {busy: false};
  function onMessage(msg) {
    if (msg && msg.progress) { progress = msg.progress; return; }  // sent by the kernel while it patches
    if (msg && msg.id !== undefined && pending[msg.id]) {
      progress = {busy: false};
      pending[msg.id]({status: msg.status, body: msg.body}); delete pending[msg.id];
    }
  }
  model.on("msg:custom", onMessage);
  function transport(route, body) {
    if (route === "progress") return Promise.resolve({status: 200, body: progress});  // the kernel's last word
    return new Promise(function (resolve) {
      var id = ++next;
      pending[id] = resolve;
      model.send({id: id, route: route, body: body});
    });
  }
  var root = document.createElement("div");
  root.className = "probe-live";
  el.appendChild(root);
  globalThis.probeViews.live(root, transport, model.get("text"));
  return function () { model.off("msg:custom", onMessage); };
}
export default { render };
