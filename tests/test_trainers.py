"""The trainers people run: ``transformers.Trainer`` and Lightning's ``Trainer`` with the two lines of the README
around ``train()`` / ``fit()``, at the budget the session learned from an unbudgeted run (NOTE [ Learned budgets ]),
bitwise equal to the same trainer without torch-dtr."""

from __future__ import annotations

import pytest
import torch

import torch_dtr


class _Ids(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.ids = torch.randint(0, 256, (32, 64), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _train(tmp_path, budget: int | None | bool) -> tuple[list[torch.Tensor], list[float], object]:
    """Four steps of a tiny GPT-2 (dropout on) with AdamW and gradient clipping, Trainer's defaults; ``budget``
    False: without torch-dtr."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # (Trainer needs it)
    transformers.set_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64)
    model = transformers.GPT2LMHeadModel(cfg)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=4,
                                          logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0,
                                          disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Ids())
    st = None
    if budget is False:
        trainer.train()
    else:
        with torch_dtr.enable(budget=budget):
            trainer.train()
            st = torch_dtr.stats()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return [p.detach().clone() for p in model.parameters()], losses, st


def _fit(budget: int | None | bool) -> tuple[list[torch.Tensor], list[float], object]:
    """Four steps of a Lightning module (an MLP, AdamW) on a CPU; ``budget`` False: without torch-dtr."""
    L = pytest.importorskip("lightning")  # noqa: N806
    losses: list[float] = []

    class MLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.GELU())
                                             for _ in range(6)], torch.nn.Linear(128, 10))

        def training_step(self, batch, _i):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(1024, 128, generator=g), torch.randint(0, 10, (1024,),
                                                                                            generator=g))
    L.seed_everything(0, verbose=False)
    model = MLP()
    trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    st = None
    if budget is False:
        trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=256))
    else:
        with torch_dtr.enable(budget=budget):
            trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=256))
            st = torch_dtr.stats()
    return [p.detach().clone() for p in model.parameters()], losses, st


@pytest.mark.parametrize("run", [_train, _fit], ids=["transformers", "lightning"])
def test_a_trainer_trains_at_its_learned_budget_bitwise_as_without_torch_dtr(tmp_path, run):
    go = (lambda b: run(tmp_path, b)) if run is _train else run
    plain, plain_losses, _ = go(False)
    assert len(plain_losses) == 4
    got, losses, learned = go(None)
    assert losses == plain_losses and all(torch.equal(a, b) for a, b in zip(got, plain, strict=True))
    assert learned.traced_steps == 2 and learned.learned_budget < learned.peak_bytes
    got, losses, st = go(learned.learned_budget)
    assert st.evictions > 0 and st.peak_bytes <= learned.learned_budget, st
    assert losses == plain_losses and all(torch.equal(a, b) for a, b in zip(got, plain, strict=True))
