#!/usr/bin/env python3
"""Every crate's `rust-version` is at least the largest one its dependency tree declares.

For each workspace member (of the root workspace, and of each workspace named on the command
line: `ratewell-pingora`), the crates it needs to build for a user (normal and build
dependencies, every feature on, every platform) are walked in `cargo metadata`'s resolved graph,
and their declared `rust-version`s compared with the member's. Fails (exit 1) naming each member
that declares less than its tree needs, and the crate that needs more.

Usage: python3 scripts/msrv.py [WORKSPACE_DIR ...]   (from the repository root; `.ci/run` runs it)
"""
import json
import subprocess
import sys


def version_key(v):
    parts = [int(x) for x in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def check(directory):
    meta = json.loads(
        subprocess.check_output(
            ["cargo", "metadata", "--format-version", "1", "--all-features", "--locked"],
            cwd=directory,
        )
    )
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    failures = []
    rows = []
    for member in meta["workspace_members"]:
        package = packages[member]
        declared = package.get("rust_version")
        # The crates a user's build of this member compiles: normal and build dependencies.
        seen, stack = set(), [member]
        while stack:
            node = nodes[stack.pop()]
            for dep in node["deps"]:
                kinds = {k["kind"] for k in dep["dep_kinds"]}
                if kinds <= {"dev"}:
                    continue
                if dep["pkg"] not in seen:
                    seen.add(dep["pkg"])
                    stack.append(dep["pkg"])
        needed, by = "0", None
        for pkg in seen:
            rv = packages[pkg].get("rust_version")
            if rv and version_key(rv) > version_key(needed):
                needed, by = rv, packages[pkg]["name"] + " " + packages[pkg]["version"]
        publish = package.get("publish")
        rows.append((package["name"], declared, needed, by, publish == []))
        if declared is None or version_key(declared) < version_key(needed):
            failures.append(f"{package['name']}: rust-version {declared}, but {by} needs {needed}")
    for name, declared, needed, by, private in sorted(rows):
        note = " (not published)" if private else ""
        print(f"{name}: declares {declared}, its tree needs {needed} ({by}){note}")
    return failures


def main():
    failures = check(".")
    for directory in sys.argv[1:]:
        failures += check(directory)
    if failures:
        print("\n".join(["msrv: crates that declare less than their dependencies need:"] + failures), file=sys.stderr)
        sys.exit(1)
    print("msrv: every crate declares at least what its dependency tree needs")


if __name__ == "__main__":
    main()
