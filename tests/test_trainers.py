"""The trainers people run: ``transformers.Trainer`` with the two lines of the README around ``train()``, at the
budget the session learned from an unbudgeted run (NOTE [ Learned budgets ]), bitwise equal to the same Trainer
without torch-dtr."""

from __future__ import annotations

import pytest
import torch

import torch_dtr

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # (Trainer needs it)


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


def test_a_transformers_trainer_trains_at_its_learned_budget_bitwise_as_without_torch_dtr(tmp_path):
    plain, plain_losses, _ = _train(tmp_path, False)
    assert len(plain_losses) == 4
    got, losses, learned = _train(tmp_path, None)
    assert losses == plain_losses and all(torch.equal(a, b) for a, b in zip(got, plain, strict=True))
    assert learned.traced_steps == 2 and learned.learned_budget < learned.peak_bytes
    got, losses, st = _train(tmp_path, learned.learned_budget)
    assert st.evictions > 0 and st.rematerializations > 0 and st.peak_bytes <= learned.learned_budget, st
    assert losses == plain_losses and all(torch.equal(a, b) for a, b in zip(got, plain, strict=True))
