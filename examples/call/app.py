#!/usr/bin/env python3
"""An application that exactly calls: `exactly run ... --call-url http://127.0.0.1:8080/process`.

exactly POSTs batches of records and writes what this answers, outputs and input offsets in one
Kafka transaction. What it does with each record:

- a JSON object with an "id": written on with "by": "app" added, and "doubled" (2 × n) when
  it has a number "n";
- a JSON object without an "id": rejected; exactly writes it to the dead-letter topic with
  reason `app_rejected` and this message;
- anything else (not JSON, another JSON value, a tombstone): written on unchanged.

Effects in Kafka are exactly once. A record can reach this application more than once (after
an abort, a restart or a rebalance), so any effect it has elsewhere must be idempotent: key it
by the record's "lineage" (topic/partition/offset).

Standard library only: python3 examples/call/app.py [--port 8080]
"""

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def answer(record):
    """The answer for one record: {"outputs": [...]} or {"reject": "why"}."""
    value, encoding = record["value"], record["value_encoding"]
    if encoding == "base64":
        return {"outputs": [{"value_base64": value}]}
    if isinstance(value, dict):
        if "id" not in value:
            return {"reject": f"no id in {record['lineage']}"}
        out = {**value, "by": "app"}
        n = value.get("n")
        if isinstance(n, (int, float)) and not isinstance(n, bool):
            out["doubled"] = n * 2
        return {"outputs": [{"value": out}]}
    # value is None for a tombstone, which stays a tombstone.
    return {"outputs": [{"value": value}]}


def answers(body):
    """The response body for a request body: one answer per record, in order."""
    records = json.loads(body)["records"]
    return {"results": [answer(r) for r in records]}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: exactly reuses its connections

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.reply(200, answers(body))

    def reply(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # one line per batch would drown the logs
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    a = ap.parse_args()
    server = ThreadingHTTPServer((a.host, a.port), Handler)
    print(f"listening on http://{a.host}:{server.server_port}/process", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
