#!/usr/bin/env python3
"""A variant of an FP8 calibration file with chosen products switched between FP8 and bf16.

The device checks' `fp8-variants` phase measures each carried
`.device-carry/calibration/pi05-full-{2v,3v}-NAME.json` (speed, and actions against bf16) to decide
which products a model's default keeps in bf16. A calibration records the input range of every
product, kept ones included, so a variant needs no recalibration: only each named product's
`precision`. Patterns match product names as `--keep-bf16` does (a prefix, `*` for any run):

    python3 tools/device/checks/calibration_variant.py IN.json OUT.json --fp8 'vision.2*.qkv' 'vision.2*.fc1'

A product switched to FP8 keeps its recorded nmse (0 for a kept one: not measured), and the
variant names what it changed in `settings.variant`, so it is never taken for a calibration run.
"""
import argparse
import json


def matches(name: str, pattern: str) -> bool:
    pieces = pattern.split("*")
    if not name.startswith(pieces[0]):
        return False
    rest = name[len(pieces[0]):]
    for piece in pieces[1:]:
        at = rest.find(piece)
        if at < 0:
            return False
        rest = rest[at + len(piece):]
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--fp8", nargs="*", default=[], metavar="PATTERN", help="products to run in FP8")
    parser.add_argument("--bf16", nargs="*", default=[], metavar="PATTERN", help="products to keep in bf16")
    args = parser.parse_args()
    with open(args.input) as f:
        calibration = json.load(f)
    targets = {"fp8": args.fp8, "bf16": args.bf16}
    for patterns in targets.values():
        for p in patterns:
            if not any(matches(name, p) for name in calibration["products"]):
                raise SystemExit(f"pattern {p!r} matches no product of {args.input}")
    changed = {precision: [] for precision in targets}
    for name, product in calibration["products"].items():
        for precision, patterns in targets.items():
            if any(matches(name, p) for p in patterns) and product["precision"] != precision:
                product["precision"] = precision
                if precision == "fp8":
                    product.pop("why", None)
                else:
                    product["why"] = "kept in bf16 by this variant"
                changed[precision].append(name)
    calibration["settings"]["variant"] = {"of": args.input, "to_fp8": args.fp8, "to_bf16": args.bf16}
    with open(args.output, "w") as f:
        json.dump(calibration, f, indent=1)
    print(f"{args.output}: {len(changed['fp8'])} products to FP8, {len(changed['bf16'])} to bf16")


if __name__ == "__main__":
    main()
