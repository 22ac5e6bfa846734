#!/usr/bin/env python3
"""Checks that the top-level modules of src/ import each other without cycles, in the layers lib.rs declares.

Imports run one way, in the layers lib.rs's map names: the `→` chain after "Imports run one
way", each layer the backticked modules between two arrows. A module imports only its own
layer's and those below; every module of src/ is in one layer. A cycle, an import upwards or
a module in no layer fails CI, naming the files and lines. A node is src/X.rs or src/X/ (lib.rs and main.rs are roots, not nodes);
X -> Y when any file of X names a path `crate::Y` (use, grouped use, or an inline path,
#[cfg(test)] code included). Comments, doc comments and string literals are not scanned.
"""
import argparse, io, os, re, sys, tempfile

CRATE = re.compile(r"\bcrate\s*::\s*(\{|[A-Za-z_]\w*)")
IDENT = re.compile(r"[A-Za-z_]\w*")
RAW = re.compile(r'(?<!\w)b?r(#*)"')
CHAR = re.compile(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'")


def blank(s):
    """`s` with comments and string/char literals turned into spaces (newlines kept)."""
    out, i, n = list(s), 0, len(s)
    while i < n:
        j, raw = i + 1, RAW.match(s, i) if s[i] in "br" else None
        if s.startswith("//", i):
            j = s.find("\n", i) % (n + 1)  # -1 (no newline) -> n
        elif s.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                step = s[j:j + 2]
                depth += (step == "/*") - (step == "*/")
                j += 2 if step in ("/*", "*/") else 1
        elif raw:
            end = s.find('"' + raw.group(1), raw.end())
            j = n if end < 0 else end + 1 + len(raw.group(1))
        elif s[i] == '"':
            while j < n and s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            j += 1
        elif s[i] == "'" and CHAR.match(s, i):
            j = CHAR.match(s, i).end()
        else:
            i += 1
            continue
        out[i:j] = [c if c == "\n" else " " for c in s[i:j]]
        i = j
    return "".join(out)


def crate_paths(code):
    """(first segment, offset) of every `crate::...` path, descending into `crate::{...}`."""
    for m in CRATE.finditer(code):
        if m.group(1) != "{":
            yield m.group(1), m.start(1)
            continue
        i, depth, expect = m.end(1), 1, True
        while i < len(code) and depth:
            word = IDENT.match(code, i)
            if word and depth == 1 and expect:
                yield word.group(), i
                expect, i = False, word.end()
                continue
            c = code[i]
            depth += (c == "{") - (c == "}")
            expect = expect or (c == "," and depth == 1)
            i += 1


def scan(src):
    """Modules of `src` and edges {(x, y): [(file, line, text), ...]}."""
    mods = {}  # module name -> its files
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if name.endswith(".rs") and name not in ("lib.rs", "main.rs"):
            mods.setdefault(name[:-3], []).append(path)
        elif os.path.isfile(os.path.join(path, "mod.rs")):
            mods.setdefault(name, [])
    for mod, files in mods.items():
        tree = os.path.join(src, mod)
        for dirpath, _, names in sorted(os.walk(tree)) if os.path.isdir(tree) else []:
            files += [os.path.join(dirpath, f) for f in sorted(names) if f.endswith(".rs")]
    edges, root = {}, os.path.dirname(os.path.abspath(src))
    for mod, files in mods.items():
        for path in files:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            lines, code = text.split("\n"), blank(text)
            for dep, at in crate_paths(code):
                if dep in mods and dep != mod:
                    line = code.count("\n", 0, at) + 1
                    where = (os.path.relpath(path, root), line, lines[line - 1].strip())
                    edges.setdefault((mod, dep), []).append(where)
    return sorted(mods), edges


def sccs(nodes, succ):
    """Tarjan's strongly connected components."""
    index, low, stack, on, out = {}, {}, [], set(), []
    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v); on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop()); on.discard(comp[-1])
            out.append(sorted(comp))
    for v in nodes:
        if v not in index:
            visit(v)
    return out


def cycle_through(start, comp, succ):
    """A shortest cycle start -> ... -> start inside `comp` (breadth first)."""
    prev, queue = {}, [start]
    for v in queue:
        for w in succ[v]:
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return path[::-1] + [start]
            if w in comp and w not in prev:
                prev[w] = v; queue.append(w)


