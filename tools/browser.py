"""Look at the built site in a real browser: headless Chromium driven over the DevTools protocol.

    python tools/browser.py notebooks/01_normalization.html [_build/screenshots/01.png]

serves ``_build/html`` on 127.0.0.1, opens the page in Debian's ``/usr/bin/chromium`` and prints
what ``inspect_page`` found (typeset math, images, widgets, the Colab link, console errors,
requests that left the machine); ``tests/test_book.py`` asserts on the same report.

The protocol runs over ``--remote-debugging-pipe`` (NUL-separated JSON on file descriptors 3
and 4), so no port, no websocket library and no ``--remote-allow-origins`` are involved.
"""

from __future__ import annotations

import base64
import fcntl
import functools
import http.server
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional
from contextlib import contextmanager

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--no-default-browser-check", "--mute-audio", "--hide-scrollbars",
]
VIEWPORT = (1280, 900)


class CDPError(RuntimeError):
    pass


class Chromium:
    """A headless Chromium process and one page, driven over the DevTools pipe."""

    def __init__(self, executable: str = CHROMIUM, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # Move the child's ends above 3/4 first so dup2 onto 3 and 4 cannot clobber them.
        child_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 100)
        child_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 100)
        os.close(to_child_r)
        os.close(from_child_w)

        def wire_pipe() -> None:
            os.dup2(child_r, 3)
            os.dup2(child_w, 4)

        args = [executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
                f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}", "--remote-debugging-pipe", "about:blank"]
        self.proc = subprocess.Popen(args, pass_fds=(3, 4), preexec_fn=wire_pipe,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(child_r)
        os.close(child_w)
        self._next_id = 0
        self._replies: Dict[int, "queue.Queue[dict]"] = {}
        self._lock = threading.Lock()
        self.events: List[dict] = []
        self._stderr: List[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self._stderr.extend(self.proc.stderr), daemon=True).start()
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def _read(self) -> None:
        buffer = b""
        while True:
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                return
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                if "id" in message:
                    with self._lock:
                        box = self._replies.get(message["id"])
                    if box is not None:
                        box.put(message)
                else:
                    with self._lock:
                        self.events.append(message)

    def send(self, method: str, session: Optional[str] = None, **params: Any) -> dict:
        with self._lock:
            self._next_id += 1
            ident = self._next_id
            box: "queue.Queue[dict]" = queue.Queue()
            self._replies[ident] = box
        message = {"id": ident, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        try:
            reply = box.get(timeout=self.timeout)
        except queue.Empty:
            raise CDPError(f"{method}: no reply in {self.timeout} s; chromium stderr: {self.stderr_tail()}") from None
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def page(self, method: str, **params: Any) -> dict:
        return self.send(method, session=self.session, **params)

    def evaluate(self, expression: str) -> Any:
        result = self.page("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise CDPError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_event(self, method: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for event in self.events:
                    if event.get("method") == method and event.get("sessionId") == self.session:
                        return event
            time.sleep(0.05)
        raise CDPError(f"no {method} within {timeout} s")

    def navigate(self, url: str) -> None:
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.page(f"{domain}.enable")
        with self._lock:
            self.events.clear()
        self.page("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired", self.timeout)

    def screenshot(self, path: Path, full_page: bool = False) -> None:
        if full_page:
            size = self.page("Page.getLayoutMetrics")["cssContentSize"]
            height = min(int(size["height"]) + 1, 16000)
            self.page("Emulation.setDeviceMetricsOverride", width=VIEWPORT[0], height=height,
                      deviceScaleFactor=1, mobile=False)
        data = self.page("Page.captureScreenshot", format="png")["data"]
        if full_page:
            self.page("Emulation.clearDeviceMetricsOverride")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def stderr_tail(self) -> str:
        return b"".join(self._stderr[-20:]).decode(errors="replace")[-2000:]

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def console_errors(self) -> List[str]:
        """Console errors, uncaught exceptions and failed loads the page reported."""
        errors = []
        with self._lock:
            events = list(self.events)
        for event in events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append("console.error: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                errors.append("exception: " + str(details.get("exception", {}).get("description") or details.get("text")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                errors.append(f"log: {entry.get('text')} {entry.get('url', '')}".strip())
        return errors

    def requested_urls(self) -> List[str]:
        with self._lock:
            return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


@contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` over http on 127.0.0.1 (a free port) in a thread; yield the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


# Runs in the page: waits for MathJax and the widget manager, makes every image load, and
# returns what a reader would see.
INSPECT_JS = r"""
(async () => {
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const deadline = Date.now() + %(timeout_ms)d;
  let mathjax = "absent";
  while (Date.now() < deadline && !(window.MathJax && MathJax.startup && MathJax.startup.promise)) await sleep(100);
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; mathjax = MathJax.version; }
  const views = document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length;
  while (Date.now() < deadline && views > 0 && document.querySelectorAll('.jupyter-widgets, .widget-box, .widget-inline-hbox').length === 0) await sleep(100);
  document.querySelectorAll('img').forEach((img) => { img.loading = 'eager'; });
  while (Date.now() < deadline && [...document.images].some((img) => !img.complete)) await sleep(100);
  const colab = [...document.querySelectorAll('a')].map((a) => a.href).filter((h) => h.includes('colab.research.google.com'));
  const languageLinks = [...document.querySelectorAll('.minimind-language-switch a')].map((a) => a.href);
  const languageStatus = await Promise.all(languageLinks.map((h) => fetch(h).then((r) => r.status, () => 0)));
  return {
    lang: document.documentElement.lang,
    language_links: languageLinks,
    language_link_status: languageStatus,
    title: document.title,
    mathjax_version: mathjax,
    mjx_containers: document.querySelectorAll('mjx-container').length,
    raw_tex_left: [...document.querySelectorAll('.math')].filter((el) => !el.querySelector('mjx-container')).length,
    images: document.images.length,
    broken_images: [...document.images].filter((img) => !(img.complete && img.naturalWidth > 0)).map((img) => img.src),
    widget_views: views,
    rendered_widgets: document.querySelectorAll('.jupyter-widgets').length,
    widget_controls: document.querySelectorAll('.widget-slider, .widget-dropdown, .widget-inline-hbox, .widget-box').length,
    colab_links: colab,
    folded_inputs: document.querySelectorAll('.cell.tag_hide-input details, .cell.tag_hide-input .toggle-details').length,
  };
})()
"""


def inspect_page(html_dir: Path, page: str, screenshot: Optional[Path] = None, timeout: float = 60.0) -> Dict[str, Any]:
    """Open ``page`` (relative to ``html_dir``) in Chromium and report what rendered."""
    with serve(html_dir) as base:
        # the page script gives up waiting at `timeout` and reports what it saw; the protocol waits longer, so
        # a widget or an image that never renders shows in the report instead of as "no reply"
        browser = Chromium(timeout=timeout + 30)
        try:
            browser.navigate(base + page)
            report = browser.evaluate(INSPECT_JS % {"timeout_ms": int(timeout * 1000)})
            time.sleep(0.5)  # late console messages (a widget failing after render) arrive here
            report["console_errors"] = browser.console_errors()
            report["external_requests"] = [u for u in browser.requested_urls()
                                           if not u.startswith((base, "data:", "blob:", "about:"))]
            if screenshot is not None:
                browser.screenshot(screenshot)
                full = screenshot.with_name(screenshot.stem + "_full" + screenshot.suffix)
                browser.screenshot(full, full_page=True)
                report["screenshots"] = [str(screenshot), str(full)]
        finally:
            browser.close()
    return report


def main(argv: List[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    shot = Path(argv[1]) if len(argv) > 1 else None
    report = inspect_page(ROOT / "_build" / "html", argv[0], shot)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
