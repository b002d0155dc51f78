/* probe rollout view: attention weights | rollout | flow of one chosen position, per input token.
 * Plain JavaScript, no library, no network request, no eval; runs under a Content-Security-Policy of
 * "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'".
 *
 * Markup (probe/view/rollout.py): a div of class "probe-rv" holding a style element, a JSON script element
 * of class "probe-rv-data" and a script element with this file, which mounts the view it sits in
 * (document.currentScript's parent); its one page-level name is the namespace probeViews, where it puts its
 * draw function probeViews.rollout(element, data). Token text is only ever set as
 * textContent, never parsed as HTML.
 *
 * One SVG per view: a row per input token j (its label, clickable: that position becomes the chosen row),
 * then three bars whose widths are proportional to weights[layer][i][j], rollout[i][j] and, for the
 * reported row only, flow[j]. Every bar carries its value in data-v. element.probeRollout (state, select,
 * drawn) is the small API tests use.
 */
(function (script) {
  "use strict";
  var SVGNS = "http://www.w3.org/2000/svg";
  var ROW = 16, LABEL_W = 150, COL_W = 170, GAP = 50, TOP = 20;
  var COLORS = { w: "#7f7f7f", r: "#1f77b4", f: "#2ca02c" };
  function render(root, data) {  // the one draw function (report, saved view, notebook)
  if (root.classList) root.classList.add("probe-rv");
  if (!data.examples.length) { root.setAttribute("data-draws", "0"); return null; }
  var state = { ex: 0, row: data.examples[0].row, layer: data.examples[0].layers.length - 1 };

  function el(tag, attrs, parent, svg) {
    var e = svg ? document.createElementNS(SVGNS, tag) : document.createElement(tag);
    for (var k in attrs) if (Object.prototype.hasOwnProperty.call(attrs, k)) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  var controls = el("div", { "class": "rv-controls" }, root);
  var exSel = null;
  if (data.examples.length > 1) {
    var exLabel = el("label", {}, controls);
    exLabel.appendChild(document.createTextNode("example "));
    exSel = el("select", { "class": "rv-example" }, exLabel);
    data.examples.forEach(function (ex, k) {
      var o = el("option", { value: String(k) }, exSel);
      o.textContent = String(ex.index + 1) + " (" + ex.tokens.length + " tokens)";
    });
    exSel.addEventListener("change", function () { select(Number(exSel.value), null, null); });
  }
  var layerLabel = el("label", {}, controls);
  layerLabel.appendChild(document.createTextNode("weights: layer "));
  var layerSel = el("select", { "class": "rv-layer" }, layerLabel);
  layerSel.addEventListener("change", function () { select(state.ex, state.row, Number(layerSel.value)); });
  var head = el("div", { "class": "rv-head" }, root);
  var notes = el("ul", { "class": "rv-notes" }, root);
  var svg = el("svg", {}, root, true);
  var drawn = { w: [], r: [], f: [] };

  function fillLayers(ex) {
    while (layerSel.firstChild) layerSel.removeChild(layerSel.firstChild);
    ex.layers.forEach(function (l, k) {
      var o = el("option", { value: String(k) }, layerSel);
      o.textContent = "L" + l + " (mean over heads)";
    });
  }

  function bar(kind, col, j, v) {
    var x = LABEL_W + col * (COL_W + GAP), y = TOP + j * ROW;
    var w = v === null ? 0 : v * COL_W;
    var r = el("rect", { x: x, y: y + 2, width: w, height: ROW - 4, fill: COLORS[kind], "class": "rv-bar rv-" + kind,
      "data-j": j, "data-v": v === null ? "" : String(v) }, svg, true);
    var title = el("title", {}, r, true);
    title.textContent = (v === null ? "n/a" : v.toFixed(data.digits));
    var t = el("text", { x: x + w + 3, y: y + ROW - 4, fill: "#555" }, svg, true);
    t.textContent = v === null ? "" : v.toFixed(3);
    drawn[kind].push(v);
  }

  function draw() {
    var ex = data.examples[state.ex], i = state.row, T = ex.tokens.length;
    drawn = { w: [], r: [], f: [] };
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    svg.setAttribute("width", String(LABEL_W + 3 * (COL_W + GAP)));
    svg.setAttribute("height", String(TOP + T * ROW + 4));
    var flowHere = ex.flow !== null && i === ex.row;
    var heads = ["weights L" + ex.layers[state.layer], "rollout", flowHere ? "flow" : "flow (reported row only)"];
    heads.forEach(function (h, c) {
      var t = el("text", { x: LABEL_W + c * (COL_W + GAP), y: TOP - 6, "font-weight": "bold" }, svg, true);
      t.textContent = h;
    });
    head.textContent = "Row of position " + i + " \u201c" + ex.tokens[i] + "\u201d" +
      (i === ex.row ? " (the reported row)" : "") + ": where its state comes from, per input token";
    while (notes.firstChild) notes.removeChild(notes.firstChild);
    var lines = ex.notes.slice();
    if (ex.flow === null) lines.push("flow not computed for this text (longer than " + data.flow_tokens + " tokens)");
    else if (!flowHere) lines.push("flow is solved for the reported row only (position " + ex.row + "); click \u201c" +
      ex.tokens[ex.row] + "\u201d to see it");
    lines.forEach(function (n) { var li = el("li", {}, notes); li.textContent = n; });
    var weights = ex.weights[state.layer];
    for (var j = 0; j < T; j++) {
      var lab = el("text", { x: LABEL_W - 6, y: TOP + j * ROW + ROW - 4, "text-anchor": "end", "data-j": j,
        "class": "rv-tok" + (j === i ? " rv-chosen" : "") }, svg, true);
      lab.textContent = ex.tokens[j];
      lab.addEventListener("click", (function (j) { return function () { select(state.ex, j, state.layer); }; })(j));
      bar("w", 0, j, weights[i][j]);
      bar("r", 1, j, ex.rollout[i][j]);
      if (flowHere) bar("f", 2, j, ex.flow[j]);
    }
  }

  function select(ex, row, layer) {
    var changed = ex !== state.ex;
    state.ex = ex;
    var e = data.examples[ex];
    if (changed || layerSel.options.length === 0) fillLayers(e);
    state.row = row === null || changed ? e.row : row;
    state.layer = layer === null || changed ? e.layers.length - 1 : layer;
    layerSel.value = String(state.layer);
    if (exSel) exSel.value = String(ex);
    draw();
  }

  fillLayers(data.examples[0]);
  select(0, null, null);
  root.probeRollout = {
    state: function () { return { ex: state.ex, row: state.row, layer: state.layer }; },
    select: function (ex, row, layer) { select(ex, row, layer); },
    drawn: function () {
      var out = { w: [], r: [], f: [] };
      root.querySelectorAll("rect.rv-bar").forEach(function (r) {
        var kind = r.getAttribute("class").split("rv-")[2].trim();
        out[kind].push({ v: r.getAttribute("data-v") === "" ? null : Number(r.getAttribute("data-v")),
          width: Number(r.getAttribute("width")) / COL_W });
      });
      return out;
    },
    token: function (j) {
      var r = root.querySelector("text.rv-tok[data-j='" + j + "']").getBoundingClientRect();
      return { x: r.left + r.width / 2, y: r.top + r.height / 2 };
    }
  };
  root.setAttribute("data-draws", "1");
  return root.probeRollout;
  }

  var views = (typeof window !== "undefined" ? window : globalThis);
  views = views.probeViews = views.probeViews || {};
  views.rollout = render;
  var host = script && script.parentNode, node = host && host.querySelector && host.querySelector("script.probe-rv-data");
  if (node && !host.probeRollout) render(host, JSON.parse(node.textContent));
})(typeof document !== "undefined" ? document.currentScript : null);
