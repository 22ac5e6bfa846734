#!/usr/bin/env python3
"""Checks that no file of src/ is over 800 lines and no function over 80 (tests apart).

A file's lines count up to its `#[cfg(test)] mod … {` block; files that are test code only
(tests.rs, fake.rs, the simulator) are not counted. A function's lines run from its `fn` line
to its closing brace (brace matching). scripts/sizes.allow lists the exceptions, one per line,
`path name most reason`: declarative tables, which may stay but never grow, each listed at its
length (longer fails; shorter asks for the limit to come down; back under 80, off the list).
"""
import argparse, os, re, sys

FILE_MOST, FN_MOST = 800, 80
TEST_ONLY = re.compile(r"(^|/)(tests|fake)\.rs$|^src/sim/")
FN = re.compile(r"\s*(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)")


def code_lines(lines):
    """The lines before the file's `#[cfg(test)] mod … {` block."""
    for k, line in enumerate(lines[:-1]):
        if line.strip() == "#[cfg(test)]" and re.match(r"\s*(pub\s+)?mod\s+\w+\s*\{", lines[k + 1]):
            return lines[:k]
    return lines


def functions(lines):
    """(line, name, length) of every function with a body in `lines`."""
    i = 0
    while i < len(lines):
        m = FN.match(lines[i])
        if not m:
            i += 1
            continue
        depth, j, started = 0, i, False
        while j < len(lines):
            depth += lines[j].count("{") - lines[j].count("}")
            started = started or "{" in lines[j]
            if (started and depth <= 0) or (not started and lines[j].rstrip().endswith(";")):
                break
            j += 1
        if started:
            yield i + 1, m.group(6), j - i + 1
        i = j + 1 if started else i + 1


def check(root, allow_path, out=sys.stdout):
    allow = {}
    with open(allow_path, encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                path, name, most = line.split()[:3]
                allow[(path, name)] = int(most)
    bad, used = [], set()
    for d, _, names in sorted(os.walk(os.path.join(root, "src"))):
        for n in sorted(names):
            path = os.path.relpath(os.path.join(d, n), root)
            if not n.endswith(".rs") or TEST_ONLY.search(path):
                continue
            with open(os.path.join(root, path), encoding="utf-8") as f:
                lines = code_lines(f.read().splitlines())
            most = allow.get((path, "(file)"), FILE_MOST)
            if len(lines) > FILE_MOST:
                used.add((path, "(file)"))
            if len(lines) > most:
                bad.append(f"{path}: {len(lines)} lines (at most {most}, tests apart)")
            for at, name, length in functions(lines):
                key = (path, name)
                most = allow.get(key, FN_MOST)
                if key in allow and length > FN_MOST:
                    used.add(key)
                    if length < most:
                        bad.append(f"{path}:{at} {name}: {length} lines; lower its limit in "
                                   f"scripts/sizes.allow from {most} to {length}")
                if length > most:
                    bad.append(f"{path}:{at} {name}: {length} lines (at most {most})")
    for key in sorted(set(allow) - used):
        bad.append(f"scripts/sizes.allow: {key[0]} {key[1]} is within the limit (or gone); "
                   "take it off the list")
    for b in bad:
        print(f"sizes: {b}", file=out)
    if not bad:
        print(f"sizes: no file over {FILE_MOST} lines, no function over {FN_MOST} "
              f"({len(allow)} listed exceptions)", file=out)
    return not bad


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--root", default=os.path.dirname(here))
    ap.add_argument("--allow", default=os.path.join(here, "sizes.allow"))
    args = ap.parse_args()
    sys.exit(0 if check(args.root, args.allow) else 1)
