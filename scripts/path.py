#!/usr/bin/env python3
"""The path of one input record through the code: the files its turn runs, in order.

Runs a debug build of exactly (target/debug/exactly, built if missing) under gdb against the
broker of scripts/kafka.sh (started if it is not), one record in a topic of its own. From the
first poll on, every function of the exactly crate is a breakpoint; the path is the main
loop's turn that takes the record: from the poll that returns it to the next poll (the unit
stays open: --commit-interval is 30 s). It prints each stay (a run of steps in one file, a
return into a file counting as a step there), then the counts:

- stays: how many runs of one file the reader follows;
- rooms: the top-level modules (src/X.rs or src/X/) visited;
- climbs: calls into a module of a higher layer than the caller's (lib.rs's layers, as
  scripts/modgraph.py reads them): a callback or a trait object reaching back up;
- the files stayed in more than once;
- the rooms in the order the path goes through them, and how often it returns to one it
  left before.

It counts three ways. As it runs: every call, down to one-line accessors (the global
allocator's shims apart). As read: only the calls into functions that call further into the
crate; a leaf (an accessor, a counter, the clock) is read by its name where it is called, as a
reader does. As read once: the same, each call read once (a loop's second pass over a call, or
a second call from the same caller, is not a new place). The stays printed, and the limits, are
the path as read once.

  scripts/path.py [--jq PROGRAM] [--max-stays N --max-climbs N]

With the limits, it exits 1 when the path is longer. It takes a few minutes (gdb stops at
every call); it is a measurement for docs/extending.md, not a CI check.
"""
import argparse, collections, json, os, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import modgraph  # noqa: E402

# The gdb side: loaded into gdb with the output file and the thread filter in the environment.
TRACER = r'''
import gdb, json, os, re
gdb.execute("set pagination off")
gdb.execute("set confirm off")
out = os.environ["PATH_TRACE"]
POLL = re.compile(r"^exactly::kafka::consumer::.*::poll(<.*>)?$")
state = {"main": None, "steps": [], "taken": False, "done": False}

def frames():
    # (function, file) of the nearest exactly frames, innermost first.
    f, got = gdb.newest_frame(), []
    while f is not None and len(got) < 3:
        name = f.name() or ""
        sal = f.find_sal()
        path = sal.symtab.filename if sal and sal.symtab else ""
        if name.startswith("exactly::") and "src/" in path:
            got.append((name, path[path.index("src/"):]))
        f = f.older()
    return got

class Hit(gdb.Breakpoint):
    def stop(self):
        if state["done"]:
            return False
        t = gdb.selected_thread()
        fs = frames()
        if not fs:
            return False
        name = fs[0][0]
        if state["main"] is None:
            if not POLL.match(name):
                return False
            state["main"] = t.num
        if t.num != state["main"]:
            return False
        if POLL.match(name):
            if state["taken"]:
                state["done"] = True
                with open(out, "w") as o:
                    json.dump(state["steps"], o)
                return True
            state["steps"] = []
        if name.startswith("exactly::sink::ledger::Ledger::read"):
            state["taken"] = True
        state["steps"].append(fs)
        return False

listing = gdb.execute("info functions ^exactly::", to_string=True)
where, seen = None, set()
for line in listing.splitlines():
    if line.startswith("File "):
        where = line[5:].rstrip(":")
        continue
    m = re.match(r"^(\d+):\s", line)
    if m and where and "src/" in where:
        spec = f"{where}:{m.group(1)}"
        if spec not in seen:
            seen.add(spec)
            try:
                Hit(spec, internal=True)
            except gdb.error:
                pass
gdb.execute("run")
gdb.execute("kill")
'''


def sh(*args, **kw):
    return subprocess.run(args, cwd=ROOT, check=True, **kw)


def setup(binary):
    """A topic of its own with one record; the bootstrap."""
    sh("scripts/kafka.sh", "start", stdout=subprocess.DEVNULL)
    bootstrap = subprocess.check_output(["scripts/kafka.sh", "bootstrap"], cwd=ROOT, text=True).strip()
    run = f"path-{int(time.time())}"
    tool = ["scripts/kafka.sh", "tool"]
    for topic in (run, run + ".out", run + ".out.dlq"):
        sh(*tool, "org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap,
           "--create", "--topic", topic, "--partitions", "1", stdout=subprocess.DEVNULL,
           stderr=subprocess.DEVNULL)
    sh(*tool, "org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", bootstrap,
       "--topic", run, "--property", "parse.key=true", "--property", "key.separator=|",
       input='k|{"id": 1, "amount": 12.5}\n', text=True, stderr=subprocess.DEVNULL)
    return bootstrap, run


