#!/usr/bin/env python3
"""The call-out tests' application: examples/call/app.py with switches to misbehave.

    callee.py --port-file PATH [--seen PATH] [--answers example|faults]

Listens on a free loopback port (written to --port-file once listening) and answers like the
example, or (--answers faults) like the fault suite's jq program, output for output and byte
for byte (compact JSON), so the suite's audit replays it with jq. `POST /control` with {"delay_ms": N, "mode": M} changes how it answers from then on:
mode "ok" (the example's answers), "garbage" (a body that is not JSON), "wrong_count" (one
result too few), "status_500", "wrong_value" (every output's value replaced). --seen appends
the lineage of every record it is sent, one per line, so a test can count what the
application saw.
"""

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "call"))
import app  # noqa: E402

state = {"delay_ms": 0, "mode": "ok"}


def faults_answer(record):
    """tests/faults.rs's PROGRAM: `if .fan then ({seq, v: (.n + 1)}, {seq, v: (.n + 1), copy:
    true}) else {seq, v: (.n + 1)} end`; what jq fails on is rejected."""
    value = record["value"]
    if record["value_encoding"] != "json" or not isinstance(value, dict):
        return {"reject": "not a JSON object"}
    n = value.get("n")
    if not isinstance(n, int) or isinstance(n, bool):
        return {"reject": "n is not a number"}
    out = {"seq": value.get("seq"), "v": n + 1}
    outs = [out, {**out, "copy": True}] if value.get("fan") else [out]
    return {"outputs": [{"value": o} for o in outs]}


ANSWERS = {"example": app.answer, "faults": faults_answer}
seen_lock = threading.Lock()


class Handler(app.Handler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/control":
            state.update(json.loads(body))
            return self.reply(200, state)
        if self.server.seen:
            lineages = [r["lineage"] for r in json.loads(body)["records"]]
            with seen_lock, open(self.server.seen, "a") as f:
                f.write("".join(l + "\n" for l in lineages))
        time.sleep(state["delay_ms"] / 1000)
        mode = state["mode"]
        if mode == "garbage":
            return self.raw(200, b"this is not an answer")
        if mode == "status_500":
            return self.raw(500, b"internal error")
        records = json.loads(body)["records"]
        out = {"results": [self.server.answer(r) for r in records]}
        if mode == "wrong_count":
            out["results"] = out["results"][:-1]
        if mode == "wrong_value":
            for r in out["results"]:
                for o in r.get("outputs", []):
                    o.pop("value_base64", None)
                    o["value"] = "changed"
        self.reply(200, out)

    def reply(self, status, payload):
        # Compact, as jq writes: exactly writes an output's value as the text it gets.
        self.raw(status, json.dumps(payload, separators=(",", ":")).encode(), "application/json")

    def raw(self, status, data, content_type="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Server(app.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # exactly killed mid-call, or a call it gave up on: not the application's error.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--seen")
    ap.add_argument("--delay-ms", type=int, default=0)
    ap.add_argument("--mode", default="ok")
    ap.add_argument("--answers", choices=sorted(ANSWERS), default="example")
    a = ap.parse_args()
    state.update(delay_ms=a.delay_ms, mode=a.mode)
    server = Server(("127.0.0.1", a.port), Handler)
    server.seen = a.seen
    server.answer = ANSWERS[a.answers]
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_port))
    os.rename(tmp, a.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
