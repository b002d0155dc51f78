/* probe report: heatmaps drawn on <canvas> from the data inlined in the page.
 * Plain JavaScript, no library, no network request. Every figure is a canvas element whose data-fig
 * attribute names its entry in the page data, figures[name] = {rows, cols, values (row-major, scaled by `scale`), vmin, vmax,
 * cmap, title, rowLabels, colLabels, xLabel, yLabel, unit, cellName}; a figure with a `kind` (scatter, bars) is
 * drawn by window.probeCharts (static/charts.js, inlined before this script).
 */
(function () {
  "use strict";
  var CMAPS = {
    // matplotlib's viridis and Blues, sampled at 0, 1/8, ..., 1 and interpolated linearly
    viridis: ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"],
    blues: ["#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b"],
    // matplotlib's RdBu reversed (negative blue, 0 white, positive red), for signed values on a symmetric scale
    rdbu: ["#053061", "#2166ac", "#4393c3", "#92c5de", "#f7f7f7", "#f4a582", "#d6604d", "#b2182b", "#67001f"]
  };
  function hex(c) { return [parseInt(c.slice(1, 3), 16), parseInt(c.slice(3, 5), 16), parseInt(c.slice(5, 7), 16)]; }
  var LUT = {};
  Object.keys(CMAPS).forEach(function (name) {
    var stops = CMAPS[name].map(hex), lut = [];
    for (var i = 0; i < 256; i++) {
      var x = i / 255 * (stops.length - 1), k = Math.min(Math.floor(x), stops.length - 2), f = x - k;
      lut.push("rgb(" + [0, 1, 2].map(function (c) { return Math.round(stops[k][c] * (1 - f) + stops[k + 1][c] * f); }).join(",") + ")");
    }
    LUT[name] = lut;
  });
  function color(cmap, t) {
    if (t === null || t === undefined || isNaN(t)) return "#e6e6e6";
    return LUT[cmap][Math.max(0, Math.min(255, Math.round(t * 255)))];
  }
  function short(s, n) { return s.length > n ? s.slice(0, n - 1) + "\u2026" : s; }
  function wrap(ctx, text, maxW) {  // lines of at most maxW pixels, broken at spaces
    var words = text.split(" "), lines = [], line = "";
    words.forEach(function (w) {
      var next = line ? line + " " + w : w;
      if (line && ctx.measureText(next).width > maxW) { lines.push(line); line = w; } else { line = next; }
    });
    if (line) lines.push(line);
    return lines;
  }
  function fmt(v) { return v === null || v === undefined ? "n/a" : (Math.abs(v) >= 100 ? v.toFixed(1) : v.toFixed(3)); }

  function draw(canvas, fig) {
    var dpr = window.devicePixelRatio || 1;
    var ctx = canvas.getContext("2d");
    var font = "11px sans-serif";
    ctx.font = font;
    var rowLabels = fig.rowLabels || [], colLabels = fig.colLabels || [];
    var labelW = 0, colW = 0;
    rowLabels.forEach(function (s) { labelW = Math.max(labelW, ctx.measureText(short(s, 14)).width); });
    colLabels.forEach(function (s) { colW = Math.max(colW, ctx.measureText(short(s, 14)).width); });
    var width = canvas.parentElement.clientWidth || 480;
    var left = 8 + labelW + (fig.yLabel ? 16 : 0), top = 6, barW = 54;
    var rotate = colLabels.length > 0 && colLabels.some(function (s) { return s.length > 2; });
    var bottom = 8 + (rotate ? colW : 14) + (fig.xLabel ? 16 : 0);
    var cell = Math.max(2, Math.min(28, (width - left - barW - 8) / fig.cols));
    var plotW = cell * fig.cols, plotH = cell * fig.rows;
    var W = left + plotW + barW + 8, title = [], tx = left;
    if (fig.title) {  // a small map (a short example) widens to its title, else the title wraps: never clipped
      ctx.font = "bold 12px sans-serif";
      var tw = ctx.measureText(fig.title).width;
      W = Math.max(W, Math.min(Math.max(width, W), left + tw + 8));
      if (left + tw + 8 > W) tx = 8;
      title = wrap(ctx, fig.title, W - tx - 8);
      top = 10 + 15 * title.length;
      ctx.font = font;
    }
    var H = top + plotH + bottom;
    canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
    canvas.style.width = W + "px"; canvas.style.height = H + "px";
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.font = font; ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    var span = (fig.vmax - fig.vmin) || 1, scale = fig.scale || 1;
    for (var r = 0; r < fig.rows; r++) {
      for (var c = 0; c < fig.cols; c++) {
        var raw = fig.values[r * fig.cols + c];
        var v = raw === null ? null : raw / scale;
        ctx.fillStyle = color(fig.cmap, v === null ? null : (v - fig.vmin) / span);
        ctx.fillRect(left + c * cell, top + r * cell, Math.ceil(cell), Math.ceil(cell));
      }
    }
    ctx.fillStyle = "#222";
    var titleW = 0;
    if (title.length) {
      ctx.font = "bold 12px sans-serif";
      title.forEach(function (line, k) {
        ctx.fillText(line, tx, 15 + 15 * k); titleW = Math.max(titleW, ctx.measureText(line).width);
      });
      ctx.font = font;
    }
    var step = Math.max(1, Math.ceil(11 / cell));
    ctx.textBaseline = "middle"; ctx.textAlign = "right";
    for (r = 0; r < rowLabels.length; r += step) ctx.fillText(short(rowLabels[r], 14), left - 4, top + (r + 0.5) * cell);
    ctx.textBaseline = "top";
    for (c = 0; c < colLabels.length; c += step) {
      ctx.save();
      if (rotate) {
        ctx.translate(left + (c + 0.5) * cell, top + plotH + 4); ctx.rotate(-Math.PI / 2);
        ctx.textAlign = "right"; ctx.textBaseline = "middle"; ctx.fillText(short(colLabels[c], 14), 0, 0);
      } else { ctx.textAlign = "center"; ctx.fillText(colLabels[c], left + (c + 0.5) * cell, top + plotH + 3); }
      ctx.restore();
    }
    ctx.textAlign = "center"; ctx.textBaseline = "alphabetic";
    if (fig.xLabel) ctx.fillText(fig.xLabel, left + plotW / 2, H - 4);
    if (fig.yLabel) { ctx.save(); ctx.translate(10, top + plotH / 2); ctx.rotate(-Math.PI / 2); ctx.fillText(fig.yLabel, 0, 0); ctx.restore(); }
    // colour bar
    var bx = left + plotW + 12, bh = Math.max(40, plotH);
    for (var i = 0; i < bh; i++) { ctx.fillStyle = color(fig.cmap, 1 - i / (bh - 1)); ctx.fillRect(bx, top + i, 10, 1); }
    ctx.fillStyle = "#222"; ctx.textAlign = "left"; ctx.textBaseline = "middle";
    ctx.fillText(fmt(fig.vmax), bx + 13, top + 4); ctx.fillText(fmt(fig.vmin), bx + 13, top + bh - 4);
    canvas._geom = {left: left, top: top, cell: cell, width: W, title: {x: tx, width: titleW, lines: title}};
  }

  function attachTooltip(canvas, fig, tip) {
    canvas.addEventListener("mousemove", function (e) {
      var g = canvas._geom, rect = canvas.getBoundingClientRect();
      var c = Math.floor((e.clientX - rect.left - g.left) / g.cell), r = Math.floor((e.clientY - rect.top - g.top) / g.cell);
      if (r < 0 || c < 0 || r >= fig.rows || c >= fig.cols) { tip.style.display = "none"; return; }
      var raw = fig.values[r * fig.cols + c];
      var rl = fig.rowLabels ? fig.rowLabels[r] : r, cl = fig.colLabels ? fig.colLabels[c] : c;
      tip.textContent = (fig.cellName ? fig.cellName(r, c) : (fig.yLabel || "row") + " " + rl + ", " + (fig.xLabel || "col") + " " + cl)
        + ": " + (raw === null ? "n/a" : fmt(raw / (fig.scale || 1))) + (fig.unit ? " " + fig.unit : "");
      tip.style.display = "block"; tip.style.left = (e.pageX + 12) + "px"; tip.style.top = (e.pageY + 12) + "px";
    });
    canvas.addEventListener("mouseleave", function () { tip.style.display = "none"; });
  }

  function init() {
    var node = document.getElementById("probe-data");
    if (!node) return;
    var data = JSON.parse(node.textContent);
    var tip = document.createElement("div");
    tip.className = "tip"; document.body.appendChild(tip);
    var canvases = document.querySelectorAll("canvas[data-fig]");
    for (var i = 0; i < canvases.length; i++) {
      var fig = data.figures[canvases[i].getAttribute("data-fig")];
      if (!fig) continue;
      var chart = fig.kind && window.probeCharts ? window.probeCharts[fig.kind] : null;
      if (chart) { chart(canvases[i], fig, tip); } else { draw(canvases[i], fig); attachTooltip(canvases[i], fig, tip); }
      canvases[i].setAttribute("data-drawn", "1");
    }
    document.body.setAttribute("data-figures-drawn", String(canvases.length));
  }
  window.probeHeatmap = {draw: draw, color: color};
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init); else init();
})();
