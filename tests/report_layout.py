#!/usr/bin/env python3
"""Layout check of a report.html or study.html in headless Chromium, at a phone width and a desktop width.

Run by .ci/run on a report the debug binary writes (needs `chromium`, a Debian package; python3
stdlib only). Usage: tests/report_layout.py REPORT.html [REPORT.html ...] [--widths 390,1280] [--chromium PATH].

The shipped page runs no script, so this injects a measuring script into a copy only (the file
given is never written). Chromium loads the copy in an iframe of each width (the headless window
cannot be narrower than 500 px) and, after a virtual-time budget, dumps the DOM, into which the
script wrote what it measured. The check fails when, at any width:

- the document is wider than the viewport (`scrollWidth > innerWidth`: a horizontal scrollbar);
- an element sticks out of the page's content box, or a table, cell, `pre`, figure or SVG is wider
  than its container, or a cell's content is wider than the cell (what sits in a scroll container,
  `overflow-x: auto`, scrolls in its box, which must itself fit);
- a metric name (`kld_mean`, `top1_agreement`, …) is broken across lines.

It fails, never skips, when Chromium is missing or the measuring script did not run.
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

MARK = "cardproof-layout-result"

# Runs in the copy only. Tolerance of 1 px for sub-pixel rounding.
MEASURE = r"""
<script>
(function () {
  const problems = [];
  const vw = window.innerWidth;
  const de = document.documentElement;
  if (de.scrollWidth > vw + 1) {
    problems.push("document is " + de.scrollWidth + " px wide in a " + vw + " px viewport");
  }
  const body = document.body.getBoundingClientRect();
  const cs = getComputedStyle(document.body);
  const right = body.right - parseFloat(cs.paddingRight) + 1;
  const left = body.left + parseFloat(cs.paddingLeft) - 1;
  const name = (el) => {
    let s = el.tagName.toLowerCase();
    if (el.id) s += "#" + el.id;
    if (el.className && typeof el.className === "string") s += "." + el.className.split(/\s+/).join(".");
    const sec = el.closest("section");
    if (sec && sec.id) s += " in section#" + sec.id;
    const t = (el.textContent || "").trim().replace(/\s+/g, " ").slice(0, 40);
    return s + (t ? " (" + JSON.stringify(t) + ")" : "");
  };
  const visible = (el) => {
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && !el.closest("details:not([open]) > :not(summary)");
  };
  // Inside a scroll container (`overflow-x: auto`) content may be wider than the page: it
  // scrolls in its box, which must itself fit (a study's tables on a phone).
  const scrolled = (el) => {
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      const o = getComputedStyle(a).overflowX;
      if (o === "auto" || o === "scroll") return true;
    }
    return false;
  };
  // Only the outermost element sticking out is reported (its children stick out with it).
  const out_of_box = new Set();
  for (const el of document.body.querySelectorAll("*")) {
    if (el.tagName === "SCRIPT" || !visible(el) || el.closest("svg") && el.tagName !== "svg") continue;
    if (scrolled(el)) continue;
    const r = el.getBoundingClientRect();
    if (r.right > right || r.left < left) {
      out_of_box.add(el);
      if (out_of_box.has(el.parentElement)) continue;
      problems.push(name(el) + " spans " + Math.round(r.left) + "–" + Math.round(r.right) +
                    " px, outside the content box " + Math.round(left) + "–" + Math.round(right));
    }
  }
  for (const el of document.body.querySelectorAll("table, pre, figure, svg, dl")) {
    if (!visible(el) || scrolled(el)) continue;
    const parent = el.parentElement;
    if (el.getBoundingClientRect().width > parent.clientWidth + 1) {
      problems.push(name(el) + " is " + Math.round(el.getBoundingClientRect().width) +
                    " px wide in a " + parent.clientWidth + " px container");
    }
  }
  for (const el of document.body.querySelectorAll("td, th, pre")) {
    if (!visible(el)) continue;
    if (el.scrollWidth > el.clientWidth + 1) {
      problems.push(name(el) + ": content " + el.scrollWidth + " px wide in " + el.clientWidth + " px");
    }
  }
  const metric = /^(kld|top1|ppl)[a-z0-9_]*$/;
  for (const el of document.body.querySelectorAll("code")) {
    if (!visible(el) || !metric.test(el.textContent.trim())) continue;
    if (el.getClientRects().length > 1) {
      problems.push("metric name " + JSON.stringify(el.textContent.trim()) + " wraps over " +
                    el.getClientRects().length + " lines" + (el.closest("section") ? " in section#" + el.closest("section").id : ""));
    }
  }
  // The page runs in an iframe of the width asked for (Chromium's headless window has a minimum
  // width of 500 px); the result goes into the parent's DOM, which --dump-dom prints.
  const out = parent.document.createElement("pre");
  out.id = "MARK";
  out.textContent = JSON.stringify({viewport: vw, scroll_width: de.scrollWidth, problems: problems});
  parent.document.body.appendChild(out);
})();
</script>
""".replace("MARK", MARK)


def find_chromium(given):
    for c in [given, os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"]:
        if c and shutil.which(c):
            return shutil.which(c)
    return None


def measure(chromium, html, width, height=2400):
    """Load the instrumented page in an iframe `width` px wide (srcdoc: the frame shares the
    wrapper's origin, so its script can write the result into the wrapper)."""
    srcdoc = html.replace("&", "&amp;").replace('"', "&quot;")
    wrapper = (f'<!DOCTYPE html><html><body style="margin:0"><iframe style="border:0" '
               f'width="{width}" height="{height}" srcdoc="{srcdoc}"></iframe></body></html>')
    with tempfile.TemporaryDirectory() as profile:
        page = pathlib.Path(profile) / "wrapper.html"
        page.write_text(wrapper, encoding="utf-8")
        cmd = [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}",
            f"--window-size={max(width, 500) + 40},{height + 40}", "--virtual-time-budget=5000", "--dump-dom",
            page.as_uri(),
        ]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="' + MARK + r'">(.*?)</pre>', p.stdout, re.S)
    if not m:
        sys.exit(f"report_layout: the measuring script did not run at {width} px "
                 f"(chromium exit {p.returncode}): {p.stderr[-2000:]}")
    text = m.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
    return json.loads(text)


