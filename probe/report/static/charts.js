/* probe report: scatter and bar charts on <canvas>, for figures whose data carry a `kind`.
 * Plain JavaScript, no library, no network request; the heatmap script (inlined after this one)
 * calls window.probeCharts[fig.kind](canvas, fig, tip) for such figures.
 *   scatter: {kind, title, xs, ys, tips, colors (hex per point) | values (0..1 per point) + cmap,
 *             legend [[name, hex]], xLabel, yLabel}
 *   bars:    {kind, mode "stack" | "group", title, categories, series [{name, color, values}],
 *             vmax, vmin (default 0; below 0: signed values, a stack's negative parts go down from 0),
 *             xLabel, yLabel, unit}
 */
(function () {
  "use strict";
  var FONT = "11px sans-serif";

  function setup(canvas, W, H) {
    var dpr = window.devicePixelRatio || 1, ctx = canvas.getContext("2d");
    canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
    canvas.style.width = W + "px"; canvas.style.height = H + "px";
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.font = FONT; ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    return ctx;
  }
  function fmt(v) { return Math.abs(v) >= 100 ? v.toFixed(0) : (Math.abs(v) >= 1 ? v.toFixed(2) : v.toFixed(3)); }
  // one number of decimals for every tick of an axis: the fewest that write each tick exactly (at most 4)
  function axisLabels(ticks) {
    var d = 0;
    while (d < 4 && ticks.some(function (t) { var m = t * Math.pow(10, d); return Math.abs(m - Math.round(m)) > 1e-6; })) d++;
    return ticks.map(function (t) { return t.toFixed(d); });
  }
  var TITLE_FONT = "bold 12px sans-serif", TITLE_LINE = 14;
  // a title's lines, broken at spaces where it is wider than maxW px (a chart at a phone's width: one line was cut
  // at the canvas's edge); a single word wider than maxW keeps its own line
  function titleLines(ctx, text, maxW) {
    ctx.font = TITLE_FONT;
    var lines = [], line = "";
    String(text).split(" ").forEach(function (word) {
      var next = line ? line + " " + word : word;
      if (line && ctx.measureText(next).width > maxW) { lines.push(line); line = word; } else line = next;
    });
    if (line) lines.push(line);
    ctx.font = FONT;
    return lines;
  }
  // the height above a chart's legend: the title's lines (or a margin without a title)
  function titleHeight(ctx, fig, maxW) {
    return fig.title ? 24 + TITLE_LINE * (titleLines(ctx, fig.title, maxW).length - 1) : 6;
  }
  function title(ctx, fig, x, maxW) {
    if (!fig.title) return;
    var lines = titleLines(ctx, fig.title, maxW);
    ctx.fillStyle = "#222"; ctx.font = TITLE_FONT; ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
    lines.forEach(function (line, i) { ctx.fillText(line, x, 15 + TITLE_LINE * i); });
    ctx.font = FONT;
  }
  function legend(ctx, items, x, y, maxW) {
    ctx.textAlign = "left"; ctx.textBaseline = "middle";
    var cx = x, cy = y;
    items.forEach(function (it) {
      var w = 16 + ctx.measureText(it[0]).width + 12;
      if (cx + w > x + maxW && cx > x) { cx = x; cy += 16; }
      ctx.fillStyle = it[1]; ctx.fillRect(cx, cy - 5, 10, 10);
      ctx.strokeStyle = "#888"; ctx.strokeRect(cx + 0.5, cy - 4.5, 9, 9);
      ctx.fillStyle = "#222"; ctx.fillText(it[0], cx + 14, cy);
      cx += w;
    });
    return cy + 10 - y;
  }
  function tooltip(canvas, tip, hit) {
    canvas.addEventListener("mousemove", function (e) {
      var rect = canvas.getBoundingClientRect(), text = hit(e.clientX - rect.left, e.clientY - rect.top);
      if (text === null) { tip.style.display = "none"; return; }
      tip.textContent = text; tip.style.display = "block";
      tip.style.left = (e.pageX + 12) + "px"; tip.style.top = (e.pageY + 12) + "px";
    });
    canvas.addEventListener("mouseleave", function () { tip.style.display = "none"; });
  }
  function pointColor(fig, i) {
    if (fig.colors) return fig.colors[i];
    return window.probeHeatmap.color(fig.cmap || "viridis", fig.values[i]);
  }

  function scatter(canvas, fig, tip) {
    var width = Math.min(canvas.parentElement.clientWidth || 480, 560);
    var ctx = setup(canvas, width, 10);
    var left = 44, right = 12, bottom = 34, head = titleHeight(ctx, fig, width - left - right);
    // the legend measured at the width it is drawn at (measured wider, a last row was drawn over the plot)
    var legendH = fig.legend ? legend(ctx, fig.legend, 0, -1000, width - left - right) : 0;
    var top = head + legendH + (legendH ? 6 : 0);
    var plot = Math.max(120, width - left - right), H = top + plot + bottom;
    ctx = setup(canvas, width, H);
    title(ctx, fig, left, width - left - right);
    if (fig.legend) legend(ctx, fig.legend, left, head + 5, width - left - right);
    var n = fig.xs.length, x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (var i = 0; i < n; i++) {
      x0 = Math.min(x0, fig.xs[i]); x1 = Math.max(x1, fig.xs[i]); y0 = Math.min(y0, fig.ys[i]); y1 = Math.max(y1, fig.ys[i]);
    }
    var span = Math.max(x1 - x0, y1 - y0) || 1, cxm = (x0 + x1) / 2, cym = (y0 + y1) / 2, pad = 0.06 * span;
    var lo = span / 2 + pad;  // same scale on both axes: distances in the map are comparable
    function px(v) { return left + (v - cxm + lo) / (2 * lo) * plot; }
    function py(v) { return top + plot - (v - cym + lo) / (2 * lo) * plot; }
    ctx.strokeStyle = "#ccc"; ctx.strokeRect(left + 0.5, top + 0.5, plot, plot);
    ctx.fillStyle = "#444"; ctx.textAlign = "center"; ctx.textBaseline = "top";
    ctx.textAlign = "left"; ctx.fillText(fmt(cxm - lo), left, top + plot + 3);
    ctx.textAlign = "right"; ctx.fillText(fmt(cxm + lo), left + plot, top + plot + 3); ctx.textAlign = "center";
    if (fig.xLabel) ctx.fillText(fig.xLabel, left + plot / 2, top + plot + 18);
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    ctx.fillText(fmt(cym - lo), left - 3, top + plot); ctx.fillText(fmt(cym + lo), left - 3, top);
    if (fig.yLabel) { ctx.save(); ctx.translate(10, top + plot / 2); ctx.rotate(-Math.PI / 2); ctx.textAlign = "center"; ctx.fillText(fig.yLabel, 0, 0); ctx.restore(); }
    var pts = [];
    for (i = 0; i < n; i++) {
      var x = px(fig.xs[i]), y = py(fig.ys[i]);
      pts.push([x, y]);
      ctx.beginPath(); ctx.arc(x, y, 4.5, 0, 2 * Math.PI);
      ctx.fillStyle = pointColor(fig, i); ctx.fill();
      ctx.strokeStyle = "#333"; ctx.lineWidth = 0.6; ctx.stroke();
    }
    canvas._points = pts;
    tooltip(canvas, tip, function (mx, my) {
      var best = -1, bd = 49;
      for (var j = 0; j < pts.length; j++) {
        var d = (pts[j][0] - mx) * (pts[j][0] - mx) + (pts[j][1] - my) * (pts[j][1] - my);
        if (d < bd) { bd = d; best = j; }
      }
      return best < 0 ? null : (fig.tips ? fig.tips[best] : "point " + best);
    });
  }

  function bars(canvas, fig, tip) {
    var width = canvas.parentElement.clientWidth || 480;
    var ctx = setup(canvas, width, 10);
    var items = fig.series.map(function (s) { return [s.name, s.color]; });
    var left = 62, right = 10, bottom = 34, plotH = 180, plotW = width - left - right;
    // the legend measured at the width it is drawn at, the plot's: measured at width - 60, a row that wrapped
    // only when drawn (probe why's "other pairs") was drawn over the top of the bars
    var legendH = legend(ctx, items, 0, -1000, plotW);
    var head = titleHeight(ctx, fig, plotW), top = head + legendH + 8, H = top + plotH + bottom;
    ctx = setup(canvas, width, H);
    title(ctx, fig, left, plotW);
    legend(ctx, items, left, head + 5, plotW);
    var cats = fig.categories, nc = cats.length, ns = fig.series.length, stack = fig.mode !== "group";
    var vmax = fig.vmax || 1, vmin = Math.min(0, fig.vmin || 0), slot = plotW / nc, barW = Math.max(1, Math.min(stack ? 48 : 24, stack ? slot * 0.8 : slot * 0.8 / ns));
    function py(v) { return top + plotH - Math.max(0, Math.min(1, (v - vmin) / (vmax - vmin))) * plotH; }
    ctx.strokeStyle = "#ddd"; ctx.fillStyle = "#444"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
    var ticks = [0, 1, 2, 3, 4].map(function (t) { return vmin + (vmax - vmin) * t / 4; }), tickText = axisLabels(ticks);
    for (var t = 0; t <= 4; t++) {
      var y = py(ticks[t]);
      ctx.beginPath(); ctx.moveTo(left, y + 0.5); ctx.lineTo(left + plotW, y + 0.5); ctx.stroke();
      ctx.fillText(tickText[t], left - 4, y);
    }
    var rects = [];
    for (var c = 0; c < nc; c++) {
      var base = 0, below = 0;  // a stack's positive parts rise from 0, its negative parts go down from 0
      for (var s = 0; s < ns; s++) {
        var val = fig.series[s].values[c];
        if (val === null || val === undefined || isNaN(val)) continue;
        var x = left + (c + 0.5) * slot - (stack ? barW : barW * ns) / 2 + (stack ? 0 : s * barW);
        var from = stack ? (val >= 0 ? base : below) : 0;
        var yTop = py(Math.max(from, from + val)), yBot = py(Math.min(from, from + val));
        ctx.fillStyle = fig.series[s].color; ctx.fillRect(x, yTop, barW, Math.max(0, yBot - yTop));
        rects.push([x, yTop, barW, yBot - yTop, c, s, val]);
        if (stack && val >= 0) base += val;
        if (stack && val < 0) below += val;
      }
    }
    ctx.fillStyle = "#444"; ctx.textAlign = "center"; ctx.textBaseline = "top";
    var step = Math.max(1, Math.ceil(16 / slot));
    for (c = 0; c < nc; c += step) ctx.fillText(cats[c], left + (c + 0.5) * slot, top + plotH + 3);
    if (fig.xLabel) ctx.fillText(fig.xLabel, left + plotW / 2, top + plotH + 18);
    if (fig.yLabel) { ctx.save(); ctx.translate(10, top + plotH / 2); ctx.rotate(-Math.PI / 2); ctx.textBaseline = "middle"; ctx.fillText(fig.yLabel, 0, 0); ctx.restore(); }
    canvas._rects = rects;
    tooltip(canvas, tip, function (mx, my) {
      for (var k = 0; k < rects.length; k++) {
        var r = rects[k];
        if (mx >= r[0] && mx <= r[0] + r[2] && my >= r[1] && my <= r[1] + Math.max(r[3], 1)) {
          return (fig.xLabel || "") + " " + cats[r[4]] + ", " + fig.series[r[5]].name + ": " + fmt(r[6]) + (fig.unit ? " " + fig.unit : "");
        }
      }
      return null;
    });
  }

  window.probeCharts = {scatter: scatter, bars: bars, axisLabels: axisLabels, titleLines: titleLines};
})();
