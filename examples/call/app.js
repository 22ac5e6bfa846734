#!/usr/bin/env node
// The call-out's example application in Node.js (no packages): the same answers as app.py.
//
//   node examples/call/app.js [port]      then: exactly run ... --call-url http://127.0.0.1:8080/process
//
// - a JSON object with an "id": written on with "by": "app" added, and "doubled" (2 × n) when
//   it has a number "n";
// - a JSON object without an "id": rejected (exactly writes it to the dead-letter topic, reason
//   app_rejected, with this message);
// - anything else (not JSON, another JSON value, a tombstone): written on unchanged.
//
// A record can arrive more than once (after an abort, a restart or a rebalance): key any effect
// outside Kafka by its "lineage".
"use strict";
const http = require("http");

function answer(record) {
  const { value, value_encoding: encoding } = record;
  if (encoding === "base64") return { outputs: [{ value_base64: value }] };
  if (value !== null && typeof value === "object" && !Array.isArray(value)) {
    if (!("id" in value)) return { reject: `no id in ${record.lineage}` };
    const out = { ...value, by: "app" };
    if (typeof value.n === "number") out.doubled = value.n * 2;
    return { outputs: [{ value: out }] };
  }
  return { outputs: [{ value }] };
}

function answers(body) {
  return { results: JSON.parse(body).records.map(answer) };
}

if (require.main === module) {
  const port = Number(process.argv[2] || 8080);
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      let status = 200;
      let out;
      try {
        out = JSON.stringify(answers(Buffer.concat(chunks)));
      } catch (e) {
        // Not a request exactly sends: a 400 makes exactly treat the application as unavailable.
        status = 400;
        out = JSON.stringify({ error: String(e) });
      }
      res.writeHead(status, { "Content-Type": "application/json" });
      res.end(out);
    });
  });
  server.listen(port, "127.0.0.1", () => {
    console.log(`listening on http://127.0.0.1:${server.address().port}/process`);
  });
}

module.exports = { answer, answers };
