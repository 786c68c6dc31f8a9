"""Users' own site files gone wrong, each a whole `mpirun -n 9` job (1 server, 8 silos): how
fast the job ends, with what line, and what it leaves behind.

    python -m benchmarks.bad_inputs [--drop] [--out DIR] [--repeats N] [--only CASE ...] [--report FILE]

Eight small valid sites are written from scikit-learn's digits (8x8 images, 1,797 in all, no
download), as `.npz` files, as folders of memory-mapped `.npy` files, or as folders of PNG
images (`train/<label>/*.png`, colour); each case then spoils one site, site 3 (site 0 in
`grey_site_0`): one file, one image, one row or one manifest line; and runs the job. A case
passes when the job exits with code 2 within `LIMIT_S` seconds of the launch, in one line
(`cfl_mpi: ...` on stderr) naming the site, the file (or the image inside a folder), the row
or the manifest line where there is one, and the fix, with nothing written in the results
folder (it does not exist, or is empty). With `--drop`, each case also runs under
`runtime.on_silo_failure: drop`: a case of one site's own files must complete (exit 0)
without the site and name it (`dropped silo 3`, summary.json's `dropped`); the cases where
sites disagree with each other (image size, channels) are no single site's fault and still
end with exit 2.

`--out DIR` keeps the sites, configs and results folders there (default: a temporary folder,
removed). Wall seconds are from the launch of `mpirun` to its exit, on this machine as loaded
at the time (the table's header gives the load average).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .runs import ROOT, mpirun

SITES = 8
IMAGE = "the image"  # a case's `where`: the spoilt image's file name
RANKS = SITES + 1
LIMIT_S = 5.0  # a bad input must end the job within this, from the launch
CLASS_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
TINT = np.array([1.0, 0.6, 0.3], dtype=np.float32)  # the PNG sites' colour (a grey digit made orange)
JOB = {"train": {"rounds": 1, "local_epochs": 1}, "model": {"name": "simple_cnn", "channels": [8, 16]}}


@dataclass(frozen=True)
class Case:
    """One bad input: the federation it spoils (`npz`, `npy`, `png`), how it spoils its site,
    what the config adds, and what the error line must say: `where` (the row, manifest line or
    image; None where the fault is the whole file) and `fix` (text of the remedy)."""

    name: str
    what: str
    files: str
    spoil: Callable[[Path, int], None]  # (the federation's folder, the site to spoil)
    where: str | None  # IMAGE: the spoilt image's file name
    fix: str
    data: dict | None = None
    one_site: bool = True  # a single site's own files are at fault (drop leaves it out)
    manifest: bool = False
    site: int = 3


# ---------------------------------------------------------------------------------- the sites
def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 digits: (N, 8, 8) float32 in [0, 1] and int64 labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return (bunch.images / 16.0).astype(np.float32), bunch.target.astype(np.int64)


def site_rows() -> list[np.ndarray]:
    """Each site's rows of the digits: a seeded shuffle cut in SITES parts."""
    n = len(digits()[1])
    return np.array_split(np.random.default_rng(0).permutation(n), SITES)


def colour(x: np.ndarray) -> np.ndarray:
    """(N, 8, 8) in [0, 1] as (N, 8, 8, 3) uint8 pixels, tinted."""
    return np.round(x[..., None] * TINT * 255).astype(np.uint8)


def write_site(path: Path, x: np.ndarray, y: np.ndarray, files: str) -> None:
    """One site: an .npz (x (N, 8, 8) float32, y), a folder of x.npy and y.npy, or PNG folders."""
    if files == "npz":
        np.savez(path, x=x, y=y)
    elif files == "npy":
        path.mkdir(parents=True, exist_ok=True)
        np.save(path / "x.npy", x)
        np.save(path / "y.npy", y)
    else:
        write_pngs(path, colour(x), y)


def write_pngs(path: Path, pixels: np.ndarray, y: np.ndarray) -> None:
    from PIL import Image

    for i, (image, label) in enumerate(zip(pixels, y)):
        folder = path / "train" / str(int(label))
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(folder / f"{i:04d}.png")


def site_path(folder: Path, site: int, files: str) -> Path:
    return folder / (f"site{site}.npz" if files == "npz" else f"site{site}")