LAYERS = re.compile(r"Imports run one way(.*?)\n//!\s*\n", re.S)


def layers(src):
    """{module: layer} from lib.rs's `→` chain (leaves first, layer 0)."""
    with open(os.path.join(src, "lib.rs"), encoding="utf-8") as f:
        m = LAYERS.search(f.read())
    if not m or "→" not in m.group(1):
        return None
    # The chain runs from the colon before its first arrow.
    text = m.group(1).replace("//!", " ")
    chain = text[text.rfind(":", 0, text.index("→")) + 1:]
    found, twice = {}, []
    for i, part in enumerate(chain.split("→")):
        for name in re.findall(r"`([A-Za-z_]\w*)`", part):
            if name in found:
                twice.append(name)
            found.setdefault(name, i)
    return found, twice


def upward(src, nodes, edges, out):
    """Reports imports from a layer to one above it, and modules in no layer; True if none."""
    if layers(src) is None:
        print("modgraph: lib.rs declares no layers (\"Imports run one way ... → ...\")", file=out)
        return False
    declared, twice = layers(src)
    ok = not twice
    for v in twice:
        print(f"modgraph: {v} is in two layers of lib.rs's map", file=out)
    for v in nodes:
        if v not in declared:
            print(f"modgraph: {v} is in no layer of lib.rs's map", file=out)
            ok = False
    for v in sorted(set(declared) - set(nodes)):
        print(f"modgraph: lib.rs's map names {v}, which is no module of src/", file=out)
        ok = False
    for (x, y), where in sorted(edges.items()):
        if x in declared and y in declared and declared[y] > declared[x]:
            (f, line, text), *more = where
            extra = f"  (+{len(more)} more)" if more else ""
            print(f"modgraph: upwards: {x} (layer {declared[x]}) -> {y} (layer {declared[y]}): "
                  f"{f}:{line}: {text}{extra}", file=out)
            ok = False
    return ok


CONFINED = re.compile(r"Only (.*?) name rust-rdkafka")
RDKAFKA = re.compile(r"\brdkafka(?:_sys)?\s*::")


def confined(src, out):
    """Whether rust-rdkafka is named only under the paths lib.rs's map allows (the sentence
    "Only `x`, `y/z` … name rust-rdkafka"): every other file speaks exactly's own types."""
    with open(os.path.join(src, "lib.rs")) as f:
        found = CONFINED.search(" ".join(l.lstrip("/! ").strip() for l in f))
    if not found:
        print("modgraph: lib.rs's map does not say where rust-rdkafka may be named", file=out)
        return False
    allowed = re.findall(r"`([^`]+)`", found.group(1))
    leaks = []
    for dirpath, _, names in sorted(os.walk(src)):
        for name in sorted(n for n in names if n.endswith(".rs")):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, src)
            if rel in ("lib.rs", "main.rs") or any(
                    rel == a + ".rs" or rel.startswith(a + os.sep) for a in allowed):
                continue
            with open(path) as f:
                code = blank(f.read())
            for m in RDKAFKA.finditer(code):
                line = code.count("\n", 0, m.start()) + 1
                leaks.append(f"src/{rel}:{line}")
    for leak in leaks:
        print(f"modgraph: rust-rdkafka named outside {', '.join(allowed)}: {leak}", file=out)
    return not leaks


def check(src, out=sys.stdout):
    if not confined(src, out):
        return False
    nodes, edges = scan(src)
    succ = {v: sorted(y for x, y in edges if x == v) for v in nodes}
    if not upward(src, nodes, edges, out):
        return False
    loops = [c for c in sccs(nodes, succ) if len(c) > 1]
    for comp in sorted(loops):
        cyc = cycle_through(comp[0], set(comp), succ)
        print(f"modgraph: cycle: {' -> '.join(cyc)}", file=out)
        inside = [e for e in sorted(edges) if set(e) <= set(comp)]
        if len(comp) > 2:
            print(f"  (strongly connected: {', '.join(comp)}; {len(inside)} edges)", file=out)
        for x, y in sorted(inside, key=lambda e: e not in set(zip(cyc, cyc[1:]))):
            (f, line, text), *more = edges[(x, y)]
            extra = f"  (+{len(more)} more)" if more else ""
            print(f"  {x} -> {y}: {f}:{line}: {text}{extra}", file=out)
    if loops:
        return False
    done = []
    while len(done) < len(nodes):  # leaves first, alphabetical among the ready ones
        done.append(min(v for v in nodes if v not in done and set(succ[v]) <= set(done)))
        print(f"{done[-1]}: {', '.join(succ[done[-1]]) or '-'}", file=out)
    print(f"modgraph: {len(nodes)} modules, acyclic", file=out)
    return True


