#!/usr/bin/env python3
"""Fails on a reference to a repository path that is not in the tree.

    python3 tools/ci/check_references.py [--root DIR]

Scans the repository's tracked source and doc files (what `git ls-files` lists: *.h
*.cpp *.cu *.cuh *.py *.sh *.md *.yaml *.txt, CMakeLists.txt included) for tokens that
name a path under one of the top-level folders (TOP_DIRS:
`kernels/cuda/attention_flash.cu`, `tests/test_remote_tls.cpp:102`, `tools/eval/`),
with an optional `:LINE` or `:A-B` suffix, and for the design document that lives
outside the repository (DESIGN_DOC below; users of the repository do not have it).
A path counts as present when a file of the tree is it or lies under it (a directory),
or when it names a module without its extension (`tools/cli/trace_chrome`: its .h and .cpp);
the tree's files are the tracked ones plus new files git does not ignore (about to be
added; they are scanned once tracked). Build outputs and other ignored files do not
count, so the answer is the one a clone gets. A token is from the repository root:
after a space or punctuation, `./`, or `$ROOT/` / `${CMAKE_SOURCE_DIR}/`; anything else
with a `/` before it is elsewhere. Tokens with `*`, `<`, `{`, `$` or `%` in them are
patterns or templates, not paths, and are skipped; so are tokens with an elided part
(`kernels/.../x.h`) or a capitalised placeholder for a name or number
(`tests/test_N.cpp`, `tools/fuzz_TARGET.sh`: the tree's own names are lower case).

Why the tree and not the disk: a comment that cites a file the build writes (build/,
models/, data/: all ignored) would pass here and fail for every reader of a clean
checkout. What is legitimately absent is in ABSENT_PATHS, each with its reason; files
not scanned (yet) are in SKIP_FILES, each with its reason.

Output: `file:line: missing path` lines and a summary on stderr; one JSON line on
stdout, {"checked_files": N, "references": M, "missing": K}. Exit 0 when nothing is
missing, 1 when something is, 2 when the tree cannot be listed (not a git work tree).

tests/check_references_test.py runs it on this tree and on a small fake one.
"""
import argparse
import json
import os
import re
import subprocess
import sys

TOP_DIRS = ("actors", "blend", "configs", "http", "kernels", "model", "storage", "tests", "tools")
SUFFIXES = (".h", ".cpp", ".cu", ".cuh", ".py", ".sh", ".md", ".yaml", ".txt")
# Written in two parts so that this file, which is scanned too, does not cite it.
DESIGN_DOC = "DESIGN" + ".md"

# Files not scanned, with why. Their references are still checked once they leave this list.
SKIP_FILES = {
    "tests/check_references_test.py": "its fake tree names missing paths on purpose",
}

# Referenced paths that are legitimately absent from the tree (written at run time,
# generated), with why. A key ending in "/" covers everything under it. None so far:
# what the build and the tools write lies outside the top-level folders (build/,
# models/, data/), so no reference here names it.
ABSENT_PATHS = {
}

# A path token: a top-level folder, a slash, then path characters. The wider class
# takes in `*`, `<`, `{`, `$`, `%` so that a pattern is seen whole (and skipped), not cut
# short at its first wildcard. What may stand before it is decided by starts_here().
PATH_RE = re.compile(
    r"(?<![\w\-$])((?:" + "|".join(TOP_DIRS) + r")/[\w./+\-*<>{}$%]*)(:\d+(?:-\d+)?)?")
# Before a token, the repository root by name: `$ROOT/tools/setup.sh` (the shell
# scripts' ROOT is the repository), `${CMAKE_SOURCE_DIR}/tests/CMakeLists.txt`. Any
# other `/` before it (`../shared/tools/x`, `https://host/tools/x`, `$BUILD/tools/x`)
# is somewhere else.
ROOT_PREFIX_RE = re.compile(r'(?:\$ROOT|\$\{ROOT\}|"\$ROOT"|\$\{CMAKE_SOURCE_DIR\}|\$\{PROJECT_SOURCE_DIR\})/$')
DESIGN_RE = re.compile(r"(?<![\w\-])([\w./\-]*" + re.escape(DESIGN_DOC) + r")")
PATTERN_CHARS = set("*<{$%")
# A placeholder in a path: a piece between `/`, `_`, `-` and `.` that is N (NN, ...) or an
# upper-case word (TARGET, NAME); the tree's capitalised names are not placeholders.
PLACEHOLDER_RE = re.compile(r"^(?:N+|[A-Z]{2,})$")
REAL_UPPER = {"README", "DESIGN"}
TRAILING = ".,:;)>]}'\"`-"

