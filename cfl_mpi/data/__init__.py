"""Every data set by name: the one registry that config parsing, the server and the silos
read. A new data set is one module with its parameters (a frozen dataclass subclassing
`DataParams`, whose methods build one silo's `SiloData`), plus one line here.

- rotated_digits, rotated_mnist, rotated_cifar10, backdoor_mnist, backdoor_cifar10, pacs: each
  silo's shard of a public benchmark (benchmarks.py);
- silo_files: each silo's own files, named per silo (silo_files.py).
"""

from __future__ import annotations

from .benchmarks import BENCHMARKS, BenchmarkData
from .silo_files import SiloFiles
from .spec import DataFacts, DataParams, SiloData

REGISTRY: dict[str, type[DataParams]] = {**dict.fromkeys(BENCHMARKS, BenchmarkData), "silo_files": SiloFiles}

__all__ = ["REGISTRY", "BenchmarkData", "DataFacts", "DataParams", "SiloData", "SiloFiles"]
