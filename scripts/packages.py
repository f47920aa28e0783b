#!/usr/bin/env python3
"""Every publishable crate packages and verifies, and the crates' versions move together.

For the root workspace and each workspace named on the command line (`ratewell-pingora`, a
workspace of its own), from `cargo metadata`:

- the publishable crates are the members whose `publish` is not `false`: a crate added later is
  covered without editing this script;
- each has the workspace's version (`workspace.package.version`, read from the root crate), and
  each dependency on another crate of the repository names it by path *and* a version
  requirement that this version meets (`cargo package` refuses a path without a version);
- `cargo package` packages and verifies them (it builds each package on its own; the root
  workspace's crates resolve each other from the packages just made, and a nested workspace's
  dependencies on the root's crates are patched to their paths for its verification);
- the root crate's package holds no benchmark results, scripts or images, and is at most
  300 KiB compressed.

Usage: python3 scripts/packages.py [WORKSPACE_DIR ...]   (from the repository root; `.ci/run`)
"""
import json
import os
import re
import shutil
import subprocess
import sys

ROOT_LIMIT = 300 * 1024


def metadata(directory):
    out = subprocess.check_output(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=directory
    )
    return json.loads(out)


def meets(req, version):
    """Whether a caret or exact requirement of the form `^X.Y.Z` / `=X.Y.Z` / `X.Y.Z` is met."""
    m = re.fullmatch(r"([\^=~]?)(\d+)\.(\d+)(?:\.(\d+))?", req.strip())
    if not m:
        return False
    op, major, minor, patch = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4) or 0)
    v = tuple(int(x) for x in version.split("-")[0].split("."))
    want = (major, minor, patch)
    if op == "=":
        return v == want
    if v < want:
        return False
    return v[0] == major if major > 0 else v[:2] == (0, minor)


def check_workspace(directory, version, root_packages, failures):
    meta = metadata(directory)
    members = [p for p in meta["packages"] if p["id"] in meta["workspace_members"]]
    publishable = [p for p in members if p.get("publish") != []]
    for p in publishable:
        if p["version"] != version:
            failures.append(f"{p['name']} is {p['version']}, not the workspace's {version}")
        for dep in p["dependencies"]:
            target = root_packages.get(dep["name"])
            if dep.get("path") is None or target is None:
                continue
            if dep["kind"] == "dev" and dep["req"] == "*":
                continue  # a path-only dev-dependency: `cargo package` drops it
            if not meets(dep["req"], target["version"]):
                failures.append(
                    f"{p['name']} depends on {dep['name']} {dep['req']!r}, which its version "
                    f"{target['version']} does not meet"
                )
    return meta, publishable


def forget_earlier_packages(names, version):
    """Drop what an earlier run of `cargo package` left of these crates at this version.

    Packaging several crates at once puts them in a local registry (`target/package/tmp-registry`),
    and each verification unpacks them into `$CARGO_HOME/registry/src/<that registry>/NAME-VERSION`
    and builds them as registry crates. Cargo trusts both: an unpacked registry crate (marked
    `.cargo-ok`) is never unpacked again, and a registry crate's build is fresh while its name and
    version are the same. The crates here keep their version while their code changes, so a second
    run from the same directory, with the same `$CARGO_HOME`, would verify against the first run's
    sources. Both are removed: cargo unpacks and builds the new packages.
    """
    home = os.environ.get("CARGO_HOME") or os.path.expanduser("~/.cargo")
    src = os.path.join(home, "registry", "src")
    registries = os.listdir(src) if os.path.isdir(src) else []
    for registry in registries:
        for name in names:
            unpacked = os.path.join(src, registry, f"{name}-{version}")
            if os.path.isdir(unpacked):
                print(f"packages: removing {unpacked}, an earlier run's copy")
                shutil.rmtree(unpacked)
    # Every build of these crates in the target directory (the workspace's own builds too:
    # `cargo clean -p` goes by name), so that no earlier verification's build counts as fresh.
    subprocess.check_call(["cargo", "clean", "--quiet"] + [a for n in names for a in ("-p", n)])


def main():
    top = os.getcwd()
    root = metadata(".")
    root_packages = {p["name"]: p for p in root["packages"] if p["id"] in root["workspace_members"]}
    version = root_packages["ratewell"]["version"]
    failures = []
    _, publishable = check_workspace(".", version, root_packages, failures)
    names = [p["name"] for p in publishable]
    print(f"packages: {', '.join(names)} at {version}")
    forget_earlier_packages(names, version)
    args = ["cargo", "package", "--locked"] + [a for n in names for a in ("-p", n)]
    if subprocess.call(args) != 0:
        failures.append("cargo package failed in the root workspace")

    listed = subprocess.check_output(
        ["cargo", "package", "--locked", "--list", "-p", "ratewell"], text=True
    ).split()
    stray = [f for f in listed if f.startswith(("benches/", "scripts/", "docs/")) or f.endswith(".png")]
    if stray:
        failures.append(f"the ratewell package holds {stray}")
    crate = os.path.join(root["target_directory"], "package", f"ratewell-{version}.crate")
    size = os.path.getsize(crate)
    print(f"ratewell's package: {len(listed)} files, {size / 1024:.1f} KiB compressed")
    if size > ROOT_LIMIT:
        failures.append(f"ratewell's package is {size} bytes compressed, above {ROOT_LIMIT}")

    for directory in sys.argv[1:]:
        _, nested = check_workspace(directory, version, root_packages, failures)
        print(f"packages of {directory}: {', '.join(p['name'] for p in nested)}")
        # Its dependencies on the root's crates (not on crates.io yet) patched to their paths.
        used = {d["name"] for p in nested for d in p["dependencies"] if d["name"] in root_packages}
        patches = []
        for name in sorted(used):
            path = os.path.dirname(root_packages[name]["manifest_path"])
            patches += ["--config", f'patch.crates-io.{name}.path="{path}"']
        # Not --locked: the patches are recorded in the lock file of the verification.
        if nested and subprocess.call(["cargo", "package"] + patches, cwd=directory) != 0:
            failures.append(f"cargo package failed in {directory}")

    if failures:
        print("\n".join(["packages:"] + failures), file=sys.stderr)
        sys.exit(1)
    print("packages: every publishable crate packages and verifies")


if __name__ == "__main__":
    main()