LAYERED = "//! Imports run one way: `b` → `c` → `a`\n//!\n//! Only `c` name rust-rdkafka.\n"
CYCLIC = {"lib.rs": "//! Imports run one way: `a`, `b` → here\n//!\n//! Only `a` name rust-rdkafka.\npub mod a;\npub mod b;\n", "a.rs": "use crate::{b::X};\npub struct Y;\n",
          "b.rs": "pub struct X;\nfn f() -> crate::a::Y { todo!() }\n"}
ACYCLIC = {  # b.rs: comments and strings make no b -> a; c/mod.rs: chars hide no c -> b
    "lib.rs": LAYERED + "pub mod a;\npub mod b;\npub mod c;\nuse crate::a::f;\n", "main.rs": "use exactly::a;\n",
    "a.rs": "use crate::{b::{X, Y}, c, self};\nuse crate :: c::inner::Z;\n",
    "b.rs": "//! [`crate::a`]\n// crate::a\n/* crate::a /* */ crate::a */\n/// [`crate::a::f`]\n"
            "const S: &str = \"crate::a \\\" crate::a\";\nconst R: &str = r#\"x \" crate::a\"#;\n"
            "pub struct X;\n",
    "c/mod.rs": "pub mod inner;\nfn g<'x>(_: &'x u8) -> char { '\"' }\nuse crate::b::X;\n",
    "c/inner.rs": "use super::super::b;\nuse crate::c::Other;\nuse rdkafka::Message;\npub struct Z;\n"}


UPWARD = dict(ACYCLIC, **{"lib.rs": "//! Imports run one way: `b`, `a` → `c`\n//!\n//! Only `c` name rust-rdkafka.\n"})
UNLAYERED = dict(ACYCLIC, **{"lib.rs": "//! Imports run one way: `b` → `c` → `d`\n//!\n//! Only `c` name rust-rdkafka.\n"})
LEAKY = dict(ACYCLIC, **{"b.rs": ACYCLIC["b.rs"] + "// rdkafka::in_a_comment\nfn h(e: rdkafka::error::KafkaError) {}\n"})


def self_test():
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, files in (("cyclic", CYCLIC), ("acyclic", ACYCLIC), ("upward", UPWARD),
                            ("unlayered", UNLAYERED), ("leaky", LEAKY)):
            for rel, text in files.items():
                path = os.path.join(tmp, name, "src", rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)
            buf = io.StringIO()
            results.append((check(os.path.join(tmp, name, "src"), buf), buf.getvalue()))
            print(f"--- {name}\n{buf.getvalue()}", end="")
    (ok1, out1), (ok2, out2), (ok3, out3), (ok4, out4), (ok5, out5) = results
    assert not ok1 and out1.startswith("modgraph: cycle: a -> b -> a\n"), out1
    assert "src/a.rs:1: use crate::{b::X};" in out1 and "src/b.rs:2: fn f()" in out1, out1
    assert ok2 and out2 == "b: -\nc: b\na: b, c\nmodgraph: 3 modules, acyclic\n", out2
    assert not ok3 and "modgraph: upwards: a (layer 0) -> c (layer 1): src/a.rs:1:" in out3, out3
    assert not ok4 and "modgraph: a is in no layer of lib.rs's map" in out4, out4
    assert "modgraph: lib.rs's map names d, which is no module of src/" in out4, out4
    assert not ok5 and out5 == "modgraph: rust-rdkafka named outside c: src/b.rs:9\n", out5
    print("modgraph: self-test passed")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=os.path.join(os.path.dirname(__file__), "..", "src"))
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        self_test()
    else:
        sys.exit(0 if check(os.path.normpath(args.src)) else 1)
