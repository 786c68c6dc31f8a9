"""The EMD-CFL paper's published figures (Zhang, Williams, Toni, "Clustered Federated Learning
via Embedding Distributions"), transcribed for `cfl_mpi.experiments.reproduce`.

Only the methods cfl_mpi implements are transcribed. Each value is (mean, std) over the
paper's seeds, accuracies in %, as printed. A block is one data set's columns of a table.
"""

from __future__ import annotations

from dataclasses import dataclass

Figure = tuple[float, float]


@dataclass(frozen=True)
class PaperBlock:
    """One data set's columns of a paper table: {method: {column: (mean, std)}}."""

    title: str
    source: str  # where in the EMD-CFL paper
    columns: tuple[str, ...]  # summary keys: avg_acc, worst_acc, ari, target_clean_acc, target_backdoor_acc
    figures: dict[str, dict[str, Figure]]


def _block(title: str, source: str, columns: tuple[str, ...], **methods: tuple) -> PaperBlock:
    """A block from each method's values in column order; None where the paper prints "-"
    (no clustering)."""
    return PaperBlock(
        title,
        source,
        columns,
        {m: {c: v for c, v in zip(columns, values) if v is not None} for m, values in methods.items()},
    )


ACC = ("avg_acc", "worst_acc", "ari")
BACKDOOR = ("target_clean_acc", "target_backdoor_acc", "ari")
PARTIAL = ("avg_acc", "ari")

