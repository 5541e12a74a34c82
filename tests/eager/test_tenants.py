"""Two models trained side by side in one session, each a tenant with its share of the budget
(NOTE [ Tenants ]); the total is halved and restored while they train."""

from __future__ import annotations

import pytest
import torch

import torch_dtr

STEPS = 6


def _pair() -> tuple[list[torch.nn.Module], list[torch.optim.Optimizer], list[torch.Tensor]]:
    torch.manual_seed(0)
    models = [torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh()) for _ in range(8)])
              for _ in range(2)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    xs = [torch.randn(256, 64, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    return models, opts, xs


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> float:
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach().item()


def _plain() -> tuple[list[list[float]], list[list[torch.Tensor]]]:
    models, opts, xs = _pair()
    losses: list[list[float]] = [[], []]
    for _ in range(STEPS):
        for i in range(2):
            losses[i].append(_step(models[i], opts[i], xs[i]))
    return losses, [[p.detach().clone() for p in m.parameters()] for m in models]


def test_two_models_as_tenants_train_bitwise_within_their_shares_while_the_total_moves():
    want, want_params = _plain()
    models, opts, xs = _pair()
    # the unbudgeted peak of one model's step, for a total that makes both evict
    torch_dtr.enable(budget=None)
    with torch_dtr.tenant("a"):
        _step(models[0], opts[0], xs[0])
    one = torch_dtr.stats("a").peak_bytes
    torch_dtr.disable()
    models, opts, xs = _pair()
    total = int(one * 1.8)  # three shares (the session, a, b): each tenant gets 60% of one model's peak
    torch_dtr.enable(budget=total)
    try:
        for name in "ab":  # both tenants first: a tenant that joins later shrinks the others' shares then
            with torch_dtr.tenant(name, share=1):
                pass
        losses: list[list[float]] = [[], []]
        budgets = []
        for step in range(STEPS):
            scope = torch_dtr.budget(int(total * 0.8)) if step in (2, 3) else None  # the total shrinks, comes back
            if scope is not None:
                scope.__enter__()
            try:
                for i, name in enumerate("ab"):
                    with torch_dtr.tenant(name):
                        losses[i].append(_step(models[i], opts[i], xs[i]))
                budgets.append((torch_dtr.stats("a").budget_bytes, torch_dtr.stats("b").budget_bytes))
            finally:
                if scope is not None:
                    scope.__exit__(None, None, None)
        a, b = torch_dtr.stats("a"), torch_dtr.stats("b")
        main = torch_dtr.stats()
    finally:
        torch_dtr.disable()
    assert losses == want
    assert all(torch.equal(p, q) for m, w in zip(models, want_params, strict=True)
               for p, q in zip(m.parameters(), w, strict=True))
    for st in (a, b):
        assert st.evictions > 0 and st.rematerializations + st.swaps_in > 0 and st.ops > 0
        assert st.peak_bytes <= total // 3 + 1, "each tenant within a third (the session itself is the third)"
    assert main.ops == 0, "every op ran under a tenant"
    assert budgets[2] == budgets[3] == (int(total * 0.8) // 3, int(total * 0.8) // 3)
    assert budgets[0] == budgets[5] == (total // 3, total // 3)


def test_shares_move_budget_between_tenants_and_bad_use_is_refused():
    torch_dtr.enable(budget=9000)
    try:
        with torch_dtr.tenant("a", share=2):
            pass
        with torch_dtr.tenant("b"):
            assert torch_dtr.stats("a").budget_bytes == 4500 and torch_dtr.stats("b").budget_bytes == 2250
        with torch_dtr.tenant("b", share=6):
            assert torch_dtr.stats("b").budget_bytes == 6000 and torch_dtr.stats("a").budget_bytes == 2000
        with pytest.raises(ValueError, match="share must be a number > 0"), torch_dtr.tenant("a", share=0):
            pass
        with pytest.raises(KeyError, match="no tenant 'c'"):
            torch_dtr.stats("c")
        with pytest.raises(TypeError, match="name is a str"), torch_dtr.tenant(3):
            pass
    finally:
        torch_dtr.disable()
    with pytest.raises(RuntimeError, match="needs an enabled session"), torch_dtr.tenant("a"):
        pass


def test_a_tensor_of_one_tenant_read_by_another_is_a_constant_there():
    w = torch.randn(32, 32, requires_grad=True)
    torch_dtr.enable(budget=None)
    try:
        with torch_dtr.tenant("a"):
            y = (w * 2).tanh()
        with torch_dtr.tenant("b"):
            z = (y * 3).sum()
        z.backward()
        assert torch_dtr.stats("b").constant_bytes >= 32 * 32 * 4, "y is a constant of b"
    finally:
        torch_dtr.disable()
    w2 = w.detach().clone().requires_grad_()
    ((w2 * 2).tanh() * 3).sum().backward()
    assert torch.equal(w.grad, w2.grad)


def _two_forwards(host: int | None, total: int) -> tuple[list[float], int, list[torch_dtr.Stats]]:
    """Both tenants' forwards, then both backwards, with the host tier: the sum of their copies held after both
    forwards (the most they hold at once), their losses, their stats."""
    models, opts, xs = _pair()
    torch_dtr.enable(budget=total, swap=True, swap_gbps=1000, host_budget=host)
    try:
        for name in "ab":
            with torch_dtr.tenant(name, share=1):
                pass
        losses = []
        for i, name in enumerate("ab"):
            with torch_dtr.tenant(name):
                losses.append(models[i](xs[i]).square().mean())
        held = torch_dtr.stats("a").host_bytes + torch_dtr.stats("b").host_bytes
        for i, name in enumerate("ab"):
            with torch_dtr.tenant(name):
                losses[i].backward()
        stats = [torch_dtr.stats(n) for n in "ab"]
    finally:
        torch_dtr.disable()
    return [loss.detach().item() for loss in losses], held, stats


def test_tenants_share_the_host_budget():
    """NOTE [ Host copies ] 8: each tenant's forward alone copies out ``one`` bytes; with a host budget of 1.5x
    that, both tenants together stay within it, bitwise (when each had the whole host budget, they held
    262,144 B of copies against a host budget of 196,608 B)."""
    torch_dtr.enable(budget=None)
    with torch_dtr.tenant("a"):
        _step(*[x[0] for x in _pair()])
    peak = torch_dtr.stats("a").peak_bytes
    torch_dtr.disable()
    total = int(peak * 2.1)  # three shares: each tenant gets 70% of one model's peak
    want, alone, _ = _two_forwards(None, total)
    one = alone // 2
    assert one > 0
    host = int(one * 1.5)
    got, held, stats = _two_forwards(host, total)
    assert got == want
    assert 0 < held <= host, (held, host)
    assert all(st.swaps_out > 0 for st in stats)


def test_tenants_on_worker_threads_train_at_once_bitwise_within_their_shares():
    """Each tenant trains on a thread of its own (``attach()`` then ``tenant()``), both at once."""
    import threading

    want, want_params = _plain()
    torch_dtr.enable(budget=None)
    models, opts, xs = _pair()
    with torch_dtr.tenant("a"):
        _step(models[0], opts[0], xs[0])
    one = torch_dtr.stats("a").peak_bytes
    torch_dtr.disable()
    models, opts, xs = _pair()
    total = int(one * 1.8)  # three shares: each tenant gets 60% of one model's peak
    losses: list[list[float]] = [[], []]
    errors: list[BaseException] = []
    torch_dtr.enable(budget=total)
    try:
        for name in "ab":
            with torch_dtr.tenant(name, share=1):
                pass
        start = threading.Barrier(2)

        def work(i: int) -> None:
            try:
                with torch_dtr.attach(), torch_dtr.tenant("ab"[i]):
                    start.wait()
                    for _ in range(STEPS):
                        losses[i].append(_step(models[i], opts[i], xs[i]))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        a, b = torch_dtr.stats("a"), torch_dtr.stats("b")
    finally:
        torch_dtr.disable()
    assert not errors, errors
    assert losses == want
    assert all(torch.equal(p, q) for m, w in zip(models, want_params, strict=True)
               for p, q in zip(m.parameters(), w, strict=True))
    for st in (a, b):
        assert st.evictions > 0 and st.ops > 0
        assert st.peak_bytes <= total // 3 + 1


def _chain(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    hs = [x]
    for _ in range(6):
        hs.append((hs[-1] @ w).tanh())
    return hs[1:]


def test_a_parameter_written_outside_its_tenant_is_told_to_the_tenant_whose_recipes_read_it():
    """Inference in a tenant evicts values whose lineage reads ``w``; ``w`` is then updated outside the tenant's
    scope (on the session itself): the tenant's values come back as they were computed, not from the new ``w``."""
    torch.manual_seed(0)
    w = torch.randn(256, 256) / 16
    x = torch.randn(64, 256)
    want = _chain(x, w)
    one = 64 * 256 * 4
    torch_dtr.enable(budget=one * 18)  # two shares: the tenant keeps its constants (5 x one) and four of its values
    try:
        with torch.no_grad(), torch_dtr.tenant("a"):
            hs = _chain(x, w)
        before = torch_dtr.stats("a")
        # every value's lineage reads w: a write to w brings back and keeps them all, so the tenant gets room first
        with torch_dtr.budget(one * 26), torch.no_grad():
            w.add_(1.0)  # outside the tenant
            after = torch_dtr.stats("a")
            torch_dtr.disable()  # (what the write brought back stays: the old budget would not fit now)
    finally:
        torch_dtr.disable()
    assert before.evictions > 0 and before.peak_bytes <= one * 9
    assert after.rematerializations > before.rematerializations and after.peak_bytes <= one * 13
    assert all(torch.equal(h, t) for h, t in zip(hs, want, strict=True))
