"""Every data set by name: the one registry that config parsing, the server and the silos
read. A data set is one module with its parameters (a frozen dataclass subclassing
`DataConfig`, whose methods build one silo's `SiloData` from its own section and
`DataFacts`); a new one is that module plus one line here.

- rotated_digits, rotated_mnist, rotated_cifar10: a public source turned once per group (rotated.py);
- backdoor_mnist, backdoor_cifar10: a source in 3 groups, one carrying a backdoor (backdoor.py);
- pacs: one group per PACS domain (pacs.py);
- silo_files: each silo's own files, named per silo (silo_files.py).
"""

from __future__ import annotations

from .backdoor import BackdoorData
from .pacs import PacsData
from .rotated import RotatedData
from .silo_files import SiloFiles
from .spec import DataConfig, DataFacts, SiloData

REGISTRY: dict[str, type[DataConfig]] = {
    **dict.fromkeys(RotatedData.SOURCES, RotatedData),
    **dict.fromkeys(BackdoorData.SOURCES, BackdoorData),
    "pacs": PacsData,
    "silo_files": SiloFiles,
}

__all__ = ["REGISTRY", "BackdoorData", "DataFacts", "DataConfig", "PacsData", "RotatedData", "SiloData", "SiloFiles"]