def check(chromium, report, widths):
    """Lays one report out at each width; True when anything overflows."""
    html = report.read_text(encoding="utf-8")
    if "<script" in html.lower():
        sys.exit(f"report_layout: {report} contains a script; the shipped page must have none")
    if "</body>" not in html:
        sys.exit(f"report_layout: {report} has no </body>")
    failed = False
    instrumented = html.replace("</body>", MEASURE + "</body>", 1)
    for width in widths:
        r = measure(chromium, instrumented, width)
        # Chromium sizes the layout viewport from --window-size; a different one would
        # measure a page nobody asked about.
        if abs(r["viewport"] - width) > 20:
            sys.exit(f"report_layout: asked for {width} px, got a {r['viewport']} px viewport")
        if r["problems"]:
            failed = True
            print(f"{report} at {width} px: {len(r['problems'])} layout problems")
            for p in r["problems"][:40]:
                print(f"  - {p}")
            if len(r["problems"]) > 40:
                print(f"  … and {len(r['problems']) - 40} more")
        else:
            print(f"{report} at {width} px: nothing overflows, no metric name wraps")
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reports", type=pathlib.Path, nargs="+", help="report.html files")
    ap.add_argument("--widths", default="390,1280")
    ap.add_argument("--chromium")
    args = ap.parse_args()
    chromium = find_chromium(args.chromium)
    if chromium is None:
        sys.exit("report_layout: chromium not found (apt-get install chromium); the layout check cannot run")
    failed = False
    for report in args.reports:
        failed |= check(chromium, report, [int(w) for w in args.widths.split(",")])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
