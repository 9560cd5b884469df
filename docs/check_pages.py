"""Look at the built docs site as a reader does: screenshots, and code blocks wider than their box.

    hatch run python docs/check_pages.py [--no-build] [--out DIR] [--widths 1280,390] [--pages PREFIX,...]

Builds the site (``hatch run docs``, strict, into a folder of its own so that
no other build can change it underneath; ``--no-build`` uses ``site/``), serves it from a local ``http.server`` on 127.0.0.1, and opens
its pages in headless Chromium (``/usr/bin/chromium``, or ``CHROMIUM``; on
Debian ``apt-get install -y chromium``) at each width:

* every page is measured: a script added to the page as it is served runs
  once the page has loaded and writes into the page's title what overflows:
  code blocks wider than their box (they would scroll sideways; checked on
  windows at least ``WIDE`` px wide: on a phone they scroll), inline code
  broken over two lines when it has no space or stands in a table (a package
  name split mid-word), and the page itself wider than the window; code
  lines that wrap (they fit no screen of that width) are noted.  Chromium's ``--dump-dom`` hands the
  title back.  No browser driver is needed.
* the home page and every page that shows an image (the benchmark plots) are
  screenshotted, whole, to ``DIR/<page>-<width>.png``; the folder is printed.

``--pages`` keeps the pages whose path starts with one of the prefixes
(``""`` is the home page: ``--pages ,benchmarks``).  Four Chromiums run at a
time; the whole site takes about a minute.

Exit status 1 when a page overflows at the widest width (the desktop layout
must never scroll sideways); narrower widths are reported, not failed.  No
test runs this (CI has no Chromium); run it after changing the docs' look.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import html
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = os.path.join(ROOT, "site")
TITLE = "RLINF-CHECK:"
#: from this window width on (60em of docs/stylesheets/readable.css) no code block may scroll sideways
WIDE = 960
# runs in the page once it has loaded (and Material's own script has decorated the code blocks)
MEASURE_JS = """
<script>
window.addEventListener("load", function () { setTimeout(function () {
  var out = {codeBlocks: [], brokenNames: [], wrapped: [], pageWidth: document.documentElement.scrollWidth,
             window: window.innerWidth, height: document.documentElement.scrollHeight};
  document.querySelectorAll("pre, pre > code").forEach(function (el) {
    if (el.scrollWidth > el.clientWidth + 1) {
      out.codeBlocks.push({width: el.scrollWidth, box: el.clientWidth,
                           text: el.textContent.split("\\n").reduce(function (a, b) {
                             return b.length > a.length ? b : a; }, "").slice(0, 120)});
    }
  });
  // lines of code blocks that wrap (readable.css wraps rather than scroll on wide screens): reported, not failed
  document.querySelectorAll("pre > code").forEach(function (el) {
    var text = el.textContent.replace(/\\n$/, ""), written = text.split("\\n").filter(function (l) { return l.trim(); }).length;
    var range = document.createRange(), shown = 0, last = -1e9;
    range.selectNodeContents(el);
    Array.prototype.map.call(range.getClientRects(), function (r) { return r.width > 0 ? r.bottom : null; })
      .filter(function (b) { return b !== null; }).sort(function (a, b) { return a - b; })
      .forEach(function (b) { if (b - last > 4) { shown += 1; } last = b; });
    if (shown > written) out.wrapped.push(text.split("\\n").reduce(function (a, b) {
      return b.length > a.length ? b : a; }, "").slice(0, 120));
  });
  // inline code whose text runs over more than one line (a Range's rects: one or more per line)
  document.querySelectorAll(":not(pre) > code").forEach(function (el) {
    var range = document.createRange(), lines = 0, last = -1e9;
    range.selectNodeContents(el);
    Array.prototype.map.call(range.getClientRects(), function (r) { return r.width > 0 ? r.bottom : null; })
      .filter(function (b) { return b !== null; }).sort(function (a, b) { return a - b; })
      .forEach(function (b) { if (b - last > 4) { lines += 1; } last = b; });
    var text = el.textContent;
    if (lines > 1 && (!/\\s/.test(text) || el.closest("td, th"))) out.brokenNames.push(text);
  });
  document.title = "RLINF-CHECK:" + JSON.stringify(out);
}, 300); });
</script>
"""


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves ``site/``; an HTML page asked for with ``?measure`` gets ``MEASURE_JS`` before ``</body>``."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        path, _, query = self.path.partition("?")
        if query != "measure":
            return super().do_GET()
        local = self.translate_path(path)
        if os.path.isdir(local):
            local = os.path.join(local, "index.html")
        try:
            with open(local, encoding="utf-8") as f:
                page = f.read().replace("</body>", MEASURE_JS + "</body>", 1)
        except OSError:
            return self.send_error(404)
        body = page.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve(folder: str) -> tuple:
    """Serve ``folder`` on 127.0.0.1 from a daemon thread; return ``(server, base_url)``.

    Raises:
        OSError: no port could be bound.
    """
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=folder))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _chromium(args: list, timeout: float = 60) -> str:
    """Run headless Chromium with ``args``; return its stdout.

    Raises:
        subprocess.TimeoutExpired: it ran past ``timeout`` seconds.
        RuntimeError: it exited with an error.
    """
    exe = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        raise RuntimeError("no Chromium: install it (Debian: apt-get install -y chromium) or set CHROMIUM")
    with tempfile.TemporaryDirectory(prefix="rlinf-chromium-") as profile:
        proc = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               "--force-device-scale-factor=1", "--no-first-run", f"--user-data-dir={profile}",
                               "--virtual-time-budget=2000", *args],
                              capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"chromium {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def measure(url: str, width: int) -> dict:
    """What overflows on the page at ``url`` in a window ``width`` px wide (see the module's docstring).

    Raises:
        RuntimeError: Chromium failed, or the page's script did not report.
    """
    dom = _chromium([f"--window-size={width},900", "--dump-dom", url + "?measure"])
    found = re.search(r"<title>" + re.escape(TITLE) + r"(.*?)</title>", dom, re.S)
    if not found:
        raise RuntimeError(f"{url}: the measuring script did not report (title: "
                           f"{re.search(r'<title>(.*?)</title>', dom, re.S)})")
    return json.loads(html.unescape(found.group(1)))


def screenshot(url: str, width: int, height: int, path: str) -> str:
    """Save the page at ``url``, ``width`` px wide and ``height`` px tall (the whole page), to ``path``.

    Raises:
        RuntimeError: Chromium failed.
    """
    _chromium([f"--window-size={width},{min(max(height, 600), 16000)}", f"--screenshot={path}", url])
    return path


def pages(site: str) -> list:
    """The site's pages as paths relative to ``site`` ("" for the home page), home first."""
    out = []
    for folder, _, files in os.walk(site):
        if "index.html" in files:
            rel = os.path.relpath(folder, site)
            out.append("" if rel == "." else rel.replace(os.sep, "/") + "/")
    return sorted(out, key=lambda p: (p != "", p))


def shows_images(site: str, page: str) -> bool:
    """Whether ``page`` shows an image of the docs (a benchmark plot, say), the theme's own left aside."""
    with open(os.path.join(site, page, "index.html"), encoding="utf-8") as f:
        body = f.read()
    return bool(re.search(r'<img [^>]*src="[^"]*\.(png|svg|jpg)"', body))


def build(folder: str) -> str:
    """Build the site into ``folder`` with ``hatch run docs`` (strict); return ``folder``.

    Raises:
        subprocess.CalledProcessError: the build failed.
    """
    subprocess.run(["hatch", "run", "docs", "--site-dir", folder], cwd=ROOT, check=True)
    return folder


def check(base: str, site: str, page: str, width: int, out: str) -> tuple:
    """Measure ``page`` at ``width`` px, screenshot it if it is the home page or shows images.

    Returns ``(problems, notes, screenshot path or None)``: problems fail the check at the widest
    width, notes (code lines that wrap) never do.

    Raises:
        RuntimeError: Chromium failed, or the page did not report.
    """
    found = measure(base + page, width)
    problems = []
    if found["pageWidth"] > found["window"]:
        problems.append(f"the page is {found['pageWidth']} px wide in a {found['window']} px window")
    if width >= WIDE:  # a phone's code blocks scroll sideways, as Material's do (docs/stylesheets/readable.css)
        problems += [f"code block {c['width']} px in a {c['box']} px box: {c['text']!r}"
                     for c in found["codeBlocks"]]
    problems += [f"inline code broken over lines: {n!r}" for n in found["brokenNames"]]
    notes = [f"a code line wraps (its block's longest: {t!r})" for t in found["wrapped"]]
    shot = None
    if page == "" or shows_images(site, page):
        name = (page.strip("/").replace("/", "-") or "home") + f"-{width}.png"
        shot = screenshot(base + page, width, found["height"], os.path.join(out, name))
    return problems, notes, shot


def main(argv=None) -> int:
    """Build, serve, measure and screenshot (see the module's docstring); return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-build", action="store_true", help="use the site already in site/")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "rlinf-docs-check"),
                        help="folder of the screenshots")
    parser.add_argument("--widths", default="1280,390", help="window widths in px, widest first")
    parser.add_argument("--pages", default=None, help="comma-separated path prefixes of the pages to check")
    args = parser.parse_args(argv)
    widths = sorted((int(w) for w in args.widths.split(",")), reverse=True)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rlinf-site-") as tmp:
        site = SITE if args.no_build else build(os.path.join(tmp, "site"))
        todo = pages(site)
        if args.pages is not None:
            prefixes = args.pages.split(",")
            todo = [p for p in todo if any(p.startswith(x) if x else p == "" for x in prefixes)]
        server, base = serve(site)
        try:
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                jobs = {(p, w): pool.submit(check, base, site, p, w, args.out) for p in todo for w in widths}
                results = {key: job.result() for key, job in jobs.items()}
        finally:
            server.shutdown()
    failed = set()
    for (page, width), (problems, notes, shot) in results.items():
        if shot:
            print(f"screenshot {shot}")
        for n in notes:
            print(f"note /{page} at {width} px: {n}")
        for p in problems:
            print(f"{'FAIL' if width == widths[0] else 'note'} /{page} at {width} px: {p}")
            if width == widths[0]:
                failed.add(page)
    print(f"screenshots in {args.out}")
    print(f"{len(todo)} page(s) checked at {', '.join(map(str, widths))} px; "
          + (f"{len(failed)} overflow at {widths[0]} px: {sorted(failed)}" if failed
             else f"none overflows at {widths[0]} px"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
