"""Every model the EMD-CFL paper uses (Appendix D.2 and E.3): embedding size, head, the split,
weights from a file or torch's cache."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from config_files import config_from

from cfl_mpi.config import ConfigError
from cfl_mpi.models.build import WeightsError, build_model, prepare_weights

EMBEDDING_DIMS = {"resnet18": 512, "resnet50": 2048, "efficientnet_b3": 1536, "vit_b_16": 768, "convnext_base": 1024}


def config(tmp_path, silos=3, data=None, **model):
    """A config of `model` settings (CIFAR-10 shaped data unless given)."""
    return config_from(
        tmp_path, {"silos": silos, "data": data or {"name": "backdoor_cifar10", "root": "x"}, "model": model}
    )


@pytest.mark.parametrize("name", sorted(EMBEDDING_DIMS))
def test_embedding_size_head_and_split(tmp_path, name):
    torch.set_num_threads(1)
    cfg = config(tmp_path, name=name, input_size=32)  # tiny inputs; the paper's default is 224
    assert cfg.model.embedding_dim == EMBEDDING_DIMS[name]
    torch.manual_seed(0)
    model = build_model(cfg.architecture).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        z = model.embedding(x)
        logits = model(x)
        assert z.shape == (2, EMBEDDING_DIMS[name]) and logits.shape == (2, 10)
        torch.testing.assert_close(model.head(z), logits)
    assert not any(k.startswith("embedding.") for k in model.head.state_dict())


def test_defaults_resize_to_224_and_check_sizes(tmp_path):
    cfg = config(tmp_path, name="resnet18")
    assert (cfg.model.input_size, cfg.data.image_size, cfg.model.pretrained) == (224, 32, False)
    model = build_model(cfg.architecture).eval()
    seen = []
    model.embedding.net.conv1.register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))  # the silo keeps 32x32 images; the device sees 224x224
    assert seen == [(1, 3, 224, 224)]
    for model_set, field in [
        ({"name": "resnet18", "embedding_dim": 128}, "model.embedding_dim: resnet18's embedding has 512"),
        ({"name": "vit_b_16", "input_size": 40}, "model.input_size: vit_b_16 needs a multiple of 16"),
        ({"name": "vit_b_16", "input_size": 32, "pretrained": True}, "model.input_size: vit_b_16's weights"),
        ({"name": "simple_cnn", "pretrained": True}, "model.pretrained: torchvision has no weights"),
        ({"name": "simple_cnn", "input_size": 64}, "model.input_size: the simple CNN is built"),
    ]:
        with pytest.raises(ConfigError) as err:
            config(tmp_path, **model_set)
        assert str(err.value).startswith(field) and "\n" not in str(err.value)


def test_simple_cnn_takes_the_data_channels(tmp_path):
    cfg = config(tmp_path, data={"name": "backdoor_mnist", "root": "x"}, name="simple_cnn")
    model = build_model(cfg.architecture)
    assert model(torch.randn(2, 3, 28, 28)).shape == (2, 10) and model.embedding(torch.randn(1, 3, 28, 28)).shape == (
        1,
        128,
    )


def test_pretrained_path_loads_a_torchvision_weights_file(tmp_path):
    from torchvision.models import resnet18

    torch.manual_seed(1)
    reference = resnet18(weights=None)  # torchvision's own keys and its 1000-class head
    torch.save(reference.state_dict(), tmp_path / "resnet18.pth")
    cfg = config(tmp_path, name="resnet18", input_size=32, pretrained=str(tmp_path / "resnet18.pth"))
    torch.manual_seed(2)
    model = build_model(cfg.architecture)
    for key, value in reference.state_dict().items():
        if not key.startswith("fc."):
            torch.testing.assert_close(model.embedding.net.state_dict()[key], value)
    assert model.head.weight.shape == (10, 512)  # a fresh head for 10 classes
    # Silos skip the file: θ(0) comes from the server.
    fresh = build_model(cfg.architecture, load_weights=False)
    assert not torch.equal(fresh.embedding.net.conv1.weight, reference.conv1.weight)


def test_pretrained_path_loads_a_cfl_mpi_model_with_its_head(tmp_path):
    cfg = config(tmp_path, name="efficientnet_b3", input_size=32)
    torch.manual_seed(3)
    trained = build_model(cfg.architecture)
    torch.save(trained.state_dict(), tmp_path / "model.pt")
    loaded = build_model(
        config(tmp_path, name="efficientnet_b3", input_size=32, pretrained=str(tmp_path / "model.pt")).architecture
    )
    for key, value in trained.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value)


def test_weights_that_do_not_fit_are_one_config_error(tmp_path):
    from torchvision.models import resnet50

    torch.save(resnet50(weights=None).state_dict(), tmp_path / "resnet50.pth")
    cfg = config(tmp_path, name="resnet18", input_size=32, pretrained=str(tmp_path / "resnet50.pth"))
    with pytest.raises(WeightsError):
        build_model(cfg.architecture)
    with pytest.raises(ConfigError) as err:
        prepare_weights(cfg.architecture)
    assert str(err.value).startswith(f"model.pretrained: {tmp_path / 'resnet50.pth'} does not fit resnet18's embedding")
    (tmp_path / "bad.pth").write_bytes(b"not a weights file")
    with pytest.raises(ConfigError, match=r"^model.pretrained: cannot load weights from .*bad.pth"):
        prepare_weights(
            config(tmp_path, name="resnet18", input_size=32, pretrained=str(tmp_path / "bad.pth")).architecture
        )


def test_pretrained_true_reads_torchs_cache_without_network(tmp_path):
    """torchvision's weights file, already in torch's cache, is used without any download."""
    from torchvision.models import resnet18

    hub = tmp_path / "hub"
    (hub / "checkpoints").mkdir(parents=True)
    torch.manual_seed(4)
    reference = resnet18(weights=None)
    torch.save(reference.state_dict(), hub / "checkpoints" / "resnet18-f37072fd.pth")
    before = torch.hub.get_dir()
    torch.hub.set_dir(str(hub))
    try:
        model = build_model(config(tmp_path, name="resnet18", input_size=32, pretrained=True).architecture)
    finally:
        torch.hub.set_dir(before)
    torch.testing.assert_close(model.embedding.net.layer4[1].conv2.weight, reference.layer4[1].conv2.weight)


def test_the_server_imports_torchvision_only_for_torchvision_models():
    code = (
        "import sys; from cfl_mpi.config import Config; from cfl_mpi.models.build import initial_model; "
        "c = Config(); initial_model(c.architecture, c.seed); print('torchvision' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_batchnorm_state_round_trips_with_its_scalar_counter(tmp_path):
    """num_batches_tracked is 0-d; the wire keeps it 0-d (tests/wire/test_wire.py), and so do we."""
    import numpy as np

    from cfl_mpi.models.build import load_arrays, state_arrays

    model = build_model(config(tmp_path, name="resnet18", input_size=32).architecture)
    arrays = state_arrays(model)
    assert arrays["embedding.net.bn1.num_batches_tracked"].shape == ()
    arrays["embedding.net.bn1.num_batches_tracked"] = np.array(7)
    load_arrays(model, arrays)
    assert (
        model.embedding.net.bn1.num_batches_tracked.shape == ()
        and int(model.embedding.net.bn1.num_batches_tracked) == 7
    )


def test_pretrained_true_without_cache_or_network_is_one_config_error(tmp_path, monkeypatch):
    from urllib.error import URLError

    def offline(url, dst, *args, **kwargs):
        raise URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)  # never touch the network in tests
    before = torch.hub.get_dir()
    torch.hub.set_dir(str(tmp_path / "empty_hub"))
    try:
        with pytest.raises(ConfigError) as err:
            prepare_weights(config(tmp_path, name="resnet18", input_size=32, pretrained=True).architecture)
    finally:
        torch.hub.set_dir(before)
    message = str(err.value)
    assert message.startswith(
        "model.pretrained: torchvision's resnet18 weights are not in torch's cache "
        f"({tmp_path / 'empty_hub' / 'checkpoints' / 'resnet18-f37072fd.pth'})"
    )
    assert "URLError" in message and "python -m cfl_mpi.commands.prepare" in message and "\n" not in message


@pytest.mark.parametrize("pools,side", [(2, 28), (1, 28), (2, 30)])  # 30: an odd map (15) to pool
def test_simple_cnn_inference_equals_the_plain_forward_bit_for_bit(pools, side):
    """The CPU inference path (chunks, ReLU + max-pool as strided maxima) gives exactly what
    training's plain forward gives, at every batch size around the chunk boundaries (speed
    work must not move W)."""
    from torch import nn

    from cfl_mpi.models.simple_cnn import ConvEmbedding, SimpleCNN

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = SimpleCNN(1, 10, side, channels=(16, 32), pools=pools)
    x = torch.rand(2 * ConvEmbedding.CHUNK + 9, 1, side, side) - 0.5  # negative inputs: the ReLUs matter
    chunk = ConvEmbedding.CHUNK
    for n in (1, 2, 7, chunk - 1, chunk, chunk + 1, 2 * chunk - 1, 2 * chunk, len(x)):
        with torch.no_grad():
            plain = nn.Sequential.forward(net.embedding, x[:n])
            assert torch.equal(net.embedding(x[:n]), plain), n
            assert torch.equal(net(x[:n]), net.head(plain)), n
    with torch.enable_grad():  # training takes the plain path, autograd and all
        z = net.embedding(x[:3])
        assert z.requires_grad