def trace(binary, bootstrap, run, transform):
    with tempfile.TemporaryDirectory() as tmp:
        script, out = os.path.join(tmp, "tracer.py"), os.path.join(tmp, "steps.json")
        with open(script, "w") as f:
            f.write(TRACER)
        env = dict(os.environ, PATH_TRACE=out)
        cmd = ["gdb", "-batch", "-nx", "-x", script, "--args", binary, "run",
               "--bootstrap-servers", bootstrap, "--input-topics", run,
               "--output-topic", run + ".out", "--group-id", run, "--commit-interval", "30s",
               "--http-addr", "127.0.0.1:0", "--log-format", "text", *transform]
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=1800)
        with open(out) as f:
            return json.load(f)


def room(path):
    """src/X.rs or src/X/…: X."""
    parts = path.split("/")
    return parts[1][:-3] if len(parts) == 2 and parts[1].endswith(".rs") else parts[1]


# The global allocator's shims (src/main.rs): not a place a reader goes.
ALLOCATOR = ("exactly::_::__rust_alloc", "exactly::_::__rust_dealloc",
             "exactly::_::__rust_realloc", "exactly::_::__rust_alloc_zeroed")


def measure(steps, layer):
    """The stays (file, first function) and the climbs (caller file, callee file)."""
    files, climbs = [], []
    steps = [fs for fs in steps if not fs[0][0].startswith(ALLOCATOR)]
    for fs in steps:
        callee, caller = fs[0], fs[1] if len(fs) > 1 else None
        if caller is not None:
            files.append((caller[1], caller[0]))
            lc, le = layer.get(room(caller[1])), layer.get(room(callee[1]))
            if lc is not None and le is not None and le > lc:
                climbs.append((caller[1], callee[1], callee[0]))
        files.append((callee[1], callee[0]))
    stays = []
    for f, fn in files:
        if not stays or stays[-1][0] != f:
            stays.append((f, fn))
    return stays, climbs


def as_read(steps):
    """The steps a reader follows: into a function only when it calls further into the crate.
    A leaf (an accessor, a counter, the clock) is read by its name where it is called."""
    interior = {fs[1][0] for fs in steps if len(fs) > 1}
    return [fs for fs in steps if fs[0][0] in interior]


def read_once(steps):
    """The path as read, each call read once: a loop's second pass over the same call, or a
    function's second call from the same caller, is not a new place the reader goes."""
    seen, kept = set(), []
    for fs in as_read(steps):
        edge = (fs[1][0] if len(fs) > 1 else None, fs[0][0])
        if edge not in seen:
            seen.add(edge)
            kept.append(fs)
    return kept


def summary(label, stays, climbs):
    count = collections.Counter(f for f, _ in stays)
    again = ", ".join(f"{f} {n}" for f, n in count.most_common() if n > 1)
    rooms = sorted({room(f) for f, _ in stays})
    walk = []
    for f, _ in stays:
        if not walk or walk[-1] != room(f):
            walk.append(room(f))
    back = len(walk) - len(set(walk))
    print(f"{label}: {len(stays)} stays in {len(rooms)} rooms ({', '.join(rooms)}), "
          f"{len(climbs)} climbs; again: {again or 'none'}")
    print(f"  rooms in order: {' > '.join(walk)}")
    print(f"  room changes: {len(walk)}, returns to a room left before: {back}")
    for caller, callee, fn in climbs:
        print(f"  climb: {caller} -> {callee} ({fn})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jq", help="a jq program instead of passthrough")
    ap.add_argument("--max-stays", type=int)
    ap.add_argument("--max-climbs", type=int)
    args = ap.parse_args()
    binary = os.path.join(ROOT, "target/debug/exactly")
    sh("cargo", "build", "--quiet", "--bin", "exactly")
    bootstrap, run = setup(binary)
    transform = ["--jq", args.jq] if args.jq else []
    steps = trace(binary, bootstrap, run, transform)
    if not steps:
        print("path: no turn with a record was traced", file=sys.stderr)
        return 2
    layer = (modgraph.layers(os.path.join(ROOT, "src")) or ({}, []))[0]
    stays, climbs = measure(steps, layer)
    read_stays, read_climbs = measure(as_read(steps), layer)
    once_stays, once_climbs = measure(read_once(steps), layer)
    for f, fn in once_stays:
        print(f"  {f:40} {fn}")
    summary("path as it runs", stays, climbs)
    summary("path as read (leaves skipped)", read_stays, read_climbs)
    summary("path as read, each call once", once_stays, once_climbs)
    stays, climbs = once_stays, once_climbs
    too_long = (args.max_stays is not None and len(stays) > args.max_stays) or (
        args.max_climbs is not None and len(climbs) > args.max_climbs)
    return 1 if too_long else 0


if __name__ == "__main__":
    sys.exit(main())
