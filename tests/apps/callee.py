#!/usr/bin/env python3
"""The call-out tests' application: examples/call/app.py with switches to misbehave.

    callee.py --port-file PATH [--seen PATH]

Listens on a free loopback port (written to --port-file once listening) and answers like the
example. `POST /control` with {"delay_ms": N, "mode": M} changes how it answers from then on:
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
        out = app.answers(body)
        if mode == "wrong_count":
            out["results"] = out["results"][:-1]
        if mode == "wrong_value":
            for r in out["results"]:
                for o in r.get("outputs", []):
                    o.pop("value_base64", None)
                    o["value"] = "changed"
        self.reply(200, out)

    def raw(self, status, data):
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--seen")
    ap.add_argument("--delay-ms", type=int, default=0)
    ap.add_argument("--mode", default="ok")
    a = ap.parse_args()
    state.update(delay_ms=a.delay_ms, mode=a.mode)
    server = app.ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.seen = a.seen
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_port))
    os.rename(tmp, a.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
