"""A local stand-in for the Hugging Face Hub, enough for `huggingface_hub` metadata and our downloads.

Two threaded servers on 127.0.0.1 with random ports, like the real Hub and its CDN (different origins,
so huggingface_hub stops at the redirect and reads the metadata from it):

    hub  HEAD/GET /{org}/{repo}/resolve/{revision}/{file}
         -> 302 to the CDN, with X-Repo-Commit, ETag, X-Linked-Etag (sha256), X-Linked-Size
         -> 401/403/404 with X-Error-Code (RepoNotFound, GatedRepo, RevisionNotFound, EntryNotFound)
    cdn  HEAD/GET /blobs/{sha256}  -> 200, or 206 with Content-Range for `Range: bytes=a-[b]`

It counts the bytes it serves and records every request, so tests can check what a resume asked for.
"""
from __future__ import annotations

import hashlib
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class HubFileSpec:
    """One file the fake Hub serves."""

    repo: str
    filename: str
    data: bytes
    revision: str = "0123456789abcdef0123456789abcdef01234567"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class Behaviour:
    """Knobs a test turns: failures, slowness, corruption."""

    token: str | None = None          # when set, resolve needs `Authorization: Bearer <token>`
    gated: bool = False               # 403 GatedRepo even with the token
    corrupt: bool = False             # the CDN flips one byte of what it serves
    delay_after: int | None = None    # sleep `delay` per chunk once this many bytes of a file were sent
    delay: float = 0.05
    drop_after: int | None = None     # close the connection after this many bytes of one response
    ignore_range: bool = False        # answer 200 with the whole file even to a Range request
    chunk: int = 64 * 1024


@dataclass
class Log:
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # (server, method+path, Range)
    bytes_served: int = 0
    per_get: list[int] = field(default_factory=list)  # body bytes sent by each CDN GET, in order
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ranges(self) -> list[str | None]:
        """The Range header of every CDN GET, in order."""
        return [r for s, m, r in self.requests if s == "cdn" and m.startswith("GET")]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a client hanging up mid-body is expected here
        pass


class FakeHub:
    """Start with `with FakeHub([HubFileSpec(...)]) as hub:`; point HF_ENDPOINT at `hub.url`."""

    def __init__(self, files: list[HubFileSpec], behaviour: Behaviour | None = None):
        self.files = {(f.repo, f.filename): f for f in files}
        self.blobs = {f.sha256: f for f in files}
        self.behaviour = behaviour or Behaviour()
        self.log = Log()
        self._hub = _Server(("127.0.0.1", 0), self._handler("hub"))
        self._cdn = _Server(("127.0.0.1", 0), self._handler("cdn"))
        self._threads = [threading.Thread(target=s.serve_forever, args=(0.02,), daemon=True) for s in (self._hub, self._cdn)]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._hub.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def __enter__(self) -> "FakeHub":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        for srv in (self._hub, self._cdn):
            srv.shutdown()
            srv.server_close()

    def _handler(self, role: str):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_HEAD(self):
                self._route(head=True)

            def do_GET(self):
                self._route(head=False)

            def _route(self, head: bool):
                with hub.log.lock:
                    hub.log.requests.append((role, f"{self.command} {self.path}", self.headers.get("Range")))
                if role == "hub":
                    hub._resolve(self)
                else:
                    hub._blob(self, head)

        return Handler

    @staticmethod
    def _reply(h, status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if body and h.command != "HEAD":
            h.wfile.write(body)

    def _resolve(self, h) -> None:
        m = re.match(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$", h.path)
        if not m:
            return self._reply(h, 404, {"X-Error-Code": "RepoNotFound"}, b"not found")
        repo, rev, filename = m["repo"], m["rev"], m["file"]
        known = [f for (r, _), f in self.files.items() if r == repo]
        b = self.behaviour
        if b.token is not None and h.headers.get("Authorization") != f"Bearer {b.token}":
            return self._reply(h, 401, {"X-Error-Code": "GatedRepo" if b.gated else "RepoNotFound",
                                        "X-Error-Message": "Access restricted"}, b"unauthorized")
        if b.gated:
            return self._reply(h, 403, {"X-Error-Code": "GatedRepo", "X-Error-Message": "gated"}, b"gated")
        if not known:
            return self._reply(h, 404, {"X-Error-Code": "RepoNotFound"}, b"no such repo")
        f = self.files.get((repo, filename))
        if rev not in ("main", known[0].revision):
            return self._reply(h, 404, {"X-Error-Code": "RevisionNotFound"}, b"no such revision")
        if f is None:
            return self._reply(h, 404, {"X-Error-Code": "EntryNotFound"}, b"no such file")
        self._reply(h, 302, {
            "Location": f"{self.cdn_url}/blobs/{f.sha256}",
            "X-Repo-Commit": f.revision,
            "ETag": '"' + hashlib.sha1(f.data).hexdigest() + '"',
            "X-Linked-Etag": f'"{f.sha256}"',
            "X-Linked-Size": str(len(f.data)),
        })

    def _blob(self, h, head: bool) -> None:
        m = re.match(r"^/blobs/([0-9a-f]{64})$", h.path)
        f = self.blobs.get(m[1]) if m else None
        if f is None:
            return self._reply(h, 404, {}, b"no such blob")
        data = f.data
        if self.behaviour.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start, end, status = 0, len(data), 200
        rng = h.headers.get("Range")
        if rng and not self.behaviour.ignore_range:
            rm = _RANGE.match(rng)
            if not rm or int(rm[1]) >= len(data):
                return self._reply(h, 416, {"Content-Range": f"bytes */{len(data)}"})
            start = int(rm[1])
            end = min(int(rm[2]) + 1, len(data)) if rm[2] else len(data)
            status = 206
        h.send_response(status)
        h.send_header("Content-Length", str(end - start))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("ETag", f'"{f.sha256}"')
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        h.end_headers()
        if head:
            return
        self._send(h, data, start, end)

    def _send(self, h, data: bytes, start: int, end: int) -> None:
        b = self.behaviour
        with self.log.lock:
            slot = len(self.log.per_get)
            self.log.per_get.append(0)
        sent = 0
        pos = start
        try:
            while pos < end:
                piece = data[pos:min(pos + b.chunk, end)]
                if b.drop_after is not None and sent + len(piece) > b.drop_after:
                    piece = piece[: b.drop_after - sent]
                    h.wfile.write(piece)
                    self._count(slot, len(piece))
                    h.close_connection = True
                    return
                if b.delay_after is not None and pos >= b.delay_after:
                    time.sleep(b.delay)
                h.wfile.write(piece)
                h.wfile.flush()
                self._count(slot, len(piece))
                sent += len(piece)
                pos += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True

    def _count(self, slot: int, n: int) -> None:
        with self.log.lock:
            self.log.bytes_served += n
            self.log.per_get[slot] += n
