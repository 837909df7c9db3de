"""Copies the licence files of every crate a package is built from.

Reads `cargo metadata --format-version 1` on stdin; takes the root package's
name and a folder. For each crate the package links (normal dependencies,
transitively, for the host platform), it copies the crate's LICENSE*,
LICENCE*, COPYING*, NOTICE* and UNLICENSE files into FOLDER/crates/NAME-VERSION/
and writes FOLDER/THIRD-PARTY.txt: one line per crate with its licence
expression. Exits 1 when a crate has neither a licence expression nor a
licence file, naming it.
"""

import json
import os
import shutil
import sys

NAMES = ("LICENSE", "LICENCE", "COPYING", "NOTICE", "UNLICENSE")


def main() -> int:
    root_name, folder = sys.argv[1], sys.argv[2]
    metadata = json.load(sys.stdin)
    packages = {p["id"]: p for p in metadata["packages"]}
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    root = next(p["id"] for p in metadata["packages"] if p["name"] == root_name)
    linked, todo = set(), [root]
    while todo:
        node = nodes[todo.pop()]
        for dep in node["deps"]:
            kinds = dep["dep_kinds"]
            if any(k["kind"] is None for k in kinds) and dep["pkg"] not in linked:
                linked.add(dep["pkg"])
                todo.append(dep["pkg"])
    lines, missing = [], []
    for pkg_id in sorted(linked, key=lambda i: (packages[i]["name"], packages[i]["version"])):
        package = packages[pkg_id]
        name = f"{package['name']}-{package['version']}"
        source = os.path.dirname(package["manifest_path"])
        files = sorted(
            f for f in os.listdir(source)
            if f.upper().startswith(NAMES) and os.path.isfile(os.path.join(source, f))
        )
        if files:
            target = os.path.join(folder, "crates", name)
            os.makedirs(target, exist_ok=True)
            for f in files:
                shutil.copy(os.path.join(source, f), target)
        licence = package.get("license") or (
            f"see {package['license_file']}" if package.get("license_file") else None
        )
        if not licence and not files:
            missing.append(name)
        lines.append(f"{name}\t{licence or 'see its files'}\t{len(files)} file(s)")
    with open(os.path.join(folder, "THIRD-PARTY.txt"), "w") as out:
        out.write(
            "Crates acemq-host is built from, with their licence expressions;\n"
            "their licence files are under crates/.\n\n"
        )
        out.write("\n".join(lines) + "\n")
    if missing:
        print("crate-licences: no licence found for " + ", ".join(missing), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
