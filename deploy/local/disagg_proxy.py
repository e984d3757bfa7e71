#!/usr/bin/env python3
"""The prefill -> decode proxy of disaggregated serving with kvdepot
(docs/cluster.md, "Prefill -> decode hand-off"), for OpenAI-compatible
engines such as vLLM's server with the kvdepot connector.

For each POST to /v1/completions or /v1/chat/completions:
1. the request goes to a prefill engine with max_tokens = 1, no streaming
   and kv_transfer_params = {"do_remote_decode": true}; its connector saves
   the prompt's KV and answers with the hand-off in kv_transfer_params
   (kvdepot_node, kvdepot_ns, kvdepot_hashes, ...);
2. the original request goes to a decode engine with those
   kv_transfer_params; its connector loads the KV from the prefill node's
   kvdepotd through the cluster and generates. The decode engine's answer
   (streamed or not) is passed back unchanged.
A prefill engine that answers without kv_transfer_params (its connector is
not kvdepot, or the request was too short to save a block) leaves the
decode engine to compute the prompt: the answer is the same, only slower.
Engines are taken round-robin. GET /healthz answers "ok"; other GETs
(/v1/models, /health) go to the first decode engine.

Usage: disagg_proxy.py --listen HOST:PORT --prefill URL[,URL...]
                       --decode URL[,URL...] [--timeout SECONDS]
Standard library only; deploy/local/cluster.sh starts it.
"""
import argparse
import copy
import http.server
import itertools
import json
import sys
import threading
import urllib.error
import urllib.request

GENERATE_PATHS = ("/v1/completions", "/v1/chat/completions")
MAX_BODY = 64 << 20  # bytes of one request body; larger is refused (413)


class Upstreams:
    """Round-robin over the engines of one role."""

    def __init__(self, urls):
        self.urls = [u.rstrip("/") for u in urls.split(",") if u.strip()]
        if not self.urls:
            raise ValueError("no engine URL")
        self._next = itertools.cycle(self.urls)
        self._lock = threading.Lock()

    def pick(self):
        with self._lock:
            return next(self._next)


def prefill_request(body):
    """The request the prefill engine gets: one token, not streamed, with
    the hand-off asked for."""
    req = copy.deepcopy(body)
    req["max_tokens"] = 1
    if "max_completion_tokens" in req:
        req["max_completion_tokens"] = 1
    req["stream"] = False
    req.pop("stream_options", None)
    req["kv_transfer_params"] = {"do_remote_decode": True}
    return req


def decode_request(body, handoff):
    """The request the decode engine gets: the client's own, plus the
    prefill engine's hand-off when it gave one."""
    req = copy.deepcopy(body)
    req.pop("kv_transfer_params", None)
    if isinstance(handoff, dict) and handoff:
        req["kv_transfer_params"] = handoff
    return req


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kvdepot-disagg-proxy"

    def log_message(self, fmt, *args):  # one line per request on stderr
        sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))

    def _reply(self, code, payload, ctype="application/json"):
        data = payload if isinstance(payload, bytes) else \
            json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code, message):
        self._reply(code, {"error": {"message": message, "code": code}})

    def do_GET(self):
        if self.path == "/healthz":
            self._reply(200, b"ok\n", "text/plain")
            return
        url = self.server.decode.urls[0] + self.path
        try:
            with urllib.request.urlopen(url, timeout=self.server.engine_timeout) as r:
                self._reply(r.status, r.read(),
                            r.headers.get("Content-Type", "application/json"))
        except urllib.error.HTTPError as e:
            self._reply(e.code, e.read(), e.headers.get("Content-Type",
                                                        "application/json"))
        except OSError as e:
            self._error(502, f"decode engine {url}: {e}")

    def _read_body(self):
        try:
            n = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._error(411, "Content-Length required")
            return None
        if n < 0 or n > MAX_BODY:
            self._error(413, f"request body over {MAX_BODY} bytes")
            return None
        try:
            body = json.loads(self.rfile.read(n))
        except ValueError as e:
            self._error(400, f"request body is not JSON: {e}")
            return None
        if not isinstance(body, dict):
            self._error(400, "request body is not a JSON object")
            return None
        return body

    def _post(self, url, req):
        return urllib.request.urlopen(urllib.request.Request(
            url, data=json.dumps(req).encode(), method="POST",
            headers={"Content-Type": "application/json",
                     **({"Authorization": self.headers["Authorization"]}
                        if self.headers.get("Authorization") else {})}),
            timeout=self.server.engine_timeout)

    def do_POST(self):
        if self.path not in GENERATE_PATHS:
            self._error(404, f"{self.path}: only {', '.join(GENERATE_PATHS)}")
            return
        body = self._read_body()
        if body is None:
            return
        prefill = self.server.prefill.pick() + self.path
        try:
            with self._post(prefill, prefill_request(body)) as r:
                handoff = json.loads(r.read()).get("kv_transfer_params")
        except urllib.error.HTTPError as e:
            # The client's request is at fault (the prefill engine refused
            # it as the decode engine would): pass the answer on.
            self._reply(e.code, e.read(), e.headers.get("Content-Type",
                                                        "application/json"))
            return
        except (OSError, ValueError) as e:
            self._error(502, f"prefill engine {prefill}: {e}")
            return
        decode = self.server.decode.pick() + self.path
        try:
            r = self._post(decode, decode_request(body, handoff))
        except urllib.error.HTTPError as e:
            self._reply(e.code, e.read(), e.headers.get("Content-Type",
                                                        "application/json"))
            return
        except OSError as e:
            self._error(502, f"decode engine {decode}: {e}")
            return
        with r:
            self._relay(r)

    def _relay(self, r):
        """The decode engine's answer as it comes (server-sent events
        included), chunked."""
        self.send_response(r.status)
        self.send_header("Content-Type",
                         r.headers.get("Content-Type", "application/json"))
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(65536)
            if not chunk:
                break
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True, help="HOST:PORT")
    ap.add_argument("--prefill", required=True, help="URL[,URL...]")
    ap.add_argument("--decode", required=True, help="URL[,URL...]")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds an engine may take to answer")
    a = ap.parse_args(argv)
    host, _, port = a.listen.rpartition(":")
    srv = http.server.ThreadingHTTPServer((host.strip("[]"), int(port)),
                                          Handler)
    srv.daemon_threads = True
    srv.prefill, srv.decode = Upstreams(a.prefill), Upstreams(a.decode)
    srv.engine_timeout = a.timeout
    sys.stderr.write(f"disagg proxy on {a.listen}: prefill "
                     f"{srv.prefill.urls}, decode {srv.decode.urls}\n")
    srv.serve_forever()


if __name__ == "__main__":
    main()
