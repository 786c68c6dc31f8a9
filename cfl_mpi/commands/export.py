"""`python -m cfl_mpi.commands.export CONFIG --to DIR [--set key=value ...]`: a federation as per-silo files.

Writes each silo's data as the config's data set builds it (`silo_0000.npz`, ... with its
splits, model-ready), a `manifest.csv` naming each silo's file and its known group, and
`config.yaml`: the same experiment reading those files (`data.name: silo_files`). Running it
gives the built-in run's clusters, per-silo accuracies and distances: the way to check that a
federation of one's own is read as intended, and an example of the files a site brings.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
import yaml

from ..cli import config_error
from ..config import Config, ConfigError, experiment_dict, load_config

DESCRIPTION = "Write a federation's data as one file per silo, a manifest and a config that runs on them."


def export(cfg: Config, folder: Path) -> Path:
    """Write the silos' files, the manifest and the config into `folder`; returns the config's path."""
    if cfg.data.per_silo_files:
        raise ConfigError(f"data.name: {cfg.data.name} is already one file per silo (export a built-in data set)")
    facts = cfg.data_facts()
    cfg.data.check(facts)
    cfg.data.prepare(facts)
    folder.mkdir(parents=True, exist_ok=True)
    groups = cfg.data.groups(cfg.silos)
    rows = []
    for silo in range(cfg.silos):
        data = cfg.data.build(silo, facts)
        arrays = {
            f"{xy}_{split}": getattr(data, f"{xy}_{split}")
            for split in ("train", "val", "test", "backdoor")
            for xy in ("x", "y")
            if getattr(data, f"{xy}_{split}") is not None
        }
        name = f"silo_{silo:04d}.npz"
        np.savez(folder / name, **arrays)
        rows.append({"silo": silo, "path": name, **({} if groups is None else {"group": int(groups[silo])})})
    with (folder / "manifest.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    experiment = experiment_dict(cfg)
    experiment["name"] = f"{cfg.name}_files"
    group_clusters = cfg.data.group_clusters
    experiment["data"] = {
        "name": "silo_files",
        "manifest": str((folder / "manifest.csv").resolve()),
        "classes": cfg.data.num_classes(),
        **({"group_clusters": group_clusters} if group_clusters is not None else {}),
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(experiment, sort_keys=False))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cfl_mpi.commands.export", description=DESCRIPTION)
    parser.add_argument("config", help="YAML config of a built-in data set, e.g. configs/digits.yaml")
    parser.add_argument("--to", required=True, metavar="DIR", help="folder to write the silos' files into")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        path = export(load_config(args.config, args.overrides), Path(args.to))
    except ConfigError as err:
        config_error(str(err))
    print(
        f"wrote {args.to}: one .npz per silo, manifest.csv and {path.name} "
        f"(run it: python -m cfl_mpi.backends.simulate {path})"
    )


if __name__ == "__main__":
    main()
