"""FlatAdam (ddprl.algos.graphs): the Adam step of the compiled regions, on flat buffers, must be
torch.optim.Adam's step and leave torch.optim.Adam's state behind (checkpoints load either way)."""

from __future__ import annotations

import copy
import io

import pytest
import torch

from ddprl.algos.graphs import FlatAdam


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Adam]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    groups = [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.05}]
    return model, torch.optim.Adam(groups, lr=0.01, betas=(0.8, 0.95), eps=1e-6)


def _grads(model: torch.nn.Module, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g) for p in model.parameters()]


def _torch_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grads: list[torch.Tensor]) -> None:
    for p, grad in zip(model.parameters(), grads, strict=True):
        p.grad = grad.clone()
    optimizer.step()


def _assert_same(model_a, opt_a, model_b, opt_b, atol=1e-6) -> None:
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(b, a, atol=atol, rtol=0)
    state_a, state_b = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
    assert state_a.keys() == state_b.keys()
    for i in state_a:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(
                torch.as_tensor(state_b[i][key]).float(), torch.as_tensor(state_a[i][key]).float(), atol=atol, rtol=0
            )


def test_flat_adam_steps_as_torch_adam_with_two_groups():
    model_a, opt_a = _model_and_optimizer()
    model_b, opt_b = _model_and_optimizer()
    flat = FlatAdam(opt_b)
    assert [p.shape for p in flat.params] == [p.shape for p in model_b.parameters()]
    for step in range(5):
        grads = _grads(model_a, step)
        _torch_step(model_a, opt_a, grads)
        flat.step_(flat.flatten(grads))
    _assert_same(model_a, opt_a, model_b, opt_b)
    assert not torch.allclose(model_a[2].weight, _model_and_optimizer()[0][2].weight)  # it did move


def test_flat_adam_state_loads_into_torch_adam_and_back():
    model_a, opt_a = _model_and_optimizer()
    flat_a = FlatAdam(opt_a)
    for step in range(3):
        flat_a.step_(flat_a.flatten(_grads(model_a, step)))
    checkpoint = io.BytesIO()
    torch.save({"model": model_a.state_dict(), "optimizer": opt_a.state_dict()}, checkpoint)

    def restored() -> tuple[torch.nn.Module, torch.optim.Adam]:
        checkpoint.seek(0)
        state = torch.load(checkpoint, weights_only=True)
        model, optimizer = _model_and_optimizer()
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        return model, optimizer

    # a plain torch.optim.Adam continues from FlatAdam's state; so does a FlatAdam re-homing it
    model_plain, opt_plain = restored()
    model_flat, opt_flat = restored()
    flat = FlatAdam(opt_flat)
    for step in range(3, 6):
        grads = _grads(model_plain, step)
        _torch_step(model_plain, opt_plain, grads)
        flat.step_(flat.flatten(grads))
    _assert_same(model_plain, opt_plain, model_flat, opt_flat)
    assert opt_flat.state_dict()["state"][0]["step"].item() == 6


def test_flat_adam_after_eager_torch_steps_keeps_their_state():
    model_a, opt_a = _model_and_optimizer()
    model_b = copy.deepcopy(model_a)
    opt_b = torch.optim.Adam(
        [{"params": model_b[0].parameters()}, {"params": model_b[2].parameters(), "lr": 0.05}],
        lr=0.01,
        betas=(0.8, 0.95),
        eps=1e-6,
    )
    for step in range(2):
        grads = _grads(model_a, step)
        _torch_step(model_a, opt_a, grads)
        _torch_step(model_b, opt_b, grads)
    flat = FlatAdam(opt_b)  # takes over mid-training
    for step in range(2, 4):
        grads = _grads(model_a, step)
        _torch_step(model_a, opt_a, grads)
        flat.step_(flat.flatten(grads))
    _assert_same(model_a, opt_a, model_b, opt_b)


def test_flat_adam_lr_tensors_follow_the_param_groups():
    model, optimizer = _model_and_optimizer()
    flat = FlatAdam(optimizer, lr_tensors=True)
    optimizer.param_groups[1]["lr"] = 0.5
    flat.sync_lr()
    assert [float(g["lr"]) for g in flat.groups] == pytest.approx([0.01, 0.5])  # float32 on the device
    assert all(isinstance(t, torch.Tensor) for t in flat.tensors())


def test_flat_adam_refuses_what_it_does_not_implement():
    model, _ = _model_and_optimizer()
    with pytest.raises(ValueError, match="plain Adam"):
        FlatAdam(torch.optim.Adam(model.parameters(), weight_decay=0.1))
    flat = FlatAdam(torch.optim.Adam(model.parameters()))
    with pytest.raises(ValueError, match="3 gradients for 4 parameters"):
        flat.flatten(_grads(model, 0)[:3])


def test_clip_grad_scales_to_the_norm_by_hand():
    from ddprl.algos.graphs import clip_grad

    clipped, norm = clip_grad(torch.tensor([3.0, 4.0]), 1.0)  # norm 5: scaled by 1 / 5
    assert float(norm) == 5.0
    torch.testing.assert_close(clipped, torch.tensor([0.6, 0.8]), rtol=1e-5, atol=0)
    small, norm = clip_grad(torch.tensor([0.3, 0.4]), 1.0)  # within the bound: as it was
    assert float(norm) == pytest.approx(0.5) and torch.equal(small, torch.tensor([0.3, 0.4]))
