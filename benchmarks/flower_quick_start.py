"""Flower beside cfl_mpi on the quick start's FedAvg: the same silos, model, local training,
rounds and evaluation, so that only the framework differs.

    python -m benchmarks.flower_quick_start [--config configs/digits.yaml] [--repeats 3]
        [--flower-python PY] [--out DIR]

Flower (Beutel et al., "Flower: A Friendly Federated Learning Framework", arXiv 2007.14390)
runs as a simulation (`flwr.simulation.run_simulation`, Ray actors): its `ClientApp` builds
silo k's data with cfl_mpi's own data set, model and seeded local training (`train_local`,
the generator seeded as a cfl_mpi silo seeds it), its `ServerApp` runs Flower's `FedAvg`
(weighted by training examples, as cfl_mpi's fedavg rule) from cfl_mpi's θ(0), and every
silo evaluates the aggregated model on its own test set each round (the accuracy: the
silos' mean, cfl_mpi's avg_acc). Two Ray settings: Flower's default (each actor 2 CPUs: one
actor on 2 cores) and two actors of one CPU. cfl_mpi: `mpirun -n 9` (one silo a rank),
`mpirun -n 3` (the server and two ranks: as many processes as Flower's two actors and its
driver) and the in-process simulator. Flower is not a dependency of cfl_mpi: PY is a Python
with `flwr[simulation]`, torch and this checkout importable (default: this one). Interleaved
repeats; medians of the whole command's wall time, of seconds per round after the first, and
of the peak PSS of the command's process tree. Writes `flower.md` in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from .runs import ROOT, machine, mpirun, run_watched

FEDAVG = ["strategy.name=fedavg"]
FLOWER = {"flower_default": 2.0, "flower_2_actors": 1.0}  # CPUs per Ray actor


def flower_app(config: str, cpus_per_actor: float, out: Path) -> None:
    """The quick start's FedAvg as a Flower simulation; writes each round's end time and mean
    accuracy to `out` (JSON)."""
    import numpy as np
    import torch
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    from cfl_mpi.config import load_config
    from cfl_mpi.models.build import build_model, initial_model, load_arrays
    from cfl_mpi.training.local import evaluate, train_local

    cfg = load_config(config, overrides=FEDAVG)
    cpu = torch.device("cpu")
    silos: dict[int, object] = {}  # an actor's silos' data, built once (a cfl_mpi rank does the same)

    def silo_of(context: Context):
        k = int(context.node_config["partition-id"])
        if k not in silos:
            silos[k] = cfg.data.build(k, cfg.data_facts())
        return k, silos[k]

    def model_of(msg: Message) -> torch.nn.Module:
        model = build_model(cfg.architecture, load_weights=False)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        return model

    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        k, data = silo_of(context)
        t = int(msg.content["config"]["server-round"])
        model = model_of(msg)
        seed = int(np.random.SeedSequence([cfg.seed, k, t]).generate_state(1)[0])  # as runtime/silo.py
        train_local(model, data.x_train, data.y_train, cfg.train, torch.Generator().manual_seed(seed), cpu)
        content = {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"num-examples": len(data.y_train)}),
        }
        return Message(content=RecordDict(content), reply_to=msg)

    @client.evaluate()
    def test(msg: Message, context: Context) -> Message:
        k, data = silo_of(context)
        accuracy, loss = evaluate(model_of(msg), data.x_test, data.y_test, cpu)
        metrics = {"accuracy": accuracy, "loss": loss, "silo": k, "num-examples": len(data.y_test)}
        return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)

    rounds: list[dict] = []

    def mean_accuracy(replies: list[RecordDict], key: str) -> MetricRecord:
        """The silos' mean accuracy (cfl_mpi's avg_acc), and when the round ended."""
        accuracy = {int(r["metrics"]["silo"]): float(r["metrics"]["accuracy"]) for r in replies}
        rounds.append({"end": time.time(), "accuracy": [accuracy[k] for k in sorted(accuracy)]})
        return MetricRecord({"accuracy": float(np.mean(list(accuracy.values())))})

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        start = build_model(cfg.architecture, load_weights=False)
        load_arrays(start, initial_model(cfg.architecture, cfg.seed))  # θ(0), as cfl_mpi's server sends it
        strategy = FedAvg(
            min_train_nodes=cfg.silos,
            min_evaluate_nodes=cfg.silos,
            min_available_nodes=cfg.silos,
            evaluate_metrics_aggr_fn=mean_accuracy,
        )
        strategy.start(grid=grid, initial_arrays=ArrayRecord(start.state_dict()), num_rounds=cfg.train.rounds)

    resources = {"client_resources": {"num_cpus": cpus_per_actor, "num_gpus": 0.0}}
    run_simulation(server_app=server, client_app=client, num_supernodes=cfg.silos, backend_config=resources)
    out.write_text(json.dumps(rounds))


def commands(config: str, flower_python: str, scratch: Path) -> dict[str, list[str]]:
    sets = [a for s in FEDAVG for a in ("--set", s)]
    ours = {
        "cfl_mpi_mpirun_9": [mpirun(), "-n", "9", sys.executable, "-m", "cfl_mpi.main", config],
        "cfl_mpi_mpirun_3": [mpirun(), "-n", "3", sys.executable, "-m", "cfl_mpi.main", config],
        "cfl_mpi_simulator": [sys.executable, "-m", "cfl_mpi.backends.simulate", config],
    }
    flower = {
        name: [flower_python, "-m", "benchmarks.flower_quick_start", "--app", str(cpus), "--config", config]
        for name, cpus in FLOWER.items()
    }
    return {
        **{name: [*cmd, "--out", str(scratch / name), "--overwrite", *sets] for name, cmd in ours.items()},
        **{name: [*cmd, "--out", str(scratch / f"{name}.json")] for name, cmd in flower.items()},
    }


def outcome(name: str, scratch: Path) -> tuple[list[float], float]:
    """Seconds of each round after the first, and the final mean accuracy."""
    if name.startswith("flower"):
        rounds = json.loads((scratch / f"{name}.json").read_text())
        ends = [r["end"] for r in rounds]
        return [b - a for a, b in zip(ends, ends[1:])], statistics.fmean(rounds[-1]["accuracy"])
    records = [json.loads(line) for line in (scratch / name / "metrics.jsonl").read_text().splitlines()]
    return [sum(r["seconds"].values()) for r in records[1:]], records[-1]["avg_acc"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/digits.yaml")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--flower-python", default=sys.executable, help="a Python with flwr[simulation] and torch")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--app", type=float, help=argparse.SUPPRESS)  # run the Flower app: CPUs per actor
    args = parser.parse_args(argv)
    if args.app is not None:
        flower_app(args.config, args.app, args.out)
        return
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    seen: dict[str, list[tuple[float, float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="cfl_flower_") as tmp:
        scratch = Path(tmp)
        cmds = commands(args.config, args.flower_python, scratch)
        for repeat in range(args.repeats):
            for name, cmd in cmds.items():
                _, wall, pss = run_watched(cmd, ROOT, env)
                later, accuracy = outcome(name, scratch)
                seen.setdefault(name, []).append((wall, statistics.median(later), pss, accuracy))
                print(f"repeat {repeat}: {name}: {wall:.1f} s, {statistics.median(later):.2f} s a round, "
                      f"{pss:.0f} MB, accuracy {100 * accuracy:.2f}", flush=True)  # fmt: skip
    med = {name: [statistics.median(x[i] for x in runs) for i in range(4)] for name, runs in seen.items()}
    tuned = med["flower_2_actors"]
    rows = [
        f"| {name} | {w:.1f} | {w / tuned[0]:.2f} | {r:.2f} | {p:.0f} | {p / tuned[2]:.2f} | {100 * a:.2f} |"
        for name, (w, r, p, a) in med.items()
    ]
    shown = {name: " ".join(cmd).replace(str(scratch), "$TMP") for name, cmd in cmds.items()}
    report = "\n".join(
        [
            f"# Flower beside cfl_mpi: the quick start's FedAvg ({args.config})",
            "",
            f"Medians of {args.repeats} interleaved runs. Machine: {machine()}. Flower: `{args.flower_python}`.",
            "",
            "| command | whole command s | ÷ Flower 2 actors | s a round after the first | peak PSS MB "
            "| ÷ Flower 2 actors | accuracy % |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
            "Commands (run from the repository root, `OMP_NUM_THREADS=1`):",
            "",
            *(f"- {name}: `{cmd}`" for name, cmd in shown.items()),
            "",
        ]
    )  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "flower.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