TABLE_1_MNIST = _block(
    "Rotated MNIST",
    "Table 1, left",
    ACC,
    oracle=((98.86, 0.05), (97.58, 0.26), (1.00, 0.00)),
    emdcfl=((98.86, 0.04), (97.58, 0.26), (1.00, 0.00)),
    cfl=((98.62, 0.33), (96.97, 0.95), (0.90, 0.14)),
    pacfl=((98.86, 0.02), (97.73, 0.00), (1.00, 0.00)),
    ifca=((98.44, 0.33), (96.67, 0.95), (0.80, 0.14)),
    fedavg=((91.04, 0.12), (86.67, 0.69), None),
)
TABLE_1_CIFAR = _block(
    "Rotated CIFAR10",
    "Table 1, right",
    ACC,
    oracle=((94.83, 0.02), (93.03, 0.38), (1.00, 0.00)),
    emdcfl=((94.84, 0.09), (93.03, 0.14), (1.00, 0.00)),
    cfl=((90.10, 1.44), (87.55, 1.34), (0.00, 0.00)),
    pacfl=((94.30, 0.09), (80.50, 0.95), (0.93, 0.00)),
    ifca=((92.14, 0.68), (89.25, 1.06), (0.44, 0.18)),
    fedavg=((90.09, 1.38), (87.80, 1.84), None),
)
# Table 3 prints the clustering methods; Table 8 repeats it and adds FedAvg.
TABLE_3_MNIST = _block(
    "Backdoor MNIST",
    "Table 3 / Table 8, left",
    BACKDOOR,
    oracle=((98.37, 0.11), (98.27, 0.16), (1.00, 0.00)),
    emdcfl=((98.40, 0.04), (98.30, 0.06), (1.00, 0.00)),
    cfl=((98.43, 0.07), (95.98, 1.39), (0.46, 0.02)),
    pacfl=((95.55, 0.14), (81.55, 1.45), (0.42, 0.00)),
    ifca=((98.54, 0.05), (98.15, 0.14), (0.55, 0.00)),
    fedavg=((97.19, 0.29), (88.49, 1.39), None),
)
TABLE_3_CIFAR = _block(
    "Backdoor CIFAR10",
    "Table 3 / Table 8, right",
    BACKDOOR,
    oracle=((97.89, 0.12), (97.63, 0.06), (1.00, 0.00)),
    emdcfl=((97.84, 0.23), (97.73, 0.32), (1.00, 0.00)),
    cfl=((92.37, 0.27), (39.94, 4.85), (0.00, 0.00)),
    pacfl=((97.71, 0.11), (84.57, 3.13), (0.53, 0.00)),
    ifca=((97.62, 0.14), (77.69, 4.06), (0.53, 0.00)),
    fedavg=((92.17, 0.24), (35.07, 5.25), None),
)
TABLE_6 = {  # Appendix E.4: {participants of 40: (MNIST block, CIFAR10 block)}
    n: (
        _block(f"Rotated MNIST, {n} of 40 silos per round", f"Table 6, {n}", PARTIAL, oracle=mo, emdcfl=me),
        _block(f"Rotated CIFAR10, {n} of 40 silos per round", f"Table 6, {n}", PARTIAL, oracle=co, emdcfl=ce),
    )
    for n, mo, me, co, ce in (
        (
            10,
            ((93.62, 2.12), (0.93, 0.03)),
            ((93.70, 2.11), (0.93, 0.03)),
            ((88.15, 2.00), (0.93, 0.03)),
            ((88.18, 1.93), (0.93, 0.03)),
        ),
        (
            20,
            ((98.54, 0.09), (1.00, 0.00)),
            ((98.52, 0.03), (1.00, 0.00)),
            ((93.88, 0.06), (1.00, 0.00)),
            ((93.86, 0.06), (1.00, 0.00)),
        ),
        (
            30,
            ((98.75, 0.03), (1.00, 0.00)),
            ((98.74, 0.04), (1.00, 0.00)),
            ((94.47, 0.11), (1.00, 0.00)),
            ((94.55, 0.04), (1.00, 0.00)),
        ),
    )
}
TABLE_10 = {  # rotated MNIST variants (Appendix E.9)
    "min": _block(
        "Rotated MNIST Min [-3, -1, 1, 3]",
        "Table 10, Min",
        ACC,
        oracle=((98.84, 0.03), (97.58, 0.26), (1.00, 0.00)),
        emdcfl=((98.85, 0.02), (97.42, 0.26), (1.00, 0.00)),
        cfl=((98.85, 0.02), (97.58, 0.26), (0.67, 0.47)),
        pacfl=((98.85, 0.02), (97.58, 0.26), (1.00, 0.00)),
        ifca=((98.84, 0.06), (97.42, 0.52), (0.00, 0.00)),
        fedavg=((98.86, 0.02), (97.58, 0.26), None),
    ),
    "two": _block(
        "Rotated MNIST Two [-3, 3, 177, 183]",
        "Table 10, Two",
        ACC,
        oracle=((98.87, 0.02), (97.73, 0.45), (1.00, 0.00)),
        emdcfl=((98.86, 0.06), (97.27, 0.00), (1.00, 0.00)),
        cfl=((94.83, 4.02), (89.39, 8.41), (0.33, 0.47)),
        pacfl=((98.87, 0.01), (97.73, 0.45), (1.00, 0.00)),
        ifca=((98.89, 0.03), (97.88, 0.26), (1.00, 0.00)),
        fedavg=((91.73, 3.14), (82.58, 6.17), None),
    ),
    "base": _block(
        "Rotated MNIST Base [0, 0, 0, 0]",
        "Table 10, Base",
        ACC,
        oracle=((98.87, 0.06), (97.58, 0.26), (1.00, 0.00)),
        emdcfl=((98.86, 0.05), (97.58, 0.26), (1.00, 0.00)),
        cfl=((98.89, 0.06), (97.58, 0.26), (0.67, 0.47)),
        pacfl=((98.89, 0.07), (97.58, 0.26), (1.00, 0.00)),
        ifca=((98.87, 0.01), (97.42, 0.52), (0.00, 0.00)),
        fedavg=((98.87, 0.07), (97.58, 0.26), None),
    ),
}
TABLE_11 = {  # rotated CIFAR10 variants (Appendix E.9)
    "min": _block(
        "Rotated CIFAR10 Min [-3, -1, 1, 3]",
        "Table 11, Min",
        ACC,
        oracle=((95.68, 0.03), (93.73, 0.40), (1.00, 0.00)),
        emdcfl=((95.72, 0.11), (93.50, 0.28), (1.00, 0.00)),
        cfl=((95.79, 0.17), (93.80, 0.00), (1.00, 0.00)),
        pacfl=((95.53, 0.03), (93.13, 0.50), (0.00, 0.00)),
        ifca=((95.68, 0.02), (93.35, 0.35), (1.00, 0.00)),
        fedavg=((95.75, 0.12), (93.60, 0.00), None),
    ),
    "two": _block(
        "Rotated CIFAR10 Two [-3, 3, 177, 183]",
        "Table 11, Two",
        ACC,
        oracle=((94.63, 0.03), (92.60, 0.20), (1.00, 0.00)),
        emdcfl=((94.62, 0.27), (92.65, 0.64), (1.00, 0.00)),
        cfl=((92.48, 1.12), (90.35, 1.06), (0.00, 0.00)),
        pacfl=((94.01, 0.07), (92.13, 0.15), (0.42, 0.00)),
        ifca=((93.22, 2.01), (90.95, 2.47), (0.50, 0.50)),
        fedavg=((92.54, 0.96), (90.15, 0.64), None),
    ),
    "base": _block(
        "Rotated CIFAR10 Base [0, 0, 0, 0]",
        "Table 11, Base",
        ACC,
        oracle=((96.34, 0.05), (95.17, 0.15), (1.00, 0.00)),
        emdcfl=((96.26, 0.10), (95.10, 0.14), (1.00, 0.00)),
        cfl=((96.23, 0.03), (95.10, 0.00), (1.00, 0.00)),
        pacfl=((96.31, 0.09), (95.33, 0.21), (1.00, 0.00)),
        ifca=((96.29, 0.03), (95.20, 0.14), (1.00, 0.00)),
        fedavg=((96.20, 0.04), (95.05, 0.07), None),
    ),
}
