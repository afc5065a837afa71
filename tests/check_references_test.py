#!/usr/bin/env python3
"""tools/ci/check_references.py on this repository (nothing missing: exit 0) and on a small
fake repository whose one file cites a header that is not there and the design document
that is not in any tree (exit 1, both named with their file and line); the JSON line on
stdout counts them; placeholders (`tests/test_N.cpp`, `kernels/.../x.h`, patterns) and
paths outside the tree (`../shared/...`, `build/...`) are no references; a directory
that is not a git work tree is exit 2.

    python3 tests/check_references_test.py
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tools", "ci", "check_references.py")


def check(root=None):
    args = [sys.executable, SCRIPT] + (["--root", root] if root else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class CheckReferences(unittest.TestCase):
    def test_the_repository_has_no_missing_reference(self):
        r = check()
        self.assertEqual(r.returncode, 0, r.stderr)
        summary = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(summary["missing"], 0, r.stderr)
        self.assertGreater(summary["checked_files"], 0)
        self.assertGreater(summary["references"], 0)

    @unittest.skipUnless(shutil.which("git"), "git is not installed")
    def test_a_fake_tree_with_two_missing_references_fails_naming_both(self):
        with tempfile.TemporaryDirectory() as d:
            git(d, "init", "-q")
            os.makedirs(os.path.join(d, "tools"))
            with open(os.path.join(d, "tools", "present.h"), "w") as f:
                f.write("// Reads tools/present.h:1 (itself: there); tools/ alone is no reference.\n"
                        "// Declared in tools/does_not_exist.h.\n"
                        "// See DESIGN.md section 2.\n")
            git(d, "add", "tools/present.h")
            git(d, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "fake")
            r = check(d)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("tools/present.h:2: missing tools/does_not_exist.h", r.stderr)
            self.assertIn("tools/present.h:3: missing DESIGN.md", r.stderr)
            self.assertNotIn("missing tools/present.h", r.stderr)
            self.assertEqual(json.loads(r.stdout.strip().splitlines()[-1]),
                             {"checked_files": 1, "references": 3, "missing": 2})

    @unittest.skipUnless(shutil.which("git"), "git is not installed")
    def test_placeholders_and_paths_elsewhere_are_no_references(self):
        with tempfile.TemporaryDirectory() as d:
            git(d, "init", "-q")
            os.makedirs(os.path.join(d, "tools"))
            with open(os.path.join(d, "tools", "present.h"), "w") as f:
                f.write("// Placeholders: tests/test_N.cpp, tools/fuzz_TARGET.sh, kernels/.../x.h,\n"
                        "// tools/fuzz_<target>.sh, tools/bench_*.py, tools/run_{a,b}.sh.\n"
                        "// Elsewhere: ../shared/tools/x.sh, $BUILD/tools/y, build/tools/z, models/tools/w.\n"
                        "// Here: (tools/present.h:3-4), `./tools/present.h`; gone: tools/gone.sh.\n")
            git(d, "add", "tools/present.h")
            git(d, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "fake")
            r = check(d)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("tools/present.h:4: missing tools/gone.sh", r.stderr)
            self.assertEqual(json.loads(r.stdout.strip().splitlines()[-1]),
                             {"checked_files": 1, "references": 3, "missing": 1})

    def test_a_directory_that_is_no_git_tree_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            r = check(d)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("cannot list the files", r.stderr)


if __name__ == "__main__":
    unittest.main()
