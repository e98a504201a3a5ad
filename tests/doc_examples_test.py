#!/usr/bin/env python3
"""Every `$ meshsim ...` example of README.md and docs/*.md, run as written in an empty folder
(the clone's top for one that says so), its output compared with the lines the doc shows.

A command runs until a line without a trailing backslash; its shown output is the lines after
it up to the next `$ ` line or the end of the code block. The shown lines must appear in the
output in order: a line `...` stands for any lines, a `...` inside a line for any text there.
The exit status must be 2 when the doc shows a refusal ("meshsim show: FailedPrecondition: ..."),
1 when it shows a FAILED verdict, and 0 otherwise. An example whose
command itself elides flags (`meshsim step ... --fault`) is not run, and is named with the
reason. The dumps an example reads are made in its block by `$ python3 tests/traces/make_fr_dumps.py`
(run from the clone, writing into the block's folder), as a reader would.

  doc_examples_test.py MESHSIM_EXE REPO_ROOT
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile


def examples(path):
    """(path, line, command, shown lines, block number) of each `$ ` command in a code block."""
    out, in_block, cmd, shown, block = [], False, None, [], 0
    for n, line in enumerate(open(path, encoding="utf-8").read().splitlines(), 1):
        if line.startswith("```"):
            if cmd:
                out.append((path, cmd_line, cmd, shown, block))
            in_block, cmd, shown = not in_block, None, []
            block += 1
            continue
        if not in_block:
            continue
        if cmd is not None and cont:
            cmd += " " + line.strip().rstrip("\\").strip()
            cont = line.rstrip().endswith("\\")
            continue
        if line.startswith("$ "):
            if cmd:
                out.append((path, cmd_line, cmd, shown, block))
            cmd, cmd_line, shown = line[2:].rstrip().rstrip("\\").strip(), n, []
            cont = line.rstrip().endswith("\\")
            continue
        if cmd is not None:
            shown.append(line.rstrip())
    return [e for e in out if e[2].startswith("meshsim ") or e[2].startswith(GENERATOR)]


# The one other command the docs run: the generator of Flight Recorder dumps, from the clone.
GENERATOR = "python3 tests/traces/make_fr_dumps.py "


def matches(expected, actual):
    parts = expected.split("...")
    if len(parts) == 1:
        return actual.rstrip() == expected.rstrip()
    if not actual.startswith(parts[0]) or not actual.rstrip().endswith(parts[-1].rstrip()):
        return False
    at = len(parts[0])
    for p in parts[1:-1]:
        k = actual.find(p, at)
        if k < 0:
            return False
        at = k + len(p)
    return True


def shown_in(shown, lines):
    """Whether the shown lines appear in order (each after the last), '...' lines skipped."""
    k = 0
    for want in shown:
        if not want.strip() or want.strip() == "...":
            continue
        while k < len(lines) and not matches(want, lines[k]):
            k += 1
        if k == len(lines):
            return want
        k += 1
    return None


def main():
    exe, root = sys.argv[1], sys.argv[2]
    docs = [os.path.join(root, "README.md")] + sorted(
        os.path.join(root, "docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    ran = failed = 0
    folders = {}  # (doc, block) -> the empty folder its commands share
    for path, n, cmd, shown, block in (e for d in docs for e in examples(d)):
        where = f"{os.path.relpath(path, root)}:{n}"
        words = shlex.split(cmd.split("  #")[0], comments=False)
        if "..." in words:
            print(f"not run: {where}: the command elides flags (`{cmd[:60]}`)")
            continue
        cwd = root if "clone's top" in cmd else folders.setdefault((path, block), tempfile.mkdtemp(prefix="meshsim-doc-"))
        if cmd.startswith(GENERATOR):
            argv = [sys.executable, os.path.join(root, words[1])] + words[2:]
        else:
            argv = [exe] + words[1:]
        p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        lines = (p.stdout + p.stderr).splitlines()
        refused = any(re.match(r"meshsim \w+: [A-Z]\w+: ", s) for s in shown)
        want_status = 2 if refused else 1 if any(s.startswith("FAILED") for s in shown) else 0
        if not any(s.strip() for s in shown):
            want_status = p.returncode if p.returncode in (0, 1) else 0  # nothing shown: any verdict
        missing = shown_in(shown, lines)
        ran += 1
        if p.returncode != want_status or missing is not None:
            failed += 1
            print(f"FAILED {where}: `{cmd}`: exit {p.returncode} (the doc implies {want_status})" +
                  (f"; the shown line {missing!r} is not in the output:" if missing is not None else ":"))
            print("\n".join("    " + s for s in lines[:40]))
        else:
            print(f"ok: {where}: `{cmd[:80]}`")
    print(f"{ran} examples run, {failed} differ from their docs")
    return 1 if failed or ran == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
