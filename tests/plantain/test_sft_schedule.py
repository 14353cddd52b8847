"""plantain's SFT learning-rate schedule (warmup-stable-decay): lr constant, then linearly to 0 over the last
decay_frac of the steps; checked against the optimizer's own lr after real Lightning steps."""
from __future__ import annotations

import pytest
import torch

from stages.plantain.model import wsd_factor


def test_wsd_factor_by_hand():
    # 10 steps, last 30% decayed: factors 1 for steps 0..6, then 3/3, 2/3, 1/3 at steps 7, 8, 9
    assert [wsd_factor(i, 10, 0.3) for i in range(7)] == [1.0] * 7
    assert [wsd_factor(i, 10, 0.3) for i in (7, 8, 9, 10)] == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0])
    assert wsd_factor(0, 1200, 0.3) == 1.0 and wsd_factor(840, 1200, 0.3) == 1.0
    assert wsd_factor(1020, 1200, 0.3) == pytest.approx(0.5)


def test_sft_module_decays_the_lr_in_a_real_fit():
    from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
    from stages.common.trainer import TrainerConfig, make_trainer
    from stages.plantain.lit import SFTModule
    from stages.plantain.model import Counter
    from kernels.record import KernelRecord

    torch.manual_seed(0)
    model = TinyTransformer(TinyTransformerConfig(vocab_size=11, d_model=8, n_layers=1, n_heads=2, max_seq_len=8))
    m = SFTModule(model, 0.004, 0.0, Counter(KernelRecord(torch.device("cpu"))), steps=10, decay_frac=0.3)
    seen = []

    class Batches(torch.utils.data.IterableDataset):
        def __iter__(self):
            for _ in range(10):
                yield torch.randint(0, 11, (3, 8))

    import lightning as L

    class LrSpy(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, idx):
            seen.append(trainer.optimizers[0].param_groups[0]["lr"])

    def step(batch, batch_idx):                                # any differentiable loss: the lr is under test
        return model(batch).float().pow(2).mean()

    m.training_step = step
    make_trainer(TrainerConfig(enable_progress_bar=False), None, max_steps=10, callbacks=[LrSpy()]).fit(
        m, torch.utils.data.DataLoader(Batches(), batch_size=None))
    assert seen == pytest.approx([0.004 * wsd_factor(i, 10, 0.3) for i in range(10)])
    assert seen[6] == pytest.approx(0.004) and seen[9] == pytest.approx(0.004 / 3)


def test_constant_lr_without_decay():
    from stages.plantain.lit import SFTModule
    from stages.plantain.model import Counter
    from kernels.record import KernelRecord
    from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig

    model = TinyTransformer(TinyTransformerConfig(vocab_size=11, d_model=8, n_layers=1, n_heads=2, max_seq_len=8))
    opt = SFTModule(model, 0.004, 0.0, Counter(KernelRecord(torch.device("cpu")))).configure_optimizers()
    assert isinstance(opt, torch.optim.AdamW)


def test_real_path_refuses_a_decay_it_would_ignore(tmp_path):
    """The real-model SFT (stages.common.hf.sft_steps) runs a constant lr: a decay_frac there is refused with one
    line naming the key, before any model is loaded."""
    from stages.plantain.train import Config, run

    cfg = Config.model_validate({"source": {"kind": "file", "model": str(tmp_path)}, "sft": {"decay_frac": 0.3}})
    with pytest.raises(ValueError, match=r"sft.decay_frac: 0.3 .* set 0"):
        run(cfg, None)
