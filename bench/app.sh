# Sourced by bench/lib.sh and bench/run.sh (with $loadgen and $EXACTLY_KAFKA_DIR set): start_app.
# The call-out's application (`loadgen serve`, a passthrough answering after DELAY_MS): one at a
# time, replacing the one before; its pid in $app, its port in $app_port.
start_app() {
  if [ -n "$app" ]; then kill "$app" 2>/dev/null || true; wait "$app" 2>/dev/null || true; fi
  rm -f "$EXACTLY_KAFKA_DIR/serve.json"
  "${loadgen[@]}" serve --delay-ms "$1" >"$EXACTLY_KAFKA_DIR/serve.json" &
  app=$!
  until [ -s "$EXACTLY_KAFKA_DIR/serve.json" ]; do
    kill -0 "$app" 2>/dev/null || { echo "bench: loadgen serve did not start" >&2; exit 1; }
    sleep 0.1
  done
  app_port=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["port"])' "$EXACTLY_KAFKA_DIR/serve.json")
}
