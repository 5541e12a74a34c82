"""Programs at torch-dtr's edges: torch.compile regions, sparse gradients, a scope's BudgetError. Each either
works under the budget or says once, in a torch_dtr message, what is outside it."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import torch_dtr


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def _compiled_steps(backend: str, budget: object = "dtr-off") -> tuple[list[float], list[torch.Tensor], list[str], int]:
    model = _mlp()
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    cm = torch.compile(model, backend=backend)
    if budget != "dtr-off":
        torch_dtr.enable(budget=budget)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses = []
            for _ in range(2):
                loss = cm(x).sum()
                loss.backward()
                losses.append(loss.detach().item())
        ops = torch_dtr.stats().ops if budget != "dtr-off" else 0
    finally:
        torch_dtr.disable()
        torch._dynamo.reset()
    said = [str(w.message) for w in caught if "torch_dtr" in str(w.message)]
    return losses, [p.grad.clone() for p in model.parameters()] + [x.grad.clone()], said, ops


def test_a_compiled_region_with_the_eager_backend_is_traced_plain_and_run_managed():
    """NOTE [ Compiled regions ]: dynamo traced through the mode and failed inside torch-dtr
    (TorchRuntimeError making a fake tensor call); the mode now steps aside while dynamo traces."""
    want, want_grads, _, _ = _compiled_steps("eager")
    got, grads, said, ops = _compiled_steps("eager", "100MB")
    assert got == want and all(torch.equal(a, b) for a, b in zip(want_grads, grads, strict=True))
    assert ops > 0, "the compiled graph's aten calls ran through the mode, managed"
    assert len(said) == 1 and "torch.compile region" in said[0] and "not managed" in said[0]


@pytest.mark.slow
def test_a_region_compiled_by_inductor_runs_under_enable(dtr_front):
    """The compiled front end plans an inductor region against the budget, silently (NOTE [ Compiled regions
    under a budget ]); the Python front end runs it unmanaged and says so once."""
    from torch_dtr.inductor.region import made

    want, want_grads, _, _ = _compiled_steps("inductor")
    before = made()
    got, grads, said, _ = _compiled_steps("inductor", "100MB")
    assert got == want
    # inductor's own kernels differ from one compilation to the next by ~1e-6 here, so within a tolerance
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(want_grads, grads, strict=True))
    if dtr_front == "python":
        assert len(said) == 1 and "not managed" in said[0] and made() == before
    else:
        assert said == [] and made() > before


@pytest.mark.parametrize("budget", [None, "100MB", "4KB"])
def test_sparse_embedding_gradients_train_bitwise(budget):
    """nn.Embedding(sparse=True) crashed at any budget (sizing its sparse gradient on meta tensors); sparse
    tensors stay unmanaged (computed eagerly, never evicted, not counted), the rest is managed as usual."""
    def run(dtr: bool) -> tuple[list[torch.Tensor], object]:
        torch.manual_seed(0)
        emb, lin = torch.nn.Embedding(100, 8, sparse=True), torch.nn.Linear(8, 1)
        opt = torch.optim.SGD([*emb.parameters(), *lin.parameters()], lr=0.1)
        ids = torch.tensor([[1, 2, 3], [4, 5, 1]])
        if dtr:
            torch_dtr.enable(budget=budget)
        try:
            for _ in range(3):
                lin(emb(ids).tanh()).sum().backward()
                assert emb.weight.grad.layout == torch.sparse_coo
                opt.step()
                opt.zero_grad()
            return [p.detach().clone() for p in [*emb.parameters(), *lin.parameters()]], torch_dtr.stats()
        finally:
            if dtr:
                torch_dtr.disable()

    want, _ = run(False)
    got, st = run(True)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    assert st.ops > 0 and (budget is None or st.peak_bytes <= torch_dtr.parse_budget(budget))


def test_a_scopes_budget_error_suggests_a_scope_and_never_less_than_it_quotes():
    model = _mlp()
    x = torch.randn(256, 64)
    torch_dtr.enable(budget=None)
    try:
        model(x).sum().backward()
        with pytest.raises(torch_dtr.BudgetError) as e, torch_dtr.budget(4096):
            pass
    finally:
        torch_dtr.disable()
    msg = str(e.value)
    suggested = int(re.search(r"torch_dtr.budget\((\d+)\)", msg).group(1))
    floor = re.search(r"single-op floor so far is ([0-9.]+) (B|KiB|MiB)", msg)
    quoted = float(floor.group(1)) * {"B": 1, "KiB": 2**10, "MiB": 2**20}[floor.group(2)]
    assert suggested >= quoted, f"suggests {suggested} B below the floor it quotes: {msg}"
    assert "for a scope inside a running session" in msg


def test_torch_func_transforms_warn_once_that_their_work_is_outside_the_budget():
    """vmap(grad(f)) under a 1 MB budget made 64.5 MiB with stats().ops == 0 and no word (DP-SGD's per-sample
    gradients): still unmanaged, now said once per session."""
    from torch.func import functional_call, grad, vmap

    model = _mlp()
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p: dict, xi: torch.Tensor) -> torch.Tensor:
        return functional_call(model, p, (xi[None],)).sum()

    x = torch.randn(16, 64)
    want = vmap(grad(loss), in_dims=(None, 0))(params, x)
    torch_dtr.enable(budget="1MB")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = vmap(grad(loss), in_dims=(None, 0))(params, x)
            vmap(grad(loss), in_dims=(None, 0))(params, x)
    finally:
        torch_dtr.disable()
    said = [str(w.message) for w in caught if "torch_dtr" in str(w.message)]
    assert len(said) == 1 and "torch.func transforms" in said[0] and "outside torch-dtr's budget" in said[0]
    assert all(torch.equal(want[k], got[k]) for k in want)
    import torch._functorch.apis as apis

    assert apis.vmap_impl.__name__ == "vmap_impl", "disable() restores the transforms"


@pytest.mark.parametrize("budget", [None, "100KB"])
def test_spectra_without_vectors_are_bitwise_plain_under_no_grad(budget):
    """NOTE [ Spectra without vectors ]: under the Python front end svdvals took the vectors' LAPACK routine on a
    managed tensor (PyTorch treats any subclass as needing a gradient) and returned values 1e-5 from plain's."""
    torch.manual_seed(0)
    a = torch.randn(64, 48)
    s = a[:48] @ a[:48].T

    def spectra() -> list[torch.Tensor]:
        with torch.no_grad():
            b, c = a * 1, s * 1  # managed under no_grad (inference)
            return [torch.linalg.svdvals(b), torch.linalg.eigvalsh(c), torch.linalg.eigvalsh(c, UPLO="U")]

    want = spectra()
    orig = torch.linalg.svdvals
    torch_dtr.enable(budget=budget)
    try:
        got = [torch_dtr.unwrap(t) for t in spectra()]
        w = a.clone().requires_grad_()
        torch.linalg.svdvals(w * 1).sum().backward()  # with a gradient: the vectors, as plain computes them
    finally:
        torch_dtr.disable()
    assert torch.linalg.svdvals is orig, "the wrapper goes with the session"
    assert all(torch.equal(x, y) for x, y in zip(want, got, strict=True))
    w2 = a.clone().requires_grad_()
    torch.linalg.svdvals(w2 * 1).sum().backward()
    assert torch.equal(w.grad, w2.grad)
