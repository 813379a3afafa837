"""Write an upstream CRD into this folder as the tests read it: `python tests/schemas/vendor.py CRD.yaml ...`.

The copy is the CRD itself (apiVersion, kind, metadata.name, spec: group, names, scope, versions with
their `openAPIV3Schema`) with every `description` removed and nothing else changed: the descriptions
are nine tenths of an upstream CRD's bytes and no validator reads them. It is written as compact JSON
(which YAML loaders read too) named `<metadata.name>.json`, in this folder or, with `--into RELEASE`, in its
subfolder of that name (a second release's CRDs beside the first's). README.md records where each file came from.

`--check` compares instead of writing, so a vendored file can be proved to be what upstream holds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).parent
KEPT_SPEC_KEYS = ("group", "names", "scope", "versions")


def without_descriptions(node):
    """`node` with every `description` key removed, recursively."""
    if isinstance(node, dict):
        return {key: without_descriptions(value) for key, value in node.items() if key != "description"}
    if isinstance(node, list):
        return [without_descriptions(value) for value in node]
    return node


def vendored(crd: dict) -> dict:
    """What this folder keeps of an upstream CRD."""
    spec = {key: crd["spec"][key] for key in KEPT_SPEC_KEYS}
    return {"apiVersion": crd["apiVersion"], "kind": crd["kind"], "metadata": {"name": crd["metadata"]["name"]},
            "spec": without_descriptions(spec)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crds", nargs="+", type=Path, help="upstream CRD files (YAML)")
    parser.add_argument("--check", action="store_true", help="compare with the vendored copies, write nothing")
    parser.add_argument("--into", default="", help="subfolder for another release's CRDs (e.g. trainer-v2.4)")
    options = parser.parse_args(argv)
    folder = HERE / options.into
    folder.mkdir(exist_ok=True)
    status = 0
    for path in options.crds:
        crd = yaml.safe_load(path.read_text())
        target = folder / f"{crd['metadata']['name']}.json"
        text = json.dumps(vendored(crd), separators=(",", ":")) + "\n"
        if options.check:
            same = target.is_file() and target.read_text() == text
            print(f"{target.name}: {'matches' if same else 'DIFFERS from'} {path}")
            status |= not same
        else:
            target.write_text(text)
            print(f"wrote {target.name} ({len(text)} bytes) from {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