# Tokens that look like paths and are not: what they are, for each.
NOT_PATHS = {
    "blend/full": "tools/bench/bench_serve.cpp's summary: the ratio of blend's sustained load to full's",
}


def starts_here(line, start):
    """Whether the token at `start` is a path from the repository root."""
    before = line[:start]
    if not before or before[-1] not in "./":
        return True
    if before.endswith("./"):  # ./tools/setup.sh, from the root; not ../tools/x or a/./tools/x
        rest = before[:-2]
        return not rest or not (rest[-1].isalnum() or rest[-1] in "_./-")
    return ROOT_PREFIX_RE.search(before) is not None


def git_list(root, *args):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z", *args], check=True, capture_output=True).stdout
    paths = {p for p in out.decode("utf-8", "surrogateescape").split("\0") if p}
    return sorted(p for p in paths if os.path.lexists(os.path.join(root, p)))  # not deleted in the work tree


def git_files(root):
    """(tracked files, the tree's files: tracked plus new ones git does not ignore)."""
    tracked = git_list(root, "--cached")
    return tracked, sorted(set(tracked) | set(git_list(root, "--others", "--exclude-standard")))


def scanned(path):
    name = os.path.basename(path)
    return name == "CMakeLists.txt" or name.endswith(SUFFIXES)


def normalise(token):
    """The path a token names, or None for a pattern, a placeholder, a bare top-level
    folder or a token of NOT_PATHS."""
    if any(c in PATTERN_CHARS for c in token):
        return None
    token = token.rstrip(TRAILING)
    if "/" not in token:  # only the folder and punctuation were left
        return None
    if "..." in token or any(PLACEHOLDER_RE.match(piece) and piece not in REAL_UPPER
                             for piece in re.split(r"[/_.\-]", token)):
        return None
    path = os.path.normpath(token)
    if path in TOP_DIRS or path in NOT_PATHS:
        return None
    return path


def is_present(path, present, stems):
    """A file or directory of the tree, or a module named without its extension
    (`tools/cli/trace_chrome` for trace_chrome.h and .cpp)."""
    return path in present or ("." not in os.path.basename(path) and path in stems)


def absent_allowed(path):
    for key in ABSENT_PATHS:
        if path == key.rstrip("/") or (key.endswith("/") and path.startswith(key)):
            return True
    return False


def references(text):
    """(line number, path) for every reference in `text`."""
    for number, line in enumerate(text.splitlines(), 1):
        for m in PATH_RE.finditer(line):
            if not starts_here(line, m.start(1)):
                continue
            path = normalise(m.group(1))
            if path is not None:
                yield number, path
        for m in DESIGN_RE.finditer(line):
            yield number, os.path.normpath(m.group(1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        help="the repository to check (default: the one this script is in)")
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root)
    try:
        tracked, files = git_files(root)
    except (subprocess.CalledProcessError, OSError) as e:
        err = e.stderr.decode(errors="replace").strip() if getattr(e, "stderr", None) else str(e)
        print(f"check_references: cannot list the files of {root}: {err}", file=sys.stderr)
        return 2
    present = set(files)
    for f in files:  # every directory that holds a file of the tree
        d = os.path.dirname(f)
        while d and d not in present:
            present.add(d)
            d = os.path.dirname(d)

    stems = {os.path.splitext(f)[0] for f in files}
    checked = refs = 0
    missing = []
    for f in tracked:
        if not scanned(f) or f in SKIP_FILES:
            continue
        full = os.path.join(root, f)
        if not os.path.isfile(full):
            continue
        with open(full, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        checked += 1
        for number, path in references(text):
            refs += 1
            if not is_present(path, present, stems) and not absent_allowed(path):
                missing.append((f, number, path))

    for f, number, path in missing:
        print(f"{f}:{number}: missing {path}", file=sys.stderr)
    skipped = sorted(s for s in SKIP_FILES if s in present)
    print(f"check_references: {checked} files, {refs} references, {len(missing)} missing"
          + (f" (not scanned: {', '.join(skipped)})" if skipped else ""), file=sys.stderr)
    print(json.dumps({"checked_files": checked, "references": refs, "missing": len(missing)}))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
