"""`runtime.silo_models: shared`: silos that continue from one model hold it once. A model that
shares its weights holds the received arrays themselves, training and loading give it copies
of its own first, and nothing writes into the shared arrays (a rank's silos would otherwise
train from each other's weights). A model of its own loads in place, as before."""

import numpy as np
import pytest
import torch
from jobs import simulate_job

from cfl_mpi.channel.local import read_only
from cfl_mpi.models.build import as_skeleton, hold_arrays, load_arrays, state_arrays, state_template
from cfl_mpi.models.simple_cnn import SimpleCNN
from cfl_mpi.training.batched import LocalTraining, train_together
from cfl_mpi.training.local import train_local
from cfl_mpi.training.params import TrainConfig

CPU = torch.device("cpu")
CFG = TrainConfig(local_epochs=2, lr=0.05, batch_size=16, momentum=0.9, weight_decay=5e-4)


def cnn() -> SimpleCNN:
    return SimpleCNN(1, 10, 28, channels=(4, 8), embedding_dim=16)


def skeleton() -> SimpleCNN:
    return as_skeleton(cnn)


def shared_model() -> dict[str, np.ndarray]:
    """A model's arrays as a channel hands them to the silos of a rank: read-only."""
    torch.manual_seed(0)
    return {k: read_only(v) for k, v in state_arrays(cnn()).items()}


def data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.normal(size=(40, 1, 28, 28)).astype(np.float32)), torch.from_numpy(
        rng.integers(0, 10, size=40)
    )


def holds(model: torch.nn.Module, arrays: dict[str, np.ndarray]) -> bool:
    """Whether every tensor of the model's state is the array of that name, not a copy of it."""
    return all(v.data_ptr() == arrays[k].ctypes.data for k, v in model.state_dict().items())


def test_models_handed_one_model_hold_its_arrays_until_training_takes_its_own_copy():
    theta = shared_model()
    before = {k: v.copy() for k, v in theta.items()}
    a, b = skeleton(), skeleton()
    assert all(p.is_meta for p in a.parameters())  # a skeleton holds no weights
    hold_arrays(a, theta, CPU)
    hold_arrays(b, theta, CPU)
    assert holds(a, theta) and holds(b, theta)

    reference = cnn()
    load_arrays(reference, theta)
    assert not holds(reference, theta)  # a copy of its own
    x, y = data(1)
    train_local(a, x, y, CFG, torch.Generator().manual_seed(3), CPU)
    train_local(reference, x, y, CFG, torch.Generator().manual_seed(3), CPU)

    assert all(np.array_equal(theta[k], before[k]) for k in theta)  # the shared arrays are untouched
    assert holds(b, theta) and not holds(a, theta)
    trained, expected = state_arrays(a), state_arrays(reference)
    assert all(np.array_equal(trained[k], expected[k]) for k in expected)  # the same bits as from a copy


def test_batched_training_and_loading_never_write_into_shared_arrays():
    theta = shared_model()
    before = {k: v.copy() for k, v in theta.items()}
    models = [skeleton() for _ in range(3)]
    for model in models:
        hold_arrays(model, theta, CPU)
    jobs = [LocalTraining(m, *data(i), torch.Generator().manual_seed(i)) for i, m in enumerate(models)]
    train_together(jobs, CFG, CPU)
    assert all(np.array_equal(theta[k], before[k]) for k in theta)
    assert not any(holds(m, theta) for m in models)

    hold_arrays(models[0], theta, CPU)
    load_arrays(models[0], {k: np.zeros_like(v) for k, v in theta.items()})  # e.g. a fault's NaN weights
    assert all(np.array_equal(theta[k], before[k]) for k in theta)


def test_a_model_of_its_own_loads_and_trains_in_its_own_memory():
    theta = shared_model()
    model = cnn()
    where = [p.data_ptr() for p in model.parameters()]
    hold_arrays(model, theta, CPU)
    train_local(model, *data(0), CFG, torch.Generator().manual_seed(0), CPU)
    assert [p.data_ptr() for p in model.parameters()] == where  # no allocation per round


def test_a_state_template_names_the_states_arrays_and_holds_no_memory():
    template, arrays = state_template(skeleton()), state_arrays(cnn())
    assert list(template) == list(arrays)
    assert all(t.dtype == a.dtype and t.shape == a.shape for t, a in zip(template.values(), arrays.values()))
    assert all(not any(t.strides) for t in template.values())  # one element each, broadcast


@pytest.mark.job
def test_a_job_whose_silos_share_their_models_gives_the_same_bits(tmp_path):
    """The quick start's shape on the digits, several silos a process (the simulator): the same
    clusters, accuracies and updates with shared models as with models of their own."""
    own, own_records = simulate_job("configs/digits.yaml", tmp_path / "own", "train.rounds=2")
    shared, shared_records = simulate_job(
        "configs/digits.yaml", tmp_path / "shared", "train.rounds=2", "runtime.silo_models=shared"
    )
    assert [r["accuracy"] for r in shared_records] == [r["accuracy"] for r in own_records]
    assert [r["clusters"] for r in shared_records] == [r["clusters"] for r in own_records]
    assert shared["avg_acc"] == own["avg_acc"]