def write_federation(folder: Path, case: Case) -> Path:
    """The eight valid sites of `case.files`, site 3 then spoilt, and the case's config."""
    import yaml

    x, y = digits()
    labels: np.ndarray = np.array(CLASS_NAMES)[y] if case.data and "class_names" in case.data else y
    folder.mkdir(parents=True, exist_ok=True)
    for site, rows in enumerate(site_rows()):
        write_site(site_path(folder, site, case.files), x[rows], labels[rows], case.files)
    where = {"files": str(site_path(folder, 0, case.files)).replace("site0", "site{silo}")}
    if case.manifest:
        lines = ["silo,path", *(f"{s},{site_path(folder, s, case.files).name}" for s in range(SITES))]
        (folder / "manifest.csv").write_text("\n".join(lines) + "\n")
        where = {"manifest": str(folder / "manifest.csv")}
    case.spoil(folder, case.site)
    config = {
        "name": case.name,
        "seed": 0,
        "silos": SITES,
        "data": {"name": "silo_files", **where, **(case.data or {})},
        **JOB,
        "strategy": {"name": "fedavg"},
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# ---------------------------------------------------------------------------------- the cases
def _rewrite(folder: Path, site: int, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    """The site's .npz written again, its arrays changed."""
    path = folder / f"site{site}.npz"
    with np.load(path) as archive:
        arrays = {k: archive[k] for k in archive.files}
    change(arrays)
    np.savez(path, **arrays)


def _set(key: str, row: int, value: object, dtype: type | None = None) -> Callable[[dict[str, np.ndarray]], None]:
    def change(arrays: dict[str, np.ndarray]) -> None:
        if dtype is not None:
            arrays[key] = arrays[key].astype(dtype)
        arrays[key][row] = value

    return change


def missing_file(folder: Path, site: int) -> None:
    (folder / f"site{site}.npz").unlink()


def _cut(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)  # a copy cut off half-way


def truncated_npy(folder: Path, site: int) -> None:
    _cut(folder / f"site{site}" / "x.npy")


def damaged_npy_header(folder: Path, site: int) -> None:
    path = folder / f"site{site}" / "x.npy"
    data = bytearray(path.read_bytes())
    data[:16] = bytes(16)  # its magic string and header length zeroed
    path.write_bytes(bytes(data))


def damaged_npz(folder: Path, site: int) -> None:
    path = folder / f"site{site}.npz"
    data = bytearray(path.read_bytes())
    middle = len(data) // 3
    data[middle : middle + 64] = bytes(64)  # 64 bytes zeroed inside x's member: its CRC fails
    path.write_bytes(bytes(data))


def spoilt_image(folder: Path, site: int) -> Path:
    """The image the PNG cases spoil: the first of class 4."""
    return sorted((folder / f"site{site}" / "train" / "4").glob("*.png"))[0]


def truncated_png(folder: Path, site: int) -> None:
    _cut(spoilt_image(folder, site))


def nan_in_x(folder: Path, site: int) -> None:
    _rewrite(folder, site, _set("x", 57, np.nan))


def label_not_whole(folder: Path, site: int) -> None:
    _rewrite(folder, site, _set("y", 12, 3.5, np.float64))


def text_label_not_listed(folder: Path, site: int) -> None:
    _rewrite(folder, site, _set("y", 40, "eigth"))


def label_out_of_range(folder: Path, site: int) -> None:
    _rewrite(folder, site, _set("y", 7, 12))


def y_rows(folder: Path, site: int) -> None:
    def change(arrays: dict[str, np.ndarray]) -> None:
        arrays["y"] = arrays["y"][:-1]

    _rewrite(folder, site, change)


def manifest_missing(folder: Path, site: int) -> None:
    text = (folder / "manifest.csv").read_text()
    (folder / "manifest.csv").write_text(text.replace(f"site{site}.npz", f"sites/site{site}.npz"))


def _site_pngs(folder: Path, site: int, pixels: Callable[[np.ndarray], np.ndarray]) -> None:
    """The site written again as PNGs of `pixels(its float images)`."""
    x, y = digits()
    rows = site_rows()[site]
    shutil.rmtree(folder / f"site{site}")
    write_pngs(folder / f"site{site}", pixels(x[rows]), y[rows])


def larger_images(folder: Path, site: int) -> None:
    _site_pngs(folder, site, lambda x: colour(np.kron(x, np.ones((1, 2, 2), np.float32))))  # 16x16


def grey_site(folder: Path, site: int) -> None:
    _site_pngs(folder, site, lambda x: np.round(x[..., None] * 255).astype(np.uint8))


def one_larger_image(folder: Path, site: int) -> None:
    from PIL import Image

    path = spoilt_image(folder, site)
    with Image.open(path) as image:
        larger = image.resize((16, 16))
    larger.save(path)


CASES = [
    Case("missing_file", "site 3's .npz file is gone", "npz", missing_file, None, "put the data there"),
    Case("truncated_npy", "site 3's x.npy (memory-mapped) cut to half", "npy", truncated_npy, None, "copy it again"),
    Case("damaged_npy_header", "site 3's x.npy: its first 16 bytes zeroed", "npy", damaged_npy_header, None,
         "copy it again"),
    Case("damaged_npz", "64 bytes of site 3's .npz zeroed", "npz", damaged_npz, None, "copy it again"),
    Case("truncated_png", "a PNG inside site 3's folder cut to half", "png", truncated_png, IMAGE,
         "replace or remove it"),
    Case("nan_in_x", "x[57] of site 3 holds a NaN", "npz", nan_in_x, "x row 57", "fix or drop that row"),
    Case("label_not_whole", "y[12] of site 3 is 3.5", "npz", label_not_whole, "y row 12", "fix it"),
    Case("text_label_not_listed", "y[40] of site 3 is 'eigth', not in data.class_names", "npz",
         text_label_not_listed, "y row 40", "add it there, or fix that row", data={"class_names": CLASS_NAMES}),
    Case("label_out_of_range", "y[7] of site 3 is 12, data.classes 10", "npz", label_out_of_range, "y row 7",
         "fix it, or raise data.classes", data={"classes": 10}),
    Case("y_rows", "site 3's y has one row fewer than x", "npz", y_rows, None, "give one label per example"),
    Case("manifest_missing", "the manifest's line for site 3 names a missing file", "npz", manifest_missing,
         "line 5", "fix the path there", manifest=True),
    Case("image_size", "site 3's PNGs are 16x16, the others' 8x8", "png", larger_images, None, "data.image_size",
         one_site=False),
    Case("one_image_size", "one PNG of site 3 is 16x16, its others 8x8", "png", one_larger_image, IMAGE,
         "data.image_size"),
    Case("grey_site", "site 3's PNGs are grey, the others' colour", "png", grey_site, None, "data.channels",
         one_site=False),
    Case("grey_site_0", "site 0's PNGs are grey, the others' colour", "png", grey_site, None, "data.channels",
         one_site=False, site=0),
]  # fmt: skip


# ---------------------------------------------------------------------------------- one run
@dataclass(frozen=True)
class Outcome:
    case: str
    policy: str  # abort or drop
    code: int
    seconds: list[float]
    line: str  # the error line (abort), or the line naming the dropped site (drop)
    lines: int  # how many lines start with "cfl_mpi:" (abort: must be 1)
    names: dict[str, bool | None]  # site, file, where, fix (None: nothing to name)
    written: list[str]  # what the results folder holds (abort: must be nothing)
    dropped: list[str]  # summary.json's dropped silos (drop: must be the case's site)


def run(config: Path, out: Path, drop: bool) -> tuple[subprocess.CompletedProcess, float]:
    """`mpirun -n 9 python -m cfl_mpi.main config`, and its seconds from launch to exit."""
    shutil.rmtree(out, ignore_errors=True)
    sets = ["--set", "runtime.on_silo_failure=drop"] if drop else []
    cmd = [mpirun(), "-n", str(RANKS), sys.executable, "-m", "cfl_mpi.main", str(config), "--out", str(out), *sets]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return done, time.monotonic() - start


def named_files(folder: Path, case: Case) -> list[str]:
    """What the line must name as the file: the site's file or folder, and the file inside a
    folder by its path there (x.npy, train/4/0010.png), or the manifest."""
    site = site_path(folder, case.site, case.files)
    if case.where == IMAGE:
        return [str(site), str(spoilt_image(folder, case.site).relative_to(site))]
    if case.files == "npy" and case.one_site:
        return [str(site), "x.npy"]
    if case.manifest:
        return [str(folder / "sites" / site.name), str(folder / "manifest.csv")]
    return [str(site)]


def judge(case: Case, folder: Path, line: str) -> dict[str, bool | None]:
    """Whether `line` names the site (`silo 3 (its file or folder)`), the file (and the file
    inside a folder, or the manifest), the row, line or image, and the fix."""
    site = site_path(folder, case.site, case.files)
    where = str(spoilt_image(folder, case.site).relative_to(site)) if case.where == IMAGE else case.where
    files = named_files(folder, case)
    return {
        "site": f"silo {case.site} ({files[0]})" in line,
        "file": all(name in line for name in files),
        "where": None if where is None else where in line,
        "fix": case.fix in line,
    }


def measure(case: Case, root: Path, drop: bool, repeats: int) -> Outcome:
    folder = root / case.name
    shutil.rmtree(folder, ignore_errors=True)
    config = write_federation(folder, case)
    out = folder / ("run_drop" if drop else "run")
    seconds, done = [], None
    for _ in range(repeats):
        done, wall = run(config, out, drop)
        seconds.append(wall)
    assert done is not None
    console = (done.stdout + done.stderr).splitlines()
    said = [line for line in console if line.startswith("cfl_mpi:")]
    if drop and case.one_site:
        line = next((x for x in console if f"dropped silo {case.site} " in x), "")
    else:
        line = said[0] if said else (done.stderr.strip().splitlines() or [""])[-1]
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*")) if out.exists() else []
    summary = out / "summary.json"
    dropped = sorted(json.loads(summary.read_text()).get("dropped", {})) if summary.exists() else []
    return Outcome(case.name, "drop" if drop else "abort", done.returncode, seconds, line, len(said),
                   judge(case, folder, line), written, dropped)  # fmt: skip


# ---------------------------------------------------------------------------------- the table
def mark(value: bool | None) -> str:
    return "–" if value is None else "yes" if value else "**no**"


def verdict(case: Case, o: Outcome) -> str:
    """Whether the outcome is what the case asks for: under drop, a single site's files leave
    the run (exit 0, a line naming the site and its file, summary.json's dropped); else exit 2
    within LIMIT_S, one line naming all it should, nothing written."""
    if o.policy == "drop" and case.one_site:
        ok = o.code == 0 and bool(o.names["site"]) and o.dropped == [str(case.site)]
    else:
        named = all(v is not False for v in o.names.values())
        ok = o.code == 2 and o.lines == 1 and named and not o.written and max(o.seconds) <= LIMIT_S
    return "ok" if ok else "**FAIL**"


def table(outcomes: list[Outcome], root: Path) -> str:
    by_name = {c.name: c for c in CASES}
    columns = "case what policy exit seconds site file row/line/image fix written verdict line".split()
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for o in outcomes:
        case = by_name[o.case]
        secs = "/".join(f"{s:.1f}" for s in o.seconds)
        line = o.line.replace(str(root) + "/", "").replace("|", "\\|")
        written = (
            "nothing"
            if not o.written
            else f"a finished run (dropped: {', '.join(o.dropped) or 'none'})"
            if o.code == 0
            else f"**{len(o.written)} files**"
        )
        rows.append(
            f"| {o.case} | {case.what} | {o.policy} | {o.code} | {secs} | {mark(o.names['site'])} | "
            f"{mark(o.names['file'])} | {mark(o.names['where'])} | {mark(o.names['fix'])} | {written} | "
            f"{verdict(case, o)} | `{line}` |"
        )
    return "\n".join(rows)


def machine() -> str:
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    return f"{platform.node()}, {os.cpu_count()} cores, load average {load}, Python {platform.python_version()}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bad_inputs", description=__doc__.split("\n\n")[0])
    p.add_argument("--drop", action="store_true", help="also run each case under runtime.on_silo_failure: drop")
    p.add_argument("--out", type=Path, help="keep the sites, configs and results here (default: a temporary folder)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each case under abort (seconds of each shown)")
    p.add_argument("--only", nargs="+", choices=[c.name for c in CASES], help="these cases only")
    p.add_argument("--report", type=Path, help="also write the table, with the command and machine, to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases = [c for c in CASES if not args.only or c.name in args.only]
    command = "python -m benchmarks.bad_inputs " + " ".join(sys.argv[1:] if argv is None else argv)
    before = machine()
    root = args.out or Path(tempfile.mkdtemp(prefix="cfl_bad_inputs_"))
    outcomes = []
    try:
        for case in cases:
            for drop in (False, True) if args.drop else (False,):
                outcome = measure(case, root.resolve(), drop, 1 if drop else args.repeats)
                outcomes.append(outcome)
                print(f"{case.name} ({outcome.policy}): exit {outcome.code} after "
                      f"{'/'.join(f'{s:.1f}' for s in outcome.seconds)} s: {outcome.line}", flush=True)  # fmt: skip
        text = table(outcomes, root.resolve())
    finally:
        if args.out is None:
            shutil.rmtree(root, ignore_errors=True)
    by_name = {c.name: c for c in CASES}
    failed = sum(verdict(by_name[o.case], o) != "ok" for o in outcomes)
    report = (
        f"`{command.strip()}`\n\nMachine: {before} at the start; {machine()} at the end "
        f"(shared with other jobs).\n\n{text}\n\n{len(outcomes) - failed} of {len(outcomes)} as asked.\n"
    )
    print(report)
    if args.report:
        args.report.write_text(report)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
